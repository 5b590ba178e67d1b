"""bench/h200.py: with --compile-for-call the plans are compiled for the profile this call measured (the footprint
and rates stages' run-profile.yaml), as a user's `liac profile` → `liac compile` on the host that runs them."""

import argparse

import pytest

from h200 import Bench, parse_points


def _bench(tmp_path, compile_for_call):
    args = argparse.Namespace(out=str(tmp_path / "out"), profile=str(tmp_path / "given.yaml"),
                              plans_dir=str(tmp_path / "plans"), deadline_s=60.0, compile_for_call=compile_for_call)
    return Bench(args)


def test_plans_are_compiled_for_the_calls_own_profile_once_it_exists(tmp_path):
    bench = _bench(tmp_path, True)
    assert bench.compile_profile() == tmp_path / "given.yaml"  # nothing measured yet: the given profile
    (tmp_path / "out" / "run-profile.yaml").write_text("name: h200-run\n")
    assert bench.compile_profile() == tmp_path / "out" / "run-profile.yaml"
    assert _bench(tmp_path, False).compile_profile() == tmp_path / "given.yaml"


def test_points_keep_their_order():
    assert parse_points("128:1,8,32;1024:1;128:64") == [(128, 1), (128, 8), (128, 32), (1024, 1), (128, 64)]


def test_contenders_with_a_prefetch_depth():
    from h200 import contender_parts, known_contender, main

    assert contender_parts("whole+d2") == ("whole", 2) and contender_parts("optimal") == ("optimal", 1)
    assert known_contender("lia-gpu+d3") and known_contender("whole")
    assert not known_contender("whole+d0") and not known_contender("fastest") and not known_contender("whole+dx")
    import pytest

    with pytest.raises(SystemExit, match="unknown contender 'whole\\+dx'"):
        main(["--out", "unused", "--contenders", "optimal,whole+dx"])


def test_a_contender_at_copies_runs_the_same_plans_with_crossings_copied(tmp_path, monkeypatch):
    """'optimal@copies' is no plan of its own: the runs stage runs each 'optimal' plan again with
    Engine.from_plan(mapped_crossings=False) (the A/B of the mapped crossings), in --abba order beside it."""
    import run_plans
    from h200 import compiled_as, contender_parts, known_contender

    assert compiled_as("optimal@copies") == "optimal" and compiled_as("whole+d2@copies") == "whole+d2"
    assert contender_parts("whole+d2@copies") == ("whole", 2) and known_contender("optimal@copies")
    assert not known_contender("optimal@nope")
    seen = []
    monkeypatch.setattr(run_plans, "run_plans", lambda specs, **kw: seen.extend(specs))
    args = argparse.Namespace(out=str(tmp_path / "out"), profile=None, plans_dir=str(tmp_path / "plans"),
                              deadline_s=600.0, reserve_s=10.0, compile_for_call=False, abba=True, repeats=1,
                              contenders=["optimal", "optimal@copies"], points=[(128, 8)], measure_gen_len=4,
                              max_run_seconds=60.0, profile_steps=0, emulate=True, timeline_batches=())
    bench = Bench(args)
    bench.summary["plans"] = [{"contender": "optimal", "prompt_len": 128, "batch": 8, "plan": "a.yaml"},
                              {"contender": "whole", "prompt_len": 128, "batch": 8, "plan": "b.yaml"}]
    bench.runs()
    assert [(s.plan, s.mapped_crossings) for s in seen] == [("a.yaml", None), ("a.yaml", False),
                                                            ("a.yaml", False), ("a.yaml", None)]
    assert [e["contender"] for e in bench.summary["runs_index"]] == ["optimal", "optimal@copies",
                                                                    "optimal@copies", "optimal"]


