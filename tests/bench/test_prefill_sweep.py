"""bench/prefill_sweep.py and bench/reprice.py's GPU GEMM curve: the committed H200 calls re-priced (no GPU)."""

import json
from pathlib import Path

import pytest
from prefill_sweep import report, sweep
from reprice import gemm_curve_from_shapes, load_call_plans, reprice

from liac.profile import resolve_profile

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "bench/results/h200-2026-12-03/i12b1/gemm-shapes.json"
CALL = ROOT / "bench/results/h200-2026-12-03/i12wp"


def test_reprice_takes_the_curve_from_gemm_shapes():
    """--gpu-gemm-shapes: i12b1's four OPT-30B shapes pooled at M = 128 by hand (their FLOPs over their seconds)."""
    units = json.loads(SHAPES.read_text())["units"]
    flops = sum(2 * 128 * u["k"] * u["n"] for u in units.values())
    seconds = sum(u["rows"]["128"]["seconds"] for u in units.values())
    curve = dict(gemm_curve_from_shapes(SHAPES))
    assert sorted(curve) == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert curve[128] == pytest.approx(flops / seconds / 1e12, rel=1e-12)
    assert 360 < curve[128] < 390 and 760 < curve[2048] < 780


def test_sweep_reprices_as_reprice_and_reports_the_points():
    """Without overrides a call's rows are bench/reprice.py's; with the curve the prompt-1024 batch-8 prefill (all on
    the GPU, 8 micro-batches) is priced lower (Eq. 24b hides the host time) and the report names it."""
    pattern = str(CALL)
    plain = sweep(pattern, {})
    rows = [r for r in reprice(CALL, resolve_profile(str(CALL / "run-profile.yaml")), load_call_plans(CALL))
            if r["measured_prefill_ms"]]
    assert plain[pattern] == rows
    curve = [{"m": m, "tflops": min(t, 680.0)} for m, t in gemm_curve_from_shapes(SHAPES)]
    after = sweep(pattern, {"gpu_gemm_bf16_tflops": curve})
    long = [(a, b) for a, b in zip(after[pattern], plain[pattern]) if a["prompt"] == 1024 and a["batch"] == 8]
    assert long and all(a["repriced_prefill_ms"] < 0.9 * b["repriced_prefill_ms"] for a, b in long)
    text = report(after, plain)
    assert "i12wp" in text and "b8-p1024" in text and "all (after)" in text and "all (before)" in text
