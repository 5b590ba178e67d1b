"""bench/serve_h200.py's orchestration of server configurations (`--configs`), without starting a server: which
plan and flags each configuration gets, that a failing one is recorded and the next still runs, and that the budget
skips what it cannot hold. The servers and the load themselves run in tests/runtime/test_serve.py and on the H200."""

import json

import pytest
import serve_h200
from serve_h200 import BENCH_SERVE, Run, main, parse_configs


def test_configs_parse_and_bad_ones_are_one_line(tmp_path):
    assert parse_configs("serving,static,plain:8,plain:32") == ["serving", "static", "plain:8", "plain:32"]
    for bad in ("plain", "plain:0", "plain:x", "dynamic", "serving,serving"):
        with pytest.raises(SystemExit, match="--configs"):
            parse_configs(bad)


def test_each_configuration_gets_its_plan_and_flags_and_a_failure_does_not_stop_the_rest(tmp_path, monkeypatch):
    started = []

    def serve(self, config, plan):
        started.append((config, plan.name, self.server_command(config, plan)))
        raise RuntimeError(f"no server in this test ({config})")
    monkeypatch.setattr(Run, "serve", serve)
    status = main(["--out", str(tmp_path), "--configs", "serving,static,plain:8,plain:3,plain:32",
                   "--phases", "rate:0.5,rate:1", "--seconds", "1", "--drain", "1", "--budget", "1000"])
    assert status == 1  # some configuration failed
    assert [(c, p) for c, p, _ in started] == [("serving", "opt-30b.h200-measured.serve.yaml"),
                                               ("static", "opt-30b.h200-measured.serve.yaml"),
                                               ("plain:8", "opt-30b.h200-measured.plain-b8.yaml"),
                                               ("plain:32", "opt-30b.h200-measured.plain-b32.yaml")]
    assert ["--static-batching" in command for _, _, command in started] == [False, True, False, False]
    summary = json.loads((tmp_path / "summary.json").read_text())
    configs = {c["config"]: c for c in summary["configs"]}
    assert list(configs) == ["serving", "static", "plain:8", "plain:3", "plain:32"]
    assert "plain-b3.yaml" in configs["plain:3"]["error"] and "--batch 3" in configs["plain:3"]["error"]
    # a plain plan serves at most its own batch: its rows are B, its one prediction is batch B's
    assert [configs[c]["rows"] for c in ("serving", "plain:8", "plain:32")] == [32, 8, 32]
    assert [p["batch"] for p in configs["plain:8"]["predicted"]] == [8]
    assert [p["batch"] for p in configs["serving"]["predicted"]] == [1, 2, 4, 8, 16, 32]


def test_the_budget_is_shared_and_what_it_cannot_hold_is_skipped(tmp_path, monkeypatch):
    started = []

    def serve(self, config, plan):
        started.append(config)
        raise RuntimeError("no server in this test")
    monkeypatch.setattr(Run, "serve", serve)
    status = main(["--out", str(tmp_path), "--configs", "serving,plain:8", "--phases", "rate:0.25,rate:0.5",
                   "--seconds", "30", "--drain", "20", "--server-seconds", "50", "--budget", "200"])
    assert status == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    serving, plain = summary["configs"]
    # 200 s over two configurations: 100 s for the first < 50 s for its server + 55 s for one phase: skipped whole,
    # every phase listed; what it left unused passes to the next, which starts
    assert [s["phase"] for s in serving["skipped"]] == ["rate-0.25", "rate-0.5"]
    assert "budget" in serving["skipped"][0]["reason"]
    assert started == ["plain:8"] and plain["skipped"] == [] and "no server" in plain["error"]


def test_the_committed_plans_are_where_the_configurations_look():
    assert (BENCH_SERVE / "opt-30b.h200-measured.serve.yaml").is_file()
    assert sorted(p.name for p in BENCH_SERVE.glob("*plain-b*.yaml")) == [
        "opt-30b.h200-measured.plain-b32.yaml", "opt-30b.h200-measured.plain-b8.yaml"]
    assert serve_h200.parse_phases("rate:0.25,clients:8") == [("rate", 0.25), ("clients", 8.0)]
