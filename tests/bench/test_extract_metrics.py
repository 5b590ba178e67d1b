"""bench/extract_metrics.py: one metrics document per run of a call's runs.json, repeats kept apart, the profiling
pass's decode steps filled in where the call did not record them."""

import json

from extract_metrics import extract


def test_one_file_per_run_with_profile_steps(tmp_path):
    def metrics(plan, gen_len, **run):
        return {"metrics_version": 1, "plan": plan, "run": {"gen_len": gen_len, **run}, "prefill_ms": 1.0}

    runs = {"profile_steps": 4, "runs": [
        {"metrics": metrics("a", 32)},
        {"metrics": metrics("a", 32)},  # the same plan again (A B B A): a file of its own
        {"skipped": "too slow"},  # no metrics: left out
        {"metrics": metrics("b", 3)},  # fewer decode steps than --profile-steps
        {"metrics": metrics("c", 32), "profile_skipped": "over --max-seconds"},
        {"metrics": metrics("d", 32, profile_steps=1)},  # recorded by the run itself: kept
    ]}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    written = extract(path, tmp_path / "m")
    assert [p.name for p in written] == ["00-a.json", "01-a.json", "03-b.json", "04-c.json", "05-d.json"]
    steps = [json.loads(p.read_text())["run"]["profile_steps"] for p in written]
    assert steps == [4, 4, 2, 0, 1]
