"""The GPU's GEMM rate by rows (Eq. 1c) and the prefill's host time under the GPU's kernels (Eq. 24b), against hand
arithmetic; a profile without the curve prices and hashes exactly as before."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hand_graphs import TINY, hand_graph

from liac.calibrate import scaled_profile
from liac.passes.costs import TierBudgets, Workload, annotate_costs, node_seconds
from liac.passes.price import layer_time, unit_times
from liac.probe import decoder_gemm_shapes, gemm_curve
from liac.profile import CurvePoint, parse_profile, profile_names, resolve_profile
from liac.schema_tools import to_data
from liac.sizes import GB

HW = resolve_profile("spr-h100-cxl")
BUDGETS = TierBudgets(10**12, 10**12, 10**12)


def _curve(*points):
    return tuple(CurvePoint(m=m, tflops=t) for m, t in points)


def _node(name):
    return next(s for s in hand_graph(TINY).sublayers("decoder") if s.name == name)


def test_gpu_gemm_rate_by_rows_by_hand():
    """Eq. 1c: a GPU `linear` node's FLOPs at the curve's rate at M = B·Q rows (linear in log M between its points,
    clamped at both ends), its bytes at HBM's; other nodes keep `gpu_bf16_tflops`. Rates low enough that the FLOPs
    bind for TINY's shapes."""
    hw = dataclasses.replace(HW, gpu_bf16_tflops=2e-3, gpu_gemm_bf16_tflops=_curve((4, 1e-4), (64, 1e-3)))
    fc1, score = _node("fc1"), _node("attn_score")
    D, F = TINY.hidden_size, TINY.ffn_dim
    for batch, query, theta in [(2, 8, 1e-4 + (1e-3 - 1e-4) * math.log(16 / 4) / math.log(64 / 4)),
                                (1, 2, 1e-4), (4, 32, 1e-3)]:
        point = (batch, query, query)
        flops = 2 * D * F * batch * query
        weights = (F * D + F) * 2
        activations = (D + F) * 2 * batch * query
        expected = max(flops / (theta * 1e12), (weights + activations) / (hw.gpu_hbm_gb_per_s * GB))
        assert flops / (theta * 1e12) > (weights + activations) / (hw.gpu_hbm_gb_per_s * GB)  # the FLOPs bind
        assert node_seconds(fc1, "gpu", "hbm", "prefill", point, hw) == pytest.approx(
            expected + hw.gpu_launch_seconds, rel=1e-12)
        # attention is not a weight GEMM: the 8192³ probe's rate, as before
        assert node_seconds(score, "gpu", "hbm", "prefill", point, hw) == node_seconds(
            score, "gpu", "hbm", "prefill", point, dataclasses.replace(hw, gpu_gemm_bf16_tflops=()))
    # a split's GPU part: its share of the FLOPs at the rows' rate
    half = node_seconds(fc1, "gpu", "hbm", "prefill", (4, 32, 32), hw, 0.5)
    assert half == pytest.approx(max(2 * D * F * 128 * 0.5 / 1e9, (weights / 2 + (D + F / 2) * 2 * 128)
                                     / (hw.gpu_hbm_gb_per_s * GB)) + hw.gpu_launch_seconds, rel=1e-12)


def _resident_layer(hw, phase, batch=4, prompt=16, gen=3):
    costs = annotate_costs(hand_graph(TINY), hw, Workload(batch, prompt, gen), BUDGETS)
    dec = costs.layer_class("decoder")
    return costs, dec, layer_time(costs, dec, phase, ("hbm",) * 6, np.array([(0,) * 6]))


def test_prefill_host_time_hides_under_the_gpu_kernels_by_hand():
    """Eq. 24b: with the curve measured, a prefill GPU unit costs max(its kernels, o) per micro-batch, not their
    sum (Eq. 24); decode keeps the sum. An all-GPU resident layer is bound by its chain: summed by hand."""
    op = 1e-3
    kernels_slow = 1e-3  # TFLOP/s: some of TINY's units take longer than o, some less
    with_curve = dataclasses.replace(HW, runtime_op_seconds=op, gpu_bf16_tflops=kernels_slow,
                                     gpu_gemm_bf16_tflops=_curve((1, kernels_slow)))
    without = dataclasses.replace(with_curve, gpu_gemm_bf16_tflops=())
    for hw, hidden in ((with_curve, True), (without, False)):
        costs, dec, priced = _resident_layer(hw, "prefill")
        assert costs.prefill_op_hidden is hidden
        pc = dec.prefill
        by_hand = 0.0
        for step, repeats in enumerate(pc.step_repeats):
            for unit in pc.units:
                kernel = unit.gpu_seconds[step]
                by_hand += repeats * (max(kernel, op) if hidden else kernel + op)
        assert priced.seconds[0] == pytest.approx(by_hand, rel=1e-12)
        units = {u.name: u for u in unit_times(costs, dec, "prefill", ("hbm",) * 6, (0,) * 6)}
        qkv = sum(r * max(k, op) if hidden else r * (k + op) for k, r in zip(pc.units[0].gpu_seconds, pc.step_repeats))
        assert units["qkv"].compute_seconds == pytest.approx(qkv, rel=1e-12)
    # both kinds of unit occur: kernels longer and shorter than o (else the max would not be tested)
    costs, dec, _ = _resident_layer(with_curve, "prefill")
    kernels = [u.gpu_seconds[0] for u in dec.prefill.units]
    assert min(kernels) < op < max(kernels)
    # decode: Eq. 24 in full, with or without the curve (its rate is the probe's here)
    assert _resident_layer(with_curve, "decode")[2].seconds[0] == _resident_layer(without, "decode")[2].seconds[0]


