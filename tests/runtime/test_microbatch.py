"""Prefill in micro-batches (plan v3, docs/runtime.md "Prefill micro-batches"): parity with HF transformers and
with the same plan run as one batch, and what the cut changes (and does not) in what crosses PCIe.

A plan's `spec.execution.prefill_microbatch_sequences` × `prefill_microbatch_tokens` cuts its prefill into row
blocks of sequences and prompt chunks; the runtime runs it layer by layer over them, each chunk attending to the
K, V of the chunks before it. The reference is HF's own greedy decoding by full recomputation (test_parity.py's),
so a wrong mask, position or K, V prefix in any micro-batch changes the tokens.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from runtime_plans import (BACKENDS, FAMILIES, NEW_TOKENS, PROMPT, assert_bf16_logits_close, hf_model_class,
                           make_plan, make_test_backend)
from test_padding import NEW, PAD, ROWS, WIDTH, _padded

from liac.runtime import Engine
from liac.runtime.executor import microbatch_parts

# PROMPT is [2, 8]: one sequence by chunks of 3 tokens cuts it into 2 row blocks × chunks of 3, 3 and 2 tokens.
CUTS = [pytest.param((1, 3), id="1seq-x-3tok"), pytest.param((1, 8), id="rows"), pytest.param((2, 5), id="chunks")]
PLANS = {"gpu": {}, "cpu": {}, "partial": {}, "crossed": {}, "mixed": {"resident_layers": 1, "cxl_layers": 1},
         "split": {"permille": 333}}


def test_microbatch_parts_cover_the_batch_in_order():
    parts = microbatch_parts(5, 7, (2, 3))
    assert parts[:3] == [((0, 2), (0, 3)), ((0, 2), (3, 6)), ((0, 2), (6, 7))]  # a row block's chunks in order
    assert [rows for rows, _ in parts[::3]] == [(0, 2), (2, 4), (4, 5)]
    covered = torch.zeros(5, 7, dtype=torch.int64)
    for (r0, r1), (t0, t1) in parts:
        covered[r0:r1, t0:t1] += 1
    assert torch.equal(covered, torch.ones(5, 7, dtype=torch.int64))
    assert microbatch_parts(2, 4, (8, 16)) == [((0, 2), (0, 4))]  # a request smaller than the plan: one part


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("policy", list(PLANS))
@pytest.mark.parametrize("family", FAMILIES)
def test_microbatched_prefill_matches_hf_fp32(checkpoints, reference, family, policy, cut, backend):
    directory, cfg = checkpoints(family)
    plan = make_plan(cfg, policy, microbatch=cut, **PLANS[policy])
    engine = Engine.from_plan(plan, directory, backend=make_test_backend(backend), dtype=torch.float32)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference(family)
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_microbatched_prefill_bf16_logits(checkpoints, reference, family, backend):
    directory, cfg = checkpoints(family)
    engine = Engine.from_plan(make_plan(cfg, "crossed", microbatch=(1, 3)), directory,
                              backend=make_test_backend(backend))
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    fp32, bf16, _, _ = reference(family)
    assert_bf16_logits_close(out, fp32, bf16)


def _run(directory, plan, log=None):
    engine = Engine.from_plan(plan, directory, emulate_gpu=True, dtype=torch.float32, stream_log=log)
    return engine, engine.generate(PROMPT, 1)  # the prefill alone (its first token)


@pytest.mark.parametrize("policy", ["crossed", "mixed", "split"])
def test_cut_moves_the_same_kv_and_streams_each_layer_once(checkpoints, policy):
    """The K, V written into the cache and the weights streamed are the same as one batch's; activations cross
    PCIe once per micro-batch (the same bytes, more copies); each streamed layer waits and releases its staging
    buffer once, around all its micro-batches."""
    directory, cfg = checkpoints("opt")
    whole_log, cut_log = [], []
    whole, ran_whole = _run(directory, make_plan(cfg, policy, **PLANS[policy]), whole_log)
    cut, ran_cut = _run(directory, make_plan(cfg, policy, microbatch=(1, 3), **PLANS[policy]), cut_log)
    assert torch.equal(ran_whole.token_ids, ran_cut.token_ids)
    a, b = ran_whole.transfers, ran_cut.transfers
    assert a["streamed_bytes"] == b["streamed_bytes"] > 0
    assert a["h2d_bytes"] == b["h2d_bytes"] and a["d2h_bytes"] == b["d2h_bytes"]
    parts = len(microbatch_parts(2, 8, (1, 3)))
    assert b["h2d_copies"] + b["d2h_copies"] > a["h2d_copies"] + a["d2h_copies"]
    for layer in range(cfg.num_layers):  # the caches hold the same K, V
        for which in ("k", "v"):
            torch.testing.assert_close(getattr(cut.executor.kv, which)[layer], getattr(whole.executor.kv, which)[layer])
    assert [e for e in cut_log if e[0] in ("wait", "release")] == [e for e in whole_log if e[0] in ("wait", "release")]
    assert parts == 6


def test_profile_reports_one_entry_per_layer_and_pass(checkpoints):
    """The profiling pass adds up a layer's micro-batches: one entry per layer and pass, as for one batch."""
    directory, cfg = checkpoints("opt")
    timings = {}
    engine = Engine.from_plan(make_plan(cfg, "partial", microbatch=(1, 3)), directory, emulate_gpu=True,
                              dtype=torch.float32)
    engine.executor.forward("prefill", PROMPT, 0, timings)
    (qkv,) = [key for key in timings if key[1] == ("qkv",) and key[2] == "prefill"]  # one group of every layer
    assert len(timings[qkv]) == cfg.num_layers


@pytest.mark.parametrize("policy", ["gpu", "crossed", "split"])
@pytest.mark.parametrize("family", ("opt", "llama"))
def test_padded_prompts_in_micro_batches_match_hf_generate(checkpoints, family, policy):
    """Left-padded prompts of 8, 3 and 5 tokens (test_padding.py's) prefilled in micro-batches of 2 sequences × 3
    slots: a chunk can be all padding for one sequence and all prompt for another; HF generate's tokens still."""
    directory, cfg = checkpoints(family)
    model = hf_model_class(family).from_pretrained(directory, dtype=torch.float32).eval()
    config = transformers.GenerationConfig(max_new_tokens=NEW, do_sample=False, pad_token_id=PAD,
                                           eos_token_id=None, bos_token_id=None)
    ids, mask = _padded()
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, generation_config=config)[:, WIDTH:]
    plan = make_plan(cfg, policy, batch=3, prompt_len=WIDTH, gen_len=NEW, microbatch=(2, 3), **PLANS[policy])
    engine = Engine.from_plan(plan, directory, emulate_gpu=True, dtype=torch.float32)
    assert torch.equal(engine.generate(ROWS, NEW).token_ids, want)