def test_warm_point_runs_each_points_first_plan_once_untimed_before_its_runs(tmp_path, monkeypatch):
    """--warm-point: before a point's A B B A, one run of its first plan tagged 'warmup' (the first run of a point
    decoded 5-20 % slower than later runs of the same plan, and the compiled plan always runs first); the report
    leaves it out, so each contender is judged on its own two runs."""
    import json

    import run_plans
    from report import collect

    seen = []
    monkeypatch.setattr(run_plans, "run_plans", lambda specs, **kw: seen.extend(specs))
    args = argparse.Namespace(out=str(tmp_path / "out"), profile=None, plans_dir=str(tmp_path / "plans"),
                              deadline_s=600.0, reserve_s=10.0, compile_for_call=False, abba=True, warm_point=True,
                              repeats=1, contenders=["optimal", "whole"], points=[(128, 1), (1024, 1)],
                              measure_gen_len=4, max_run_seconds=60.0, profile_steps=0, emulate=True,
                              timeline_batches=())
    bench = Bench(args)
    bench.summary["plans"] = [{"contender": c, "prompt_len": p, "batch": 1, "plan": f"{c}-{p}.yaml"}
                              for p in (128, 1024) for c in ("optimal", "whole")]
    bench.runs()
    assert [s.plan for s in seen] == ["optimal-128.yaml", "optimal-128.yaml", "whole-128.yaml", "whole-128.yaml",
                                      "optimal-128.yaml", "optimal-1024.yaml", "optimal-1024.yaml",
                                      "whole-1024.yaml", "whole-1024.yaml", "optimal-1024.yaml"]
    index = bench.summary["runs_index"]
    assert [e["contender"] for e in index][:5] == ["warmup", "optimal", "whole", "whole", "optimal"]
    out = tmp_path / "out"
    runs = [{"plan_file": e["plan"], "summary": {"decode_ms_per_token": 900.0 if n in (0, 5) else 400.0},
             "request": {"prompt_len": e["prompt_len"], "batch_size": 1}} for n, e in enumerate(index)]
    (out / "runs.json").write_text(json.dumps({"runs": runs}))
    (out / "summary.json").write_text(json.dumps({"runs_index": index}))
    kept = collect([out])["runs"]
    assert len(kept) == 8 and {r["contender"] for r in kept} == {"optimal", "whole"}
    assert all(r["summary"]["decode_ms_per_token"] == 400.0 for r in kept)  # the warm-up runs are left out


def test_a_points_runs_follow_the_contenders_order_given(tmp_path, monkeypatch):
    """--contenders whole,optimal runs the whole plan first (2026-12-03's i12ord asked for that and got the compiled
    plan first: the script had its own order)."""
    import run_plans

    seen = []
    monkeypatch.setattr(run_plans, "run_plans", lambda specs, **kw: seen.extend(specs))
    args = argparse.Namespace(out=str(tmp_path / "out"), profile=None, plans_dir=str(tmp_path / "plans"),
                              deadline_s=600.0, reserve_s=10.0, compile_for_call=False, abba=True, repeats=1,
                              contenders=["whole", "lia-cpu", "optimal"], points=[(128, 1)], measure_gen_len=4,
                              max_run_seconds=60.0, profile_steps=0, emulate=True, timeline_batches=())
    bench = Bench(args)
    bench.summary["plans"] = [{"contender": c, "prompt_len": 128, "batch": 1, "plan": f"{c}.yaml"}
                              for c in ("optimal", "whole", "lia-cpu")]
    bench.runs()
    assert [s.plan for s in seen] == ["whole.yaml", "lia-cpu.yaml", "optimal.yaml", "optimal.yaml", "lia-cpu.yaml",
                                      "whole.yaml"]


def test_abba_runs_each_contender_first_once_and_last_once():
    """--abba: a point's contenders in order, then reversed, so each runs once first and once last."""
    from h200 import abba, main

    assert abba(["optimal", "whole"]) == ["optimal", "whole", "whole", "optimal"]
    assert abba(["optimal"]) == ["optimal", "optimal"] and abba([]) == []
    import pytest

    with pytest.raises(SystemExit, match="unknown contender"):  # the flag parses (the contender check fails later)
        main(["--out", "unused", "--abba", "--contenders", "optimal,nope"])


def test_rates_stage_probes_the_decoders_own_gemv_shapes():
    """The rates stage measures the CPU GEMV on the decoder's weight matrices from the traced graph (OPT-30B: fc1,
    fc2, out_proj, qkv), not on one square-ish probe matrix: a Llama's fused gate/up and its down differ."""
    from h200 import decoder_gemv_shapes

    assert set(decoder_gemv_shapes("opt-30b")) == {(21504, 7168), (7168, 7168), (28672, 7168), (7168, 28672)}
    from liac.models import resolve_model

    cfg = resolve_model("llama-3.1-8b")
    shapes = set(decoder_gemv_shapes("llama-3.1-8b"))
    assert (cfg.hidden_size, cfg.ffn_dim) in shapes and len(shapes) >= 3


