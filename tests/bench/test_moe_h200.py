"""bench/moe_h200.py: the footprint is measured first (bench/h200.py's footprint stage, with a Mixtral probe) and
every contender is compiled for the profile holding it; the decode-step breakdown and the expert kernel probe."""

import argparse

import pytest
import yaml

torch = pytest.importorskip("torch")

import moe_h200  # noqa: E402

from liac.host import CONTEXT_MARGIN_MIB  # noqa: E402
from liac.profile import load_profile  # noqa: E402
from liac.runtime.footprint import Footprint  # noqa: E402
from liac.sizes import MIB  # noqa: E402


def _bench(tmp_path, **extra):
    args = argparse.Namespace(out=str(tmp_path / "out"), layers=2, emulate=True, gpu_budget_gib=1.0, batches=[1],
                              prompt_len=16, gen_len=4, deadline_s=60.0, **extra)
    return moe_h200.MoeBench(args)


def test_footprint_then_compile_uses_the_measured_profile(tmp_path, monkeypatch):
    """The footprint stage (no CUDA here: the measurement replaced, the probes real plans, the Mixtral probe among
    them) writes its fields into run-profile.yaml, and the compile stage's plans are for that profile."""
    monkeypatch.setattr("liac.host.FOOTPRINT_MODELS", ())  # only the Mixtral probe: fewer compiles here
    seen = []

    def measure(runs):
        seen.extend(plan.spec.model.name for plan, _, _ in runs)
        return Footprint(library_bytes=40 * MIB, context_bytes=900 * MIB,
                         activation_bytes=tuple(10**6 for _ in runs))

    bench = _bench(tmp_path)
    bench.footprint(measure=measure)
    assert seen and set(seen) == {"probe-mixtral"}  # one run per probe plan: 2 points × 2 policies
    assert len(seen) == 4
    profile = load_profile(bench.profile)
    assert profile.name == "h200-moe-run"
    assert profile.gpu_context_mib == pytest.approx(900 + CONTEXT_MARGIN_MIB)
    assert profile.gpu_library_workspace_mib == pytest.approx(40)
    fields = bench.summary["footprint"]["profile_fields"]
    assert fields["gpu_activation_factor"] == profile.gpu_activation_factor >= 1.0
    monkeypatch.setattr(moe_h200, "CONTENDERS", {"optimal": None})
    bench.compile()
    assert bench.summary["compiled_for"] == str(bench.profile)
    (entry,) = bench.summary["plans"]
    plan = yaml.safe_load(open(entry["plan"]))
    assert plan["spec"]["hardware"]["profile"] == "h200-moe-run"


def test_rates_keep_the_footprint_fields(tmp_path, monkeypatch):
    """The rates stage after the footprint stage replaces its own fields only (one run-profile.yaml for both)."""
    bench = _bench(tmp_path)
    moe_h200.update_run_profile(bench.profile, moe_h200.BASE_PROFILE, {"gpu_context_mib": 999.0}, "test",
                                name="h200-moe-run")
    monkeypatch.setattr("liac.probe.measure_rates", lambda sizes, use_gpu=None: {"cpu_ddr_read_gb_per_s": 12.5})
    bench.rates()
    profile = load_profile(bench.profile)
    assert profile.gpu_context_mib == 999.0 and profile.cpu_ddr_read_gb_per_s == 12.5