def test_a_profile_without_the_gemm_curve_prices_and_hashes_as_before():
    """No shipped profile but h200-measured (measured on the H200 machine, 2026-12-03) has the curve, and the others
    do not hash it (plans compiled for them stay valid); a curve flat at the probe's rate with o = 0 prices every
    placement bit for bit as no curve (Eq. 1c is then Eq. 1 and Eq. 24b's max(kernel, 0) the kernel), in both
    phases; the curve is part of the hash."""
    with_curve = []
    for name in profile_names():
        profile = resolve_profile(name)
        if profile.gpu_gemm_bf16_tflops:
            with_curve.append(name)
            assert dataclasses.replace(profile, gpu_gemm_bf16_tflops=()).sha256() != profile.sha256()
            continue
        assert "gpu_gemm_bf16_tflops" not in profile.canonical()
        assert dataclasses.replace(profile, gpu_gemm_bf16_tflops=()).sha256() == profile.sha256()
    assert with_curve == ["h200-measured"]
    flat = dataclasses.replace(HW, gpu_gemm_bf16_tflops=_curve((1, HW.gpu_bf16_tflops)))
    assert flat.sha256() != HW.sha256()
    placements = np.array([(1000, 1000, 1000, 0, 0, 0), (0,) * 6, (0, 0, 0, 1000, 0, 1000)])
    for batch in (1, 64):
        a, b = (annotate_costs(hand_graph(TINY), hw, Workload(batch, 512, 2), BUDGETS) for hw in (HW, flat))
        for phase in ("decode", "prefill"):
            for tiers in (("ddr",) * 6, ("hbm",) * 6):
                assert np.array_equal(layer_time(a, a.layer_class("decoder"), phase, tiers, placements).seconds,
                                      layer_time(b, b.layer_class("decoder"), phase, tiers, placements).seconds)


def test_the_curve_in_a_profile_file_and_calibrate():
    """The field loads from a profile file (sorted, positive points, path-named errors), and calibrate's GPU
    factor scales it with `gpu_bf16_tflops`."""
    data = to_data(HW)
    data["gpu_gemm_bf16_tflops"] = [{"m": 128, "tflops": 300.0}, {"m": 1024, "tflops": 700.0}]
    hw = parse_profile(data, "x.yaml")
    assert hw.gpu_gemm_tflops_at(128) == 300.0 and hw.gpu_gemm_tflops_at(8192) == 700.0
    assert hw.gpu_gemm_tflops_at(1) == 300.0
    assert hw.gpu_gemm_tflops_at(math.sqrt(128 * 1024)) == pytest.approx(500.0)
    assert HW.gpu_gemm_tflops_at(128) == HW.gpu_bf16_tflops
    scaled = scaled_profile(hw, {"gpu_flops": 0.5})
    assert [p.tflops for p in scaled.gpu_gemm_bf16_tflops] == [150.0, 350.0]
    data["gpu_gemm_bf16_tflops"] = [{"m": 1024, "tflops": 700.0}, {"m": 128, "tflops": 300.0}]
    with pytest.raises(Exception, match=r"gpu_gemm_bf16_tflops\[1\]\.m"):
        parse_profile(data, "x.yaml")


def test_gemm_curve_pools_the_shapes_by_hand():
    """liac.probe.gemm_curve: at each M the shapes' FLOPs over their summed seconds; the shapes are a decoder's."""
    assert decoder_gemm_shapes(4096) == ((4096, 12288), (4096, 4096), (4096, 16384), (16384, 4096))
    seconds = {(128, 10, 20): 1e-6, (128, 20, 10): 3e-6, (256, 10, 20): 2e-6}
    curve = gemm_curve(seconds)
    assert [m for m, _ in curve] == [128, 256]
    assert [t for _, t in curve] == pytest.approx([2 * 128 * 400 / 4e-6 / 1e12, 2 * 256 * 200 / 2e-6 / 1e12])

