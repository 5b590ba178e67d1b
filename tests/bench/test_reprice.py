"""bench/reprice.py: a device call's plans re-priced with a profile, beside what the call measured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import reprice

CALL = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200-2026-12-02" / "i12-release"


def _unit(group, device, measured, compute, transfer, phase="decode", sublayers=("qkv",)):
    return {"group": group, "device": device, "phase": phase, "sublayers": list(sublayers), "measured_ms": measured,
            "predicted_compute_ms": compute, "predicted_transfer_ms": transfer,
            "predicted_ms": None if compute is None else compute + transfer}


def test_op_seconds_from_runs_is_the_median_over_crossing_gpu_units():
    """Only GPU units whose input crosses PCIe (a predicted transfer) count; CPU units, splits, the staging ops,
    the embedding and the prefill do not. Excesses 0.2, 0.3, 0.5 ms → median 0.3 ms."""
    runs = [{"metrics": {"sublayers": [
        _unit("decoder-0", "gpu", 0.30, 0.08, 0.02),   # 0.2 ms beyond its price
        _unit("decoder-0", "gpu", 0.60, 0.05, 0.05),   # 0.5
        _unit("decoder-0", "gpu", 9.00, 0.05, 0.0),    # no crossing: not counted
        _unit("decoder-0", "cpu", 9.00, 1.0, 0.1),     # a CPU unit: its GEMV rate would blur it
        _unit("decoder-0", "split", 9.00, 1.0, 0.1),
        _unit("decoder-0", "gpu", 5.0, None, None, sublayers=("release",)),
        _unit("embed", "gpu", 5.0, 0.01, 0.01),
        _unit("decoder-0", "gpu", 5.0, 0.01, 0.01, phase="prefill"),
    ]}}, {"metrics": {"sublayers": [_unit("decoder-1", "gpu", 0.35, 0.03, 0.02)]}}]  # 0.3
    seconds, samples = reprice.op_seconds_from_runs(runs)
    assert samples == 3 and seconds == pytest.approx(3e-4)


def test_cpu_rates_from_runs_on_call_i12j():
    """Call i12j's profiled decode steps (each op timed alone): its whole-CPU weight GEMV units at batch 1 and 8
    read 56.1 GB/s (median of 34), its fused CPU attention at batch 8 and 32 72.0 GB/s (12), where the rates stage
    measured 49.5 and 82.7; each sample is the unit's bytes as the cost model counts them over its measured ms."""
    from liac.profile import resolve_profile

    call = CALL.parent / "i12j"
    profile = resolve_profile(str(call / "run-profile.yaml"))
    rates = reprice.cpu_rates_from_runs(call, profile, reprice.load_call_plans(call))
    gemv, gemv_samples = rates["cpu_ddr_read_gb_per_s"]
    kv, kv_samples = rates["cpu_kv_read_gb_per_s"]
    assert (gemv_samples, kv_samples) == (34, 12)
    assert gemv == pytest.approx(56.1, abs=0.05) and kv == pytest.approx(72.0, abs=0.05)
    # one sample by hand: the first run's (batch 32: no GEMV sample) fused attention in decoder-0, 1.764 ms for the
    # K and V of 32 sequences × 7168 features over the mean context of the 31 steps (128 + 2 … 128 + 32 tokens)
    entry = next(e for e in __import__("json").loads((call / "runs.json").read_text())["runs"][0]["metrics"]
                 ["sublayers"] if e["phase"] == "decode" and e["device"] == "cpu" and len(e["sublayers"]) == 2)
    kv_bytes = 2 * 32 * 7168 * 2 * (128 + 17)
    assert entry["measured_ms"] == pytest.approx(1.76441) and kv_bytes / 1.76441e-3 / 1e9 == pytest.approx(75.4, abs=0.1)


def test_error_summary_is_per_phase_over_measured_runs():
    rows = [{"repriced_decode_ms": 110.0, "measured_decode_ms": 100.0, "repriced_prefill_ms": 50.0,
             "measured_prefill_ms": None},
            {"repriced_decode_ms": 95.0, "measured_decode_ms": 100.0, "repriced_prefill_ms": 80.0,
             "measured_prefill_ms": 100.0},
            {"repriced_decode_ms": 130.0, "measured_decode_ms": 100.0, "repriced_prefill_ms": 1.0,
             "measured_prefill_ms": None}]
    summary = reprice.error_summary(rows)
    assert summary["decode"] == pytest.approx((0.10, 0.30, 3))
    assert summary["prefill"] == pytest.approx((0.20, 0.20, 1))


