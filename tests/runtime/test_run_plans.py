"""bench/run_plans.py: many plans over one set of weights, one results file rewritten after every run, budget
skips, failures recorded, one-line errors. Emulated GPU with a tiny model (and on CUDA with `-m gpu`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from runtime_plans import BACKENDS, make_plan

from liac.models.config import ModelConfig
from liac.plan import dump_plan
from liac.runtime import Engine, HostWeights
from liac.runtime.memory import aligned
from liac.runtime.schedule import model_params

_SPEC = importlib.util.spec_from_file_location("run_plans", Path(__file__).parents[2] / "bench" / "run_plans.py")
run_plans_module = importlib.util.module_from_spec(_SPEC)
sys.modules["run_plans"] = run_plans_module  # dataclasses look their module up while the script loads
_SPEC.loader.exec_module(run_plans_module)
RunSpec, run_plans, estimate_seconds = run_plans_module.RunSpec, run_plans_module.run_plans, \
    run_plans_module.estimate_seconds

TINY = ModelConfig(name="tiny-opt", family="opt", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=4,
                   head_dim=8, ffn_dim=64, vocab_size=50, max_position=64, norm="layernorm", norm_eps=1e-5,
                   activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)


def _write(tmp_path, policy, cfg=TINY, predicted_seconds=None, **kwargs) -> str:
    plan = make_plan(cfg, policy, batch=2, prompt_len=8, gen_len=6, **kwargs)
    if predicted_seconds is not None:  # a plan whose own prediction is slow (prefill and every decode step)
        predicted = dataclasses.replace(plan.status.predicted, prefill_seconds=predicted_seconds,
                                        decode_seconds_per_token=predicted_seconds)
        plan = dataclasses.replace(plan, status=dataclasses.replace(plan.status, predicted=predicted))
    path = tmp_path / f"{cfg.name}-{policy}-{predicted_seconds}.yaml"
    dump_plan(plan, path)
    return str(path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_plan_runs_over_one_set_of_weights(tmp_path, monkeypatch, backend):
    made = []
    original = HostWeights.random.__func__

    def counting(cls, *args, **kwargs):
        made.append(args)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(HostWeights, "random", classmethod(counting))
    plans = [_write(tmp_path, p, **({"resident_layers": 1, "cxl_layers": 1} if p == "mixed" else {}))
             for p in ("gpu", "partial", "mixed")]
    runs = [RunSpec(plans[0]), RunSpec(plans[1], gen_len=3), RunSpec(plans[2], batch=1, prompt_len=5)]
    out = tmp_path / "results.json"
    results = run_plans(runs, seed=4, out=out, profile_steps=2, emulate_gpu=backend == "emulated",
                        metrics_dir=tmp_path / "metrics", log=lambda line: None)
    assert len(made) == 1  # the weights were generated once for the three plans
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    numels = [p.numel for params in model_params(TINY).values() for p in params]
    shapes = {p.canonical: p.shape for params in model_params(TINY).values() for p in params}
    assert results["weights"]["bytes"] == sum(aligned(2 * torch.Size(s).numel()) for s in shapes.values())
    assert len(numels) > len(shapes)  # the tied head reads the embedding matrix: listed twice, stored once
    want = [(2, 8, 6), (2, 8, 3), (1, 5, 6)]
    for record, (batch, prompt, gen) in zip(results["runs"], want):
        assert "error" not in record and "skipped" not in record, record
        metrics = record["metrics"]
        assert metrics["run"] == {"batch_size": batch, "prompt_len": prompt, "gen_len": gen, "decode_steps": gen - 1,
                                  "generated_tokens": batch * gen, "prefill_microbatches": 1,
                                  "profile_steps": min(2, gen - 1)}
        assert metrics["prefill_ms"] > 0 and metrics["decode_ms_per_token"] > 0
        assert metrics["tokens_per_second"] == pytest.approx(batch * gen / (metrics["total_ms"] / 1e3), rel=1e-3)
        phases = {row["phase"] for row in metrics["sublayers"]}
        assert phases == {"prefill", "decode"}  # the profiling pass covered both
        assert {row["tier"] for row in metrics["memory"]} == {"hbm", "ddr", "cxl"}
        assert record["predicted"]["decode_ms_per_token"] == metrics["predicted"]["decode_ms_per_token"]
        assert record["summary"]["prefill_ms"] == metrics["prefill_ms"]
        written = json.loads((tmp_path / "metrics" / f"{results['runs'].index(record):02d}-{record['plan']}.json")
                             .read_text())
        assert written["metrics_version"] == 1 and written["plan_file"] == record["plan_file"]
        if backend == "cuda":
            assert record["gpu"]["peak_allocated_bytes"] > 0
            # what stays after a close is torch's own cuBLAS / cuBLASLt workspaces (32 + 1 MiB on an H200), made
            # by the first run's GEMMs: the same after every run, nothing of the engines
            assert record["gpu"]["allocated_after_close_bytes"] == \
                results["runs"][0]["gpu"]["allocated_after_close_bytes"] <= 64 * 2**20
    mixed = results["runs"][2]["metrics"]["memory"]
    assert [row["shared_bytes"] > 0 for row in mixed] == [False, True, False]  # 'cxl' falls back into DDR here


def test_budget_skips_failures_and_a_file_after_every_run(tmp_path, monkeypatch):
    fast, slow = _write(tmp_path, "gpu"), _write(tmp_path, "cpu", predicted_seconds=100.0)
    broken = _write(tmp_path, "partial")
    original = Engine.generate

    def generate(self, ids, new_tokens, **kwargs):
        if self.plan.spec.layer_groups[1].sublayers[1].decode == "cpu" and ids.shape[1] > 4:  # the timed partial run
            raise RuntimeError("simulated crash")
        return original(self, ids, new_tokens, **kwargs)

    monkeypatch.setattr(Engine, "generate", generate)
    out = tmp_path / "results.json"
    seen = []

    def log(line):  # each run's line is printed before its record is saved: the file then holds the runs before it
        if line.startswith("["):
            seen.append(len(json.loads(out.read_text())["runs"]) if out.exists() else 0)

    runs = [RunSpec(slow), RunSpec(fast, gen_len=7), RunSpec(broken), RunSpec(fast, gen_len=2)]
    results = run_plans(runs, seed=0, out=out, max_seconds=60, emulate_gpu=True, log=log)
    assert seen == [0, 1, 2, 3]
    records = json.loads(out.read_text())["runs"]
    assert records == json.loads(json.dumps(results["runs"]))
    assert "exceeds --max-seconds 60" in records[0]["skipped"] and "metrics" not in records[0]
    assert records[0]["estimated_seconds"] > 60
    assert records[1]["error"].startswith("max_new_tokens: new tokens must be between 1 and 6")
    assert records[2]["error"] == "RuntimeError: simulated crash"
    assert records[3]["metrics"]["run"]["decode_steps"] == 1  # later runs still ran


def test_estimate_is_warmup_plus_timed_run_plus_profile():
    work = make_plan(TINY, "gpu", batch=4, prompt_len=32, gen_len=10).spec.workload
    predicted = dataclasses.make_dataclass("P", ["prefill_seconds", "decode_seconds_per_token"])(2.0, 0.5)
    # full request, a warm-up through a quarter of the layers then a whole 2-token request: (2 + 0.5) × 1.25;
    # timed = 2 + 9 × 0.5; profile of 3 steps = 2 + 3 × 0.5
    assert estimate_seconds(predicted, work, 4, 32, 10, 3, 0.25) == pytest.approx(3.125 + 6.5 + 3.5)
    # half the batch and prompt: prefill scales with batch × prompt (0.5 s), a decode step with batch (0.25 s)
    assert estimate_seconds(predicted, work, 2, 16, 4, 0) == pytest.approx(2 * (0.5 + 0.25) + (0.5 + 3 * 0.25))
    # a timeline: its own engine's warm-up, a 3-token generate (prefill + 2 steps) and ~5 s for engine and trace
    assert run_plans_module.timeline_seconds(predicted, work, 2, 16, 0.25) == pytest.approx(
        (0.5 + 0.25) * 1.25 + (0.5 + 2 * 0.25) + 5.0)


def test_runs_that_would_end_past_the_deadline_are_skipped(tmp_path):
    import time

    path = _write(tmp_path, "gpu")
    results = run_plans([RunSpec(path), RunSpec(path)], seed=0, emulate_gpu=True, profile_steps=0,
                        log=lambda line: None, deadline=time.monotonic() - 1)
    assert all(r["skipped"].startswith("out of time") for r in results["runs"])


def test_a_run_may_have_its_own_cpu_thread_count(tmp_path):
    """`RunSpec.threads`: torch's intra-op threads for that run (recorded as its `cpu_threads`), given back after."""
    path = _write(tmp_path, "gpu")
    before = torch.get_num_threads()
    results = run_plans([RunSpec(path, threads=1), RunSpec(path)], seed=0, emulate_gpu=True, profile_steps=0,
                        log=lambda line: None)
    assert [r["cpu_threads"] for r in results["runs"]] == [1, before]
    assert results["runs"][0]["metrics"]["backend"]["cpu_threads"] == 1
    # the counters of what a run pays outside its ops (page faults, allocator syncs), over its timed generate
    assert all(r["events"]["minor_faults"] >= 0 and "major_faults" in r["events"] for r in results["runs"])
    assert torch.get_num_threads() == before