def test_decode_breakdown_counts_layers_and_parts():
    rows = [
        {"group": "decoder-0", "sublayers": ["qkv"], "phase": "decode", "device": "gpu", "measured_ms": 0.1},
        {"group": "decoder-0", "sublayers": ["attn"], "phase": "decode", "device": "gpu", "measured_ms": 0.2},
        {"group": "decoder-0", "sublayers": ["router"], "phase": "decode", "device": "gpu", "measured_ms": 0.05},
        {"group": "decoder-0", "sublayers": ["experts"], "phase": "decode", "device": "split", "measured_ms": 8.0,
         "measured_cpu_part_ms": 7.0, "measured_gpu_part_ms": 5.0, "measured_route_ms": 0.3},
        {"group": "decoder-1", "sublayers": ["experts"], "phase": "decode", "device": "cpu", "measured_ms": 9.0},
        {"group": "decoder-1", "sublayers": ["wait"], "phase": "decode", "device": "gpu", "measured_ms": 1.0},
        {"group": "head", "sublayers": ["lm_head"], "phase": "decode", "device": "gpu", "measured_ms": 0.5},
        {"group": "decoder-0", "sublayers": ["experts"], "phase": "prefill", "device": "split", "measured_ms": 99.0},
    ]
    out = moe_h200.decode_breakdown(rows, {"decoder-0": 3, "decoder-1": 2, "head": 1})
    assert out["attention"] == pytest.approx(0.9)
    assert out["router"] == pytest.approx(0.15)
    assert out["experts_split"] == pytest.approx(24.0)
    assert out["experts_cpu_part"] == pytest.approx(21.0) and out["experts_gpu_part"] == pytest.approx(15.0)
    assert out["experts_route"] == pytest.approx(0.9)
    assert out["experts_cpu"] == pytest.approx(18.0)
    assert out["stream_wait"] == pytest.approx(2.0)
    assert out["total"] == pytest.approx(0.9 + 0.15 + 24.0 + 18.0 + 2.0 + 0.5)  # parts are inside their rows


def test_expert_kernel_rates_cover_rows_threads_and_pinned_memory():
    cfg = moe_h200.model_config(2, emulate=True)
    pinned, unpinned = [], []

    class Pinning:  # CudaBackend's page-locking calls, recorded
        def pin(self, tensor):
            pinned.append(tuple(tensor.shape))
            return True

        def unpin(self, tensor):
            unpinned.append(tuple(tensor.shape))

    out = moe_h200.expert_kernel_rates(cfg, 4 * 3 * cfg.hidden_size * cfg.ffn_dim * 2, rows=(1, 8), repeats=1,
                                       backend=Pinning())
    assert out["experts_rotated"] == 4 and out["expert_bytes"] == 3 * cfg.hidden_size * cfg.ffn_dim * 2
    assert set(out["linear_gb_per_s_by_rows"]) == {"1", "8"}
    assert all(v > 0 for v in out["linear_gb_per_s_by_rows"].values()) and out["mv_gb_per_s_1_row"] > 0
    assert str(torch.get_num_threads()) in out["linear_gb_per_s_1_row_by_threads"]
    assert pinned == [(4, 2 * cfg.ffn_dim, cfg.hidden_size), (4, cfg.hidden_size, cfg.ffn_dim)]
    assert sorted(unpinned) == sorted(pinned)  # unlocked again before the memory is freed
    assert set(out["pinned_linear_gb_per_s_by_rows"]) == {"1", "8"}


def test_batch1_experts_model_by_hand():
    """One layer of 8 experts, 1 resident, 5 on the CPU, 2 streamed, top-2: 28 routings. Without the share: both on
    the CPU in 10 (2 CPU experts), one CPU + one streamed in 10, one CPU + the resident in 5, both streamed in 1, one
    streamed + the resident in 2. Rates: CPU 1 byte/s alone, 0.5 beside a copy, PCIe 1 byte/s, experts of 1 byte."""
    args = dict(num_experts=8, top_k=2, expert_bytes=1, cpu_gb_per_s=1e-9, cpu_beside_h2d_gb_per_s=0.5e-9,
                h2d_gb_per_s=1e-9)
    # one CPU + one streamed: in the copy's 1 s the CPU reads 0.5, then 0.5 alone: 1.5 s
    unshared = (10 * 2 + 10 * 1.5 + 5 * 1 + 1 * 2 + 2 * 1) / 28
    assert moe_h200.batch1_experts_ms([(3, 1, 5)], share=False, **args) == pytest.approx(3 * unshared * 1e3)
    # shared: two routed host experts always go one to each device (1.5 s); one routed host expert stays on the CPU
    shared = (21 * 1.5 + 7 * 1) / 28  # C(7, 2) routings hit two host experts, 7 hit the resident one
    assert moe_h200.batch1_experts_ms([(3, 1, 5)], share=True, **args) == pytest.approx(3 * shared * 1e3)


