"""The quick slice of bench/fuzz.py in CI: hypothesis draws case seeds for every target (mutated plans, profiles,
model configs, checkpoint headers and indexes, sweep files, command lines), each run in process and judged as the
script judges it. No traceback, no write outside -o, an exit-2 error in one line. (The 10,000-case run, with a
timeout per case, is `python bench/fuzz.py`; its tally is bench/results/fuzz.json.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return fuzz.build_seeds(tmp_path_factory.mktemp("seeds"))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz").joinpath(*fuzz.DEPTH, "case")


@pytest.mark.parametrize("target", sorted(fuzz.TARGETS))
def test_fuzzed_inputs_end_in_one_line_or_success(seeds, sandbox, target):
    @settings(max_examples=8, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(min_value=0, max_value=2**32))
    def check(seed):
        result = fuzz.run_case(fuzz.make_case(seed, seeds, sandbox, target), sandbox)
        verdict = fuzz._judge(result)
        assert verdict in ("exit 0", "exit 1", "exit 2, one line", "exit 3"), (
            f"{verdict}: {result} (replay: python bench/fuzz.py --replay {seed})")
    check()


def test_the_judge_sees_tracebacks_outside_writes_and_long_errors(seeds, sandbox, monkeypatch):
    """The harness's premise: each kind of finding is detected."""
    import liac.cli

    monkeypatch.setattr(liac.cli, "main", lambda argv: 1 / 0)
    assert fuzz._judge(fuzz.run_case(fuzz.Case(1, "t", "liac", ["validate"]), sandbox)) == "traceback"

    def writes_beside(argv):
        Path("escaped.yaml").write_text("x")  # in work/, not under out/
        return 0
    monkeypatch.setattr(liac.cli, "main", writes_beside)
    assert fuzz._judge(fuzz.run_case(fuzz.Case(2, "t", "liac", ["compile", "-o", "out/x"]), sandbox)) \
        == "write outside -o"

    def two_lines(argv):
        import sys

        sys.stderr.write("liac: first\nliac: second\n")
        return 2
    monkeypatch.setattr(liac.cli, "main", two_lines)
    assert fuzz._judge(fuzz.run_case(fuzz.Case(3, "t", "liac", ["validate"]), sandbox)) == "exit 2, several lines"


def _meets_the_goal(tally: dict) -> None:
    assert tally["tracebacks"] == tally["hangs"] == tally["writes_outside_output"] == 0
    assert "exit 2, several lines" not in tally["outcomes"] and not tally.get("partial")
    assert sum(tally["outcomes"].values()) == tally["cases"]


def test_the_committed_tally_meets_the_goal():
    tally = json.loads((REPO / "bench" / "results" / "fuzz.json").read_text())
    _meets_the_goal(tally)
    assert tally["cases"] >= 10_000
    assert set(tally["by_target"]) >= {f"{t}:{c}" for t, c in (
        ("plan", "validate"), ("plan", "explain"), ("plan", "diff"), ("plan", "lia-run"), ("profile", "compile"),
        ("profile", "explain"), ("config", "compile"), ("config", "inspect"), ("checkpoint", "lia-run"),
        ("sweep", "validate"), ("sweep", "docs"), ("argv", "liac"), ("argv", "lia-run"))}


def test_the_committed_tally_of_the_text_inputs_meets_the_goal():
    """lia-run's text inputs (--prompt-file, a sweep directory as the plan, repo ids): a run of those targets."""
    tally = json.loads((REPO / "bench" / "results" / "fuzz-text.json").read_text())
    _meets_the_goal(tally)
    assert tally["cases"] >= 1_000 and set(tally["targets"]) == {"text", "sweep-run", "argv"}
    assert {"text:lia-run", "sweep:lia-run", "argv:lia-run"} <= set(tally["by_target"])