def _attention_apart(plan) -> bool:
    """Whether a plan runs a decode attention unit on the CPU beside its partner on the GPU (Eq. 25)."""
    for group in plan.spec.layer_groups:
        devices = {s.name: s.decode for s in group.sublayers}
        if {devices.get("attn_score"), devices.get("attn_context")} == {"cpu", "gpu"}:
            return True
    return False


def test_reprice_with_the_calls_own_profile_gives_the_plans_predictions():
    """The committed call 4 (2026-12-02): priced with its run-profile.yaml as it was (runtime_op_seconds absent,
    so 0), each plan re-prices to the decode the run recorded, and to its prefill where the prefill computes nothing
    on the CPU (a plan with CPU work in its prefill now prices higher: Eq. 18a's prefill case, no DMA beside the
    CPU's many-row kernels), but for Eq. 25 (added since): a plan that runs decode attention apart, its CPU half over
    the cache's capacity at the GEMV rate, re-prices its decode higher on this host (GEMV 46.8 GB/s, the fused
    kernel 65.8); the term adds to every plan, and more to a plan with split units. Eq. 26 (added since) prices the
    crossings queued behind the weight copies, which the whole plans at b8 and b64 had in every layer."""
    from liac.profile import resolve_profile

    profile = resolve_profile(str(CALL / "run-profile.yaml"))
    assert profile.runtime_op_seconds == 0.0
    assert profile.cpu_ddr_read_gb_per_s < profile.cpu_kv_read_gb_per_s
    plans = reprice.load_call_plans(CALL)
    rows = reprice.reprice(CALL, profile, plans)
    assert len(rows) == 8
    apart = {row["plan"]: _attention_apart(plans[row["plan"]]) for row in rows}
    assert 0 < sum(apart.values()) < len(rows)
    cpu_prefills = 0
    for row in rows:
        if apart[row["plan"]]:
            assert row["planned_decode_ms"] < row["repriced_decode_ms"] <= row["measured_decode_ms"] * 1.02
        else:
            # Eqs. 1b, 18c and 26 (added since) move these, each toward what the call measured (Eq. 26 by up to a
            # third: the whole plans at b8 and b64, 407 → 538 and 553 → 648 ms, measured 544 and 679)
            assert 0.995 * row["planned_decode_ms"] <= row["repriced_decode_ms"] <= row["measured_decode_ms"] * 1.02
            assert (abs(row["repriced_decode_ms"] - row["measured_decode_ms"])
                    <= abs(row["planned_decode_ms"] - row["measured_decode_ms"]) + 0.5)
        plan = plans[row["plan"]]
        cpu_prefill = any(s.prefill != "gpu" for g in plan.spec.layer_groups if g.layer_class == "decoder"
                          for s in g.sublayers)
        cpu_prefills += cpu_prefill
        if cpu_prefill:
            assert row["repriced_prefill_ms"] > 1.1 * row["planned_prefill_ms"]
        else:
            assert row["repriced_prefill_ms"] == pytest.approx(row["planned_prefill_ms"], rel=1e-5)
    assert cpu_prefills == 4  # the split plans at batch 1, 8, 32 and the whole one at batch 1 (qkv on the CPU)
    import dataclasses

    with_ops = reprice.reprice(CALL, dataclasses.replace(profile, runtime_op_seconds=3e-4), plans)
    added = {(r["batch"], r["splits"] > 0): b["repriced_decode_ms"] - r["repriced_decode_ms"]
             for r, b in zip(rows, with_ops)}
    for batch in (1, 8, 32):
        assert added[(batch, True)] > added[(batch, False)] > 0


