"""bench/floor.py: the offload LP against brute force, the floor of OPT-30B and OPT-1.3B against hand arithmetic,
and the floor against what liac's cost model predicts for compiled plans (no plan may beat it)."""

import numpy as np
import pytest

import floor as fl
from liac.models import resolve_model
from liac.passes.trace import trace_model
from liac.profile import resolve_profile

GIB = 2**30
HW = resolve_profile("h200-amx16")


def _brute_offload(n_w, n_k, s_w, s_k, r_p, r_s, steps=401):
    """min over CPU shares (x_w, x_k) on a grid of max(CPU time, PCIe time, shared DDR time)."""
    x_w = np.linspace(0, n_w, steps)[:, None]
    x_k = np.linspace(0, n_k, steps)[None, :]
    cpu = x_w * s_w + x_k * s_k
    pcie = (n_w - x_w + n_k - x_k) / r_p
    return float(np.maximum(np.maximum(cpu, pcie), (n_w + n_k) / r_s).min())


@pytest.mark.parametrize("n_w,n_k,cpu_w,cpu_k,r_p,r_s", [
    (30e9, 0.0, 40e9, 70e9, 55e9, 75e9),     # weights only, the shared DDR rate binds (40 + 55 > 75)
    (30e9, 0.0, 10e9, 70e9, 55e9, 75e9),     # weights only, CPU + PCIe bind (10 + 55 < 75)
    (30e9, 20e9, 40e9, 70e9, 55e9, 500e9),   # both kinds, no DDR cap: the CPU takes the KV (faster) first
    (30e9, 5e9, 40e9, 70e9, 55e9, 500e9),
    (1e9, 40e9, 60e9, 20e9, 30e9, 500e9),    # the CPU reads weights faster than KV here
    (0.0, 0.0, 40e9, 70e9, 55e9, 75e9),
])
def test_offload_seconds_is_the_optimum_of_the_split(n_w, n_k, cpu_w, cpu_k, r_p, r_s):
    got = fl.offload_seconds(n_w, n_k, 1 / cpu_w, 1 / cpu_k, r_p, r_s)
    brute = _brute_offload(n_w, n_k, 1 / cpu_w, 1 / cpu_k, r_p, r_s)
    assert got <= brute * (1 + 1e-12)
    assert brute <= got * 1.01 + 1e-15  # the grid lands within 1% of the optimum


def test_offload_seconds_one_kind_closed_form():
    # N / min(r_cpu + r_pcie, r_shared); without a shared rate (the floor's case) N / (r_cpu + r_pcie)
    assert fl.offload_seconds(30e9, 0, 1 / 40e9, 1, 55e9) == pytest.approx(30e9 / 95e9, rel=1e-12)
    assert fl.offload_seconds(30e9, 0, 1 / 40e9, 1, 55e9, 75e9) == pytest.approx(30e9 / 75e9, rel=1e-12)
    assert fl.offload_seconds(30e9, 0, 1 / 10e9, 1, 55e9, 75e9) == pytest.approx(30e9 / 65e9, rel=1e-12)


def _opt30b_numbers():
    h, v, layers = 7168, 50272, 48
    weights = 2 * (layers * (12 * h * h + 13 * h) + v * h + 2 * h)  # decoder layers + final norm + LM head, bf16
    kv_per_token = 2 * layers * h * 2  # K and V, all layers, bf16
    return weights, kv_per_token


def test_opt30b_batch1_is_the_bytes_left_in_ddr_over_both_paths_at_once():
    graph = trace_model(resolve_model("opt-30b"))
    floor = fl.workload_floor(graph, HW, batch=1, prompt_len=128, gen_len=32, gpu_budget_bytes=24 * GIB)
    weights, kv_per_token = _opt30b_numbers()
    # Keeping weights resident saves a byte per byte every step; keeping KV saves less (a step reads only C of the
    # P + G - 1 tokens the cache holds): the budget goes to weights, the KV stays in DDR.
    assert floor.resident_kv_share == 0.0
    assert floor.resident_weight_bytes == 24 * GIB
    left = weights - 24 * GIB
    # Each step: the CPU reads the KV first (70 GB/s, its faster kind), then weights at 40 GB/s, while PCIe copies
    # at 55.4 GB/s: t·55.4 + N_k + (t − N_k/70)·40 = N_w + N_k. The profile's 75 GB/s of shared DDR (a GEMV beside
    # the copies, as probed) does not cap the two paths: the H200 drew more than its probe with attention beside.
    cpu_w, cpu_k, h2d = 40e9, 70e9, HW.pcie_h2d_gb_per_s * 1e9
    assert (HW.cpu_ddr_read_gb_per_s, HW.cpu_kv_read_gb_per_s) == (40.0, 70.0)
    steps = [(left + kv_per_token * (128 + t + 1) * cpu_w / cpu_k) / (h2d + cpu_w) for t in range(31)]
    assert floor.decode_seconds_per_token == pytest.approx(sum(steps) / 31, rel=1e-9)
    assert floor.decode_seconds_per_token < (left + kv_per_token * 144) / (HW.ddr_shared_gb_per_s * 1e9)
    # Prefill: the same weights, the decoder's at AMX's 128-row rate (3.58 TFLOP/s / 128 FLOP per byte = 28 GB/s),
    # the head's (the last position only) at 40 GB/s, a byte-weighted mean (norms and biases: 1e-5 of the bytes)
    h, v, layers = 7168, 50272, 48
    decoder, head = 2 * layers * (12 * h * h + 13 * h), 2 * (v * h + 2 * h)
    per_byte = (decoder / (HW.cpu_tflops_at(128) * 1e12 / 128) + head / cpu_w) / weights
    assert floor.prefill_seconds == pytest.approx(left / (h2d + 1 / per_byte), rel=1e-4)
    assert floor.prefill_bound == "offload" and floor.decode_bound == "offload"
    assert floor.tokens_per_second == pytest.approx(32 / (floor.prefill_seconds + sum(steps)), rel=1e-9)


