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
from runtime_plans import (BACKENDS, FAMILIES, NEW_TOKENS, POLICIES, PROMPT, assert_bf16_logits_close, make_plan,
                           make_test_backend)

from liac.runtime import Engine

# The mixed plan: layer 0 HBM-resident (KV in HBM), layer 1 streamed from DDR (KV in DDR), layer 2 in the 'cxl'
# tier (KV too; DDR on hosts without a CXL node).
PLAN_ARGS = {"gpu": {}, "cpu": {}, "partial": {}, "mixed": {"resident_layers": 1, "cxl_layers": 1}, "crossed": {}}


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
    fp32, bf16, _, _ = reference(family)
    assert_bf16_logits_close(out, fp32, bf16)