def test_main_prints_a_table(capsys):
    assert reprice.main([str(CALL), "--set", "runtime_op_seconds=0.0002"]) == 0
    out = capsys.readouterr().out
    assert out.count("opt-30b.h200-run.") == 8 and "repriced" in out
    header, first = out.splitlines()[:2]
    assert header.count("error") == 2 and " pre " in header  # both phases' errors; prefill split units
    assert first.split()[-1].endswith("%")  # the prefill error of a run that measured one
    assert reprice.main([str(CALL), "--set", "no_such_field=1"]) == 2


MOE_CALL = CALL.parent / "moe-peers"


def test_reprice_units_of_an_moe_call():
    """The committed Mixtral call (2026-12-02 c): each profiled decode row of the experts unit beside its price.
    Whole experts units (all on the GPU, all on the CPU) re-price to the prediction the run recorded; a split one
    to at least it (Eq. 21b only adds: the host's dispatch of the GPU's experts, DDR shared with the copies)."""
    from liac.profile import resolve_profile

    profile = resolve_profile(str(MOE_CALL / "run-profile.yaml"))
    plans = reprice.load_call_plans(MOE_CALL)
    rows = reprice.reprice_units(MOE_CALL, profile, plans, {"experts"})
    assert {r["batch"] for r in rows} == {1, 8, 32} and all(r["units"] == "experts" for r in rows)
    splits = [r for r in rows if r["device"] == "split"]
    whole = [r for r in rows if r["device"] != "split"]
    assert splits and whole
    for row in whole:
        assert row["repriced_ms"] == pytest.approx(row["planned_ms"], rel=1e-4)
    for row in splits:
        assert row["cpu_part_ms"] > 0 and row["gpu_part_ms"] > 0
        assert row["repriced_ms"] >= row["planned_ms"] * (1 - 1e-4)
    assert any(r["repriced_ms"] > r["planned_ms"] * 1.05 for r in splits)


def test_main_prints_the_units_table(capsys):
    assert reprice.main([str(MOE_CALL), "--units", "experts"]) == 0
    out = capsys.readouterr().out
    assert "CPU part, GPU part" in out and out.count(" experts ") >= 20


def test_attribute_takes_the_moe_calls_profiled_steps_apart():
    """--attribute on the committed Mixtral call: per run, the profiled decode step by part, summed over layers.
    The parts add up to the step the profile measured (each row once; a split's route, CPU part, GPU part and rest
    only take it apart), a split's rest is its time less the routing and the slower part, and the split experts
    units re-price to what `--units` gives them times their layers."""
    import json

    from liac.profile import resolve_profile

    profile = resolve_profile(str(MOE_CALL / "run-profile.yaml"))
    plans = reprice.load_call_plans(MOE_CALL)
    rows = reprice.attribute_decode(MOE_CALL, profile, plans)
    runs = json.loads((MOE_CALL / "runs.json").read_text())["runs"]
    assert len(rows) == len(runs)
    first = rows[0]
    measured = first["measured_ms"]
    assert first["batch"] == 1 and first["timed_step_ms"] == runs[0]["summary"]["decode_ms_per_token"]
    whole = sum(v for k, v in measured.items() if k not in ("experts_route", "experts_cpu_part", "experts_gpu_part",
                                                            "experts_split_rest"))
    assert first["profiled_step_ms"] == pytest.approx(whole, abs=1e-2)
    counts = {g.name: g.layer_count for g in plans[runs[0]["plan"]].spec.layer_groups}
    entries = [e for e in runs[0]["metrics"]["sublayers"] if e["phase"] == "decode"]
    assert first["profiled_step_ms"] == pytest.approx(sum(e["measured_ms"] * counts.get(e["group"], 1)
                                                          for e in entries), abs=1e-2)
    splits = [e for e in entries if e["device"] == "split"]
    rest = sum((e["measured_ms"] - e["measured_route_ms"] - max(e["measured_cpu_part_ms"], e["measured_gpu_part_ms"]))
               * counts[e["group"]] for e in splits)
    assert measured["experts_split_rest"] == pytest.approx(rest, abs=1e-2) and rest > 0
    units = [u for u in reprice.reprice_units(MOE_CALL, profile, plans, {"experts"})
             if u["plan"] == runs[0]["plan"] and u["device"] == "split"][:len(splits)]
    assert first["repriced_ms"]["experts_split"] == pytest.approx(sum(u["repriced_ms"] * u["layers"] for u in units),
                                                                  abs=1e-2)
    cpu_only = next(r for r in rows if r["plan"].endswith("experts-cpu"))
    assert "experts_cpu" in cpu_only["measured_ms"] and "experts_split" not in cpu_only["measured_ms"]


