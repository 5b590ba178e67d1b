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
    # Each step: the CPU reads the KV first (70 GB/s, its faster kind; the profile measured no KV pair, so no cap),
    # then weights, while PCIe copies at 55.4 GB/s. The GEMV beside the copies and the copies drew 75 GB/s together
    # (the profile's GEMV pair): each second of weights the CPU reads adds 75 − 55.4 = 19.6 GB to the copies' 55.4,
    # not its 40 alone: t·55.4 + N_k + (t − N_k/70)·19.6 = N_w + N_k.
    cpu_k, h2d = 70e9, HW.pcie_h2d_gb_per_s * 1e9
    cpu_w = HW.ddr_shared_gb_per_s * 1e9 - h2d
    assert (HW.cpu_ddr_read_gb_per_s, HW.cpu_kv_read_gb_per_s, HW.ddr_shared_kv_gb_per_s) == (40.0, 70.0, 0.0)
    assert cpu_w == pytest.approx(19.6e9)
    steps = [(left + kv_per_token * (128 + t + 1) * cpu_w / cpu_k) / (h2d + cpu_w) for t in range(31)]
    assert floor.decode_seconds_per_token == pytest.approx(sum(steps) / 31, rel=1e-9)
    alone = fl.workload_floor(graph, HW, batch=1, prompt_len=128, gen_len=32, gpu_budget_bytes=24 * GIB, paired=False)
    alone_steps = [(left + kv_per_token * (128 + t + 1) * 40e9 / cpu_k) / (h2d + 40e9) for t in range(31)]
    assert alone.decode_seconds_per_token == pytest.approx(sum(alone_steps) / 31, rel=1e-9)
    # Prefill: the same weights, the decoder's at AMX's 128-row rate (3.58 TFLOP/s / 128 FLOP per byte = 28 GB/s),
    # the head's (the last position only) at 40 GB/s, a byte-weighted mean (norms and biases: 1e-5 of the bytes),
    # capped by the GEMV pair's 19.6 GB/s beside the copies
    h, v, layers = 7168, 50272, 48
    decoder, head = 2 * layers * (12 * h * h + 13 * h), 2 * (v * h + 2 * h)
    per_byte = max((decoder / (HW.cpu_tflops_at(128) * 1e12 / 128) + head / 40e9) / weights, 1 / cpu_w)
    assert floor.prefill_seconds == pytest.approx(left / (h2d + 1 / per_byte), rel=1e-4)
    assert floor.prefill_bound == "offload" and floor.decode_bound == "offload"
    assert floor.tokens_per_second == pytest.approx(32 / (floor.prefill_seconds + sum(steps)), rel=1e-9)


def test_the_floor_lies_under_every_measured_run_of_its_call():
    """Every OPT-30B call on the H200 with its run-profile (2026-12-01 to 12-03: each point's fastest run of any
    plan, the floor at that call's own rates, DDR pairs and measured footprint): with DDR capped at the GEMV pair's
    rate for every byte the prompt-1024 batch-32 floor (824 ms) had lain above both runs (748, 754 ms, i12q); the
    pairs per kind (the KV's uncapped where not measured) keep it under them, and under every other run."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "bench" / "results"
    graph = trace_model(resolve_model("opt-30b"))
    checked, calls = 0, 0
    for folder in sorted(results.glob("h200-2026-12-0[123]*/i12*")):
        if not (folder / "runs.json").exists() or not (folder / "run-profile.yaml").exists():
            continue
        calls += 1
        hw = resolve_profile(str(folder / "run-profile.yaml"))
        summary = folder / "summary.json"
        reserved = fl.process_bytes(json.loads(summary.read_text()).get("footprint") if summary.exists() else None)
        best: dict = {}
        for run in json.loads((folder / "runs.json").read_text())["runs"]:
            measured = (run.get("summary") or {}).get("decode_ms_per_token")
            request = run["request"]
            if measured and "opt-30b" in run.get("plan", "") + run.get("plan_file", ""):
                point = (request["batch_size"], request["prompt_len"])
                best[point] = min(best.get(point, measured), measured)
        for (batch, prompt), measured in best.items():
            floor = fl.workload_floor(graph, hw, batch, prompt, 32, 24 * GIB, reserved_bytes=reserved)
            assert floor.decode_seconds_per_token * 1e3 < measured, (folder.name, batch, prompt)
            checked += 1
    assert calls >= 20 and checked >= 60


def _brute_paired(n_w, n_k, r_w, r_k, h, s_w, s_k):
    """The LP over the time spent in each state: the CPU reading weights beside the copies (t_w), reading KV beside
    them (t_k), the copies alone (t_0); per state the CPU at most its rate, the copies at most h, the two at most the
    pair's rate; every byte moved by one of them (pulp, an independent solver)."""
    import pulp

    lp = pulp.LpProblem("offload", pulp.LpMinimize)
    v = {name: pulp.LpVariable(name, lowBound=0) for name in ("t_w", "t_k", "t_0", "a_w", "a_k", "d_w", "d_k", "d_0")}
    lp += v["t_w"] + v["t_k"] + v["t_0"]
    scale = 1e-9  # GB and seconds: keeps the LP well scaled
    lp += v["a_w"] <= r_w * scale * v["t_w"]
    lp += v["a_k"] <= r_k * scale * v["t_k"]
    for d, t in (("d_w", "t_w"), ("d_k", "t_k"), ("d_0", "t_0")):
        lp += v[d] <= h * scale * v[t]
    lp += v["a_w"] + v["d_w"] <= s_w * scale * v["t_w"]
    lp += v["a_k"] + v["d_k"] <= s_k * scale * v["t_k"]
    lp += v["a_w"] <= n_w * scale
    lp += v["a_k"] <= n_k * scale
    lp += v["a_w"] + v["a_k"] + v["d_w"] + v["d_k"] + v["d_0"] == (n_w + n_k) * scale
    lp.solve(pulp.HiGHS(msg=False))
    return pulp.value(lp.objective)