def test_rates_after_stage_runs_after_the_runs_and_before_the_floor():
    import pytest
    from h200 import STAGES, check_stage_order

    assert STAGES.index("runs") < STAGES.index("peers") < STAGES.index("rates-after") < STAGES.index("floor")
    check_stage_order(["footprint", "rates", "compile", "runs", "peers", "rates-after", "floor"])
    check_stage_order(["rates", "runs", "floor"])  # without it, any order as before
    with pytest.raises(SystemExit, match="'rates-after' must come after 'runs'"):
        check_stage_order(["rates-after", "runs", "floor"])
    with pytest.raises(SystemExit, match="must come before 'floor'"):
        check_stage_order(["runs", "floor", "rates-after"])


def test_the_floor_takes_the_faster_probe_per_field():
    """A floor is a lower bound on step time: per field the higher rate, the shorter sync, per m the higher
    attention TFLOP/s; the record keeps both probes and after / before."""
    from h200 import floor_rates

    before = {"ddr_shared_gb_per_s": 124.5, "concurrent_cpu_gb_per_s": 74.3, "pcie_h2d_gb_per_s": 55.0,
              "split_sync_seconds": 1e-5, "cpu_attention_bf16_tflops": [{"m": 16, "tflops": 0.2},
                                                                        {"m": 128, "tflops": 0.7}]}
    after = {"ddr_shared_gb_per_s": 99.6, "concurrent_cpu_gb_per_s": 44.6, "pcie_h2d_gb_per_s": 56.0,
             "split_sync_seconds": 2e-5, "cpu_attention_bf16_tflops": [{"m": 16, "tflops": 0.1},
                                                                       {"m": 128, "tflops": 0.9}],
             "cpu_kv_read_gb_per_s": 70.0}
    chosen, record = floor_rates(before, after)
    assert chosen["ddr_shared_gb_per_s"] == 124.5 and chosen["concurrent_cpu_gb_per_s"] == 74.3
    assert chosen["pcie_h2d_gb_per_s"] == 56.0 and chosen["split_sync_seconds"] == 1e-5
    assert chosen["cpu_attention_bf16_tflops"] == [{"m": 16, "tflops": 0.2}, {"m": 128, "tflops": 0.9}]
    assert chosen["cpu_kv_read_gb_per_s"] == 70.0 and "cpu_kv_read_gb_per_s" not in record  # one probe only
    assert record["ddr_shared_gb_per_s"] == {"before": 124.5, "after": 99.6, "ratio": 0.8, "floor": 124.5}
    assert record["cpu_attention_bf16_tflops"][1]["ratio"] == pytest.approx(0.9 / 0.7, abs=1e-3)


def test_emulated_call_writes_both_probes_and_prices_the_floor_with_the_faster(tmp_path, monkeypatch):
    """An emulated call (no GPU) with rates before and after the runs: rates.json and rates-after.json written,
    summary.json records both with their ratio, run-profile.yaml keeps the first probe, and the floor prices with
    the faster of the two (the probes are replaced by fixed rates: no timing is asserted)."""
    import json

    import h200
    import yaml

    probes = iter([{"cpu_ddr_read_gb_per_s": 50.0, "cpu_kv_read_gb_per_s": 60.0},
                   {"cpu_ddr_read_gb_per_s": 40.0, "cpu_kv_read_gb_per_s": 90.0}])
    monkeypatch.setattr("liac.probe.measure_rates", lambda sizes, use_gpu=None: next(probes))
    monkeypatch.setattr("liac.probe.split_sync_seconds", lambda gpu: 1e-5)
    monkeypatch.setattr("liac.probe.attention_curve", lambda queries, repeats: [(q, 0.5) for q in queries])
    seen = []
    monkeypatch.setattr("floor.workload_floor", lambda graph, hw, **kw: seen.append(hw) or {"seconds": 1.0})
    out = tmp_path / "out"
    assert h200.main(["--out", str(out), "--emulate", "--profile", "spr-h100", "--stages",
                      "rates,rates-after,floor", "--points", "128:1"]) == 0
    assert json.loads((out / "rates.json").read_text())["cpu_ddr_read_gb_per_s"] == 50.0
    assert json.loads((out / "rates-after.json").read_text())["cpu_kv_read_gb_per_s"] == 90.0
    run_profile = yaml.safe_load((out / "run-profile.yaml").read_text())
    assert run_profile["cpu_kv_read_gb_per_s"] == 60.0  # the first probe's: what the plans were priced for
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rates_probes"]["cpu_kv_read_gb_per_s"] == {"before": 60.0, "after": 90.0, "ratio": 1.5,
                                                               "floor": 90.0}
    assert summary["rates_probes"]["cpu_ddr_read_gb_per_s"]["floor"] == 50.0
    assert [s for s in summary["stages"].values() if s["status"] != "done"] == []
    assert seen[0].cpu_ddr_read_gb_per_s == 50.0 and seen[0].cpu_kv_read_gb_per_s == 90.0
    assert json.loads((out / "floor.json").read_text())[0]["seconds"] == 1.0