def test_main_prints_the_attribution(capsys):
    assert reprice.main([str(MOE_CALL), "--attribute"]) == 0
    out = capsys.readouterr().out
    assert "experts_split_rest" in out and "profiled step" in out and "timed steps 167.7" in out


def test_split_parts_of_call_i12k_by_width():
    """Call i12k's six profiled split units, each with its CPU part's shape: the batch-128 out_proj split at 250 ‰
    computes 1792 of 7168 features at M = 128 rows, priced at the AMX curve's M = 128 point (3.708 TFLOP/s, its
    FLOPs outweigh its 25.7 MB read at 46.4 GB/s) plus its element-wise ops, and measured 1.30 ms."""
    from liac.profile import resolve_profile

    call = CALL.parent / "i12k"
    profile = resolve_profile(str(call / "run-profile.yaml"))
    rows = reprice.split_parts(call, profile, reprice.load_call_plans(call))
    assert sorted((r["phase"], r["unit"], r["rows_m"], r["cpu_features"]) for r in rows) == [
        ("decode", "lm_head", 64, 20108), ("decode", "lm_head", 128, 15081), ("decode", "out_proj", 128, 1792),
        ("decode", "qkv", 64, 12902), ("prefill", "lm_head", 64, 20108), ("prefill", "lm_head", 128, 15081)]
    out_proj = next(r for r in rows if r["unit"] == "out_proj")
    assert (out_proj["layers"], out_proj["permille"], out_proj["features"]) == (27, 250, 7168)
    gemm_ms = 2 * 128 * 1792 * 7168 / 3.708e12 * 1e3
    assert gemm_ms < out_proj["repriced_cpu_part_ms"] < 1.05 * gemm_ms
    assert out_proj["cpu_part_ms"] == pytest.approx(1.30348, abs=1e-5)
    assert out_proj["repriced_stream_ms"] == pytest.approx(0.75 * 7168 * 7168 * 2 / 54.802e9 * 1e3, rel=0.01)


def test_main_prints_the_split_parts_table(capsys):
    assert reprice.main([str(CALL.parent / "i12k"), "--split-parts"]) == 0
    out = capsys.readouterr().out
    assert "CPU part ms (priced)" in out and "1792@250‰" in out and out.count(" lm_head ") == 4


