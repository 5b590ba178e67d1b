"""liac.runtime against HF transformers on the same safetensors weights, under four kinds of plan.

For OPT, Llama (grouped-query attention) and Qwen2 (QKV bias, tied head), tiny random HF models are saved with
`save_pretrained(safe_serialization=True)` and loaded through the runtime's safetensors path. The reference is HF's
own forward pass over the whole sequence at every step (no KV cache), so it shares nothing with the runtime's
incremental decode.

dtype choice: token parity is checked in float32 (both sides), where the two implementations agree to ~1e-5 and a
greedy argmax cannot flip on rounding; bf16 is checked on logits: teacher-forced on the tokens the runtime
generated, the runtime's bf16 logits must be as close to HF's fp32 logits as HF's own bf16 run is (plus a margin),
and within 5% of the logit range.
"""

from __future__ import annotations

import pytest
import torch
from runtime_plans import BACKENDS, FAMILIES, POLICIES, hf_model_class, make_plan, make_test_backend

from liac.runtime import Engine

NEW_TOKENS = 16
PROMPT = torch.randint(0, 112, (2, 8), generator=torch.Generator().manual_seed(7))
# The mixed plan: layer 0 HBM-resident (KV in HBM), layer 1 streamed from DDR (KV in DDR), layer 2 in the 'cxl'
# tier (KV too; DDR on hosts without a CXL node).
PLAN_ARGS = {"gpu": {}, "cpu": {}, "partial": {}, "mixed": {"resident_layers": 1, "cxl_layers": 1}}


@pytest.fixture(scope="module")
def reference(checkpoints):
    """family → (HF fp32 model, HF bf16 model, greedy tokens, their logits), computed once per family."""
    cache = {}

    def get(family: str):
        if family not in cache:
            directory, _ = checkpoints(family)
            fp32 = hf_model_class(family).from_pretrained(directory, dtype=torch.float32).eval()
            bf16 = hf_model_class(family).from_pretrained(directory, dtype=torch.bfloat16).eval()
            cache[family] = (fp32, bf16, *hf_greedy(fp32, PROMPT, NEW_TOKENS))
        return cache[family]

    return get


def hf_greedy(model, ids: torch.Tensor, new_tokens: int):
    """Greedy decoding by full recomputation: tokens [B, n], logits [B, n, V] (float32)."""
    sequence, tokens, logits = ids, [], []
    with torch.no_grad():
        for _ in range(new_tokens):
            last = model(sequence).logits[:, -1].float()
            nxt = last.argmax(-1, keepdim=True)
            tokens.append(nxt)
            logits.append(last)
            sequence = torch.cat([sequence, nxt], dim=1)
    return torch.cat(tokens, dim=1), torch.stack(logits, dim=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_match_hf_fp32(checkpoints, reference, family, policy, backend):
    directory, cfg = checkpoints(family)
    plan = make_plan(cfg, policy, **PLAN_ARGS[policy])
    engine = Engine.from_plan(plan, directory, backend=make_test_backend(backend), dtype=torch.float32)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference(family)
    assert out.token_ids.shape == (2, NEW_TOKENS)
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_logits_within_bf16_tolerance(checkpoints, reference, family, policy, backend):
    directory, cfg = checkpoints(family)
    plan = make_plan(cfg, policy, **PLAN_ARGS[policy])
    engine = Engine.from_plan(plan, directory, backend=make_test_backend(backend))
    assert engine.dtype == torch.bfloat16  # the plan's dtype is the default
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    sequence = torch.cat([PROMPT, out.token_ids], dim=1)
    positions = slice(PROMPT.shape[1] - 1, -1)  # the logits each generated token was picked from
    fp32, bf16, _, _ = reference(family)
    with torch.no_grad():
        truth = fp32(sequence).logits[:, positions].float()
        hf_bf16 = bf16(sequence).logits[:, positions].float()
    ours_error = (out.logits - truth).abs().max().item()
    hf_error = (hf_bf16 - truth).abs().max().item()
    assert ours_error <= 1.5 * hf_error + 0.02, (ours_error, hf_error)
    assert ours_error <= 0.05 * truth.abs().max().item()