def test_rates_after_is_skipped_with_its_reason_when_time_is_short(tmp_path, monkeypatch):
    import json

    import h200

    monkeypatch.setattr("liac.probe.measure_rates", lambda *a, **k: pytest.fail("probed past the deadline"))
    out = tmp_path / "out"
    assert h200.main(["--out", str(out), "--emulate", "--profile", "spr-h100", "--stages", "rates-after",
                      "--deadline-s", "5", "--rates-after-s", "20"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert not (out / "rates-after.json").exists()
    assert summary["skipped"][0]["stage"] == "rates-after" and "out of time" in summary["skipped"][0]["reason"]


def test_a_contender_without_the_split_start_is_compiled_apart(tmp_path):
    """'optimal+nostart' compiles the optimum with Eq. 15b's split_cpu_start_seconds at 0 (the A/B of the splits
    that term takes out): its plans are named for the profile with '-nostart', so that runs.json and
    bench/reprice.py tell them from 'optimal's."""
    import json

    import h200
    import yaml

    from h200 import contender_parts, known_contender

    assert known_contender("optimal+nostart") and known_contender("whole+d2+nostart@copies")
    assert contender_parts("optimal+nostart") == ("optimal", 1) and contender_parts("whole+d2+nostart") == ("whole", 2)
    profile = tmp_path / "late.yaml"
    data = yaml.safe_load(open(h200.ROOT / "liac" / "profiles" / "spr-h100.yaml"))
    data["sources"]["split_cpu_start_seconds"] = "this test"
    profile.write_text(yaml.safe_dump(dict(data, split_cpu_start_seconds=0.002)))
    out = tmp_path / "out"
    assert h200.main(["--out", str(out), "--emulate", "--profile", str(profile), "--stages", "compile",
                      "--points", "128:1", "--contenders", "optimal,optimal+nostart"]) == 0
    plans = json.loads((out / "summary.json").read_text())["plans"]
    assert sorted(p["contender"] for p in plans) == ["optimal", "optimal+nostart"]
    named = {p["contender"]: yaml.safe_load(open(p["plan"])) for p in plans}
    assert named["optimal+nostart"]["metadata"]["name"] != named["optimal"]["metadata"]["name"]
    assert "-nostart" in named["optimal+nostart"]["metadata"]["name"]


def test_the_floor_leaves_out_the_process_footprint_measured_in_the_call(tmp_path, monkeypatch):
    """The footprint stage measures the CUDA context and library workspaces; the floor stage takes those bytes out
    of the budget (no plan can keep weights there) and records them; without a footprint stage it reserves 0."""
    import json

    import h200
    import torch

    from importlib import resources

    PROFILE = resources.files("liac") / "profiles" / "spr-h100.yaml"

    record = {"context_bytes": 800 * 2**20, "library_bytes": 30 * 2**20, "runs": [], "decode_step_seconds": [],
              "profile_fields": {"gpu_context_mib": 992.0, "gpu_library_workspace_mib": 30.0,
                                 "gpu_activation_factor": 2.0, "runtime_op_seconds": 1e-4}}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(h200, "measure_call_footprint", lambda profile: record)
    seen = []
    monkeypatch.setattr("floor.workload_floor", lambda graph, hw, **kw: seen.append(kw) or {"seconds": 1.0})
    out = tmp_path / "out"
    assert h200.main(["--out", str(out), "--profile", str(PROFILE), "--stages", "footprint,floor",
                      "--points", "128:1"]) == 0
    assert seen[0]["reserved_bytes"] == 830 * 2**20 and seen[0].get("paired", True)
    assert seen[1]["paired"] is False and "reserved_bytes" not in seen[1]  # the paths-alone floor, for comparison
    assert json.loads((out / "floor.json").read_text())[0]["reserved_bytes"] == 830 * 2**20
    assert h200.main(["--out", str(tmp_path / "bare"), "--emulate", "--profile", str(PROFILE), "--stages", "floor",
                      "--points", "128:1"]) == 0
    assert seen[2]["reserved_bytes"] == 0.0


def test_rates_stage_measures_the_split_start_and_the_amx_curve_and_compile_for_call_prices_with_them(
        tmp_path, monkeypatch):
    """The rates stage probes Eq. 15b's w (`split_cpu_start`) and the AMX curve on the model's decoder shapes
    (`cpu_gemm_curve`) into rates.json; the curve goes into run-profile.yaml too, the split start does not (the probe
    reads 4-6x below the runs' fit, docs/benchmarks.md (p): the base profile's w stays); with --compile-for-call the
    plans are compiled for that profile (the probes are replaced by fixed numbers)."""
    import json

    import h200
    import yaml

    from liac.plan import load_plan
    from liac.profile import load_profile, resolve_profile

    monkeypatch.setattr("liac.probe.measure_rates", lambda sizes, use_gpu=None: {"cpu_ddr_read_gb_per_s": 50.0})
    monkeypatch.setattr("liac.probe.split_sync_seconds", lambda gpu: 1e-5)
    monkeypatch.setattr("liac.probe.attention_curve", lambda queries, repeats: [(q, 0.5) for q in queries])
    starts, curves = [], []
    monkeypatch.setattr("liac.probe.split_cpu_start", lambda use_gpu, **kw: starts.append(use_gpu) or 7.5e-4)
    monkeypatch.setattr("liac.probe.cpu_gemm_curve", lambda hidden, **kw: curves.append(hidden) or (
        (1, 0.05), (128, 1.5), (1024, 2.25)))
    out = tmp_path / "out"
    assert h200.main(["--out", str(out), "--emulate", "--profile", "spr-h100", "--stages", "rates,compile",
                      "--compile-for-call", "--points", "128:1", "--contenders", "optimal"]) == 0
    curve = [{"m": 1, "tflops": 0.05}, {"m": 128, "tflops": 1.5}, {"m": 1024, "tflops": 2.25}]
    rates = json.loads((out / "rates.json").read_text())
    assert rates["split_cpu_start_seconds"] == 7.5e-4 and rates["cpu_amx_bf16_tflops"] == curve
    assert starts == [False] and curves == [768]  # emulated: no GPU; opt-125m's hidden size
    run_profile = yaml.safe_load((out / "run-profile.yaml").read_text())
    assert run_profile["cpu_amx_bf16_tflops"] == curve
    assert "rates stage" in run_profile["sources"]["cpu_amx_bf16_tflops"]
    assert "rates stage" not in run_profile["sources"].get("split_cpu_start_seconds", "")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["compiled_for"] == str(out / "run-profile.yaml")
    profile = load_profile(out / "run-profile.yaml")
    assert profile.split_cpu_start_seconds == resolve_profile("spr-h100").split_cpu_start_seconds != 7.5e-4
    assert [(p.m, p.tflops) for p in profile.cpu_amx_bf16_tflops] == [(1, 0.05), (128, 1.5), (1024, 2.25)]
    plan = load_plan(summary["plans"][0]["plan"])
    assert plan.spec.hardware.sha256 == profile.sha256()  # priced with the probes' w and curve


def test_the_floor_takes_the_faster_split_start_and_amx_curve():
    """The rates-after probe carries the new fields too: the floor takes the shorter start and per m the higher
    AMX TFLOP/s."""
    from h200 import floor_rates

    before = {"split_cpu_start_seconds": 5e-4, "cpu_amx_bf16_tflops": [{"m": 1, "tflops": 0.06},
                                                                      {"m": 128, "tflops": 3.7}]}
    after = {"split_cpu_start_seconds": 4e-4, "cpu_amx_bf16_tflops": [{"m": 1, "tflops": 0.05},
                                                                     {"m": 128, "tflops": 4.0}]}
    chosen, record = floor_rates(before, after)
    assert chosen["split_cpu_start_seconds"] == 4e-4
    assert chosen["cpu_amx_bf16_tflops"] == [{"m": 1, "tflops": 0.06}, {"m": 128, "tflops": 4.0}]
    assert record["split_cpu_start_seconds"]["ratio"] == 0.8