def test_rates_after_overrides_the_run_profiles_rates(tmp_path, capsys):
    """--rates-after prices with the call's second probe: its fields replace the run-profile's; a slower CPU GEMV
    and PCIe after the runs price every plan slower, and the override is named in the notes."""
    import json
    import shutil

    from liac.profile import resolve_profile

    call = tmp_path / "call"
    shutil.copytree(CALL, call)
    assert reprice.main([str(call), "--rates-after"]) == 2  # no rates-after.json, no rates_probes: one line
    assert "rates-after.json" in capsys.readouterr().err
    profile = resolve_profile(str(call / "run-profile.yaml"))
    after = {"cpu_ddr_read_gb_per_s": profile.cpu_ddr_read_gb_per_s / 2,
             "pcie_h2d_gb_per_s": profile.pcie_h2d_gb_per_s / 2, "concurrent_cpu_gb_per_s": 40.0}  # not a field
    (call / "rates-after.json").write_text(json.dumps(after))
    assert reprice.main([str(call), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert reprice.main([str(call), "--json", "--rates-after"]) == 0
    moved = json.loads(capsys.readouterr().out)
    assert any(n.startswith("rates-after:") and "cpu_ddr_read_gb_per_s" in n for n in moved["notes"])
    for a, b in zip(before["runs"], moved["runs"]):
        assert a["plan"] == b["plan"] and b["repriced_decode_ms"] > a["repriced_decode_ms"]
    # where rates-after.json did not come back, summary.json's rates_probes hold the same 'after' values
    (call / "rates-after.json").unlink()
    summary = json.loads((call / "summary.json").read_text())
    summary["rates_probes"] = {k: {"before": getattr(profile, k), "after": v, "ratio": 0.5, "floor": 0}
                               for k, v in after.items() if k != "concurrent_cpu_gb_per_s"}
    (call / "summary.json").write_text(json.dumps(summary))
    assert reprice.main([str(call), "--json", "--rates-after"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == moved["runs"]


def test_the_attentions_shared_rate_from_the_calls_probe_prices_i12q():
    """Call i12q (prompt 1024): its probe predates `ddr_shared_kv_gb_per_s`; estimated from its other rates
    (116.4 GB/s, where the b32 runs drew 113 with the fused attention beside the stream) the b32 plans re-price
    from +21 % over their runs to within 5 %, and the b8 plans (no CPU attention over DDR) do not move; call i12k's
    estimate (99.5) is what its LIA-partial b256 run drew (99.6). A measured field in rates.json wins."""
    import dataclasses
    import json

    from liac.profile import resolve_profile

    root = CALL.parent
    assert reprice.kv_shared_from_rates(root / "i12q") == pytest.approx(116.42, abs=0.01)
    assert reprice.kv_shared_from_rates(root / "i12k") == pytest.approx(99.5, abs=0.05)
    call = root / "i12q"
    profile = resolve_profile(str(call / "run-profile.yaml"))
    plans = reprice.load_call_plans(call)
    before = {r["plan"]: r for r in reprice.reprice(call, profile, plans)}
    kv = dataclasses.replace(profile, ddr_shared_kv_gb_per_s=reprice.kv_shared_from_rates(call))
    after = {r["plan"]: r for r in reprice.reprice(call, kv, plans)}
    for name, row in after.items():
        error = row["repriced_decode_ms"] / row["measured_decode_ms"] - 1
        if ".b32-" in name:
            assert before[name]["repriced_decode_ms"] / row["measured_decode_ms"] - 1 > 0.15 and abs(error) < 0.05
        else:
            assert row["repriced_decode_ms"] == pytest.approx(before[name]["repriced_decode_ms"], rel=1e-3)


def test_a_measured_attention_shared_rate_wins(tmp_path):
    (tmp_path / "rates.json").write_text('{"ddr_shared_kv_gb_per_s": 120.5, "cpu_kv_read_gb_per_s": 1}')
    assert reprice.kv_shared_from_rates(tmp_path) == 120.5
    (tmp_path / "rates.json").write_text('{"cpu_kv_read_gb_per_s": 1}')
    from liac.errors import LiacError

    with pytest.raises(LiacError, match="--kv-shared-from-rates"):
        reprice.kv_shared_from_rates(tmp_path)


CUT_CALL = CALL.parent / "moe-cut"


def test_the_host_chain_from_the_runs_reprices_the_moe_cut_call():
    """Eq. 21d on the committed call moe-cut (2026-12-02 f): o_c from its runs' timed steps (host seconds per CPU
    part over the layer's host ops: 0.307 ms over the 4 runs without a cut expert whose CPU-part layers run their
    other units on the GPU; the batch-8 optimum's CPU attention is left out) raises every run with a CPU part (the
    batch-1 optimum past what it measured: 111.2 → 132.0 ms against 118.9, the all-CPU placement's longer chain per
    op weighs in), leaves the streamed runs (no CPU part) as they were, and brings the median decode error from
    14.2 % to 11.0 %; each run but the first (the call's cold start) within 28 % of what it measured."""
    import dataclasses
    import json

    from liac.profile import resolve_profile

    profile = resolve_profile(str(CUT_CALL / "run-profile.yaml"))
    assert profile.runtime_op_seconds_beside_cpu == 0.0  # the call's profile predates the field
    plans = reprice.load_call_plans(CUT_CALL)
    runs = json.loads((CUT_CALL / "runs.json").read_text())["runs"]
    seconds, used = reprice.chain_seconds_from_runs(runs, plans, profile)
    assert used == 4 and seconds == pytest.approx(3.07e-4, rel=0.01)
    before = reprice.reprice(CUT_CALL, profile, plans)
    after = reprice.reprice(CUT_CALL, dataclasses.replace(profile, runtime_op_seconds_beside_cpu=seconds), plans)
    assert len(before) == len(after) == len(runs) == 9
    for run, old, new in zip(runs, before, after):
        parts = ((run["metrics"].get("experts") or {}).get("decode") or {}).get("cpu_parts", 0)
        measured = new["measured_decode_ms"]
        if not parts:  # the streamed placement: no CPU part, no chain beside it
            assert new["repriced_decode_ms"] == old["repriced_decode_ms"]
            continue
        assert new["repriced_decode_ms"] > old["repriced_decode_ms"]
        if old["repriced_decode_ms"] < measured and new["repriced_decode_ms"] <= measured:
            assert abs(new["repriced_decode_ms"] / measured - 1) < abs(old["repriced_decode_ms"] / measured - 1)
    errors = [abs(r["repriced_decode_ms"] / r["measured_decode_ms"] - 1) for r in after]
    assert max(errors[1:]) < 0.28
    median = sorted(errors)[len(errors) // 2]
    assert median < 0.12 < sorted(abs(r["repriced_decode_ms"] / r["measured_decode_ms"] - 1) for r in before)[4]


@pytest.mark.parametrize("field", ["runtime_op_seconds_beside_cpu=0.001", "ddr_shared_experts_gb_per_s=20"])
def test_the_experts_fields_leave_dense_plans_unpriced(capsys, field):
    """A dense plan has no experts unit: o_c (Eq. 21d) and the experts' DDR rate (Eq. 21b) change none of call 4's
    prices (OPT-30B)."""
    assert reprice.main([str(CALL)]) == 0
    plain = capsys.readouterr().out
    assert reprice.main([str(CALL), "--set", field]) == 0
    assert capsys.readouterr().out == plain


def test_the_experts_ddr_rate_from_the_runs_reprices_the_moe_calls():
    """Eq. 21b's DDR term at the rate the runs' split CPU parts reached (`ddr_experts_from_runs`: the CPU parts'
    expert bytes plus the experts streamed beside them, over the CPU parts' timed seconds): 90.9 GB/s over moe-cut's
    3 runs without a cut expert (the probe's ddr_shared_gb_per_s 100.0). It raises the split optima (most at batch
    8, whose 4 CPU and ~3.7 streamed experts a layer are bound by DDR), leaves the all-CPU and streamed placements
    (no expert copied beside a CPU part) as they were, and brings moe-cut's median decode error from 14.2 % to
    8.1 %; the same ratio to DDR's probed rate (0.909) carried to moe-wake, another machine start, 28.5 % → 24.0 %."""
    import dataclasses
    import json

    from liac.profile import resolve_profile

    wake = CUT_CALL.parent / "moe-wake"
    fitted = {}
    for call in (CUT_CALL, wake):
        profile = resolve_profile(str(call / "run-profile.yaml"))
        assert profile.ddr_shared_experts_gb_per_s == 0.0  # the calls' profiles predate the field
        runs = json.loads((call / "runs.json").read_text())["runs"]
        plans = reprice.load_call_plans(call)
        if call == CUT_CALL:
            rate, used = reprice.ddr_experts_from_runs(runs)
            assert used == 3 and rate == pytest.approx(90.9, abs=0.1)
            fitted["kappa"] = rate / profile.ddr_shared_gb_per_s
        else:
            rate = fitted["kappa"] * profile.ddr_shared_gb_per_s
        before = reprice.reprice(call, profile, plans)
        after = reprice.reprice(call, dataclasses.replace(profile, ddr_shared_experts_gb_per_s=rate), plans)
        for run, old, new in zip(runs, before, after):
            decode = (run["metrics"].get("experts") or {}).get("decode") or {}
            if not decode.get("streamed_experts"):  # all-CPU or all-streamed: no expert copied beside a CPU part
                assert new["repriced_decode_ms"] == old["repriced_decode_ms"]
            else:
                assert new["repriced_decode_ms"] > old["repriced_decode_ms"]
        errors = {name: sorted(abs(r["repriced_decode_ms"] / r["measured_decode_ms"] - 1) for r in rows)[4]
                  for name, rows in (("before", before), ("after", after))}
        expected = (0.142, 0.081) if call == CUT_CALL else (0.285, 0.240)
        assert (errors["before"], errors["after"]) == pytest.approx(expected, abs=0.002)




def test_robust_line_ignores_an_outlier():
    """Theil-Sen: intercept and slope of 0.5 + 0.8 x through six points, one of them far off (a slowed part)."""
    xs = [0.1, 0.5, 1.0, 2.0, 4.0, 7.0]
    ys = [0.5 + 0.8 * x for x in xs]
    ys[4] += 9.0
    intercept, slope = reprice.robust_line(xs, ys)
    assert (intercept, slope) == (pytest.approx(0.5), pytest.approx(0.8))
    with pytest.raises(ValueError):
        reprice.robust_line([1.0, 1.0], [2.0, 3.0])


def test_split_start_from_the_runs_of_call_i12u():
    """Call i12u's eight profiled decode split CPU parts (358-27649 features): the narrow ones ran 2-2.5x their
    price, the wide ones at or under it; the robust line starts at 0.33 ms with a slope under 1. Priced with it,
    the b32 split plan (23 fc1 CPU parts of 1433 features and the LM head's) rises by up to 24 starts a step (its
    layers' chains, partly under the stream) and its decode error shrinks."""
    from liac.profile import resolve_profile

    call = CALL.parent / "i12u"
    profile = resolve_profile(str(call / "run-profile.yaml"))
    seconds, slope, samples = reprice.split_start_from_runs(call, profile, reprice.load_call_plans(call))
    assert samples == 8 and seconds == pytest.approx(0.326e-3, abs=0.005e-3) and 0.7 < slope < 1.0
    plans = reprice.load_call_plans(call)
    late = dataclasses.replace(profile, split_cpu_start_seconds=seconds)
    rows = {name: {r["plan"]: r for r in reprice.reprice(call, p, plans)} for name, p in (("bare", profile),
                                                                                          ("late", late))}
    b32 = "opt-30b.h200-run.b32-p128-g32"
    rise = rows["late"][b32]["repriced_decode_ms"] - rows["bare"][b32]["repriced_decode_ms"]
    assert 0.4 * 24 * seconds * 1e3 < rise <= 24 * seconds * 1e3 + 1e-9  # 24 starts on a chain the stream hides in part
    assert abs(rows["late"][b32]["repriced_decode_ms"] / rows["late"][b32]["measured_decode_ms"] - 1) < abs(
        rows["bare"][b32]["repriced_decode_ms"] / rows["bare"][b32]["measured_decode_ms"] - 1)
    assert rows["late"][b32 + ".whole"] == rows["bare"][b32 + ".whole"]  # no split, no start
    assert reprice.main([str(call), "--split-start-from-runs"]) == 0


def test_runs_with_the_launcher_thread_are_left_out_of_the_chain_and_ddr_fits():
    """A run with `expert_launcher` (the GPU part launched from a second host thread: its dispatch leaves the CPU
    part's path) measures another chain than Eq. 21d prices for the default runtime, and its CPU parts start
    earlier beside the copies: `chain_seconds_from_runs` and `ddr_experts_from_runs` leave it out, as they leave out
    a cut expert's runs."""
    import copy
    import json

    from liac.profile import resolve_profile

    profile = resolve_profile(str(CUT_CALL / "run-profile.yaml"))
    plans = reprice.load_call_plans(CUT_CALL)
    runs = json.loads((CUT_CALL / "runs.json").read_text())["runs"]
    launched = copy.deepcopy(runs[1])  # the batch-1 optimum's second run, counted by both fits
    launched["expert_launcher"] = True
    launched["metrics"]["experts"]["decode"]["host_ms_per_cpu_part"]["dispatch"] = 0.01
    launched["metrics"]["experts"]["decode"]["cpu_ms"] *= 0.5
    assert reprice.chain_seconds_from_runs(runs + [launched], plans, profile) == \
        reprice.chain_seconds_from_runs(runs, plans, profile)
    assert reprice.ddr_experts_from_runs(runs + [launched]) == reprice.ddr_experts_from_runs(runs)
    del launched["expert_launcher"]  # the same run counted: the fits move
    assert reprice.chain_seconds_from_runs(runs + [launched], plans, profile) != \
        reprice.chain_seconds_from_runs(runs, plans, profile)
    assert reprice.ddr_experts_from_runs(runs + [launched]) != reprice.ddr_experts_from_runs(runs)