def test_cli_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    other = ModelConfig(**{**dataclasses.asdict(TINY), "name": "tiny-opt-2", "hidden_size": 64,
                           "head_dim": 64 // TINY.num_heads})
    out = tmp_path / "results.json"
    code = run_plans_module.main([_write(tmp_path, "gpu"), _write(tmp_path, "gpu", cfg=other), "--emulate-gpu",
                                  "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "all plans must be for one model" in err[0] and not out.exists()
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps([{"plan": _write(tmp_path, "gpu"), "gen_len": 0}]))
    assert run_plans_module.main(["--runs", str(runs), "--emulate-gpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be positive integers" in err[0] and not out.exists()


def test_transfers_in_the_metrics_are_the_timed_runs_own(tmp_path):
    # Engines share one backend: each run's transfer counts must not include the runs (or warm-ups) before it.
    path = _write(tmp_path, "partial")
    results = run_plans([RunSpec(path), RunSpec(path)], seed=1, emulate_gpu=True, profile_steps=1,
                        log=lambda line: None)
    first, second = (r["metrics"]["transfers"] for r in results["runs"])
    assert first == second and first["h2d_copies"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_runs_at_the_timeline_batches_record_a_decode_step(tmp_path, backend):
    """bench/timeline.py over a real profiler trace, after the runs, in an engine of its own: the step is found and
    summarised; on CUDA the streamed layers' copies show on a copy stream beside the compute stream."""
    path = _write(tmp_path, "mixed", resident_layers=1)
    results = run_plans([RunSpec(path), RunSpec(path, batch=1)], seed=0, emulate_gpu=backend == "emulated",
                        profile_steps=0, log=lambda line: None, timeline_batches=(2,))
    timed, untimed = results["runs"]
    assert "timeline" not in untimed and "error" not in timed["timeline"], timed["timeline"]
    assert timed["summary"]["decode_ms_per_token"] > 0  # the timed run's own numbers stand beside it
    line = timed["timeline"]
    assert 0 < line["main_busy_ms"] <= line["step_ms"] and line["cpu_ops"]
    if backend == "emulated":
        assert line["copy_busy_ms"] is None
    else:
        assert line["compute_busy_ms"] > 0 and line["copy_busy_ms"] > 0
        assert {s["role"] for s in line["streams"].values()} >= {"compute", "copy"}


def test_the_deadline_keeps_room_for_the_timelines_of_the_runs_that_ran(tmp_path):
    """A run starts only if it, its own timeline and the timelines already owed fit before the deadline. The plan
    predicts 10 s a step (its tiny model runs in far less): with room for one run and one and a half timelines, the
    first run runs, the second would leave too little for both timelines and is skipped, the first gets its
    timeline."""
    import time

    from liac.plan import load_plan

    path = _write(tmp_path, "gpu", predicted_seconds=10.0)
    plan = load_plan(path)
    args, share = (plan.status.predicted, plan.spec.workload, 2, 8), run_plans_module._warm_share(plan)
    run, owed = estimate_seconds(*args, 6, 0, share), run_plans_module.timeline_seconds(*args, share)
    results = run_plans([RunSpec(path), RunSpec(path)], seed=0, emulate_gpu=True, profile_steps=0,
                        log=lambda line: None, deadline=time.monotonic() + run + 5 + 1.5 * owed,
                        timeline_batches=(2,))
    first, second = results["runs"]
    assert "summary" in first and "error" not in first["timeline"], first.get("timeline")
    assert second["skipped"].startswith("out of time") and "kept for timelines" in second["skipped"]