def test_table_reads_thread_variants_and_compares_every_run_with_accelerate(tmp_path, capsys):
    """A `--threads-ab` run ('optimal@15t:b1') gets its own row with its thread count and GPU peak, and every liac
    run at the peer's batch its speedup over Accelerate."""
    import json

    bench = _bench(tmp_path)
    bench.summary["runs_index"] = ["warmup", "optimal:b1", "optimal@15t:b1"]
    run = {"predicted": {"decode_ms_per_token": 100.0, "prefill_ms": 10.0}, "cpu_threads": 16,
           "summary": {"decode_ms_per_token": 200.0, "prefill_ms": 20.0}, "gpu": {"peak_footprint_bytes": 3 * 2**30}}
    fifteen = dict(run, cpu_threads=15, summary={"decode_ms_per_token": 125.0, "prefill_ms": 20.0})
    (bench.out / "runs.json").write_text(json.dumps({"runs": [run, run, fifteen]}))
    (bench.out / "peers.json").write_text(json.dumps([{"peer": "accelerate-pinned", "batch": 1,
                                                       "result": {"decode_ms_per_token": 1000.0}}]))
    bench.table()
    rows = bench.summary["table"]
    assert [(r["contender"], r["cpu_threads"], r["gpu_peak_gib"]) for r in rows] == \
        [("optimal", 16, 3.0), ("optimal@15t", 15, 3.0)]
    (peer,) = bench.summary["peers"]
    assert peer["liac_optimal_decode_speedup"] == 5.0
    assert peer["liac_decode_speedup"] == {"optimal": 5.0, "optimal@15t": 8.0}
    assert "optimal@15t 8.0x" in capsys.readouterr().out


def test_share_ab_runs_each_optimum_again_with_the_share_following_the_cpu(tmp_path, monkeypatch):
    """`--share-ab`: right after each optimum (before its `--threads-ab` variants) the same plan runs twice with
    Engine expert_share='auto' (the ratio following the CPU parts), 'optimal@auto:bN' and 'optimal@auto#2:bN', then
    once more as the optimum ('optimal@no-auto:bN': A B B A); the others as before."""
    calls = []
    monkeypatch.setattr(moe_h200, "run_plans", lambda specs, **kw: calls.append(specs))
    bench = _bench(tmp_path, share_ab=True, threads_ab=[15], measure_gen_len=4, profile_steps=0,
                   max_run_seconds=60.0, reserve_s=0.0)
    bench.summary["plans"] = [{"contender": c, "batch": b, "plan": f"{c}-{b}.yaml"}
                              for b in (1, 8) for c in ("optimal", "experts-cpu")]
    bench.runs()
    (specs,) = calls
    assert bench.summary["runs_index"] == [
        "optimal:b1", "optimal@auto:b1", "optimal@auto#2:b1", "optimal@no-auto:b1", "optimal@15t:b1",
        "experts-cpu:b1", "optimal:b8", "optimal@auto:b8", "optimal@auto#2:b8", "optimal@no-auto:b8",
        "experts-cpu:b8"]
    assert [(s.plan, s.expert_share, s.threads) for s in specs] == [
        ("optimal-1.yaml", None, None), ("optimal-1.yaml", "auto", None), ("optimal-1.yaml", "auto", None),
        ("optimal-1.yaml", None, None), ("optimal-1.yaml", None, 15), ("experts-cpu-1.yaml", None, None),
        ("optimal-8.yaml", None, None), ("optimal-8.yaml", "auto", None), ("optimal-8.yaml", "auto", None),
        ("optimal-8.yaml", None, None), ("experts-cpu-8.yaml", None, None)]


