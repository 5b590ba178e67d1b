"""The plan's prediction scaled to a smaller request (runtime/metrics.py `request_prediction`): identity at the
plan's own workload, and the docstring's rule worked out by hand on a two-row plan."""

from __future__ import annotations

from dataclasses import replace

import pytest
from runtime_plans import TINY, make_plan

from liac.plan import SublayerTime
from liac.runtime.metrics import request_prediction


def test_identity_at_the_plans_workload():
    plan = make_plan(TINY, "mixed", batch=4, prompt_len=8, gen_len=6)
    predicted = plan.status.predicted
    got = request_prediction(plan, 4, 8, 6)
    assert got["prefill_ms"] == pytest.approx(predicted.prefill_seconds * 1e3, rel=1e-5)
    assert got["decode_ms_per_token"] == pytest.approx(predicted.decode_seconds_per_token * 1e3, rel=1e-5)
    assert got["total_ms"] == pytest.approx((predicted.prefill_seconds + 5 * predicted.decode_seconds_per_token)
                                            * 1e3, rel=1e-5)


def test_scaling_worked_by_hand():
    plan = make_plan(TINY, "gpu", batch=4, prompt_len=8, gen_len=5)  # decoder group 'offload', 2 layers
    rows = (SublayerTime("offload", "fc1", "prefill", "gpu", 1.0, 0.0, 1.0),        # GEMM: compute, stream
            SublayerTime("offload", "attn_score", "prefill", "gpu", 1.0, 0.0, 0.0),  # attention
            SublayerTime("offload", "fc1", "decode", "gpu", 0.5, 0.5, 0.0),         # GEMM: compute, transfer
            SublayerTime("offload", "attn_score", "decode", "gpu", 1.0, 0.0, 0.0))
    predicted = replace(plan.status.predicted, prefill_seconds=3.0, decode_seconds_per_token=2.0, sublayers=rows)
    plan = replace(plan, status=replace(plan.status, predicted=predicted))
    got = request_prediction(plan, 2, 4, 5)  # half the batch, half the prompt
    # prefill: tokens ratio 2·4 / (4·8) = 1/4; fc1 1 · 1/4 + 1 (stream); attention 1 · 1/4 · 4/8 = 1/8;
    # the phase time 3 s scaled as the rows' sum (3 → 1.375)
    assert got["prefill_ms"] == pytest.approx(3.0 * 1.375 / 3.0 * 1e3)
    # decode: fc1 compute 0.5 kept, its transfer 0.5 · 2/4; attention 1 · 2/4 · (4 + 2) / (8 + 2) = 0.3
    per_token = 2.0 * (0.5 + 0.25 + 0.3) / 2.0
    assert got["decode_ms_per_token"] == pytest.approx(per_token * 1e3)
    assert got["total_ms"] == pytest.approx((1.375 + 4 * per_token) * 1e3)
    assert got["tokens_per_second"] == pytest.approx(2 * 5 / (1.375 + 4 * per_token), rel=1e-5)