@pytest.mark.parametrize("n_w,n_k,r_w,r_k,h,s_w,s_k", [
    (34e9, 0.0, 54.7e9, 77e9, 55.4e9, 105.2e9, 123.7e9),  # i12wp b1: the GEMV pair binds (54.7 + 55.4 > 105.2)
    (30e9, 0.0, 40e9, 70e9, 55e9, 200e9, 200e9),          # no pair binds: both paths at their own rates
    (30e9, 20e9, 40e9, 70e9, 55e9, 80e9, 110e9),          # both kinds, each pair binds
    (30e9, 20e9, 40e9, 70e9, 55e9, 50e9, 110e9),          # a GEMV pair under PCIe alone: the CPU reads no weights
    (1e9, 40e9, 60e9, 20e9, 30e9, 100e9, 45e9),           # the CPU reads weights faster than KV
    (5e9, 60e9, 50e9, 80e9, 55e9, 100e9, 120e9),          # the CPU runs out of KV before PCIe is done
])
def test_paired_offload_is_the_optimum_of_the_state_lp(n_w, n_k, r_w, r_k, h, s_w, s_k):
    got = fl.offload_seconds(n_w, n_k, fl.paired_seconds_per_byte(1 / r_w, s_w, h),
                             fl.paired_seconds_per_byte(1 / r_k, s_k, h), h)
    assert got == pytest.approx(_brute_paired(n_w, n_k, r_w, r_k, h, s_w, s_k), rel=1e-6)


def test_an_unmeasured_pair_leaves_the_cpu_rate_alone():
    assert fl.paired_seconds_per_byte(1 / 40e9, 0.0, 55e9) == 1 / 40e9
    assert fl.paired_seconds_per_byte(1 / 40e9, 80e9, 55e9) == pytest.approx(1 / 25e9)
    assert fl.paired_seconds_per_byte(1 / 40e9, 50e9, 55e9) == float("inf")


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


def test_the_mixtral_floor_lies_under_every_measured_run_of_its_call():
    """The Mixtral calls on the H200 (bench/moe_h200.py, 2026-12-02 and -03: the model's layers and GPU budget from each
    call's summary.json, its rates and footprint): the floor with the DDR pairs and the reserved footprint lies
    under every batch's fastest run (the experts a step touches, as the floor counts them)."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "bench" / "results"
    checked = 0
    for folder in sorted(results.glob("h200-2026-12-0[23]*/moe*")):
        summary_path = folder / "summary.json"
        if not (folder / "runs.json").exists() or not (folder / "run-profile.yaml").exists() \
                or not summary_path.exists():
            continue
        summary = json.loads(summary_path.read_text())
        graph = trace_model(resolve_model("mixtral-8x7b").with_layers(summary["layers"]))
        hw = resolve_profile(str(folder / "run-profile.yaml"))
        reserved = fl.process_bytes(summary.get("footprint"))
        best: dict = {}
        for run in json.loads((folder / "runs.json").read_text())["runs"]:
            measured = (run.get("summary") or {}).get("decode_ms_per_token")
            if measured:
                batch = run["request"]["batch_size"]
                best[batch] = min(best.get(batch, measured), measured)
        for batch, measured in best.items():
            floor = fl.workload_floor(graph, hw, batch, 128, 32, summary["gpu_budget_gib"] * GIB,
                                      reserved_bytes=reserved)
            assert floor.decode_seconds_per_token * 1e3 < measured, (folder.name, batch)
            checked += 1
    assert checked >= 20
