"""Sampling: the same distribution as HF transformers' warpers, drawn as that distribution says, reproducible per
seed and per sequence; temperature → 0 and top_k = 1 are greedy."""

from __future__ import annotations

import pytest
import torch
from runtime_plans import PROMPT, make_plan, make_test_backend

from liac.errors import LiacError
from liac.runtime import Engine
from liac.runtime.sampling import Sampler, SamplingParams, draw, warp

LOGITS = torch.randn(4, 50, generator=torch.Generator().manual_seed(3)) * 3


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.8),
                                                        (0.5, 5, 0.6), (2.0, 1, 1.0), (1.0, 0, 0.01)])
def test_warp_matches_hf_warpers(temperature, top_k, top_p):
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = TemperatureLogitsWarper(temperature)(None, LOGITS.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    want = torch.softmax(scores, dim=-1)
    rows = LOGITS.shape[0]
    probs, order = warp(LOGITS, torch.full((rows,), temperature), torch.full((rows,), top_k),
                        torch.full((rows,), top_p))
    got = torch.zeros_like(probs).scatter_(-1, order, probs)  # back to vocabulary order
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_draws_follow_the_distribution():
    # inverse-CDF draws at uniform points: token frequencies converge to the warped probabilities
    probs, order = warp(LOGITS[:1], torch.tensor([1.2]), torch.tensor([8]), torch.tensor([0.9]))
    uniform = torch.rand(40000, generator=torch.Generator().manual_seed(0))
    tokens = draw(probs.expand(len(uniform), -1), order.expand(len(uniform), -1), uniform)
    counts = torch.bincount(tokens, minlength=LOGITS.shape[1]).double() / len(uniform)
    want = torch.zeros(LOGITS.shape[1], dtype=torch.float64).scatter_(0, order[0], probs[0].double())
    assert set(tokens.unique().tolist()) <= set(torch.nonzero(want).flatten().tolist())  # only kept tokens
    assert (counts - want).abs().max() < 0.01


def test_sampler_reproducible_per_seed_and_per_sequence():
    def run(params, steps=20):
        sampler = Sampler(params)
        return torch.cat([sampler(LOGITS[:len(params)]) for _ in range(steps)], dim=1)

    hot = SamplingParams(temperature=2.0, seed=7)
    first = run([hot] * 3)
    assert torch.equal(first, run([hot] * 3))
    assert not torch.equal(first, run([SamplingParams(temperature=2.0, seed=8)] * 3))
    # a sequence's draws depend on its seed and index, not on the others: greedy neighbours change nothing
    mixed = run([hot, SamplingParams(), hot])
    assert torch.equal(mixed[[0, 2]], first[[0, 2]])
    assert torch.equal(mixed[1], LOGITS[1].argmax().repeat(20))


def test_sampling_params_are_checked():
    for kwargs, fragment in (({"temperature": -1.0}, "temperature: must be a number at least 0"),
                             ({"top_p": 0.0}, "top_p: must be a number greater than 0"),
                             ({"top_k": -2}, "top_k: must be an integer at least 0"),
                             ({"seed": 1.5}, "seed: must be an integer")):
        with pytest.raises(LiacError, match=fragment):
            SamplingParams(**kwargs)


@pytest.fixture(scope="module")
def engine(checkpoints):
    directory, cfg = checkpoints("llama")
    return Engine.from_plan(make_plan(cfg, "partial"), directory, backend=make_test_backend("emulated"),
                            dtype=torch.float32)


def test_engine_seeded_sampling_is_reproducible(engine):
    first = engine.generate(PROMPT, 12, temperature=1.5, seed=11).token_ids
    assert torch.equal(first, engine.generate(PROMPT, 12, temperature=1.5, seed=11).token_ids)
    greedy = engine.generate(PROMPT, 12).token_ids
    assert not torch.equal(first, greedy)
    assert not torch.equal(first, engine.generate(PROMPT, 12, temperature=1.5, seed=12).token_ids)


def test_temperature_to_zero_and_top_k_one_are_greedy(engine):
    greedy = engine.generate(PROMPT, 12).token_ids
    assert torch.equal(engine.generate(PROMPT, 12, temperature=1e-4, seed=3).token_ids, greedy)
    assert torch.equal(engine.generate(PROMPT, 12, temperature=1.0, top_k=1, seed=3).token_ids, greedy)
    assert torch.equal(engine.generate(PROMPT, 12, temperature=1.0, top_p=1e-6, seed=3).token_ids, greedy)


def test_per_sequence_params(engine):
    greedy = engine.generate(PROMPT, 8).token_ids
    out = engine.generate(PROMPT, 8, sampling=[SamplingParams(), SamplingParams(temperature=1.5, seed=4)])
    assert torch.equal(out.token_ids[0], greedy[0])
    with pytest.raises(LiacError, match="one SamplingParams per sequence"):
        engine.generate(PROMPT, 8, sampling=[SamplingParams()])