def test_rates_stage_probes_the_expert_kernel_and_prices_it(tmp_path, monkeypatch):
    """The rates stage adds the expert kernel's rates (liac.probe.expert_rates on the model's own expert shapes) to
    rates.json, and their beside-copy rate (Eq. 21c's) and DDR's total beside several copies (Eq. 21b's) to
    run-profile.yaml, where the compile stage reads them."""
    bench = _bench(tmp_path)
    seen = []

    def experts(hidden, ffn, rotate_bytes, repeats=3, use_gpu=None):
        seen.append((hidden, ffn, use_gpu))
        return {"cpu_expert_gb_per_s": 40.0, "cpu_expert_after_idle_gb_per_s": 31.0,
                "cpu_expert_beside_copy_gb_per_s": 27.5, "h2d_beside_expert_gb_per_s": 50.0,
                "ddr_shared_experts_gb_per_s": 81.5}

    monkeypatch.setattr("liac.probe.measure_rates", lambda sizes, use_gpu=None: {"cpu_ddr_read_gb_per_s": 40.5})
    monkeypatch.setattr("liac.probe.expert_rates", experts)
    bench.rates()
    assert seen == [(bench.cfg.hidden_size, bench.cfg.ffn_dim, False)]
    rates = __import__("json").loads((bench.out / "rates.json").read_text())
    assert rates["cpu_expert_after_idle_gb_per_s"] == 31.0 and rates["cpu_expert_beside_copy_gb_per_s"] == 27.5
    profile = load_profile(bench.profile)
    assert profile.cpu_expert_beside_copy_gb_per_s == 27.5 and profile.cpu_ddr_read_gb_per_s == 40.5
    assert profile.ddr_shared_experts_gb_per_s == 81.5  # Eq. 21b's DDR term, probed in the experts' pattern
    assert "cpu_expert_beside_copy_gb_per_s" not in profile.estimates
    assert "ddr_shared_experts_gb_per_s" not in profile.estimates


@pytest.mark.parametrize("flag, tag, option", [("wake_ab", "wake", "cpu_wake"), ("split_ab", "cut", "expert_split"),
                                               ("launcher_ab", "launch", "expert_launcher")])
def test_an_ab_flag_runs_each_optimum_again_with_its_engine_option(tmp_path, monkeypatch, flag, tag, option):
    """`--wake-ab` / `--split-ab` / `--launcher-ab`: after each optimum the same plan runs twice with Engine
    cpu_wake=True / expert_split=True / expert_launcher=True ('optimal@wake:bN', 'optimal@wake#2:bN' / '@cut' /
    '@launch'), then once more as the optimum ('optimal@no-wake:bN' / ...): A B B A; a run's record carries the
    option to the table's row."""
    calls = []
    monkeypatch.setattr(moe_h200, "run_plans", lambda specs, **kw: calls.append(specs))
    flags = {"wake_ab": False, "split_ab": False, "launcher_ab": False, flag: True}
    bench = _bench(tmp_path, share_ab=False, threads_ab=[], measure_gen_len=4, profile_steps=0,
                   max_run_seconds=60.0, reserve_s=0.0, **flags)
    bench.summary["plans"] = [{"contender": c, "batch": b, "plan": f"{c}-{b}.yaml"}
                              for b in (1, 8) for c in ("optimal", "experts-cpu")]
    bench.runs()
    (specs,) = calls
    # A B B A: the optimum, the variant twice, the optimum again, so that the order cancels in each side's mean
    assert bench.summary["runs_index"] == [
        "optimal:b1", f"optimal@{tag}:b1", f"optimal@{tag}#2:b1", f"optimal@no-{tag}:b1", "experts-cpu:b1",
        "optimal:b8", f"optimal@{tag}:b8", f"optimal@{tag}#2:b8", f"optimal@no-{tag}:b8", "experts-cpu:b8"]
    assert [getattr(s, option) for s in specs] == [None, True, True, None, None, None, True, True, None, None]
    assert [s.plan for s in specs] == ["optimal-1.yaml"] * 4 + ["experts-cpu-1.yaml"] + ["optimal-8.yaml"] * 4 + [
        "experts-cpu-8.yaml"]


