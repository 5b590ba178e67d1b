"""Prompts of different lengths in one batch: left padding and a per-sequence mask give HF generate's tokens.

The reference is `transformers`' own `generate` on the same left-padded batch with its attention mask (fp32, greedy):
it derives positions from the mask (OPT's learned positions, Llama's RoPE) and masks the padding in its own
attention code, sharing nothing with the runtime's `padded_causal_mask` / `padded_positions`. Every placement kind
runs, the CPU-only plan included; each sequence must also come out as it does alone, unpadded. EOS stops each
sequence on its own, as HF's does (finished rows are filled with the padding id until all are done).
"""

from __future__ import annotations

import pytest
import torch
from runtime_plans import BACKENDS, hf_model_class, make_plan, make_test_backend

from liac.runtime import Engine
from liac.runtime.sequences import PromptBatch

ROWS = [[5, 9, 17, 33, 4, 60, 71, 8], [44, 12, 3], [7, 7, 19, 100, 2]]  # 8, 3 and 5 tokens
WIDTH = 8
NEW = 12
PAD = 0
POLICIES = ("gpu", "cpu", "partial", "mixed", "crossed", "split")
PLAN_ARGS = {"mixed": {"resident_layers": 1, "cxl_layers": 1}}


def _padded():
    ids = torch.tensor([[PAD] * (WIDTH - len(r)) + r for r in ROWS])
    mask = torch.tensor([[0] * (WIDTH - len(r)) + [1] * len(r) for r in ROWS])
    return ids, mask


def _hf_generate(directory, family, new_tokens, eos=None):
    import transformers

    model = hf_model_class(family).from_pretrained(directory, dtype=torch.float32).eval()
    config = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD,
                                           eos_token_id=eos, bos_token_id=None)
    ids, mask = _padded()
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, generation_config=config)[:, WIDTH:]


@pytest.fixture(scope="module")
def hf_tokens(checkpoints):
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = _hf_generate(checkpoints(family)[0], family, NEW)
        return cache[family]
    return get


def _engine(checkpoints, family, policy, backend="emulated"):
    directory, cfg = checkpoints(family)
    plan = make_plan(cfg, policy, batch=3, prompt_len=WIDTH, gen_len=NEW, **PLAN_ARGS.get(policy, {}))
    return Engine.from_plan(plan, directory, backend=make_test_backend(backend), dtype=torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("family", ("opt", "llama"))
def test_padded_batch_matches_hf_generate(checkpoints, hf_tokens, family, policy, backend):
    engine = _engine(checkpoints, family, policy, backend)
    want = hf_tokens(family)
    out = engine.generate(ROWS, NEW)  # lists of different lengths: left-padded by the engine
    assert torch.equal(out.token_ids, want)
    assert out.prompt_lengths == (8, 3, 5) and out.prompt_len == WIDTH
    alone = engine.generate([ROWS[1]], NEW)  # the shortest prompt, unpadded
    assert torch.equal(alone.token_ids[0], want[1])


def test_attention_mask_of_either_side_is_the_same_batch(checkpoints, hf_tokens):
    engine = _engine(checkpoints, "llama", "partial")
    ids, mask = _padded()
    left = engine.generate(ids, NEW, attention_mask=mask)
    right_ids = torch.tensor([r + [PAD] * (WIDTH - len(r)) for r in ROWS])
    right_mask = torch.tensor([[1] * len(r) + [0] * (WIDTH - len(r)) for r in ROWS])
    right = engine.generate({"input_ids": right_ids, "attention_mask": right_mask}, NEW)  # a tokenizer's output
    assert torch.equal(left.token_ids, hf_tokens("llama")) and torch.equal(right.token_ids, left.token_ids)


def test_without_the_mask_the_padded_rows_differ(checkpoints, hf_tokens):
    # the reference is sensitive: the same padded ids run as if the padding were text give other tokens
    engine = _engine(checkpoints, "opt", "cpu")
    ids, _ = _padded()
    assert not torch.equal(engine.generate(ids, NEW).token_ids, hf_tokens("opt"))


@pytest.mark.parametrize("family", ("opt", "llama"))
def test_eos_stops_each_sequence_like_hf(checkpoints, hf_tokens, family):
    free = hf_tokens(family)
    # an EOS id that the second sequence produces early and the others later or never
    eos = int(free[1, 2])
    want = _hf_generate(checkpoints(family)[0], family, NEW, eos=eos)
    engine = _engine(checkpoints, family, "mixed")
    out = engine.generate(ROWS, NEW, eos_token_id=eos)
    assert torch.equal(out.token_ids, want)  # same width (stops when all are done), padding after each EOS
    for row, length, reason, free_row in zip(out.token_ids.tolist(), out.lengths, out.finish_reasons, free.tolist()):
        hit = free_row.index(eos) + 1 if eos in free_row else None
        assert length == (hit or out.token_ids.shape[1])
        assert reason == ("eos" if hit else "length")
        assert row[:length] == free_row[:length] and set(row[length:]) <= {PAD}
    assert out.lengths[1] == 3


def test_prompt_batch_left_pads_and_reads_back():
    batch = PromptBatch.from_lists([[5, 6, 7], [8]], pad_id=9)
    assert batch.ids.tolist() == [[5, 6, 7], [9, 9, 8]] and batch.pad.tolist() == [0, 2]
    assert batch.rows() == [[5, 6, 7], [8]] and batch.lengths == [3, 1]
    right = PromptBatch.from_tensor(torch.tensor([[5, 6, 7], [8, 0, 0]]), torch.tensor([[1, 1, 1], [1, 0, 0]]))
    assert right.rows() == [[5, 6, 7], [8]] and right.pad.tolist() == [0, 2]