def test_the_floor_lies_under_every_measured_run_of_its_call():
    """The H200 calls of 2026-12-02 (each point's fastest run, the floor at that call's own rates): with DDR capped
    at the probe's shared rate the prompt-1024 batch-32 floor (824 ms) lay above both runs (748, 754 ms)."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200-2026-12-02"
    graph = trace_model(resolve_model("opt-30b"))
    checked = 0
    for call in ("i12j", "i12k", "i12p", "i12q", "i12r", "i12s"):
        hw = resolve_profile(str(results / call / "run-profile.yaml"))
        best: dict = {}
        for run in json.loads((results / call / "runs.json").read_text())["runs"]:
            measured = (run.get("summary") or {}).get("decode_ms_per_token")
            request = run["request"]
            if measured:
                point = (request["batch_size"], request["prompt_len"])
                best[point] = min(best.get(point, measured), measured)
        for (batch, prompt), measured in best.items():
            floor = fl.workload_floor(graph, hw, batch, prompt, 32, 24 * GIB)
            assert floor.decode_seconds_per_token * 1e3 < measured, (call, batch, prompt)
            checked += 1
    assert checked >= 15


def test_a_model_that_fits_is_bound_by_hbm():
    graph = trace_model(resolve_model("opt-1.3b"))
    floor = fl.workload_floor(graph, HW, batch=1, prompt_len=128, gen_len=8, gpu_budget_bytes=100 * GIB)
    h, v, layers = 2048, 50272, 24
    weights = 2 * (layers * (12 * h * h + 13 * h) + v * h + 2 * h)
    hbm = HW.gpu_hbm_gb_per_s * 1e9
    # All weights resident; the few MB of KV per step can be read from DDR by the CPU alongside (25 MB at 75 GB/s
    # takes less than the weights at HBM rate), so each step is the weights at HBM rate.
    assert floor.resident_weight_bytes == weights
    assert floor.decode_seconds_per_token == pytest.approx(weights / hbm, rel=1e-9)
    assert floor.decode_bound == "hbm"
    # Prefill at 128 tokens: the weights and the fresh K, V (2 · 128 tokens · layers · h · 2 bytes) at HBM rate;
    # the compute floor is below it: 2 FLOP per decoder weight element per token, Q·Kᵀ and P·V (2 · 2·Q·C·h per
    # layer), the LM head for the last token only, at 781 + 3.58 TFLOP/s ≈ 0.4 ms.
    fresh_kv = 2 * 128 * layers * h * 2
    assert floor.prefill_seconds == pytest.approx((weights + fresh_kv) / hbm, rel=1e-9)
    flops = 2 * 128 * layers * 12 * h * h + layers * 2 * 2 * 128 * 128 * h + 2 * v * h
    assert flops / ((HW.gpu_bf16_tflops + 3.58) * 1e12) < floor.prefill_seconds
    assert floor.prefill_bound == "hbm"


def test_more_budget_never_raises_the_floor():
    graph = trace_model(resolve_model("opt-30b"))
    totals = [fl.workload_floor(graph, HW, 8, 128, 8, budget * GIB).total_seconds for budget in (8, 24, 48, 96)]
    assert totals == sorted(totals, reverse=True)
    assert totals[0] > totals[-1]


def test_no_compiled_plan_beats_the_floor():
    from liac.api import compile_plans

    cfg = resolve_model("opt-30b")
    graph = trace_model(cfg)
    result = compile_plans(cfg, HW, batches=(1, 32), prompt_len=128, gen_len=8, gpu_mem=24 * GIB, graph=graph)
    assert len(result.points) == 2
    for point in result.points:
        work = point.plan.spec.workload
        floor = fl.workload_floor(graph, HW, work.batch_size, work.prompt_len, work.gen_len, 24 * GIB)
        predicted = point.plan.status.predicted
        assert predicted.prefill_seconds >= floor.prefill_seconds
        assert predicted.decode_seconds_per_token >= floor.decode_seconds_per_token
        # and the bound is not vacuous: within a small factor of the cost model's best plan
        assert predicted.decode_seconds_per_token <= 3 * floor.decode_seconds_per_token


def test_the_process_footprint_raises_the_floor_and_sums_context_and_workspaces():
    """process_bytes reads a footprint record (context + library workspaces; nothing measured → 0), and reserving
    those bytes can only raise the floor: fewer weights fit beside them (OPT-1.3B at a budget that offloads)."""
    from floor import process_bytes, workload_floor

    from liac.models import resolve_model
    from liac.passes.trace import trace_model
    from liac.profile import resolve_profile

    assert process_bytes(None) == 0.0 and process_bytes({}) == 0.0
    assert process_bytes({"context_bytes": 700, "library_bytes": 35, "runs": []}) == 735.0
    graph, hw = trace_model(resolve_model("opt-1.3b")), resolve_profile("spr-h100")
    free = workload_floor(graph, hw, batch=1, prompt_len=128, gen_len=4, gpu_budget_bytes=1.5 * 2**30)
    held = workload_floor(graph, hw, batch=1, prompt_len=128, gen_len=4, gpu_budget_bytes=1.5 * 2**30,
                          reserved_bytes=0.5 * 2**30)
    assert held.resident_weight_bytes == pytest.approx(free.resident_weight_bytes - 0.5 * 2**30, rel=1e-6)
    assert held.decode_seconds_per_token > free.decode_seconds_per_token