def test_ab_pairs_set_each_sides_two_runs_beside_each_other():
    """The table's A/B lines (`ab_pairs`): per tag and batch, A's two runs ('optimal', 'optimal@no-TAG') and B's
    ('optimal@TAG', 'optimal@TAG#2') in run order, their means and B over A; a pair with a run missing has no
    means (here batch 8's second B run did not run)."""
    def row(contender, batch, ms):
        return {"contender": contender, "batch": batch, "measured": {"decode_ms_per_token": ms} if ms else None}

    rows = [row("optimal", 1, 130.0), row("optimal@cut", 1, 150.0), row("optimal@cut#2", 1, 140.0),
            row("optimal@no-cut", 1, 120.0), row("experts-cpu", 1, 240.0), row("optimal", 8, 500.0),
            row("optimal@cut", 8, 410.0), row("optimal@cut#2", 8, None), row("optimal@no-cut", 8, 480.0)]
    one, eight = moe_h200.ab_pairs(rows)
    assert one == {"tag": "cut", "batch": 1, "a": [130.0, 120.0], "b": [150.0, 140.0], "a_mean": 125.0,
                   "b_mean": 145.0, "b_over_a": 1.16}
    assert eight == {"tag": "cut", "batch": 8, "a": [500.0, 480.0], "b": [410.0]}


def test_profile_set_reaches_the_compiled_plans_profile(tmp_path, monkeypatch):
    """--profile-set FIELD=VALUE is written into run-profile.yaml before the compile stage, so the plans are priced
    with it; a malformed one is refused by the parser."""
    (field, value), = [moe_h200._profile_field("runtime_op_seconds_beside_cpu=0.000307")]
    bench = _bench(tmp_path, profile_set=[(field, value)])
    monkeypatch.setattr(moe_h200, "CONTENDERS", {"optimal": None})
    bench.compile()
    assert load_profile(bench.profile).runtime_op_seconds_beside_cpu == pytest.approx(0.000307)
    (entry,) = bench.summary["plans"]
    assert yaml.safe_load(open(entry["plan"]))["spec"]["hardware"]["profile"] == "h200-moe-run"
    with pytest.raises(argparse.ArgumentTypeError, match="FIELD=NUMBER"):
        moe_h200._profile_field("runtime_op_seconds_beside_cpu")


def test_each_batch_size_gets_a_warmup_run_before_its_first_plan(tmp_path, monkeypatch):
    """The first run at a batch size paid ~45-60 ms a decode step outside its CPU parts and their host chain in the
    2026-12-02 calls (the second run at that batch 8-15): on the device (not --emulate) a warm-up run of each
    batch's first plan runs before it ('warmup', then 'warmup:b8'), and the table leaves it out."""
    calls = []
    monkeypatch.setattr(moe_h200, "run_plans", lambda specs, **kw: calls.append(specs))
    bench = _bench(tmp_path, share_ab=False, threads_ab=[], measure_gen_len=4, profile_steps=0,
                   max_run_seconds=60.0, reserve_s=0.0, split_ab=True)
    bench.args.emulate = False
    bench.summary["plans"] = [{"contender": c, "batch": b, "plan": f"{c}-{b}.yaml"}
                              for b in (1, 8) for c in ("optimal", "experts-cpu")]
    bench.runs()
    (specs,) = calls
    assert bench.summary["runs_index"] == [
        "warmup", "optimal:b1", "optimal@cut:b1", "optimal@cut#2:b1", "optimal@no-cut:b1", "experts-cpu:b1",
        "warmup:b8", "optimal:b8", "optimal@cut:b8", "optimal@cut#2:b8", "optimal@no-cut:b8", "experts-cpu:b8"]
    assert specs[0] == specs[1] and specs[6] == specs[7] and specs[6].plan == "optimal-8.yaml"
    assert not specs[6].expert_split
