"""The checked-in artifacts are fresh (like a lock file) and valid, without re-solving every point.

How (docs/architecture.md, "Checked-in plans"; liac/artifacts/refresh.py):

1. plans/, docs/plans/*.md and docs/plan-format.md are rebuilt into a temporary directory by the same code as
   `make artifacts` (`refresh_artifacts(..., reuse=REPO)`), except that each committed plan is *re-priced* from
   the choice it records instead of solved: traced with the current tracer, priced with the current profile and
   cost model, emitted and serialised with the current code (`liac.api.reprice_point`). Points without a
   committed plan (infeasible ones, new batches) are solved. The result is compared with what is committed:
   plans byte for byte, pages as text. Any change to the trace, the costs of the chosen placements, the
   emitter, the format, the profiles or the zoo shows here.
2. What re-pricing cannot see is the solver choosing differently. plans/sweeps.yaml records
   `decision_fingerprint()`, a hash of the code that decides (passes/, the models, the profile and compile
   code; comments and docstrings ignored): when it changed, the catalog is stale and this test names
   `make artifacts`, which re-solves everything.
3. A few points, chosen by that fingerprint (so each code state checks the same ones, and a change of the
   decision code rotates them), are re-solved in full and must give the committed bytes: a guard against an
   environment (solver, numpy) that decides differently.

Figures are not compared byte for byte (PNG bytes change with matplotlib/FreeType); their file names hash the
data they plot and the drawing code, so a page's text changes whenever one of its figures would, and the test
checks that every figure a page names is committed. Re-solving every point (`make artifacts`) takes minutes on
two cores; this check takes seconds. Neither depends on the machine's speed: whatever is solved (by `make
artifacts`, or here the points without a committed plan and the sample) is solved under work limits, with
no wall-clock limit (`artifact_solver_options`), so load makes a solve slower, never different.
"""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest
import yaml

from liac.artifacts.refresh import (BATCHES, GEN_LEN, MODELS, PROFILES, PROMPT_LEN, _code_text,
                                    artifact_solver_options, decision_fingerprint, refresh_artifacts)
from liac.artifacts.validate import validate_path

REPO = Path(__file__).resolve().parents[1]
REFRESH = "run scripts/refresh-artifacts (or `make artifacts`) and commit plans/ and docs/"
RESOLVED_POINTS = 3
# Whose points the re-solved sample draws from: the CXL profile's solves take 2-60 s each (its placement space is
# ~10x larger); the fingerprint covers them like every other point.
SAMPLED_PROFILES = tuple(p for p in PROFILES if p != "spr-h100-cxl")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    root = tmp_path_factory.mktemp("artifacts")
    refresh_artifacts(root, jobs=1, reuse=REPO)  # in this process: the traces are shared with the other tests
    return root


def _files(root: Path, sub: str, pattern: str) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in sorted((root / sub).glob(pattern)) if p.is_file()}


def _compare(committed: dict[str, Path], regenerated: dict[str, Path]) -> list[str]:
    problems = [f"missing (not committed): {name}" for name in sorted(set(regenerated) - set(committed))]
    problems += [f"stale (no longer generated): {name}" for name in sorted(set(committed) - set(regenerated))]
    problems += [f"stale: {name}" for name in sorted(set(committed) & set(regenerated))
                 if committed[name].read_bytes() != regenerated[name].read_bytes()]
    return problems


def test_checked_in_plans_are_fresh(fresh):
    problems = _compare(_files(REPO, "plans", "**/*"), _files(fresh, "plans", "**/*"))
    assert not problems, f"{len(problems)} checked-in plan files differ from a fresh compile: {REFRESH}\n  " + \
        "\n  ".join(problems[:20])


def test_checked_in_pages_are_fresh(fresh):
    committed = {**_files(REPO, "docs/plans", "*.md"), **_files(REPO, "docs", "plan-format.md")}
    regenerated = {**_files(fresh, "docs/plans", "*.md"), **_files(fresh, "docs", "plan-format.md")}
    problems = _compare(committed, regenerated)
    assert not problems, f"{len(problems)} generated pages differ from a fresh render: {REFRESH}\n  " + \
        "\n  ".join(problems[:20])


def test_every_figure_a_page_names_is_committed_and_none_is_orphaned():
    pages = sorted((REPO / "docs" / "plans").glob("*.md"))
    named = {name for page in pages for name in re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", page.read_text())}
    on_disk = {p.name for p in (REPO / "docs" / "plans").glob("*.png")}
    assert named, "no page names a figure"
    assert not named - on_disk, f"figures named by pages but not committed ({REFRESH}): {sorted(named - on_disk)}"
    assert not on_disk - named, f"figures no page names ({REFRESH}): {sorted(on_disk - named)}"
    for name in named:
        assert (REPO / "docs" / "plans" / name).stat().st_size > 10_000  # a drawn figure, not an empty file


def test_every_checked_in_sweep_validates():
    sweeps = sorted(p for p in (REPO / "plans").iterdir() if p.is_dir())
    assert sweeps
    for sweep in sweeps:
        _, findings = validate_path(sweep)
        assert [f.line() for f in findings] == []


def test_catalog_covers_the_whole_set():
    catalog = yaml.safe_load((REPO / "plans" / "sweeps.yaml").read_text())
    pairs = {(entry["model"], entry["hardware"]) for entry in catalog["sweeps"]}
    assert pairs == {(model, profile) for model in MODELS for profile in PROFILES}
    for entry in catalog["sweeps"]:
        assert ("directory" in entry) != ("reason" in entry)
        if "directory" in entry:
            assert (REPO / "plans" / entry["directory"] / "index.yaml").is_file()


def test_the_decision_code_is_the_one_the_plans_were_solved_with():
    catalog = yaml.safe_load((REPO / "plans" / "sweeps.yaml").read_text())
    assert catalog["decision_code_sha256"] == decision_fingerprint(), (
        "the code that decides placements (liac.artifacts.refresh.DECISION_CODE) changed since plans/ was solved: "
        + REFRESH)


def _sample() -> list[Path]:
    committed = sorted(path for profile in SAMPLED_PROFILES for path in (REPO / "plans").glob(f"*.{profile}/*.yaml")
                       if path.name != "index.yaml")
    return random.Random(decision_fingerprint()).sample(committed, RESOLVED_POINTS)


def test_a_sample_of_points_re_solves_to_the_committed_plans():
    """Solved as `make artifacts` solves, under work limits and no wall-clock limit (`artifact_solver_options`): on
    a loaded machine the solve takes longer, never ends differently."""
    from liac.api import compile_budgets, compile_point
    from liac.models import resolve_model
    from liac.passes.trace import trace_model
    from liac.plan import load_plan, plan_to_yaml
    from liac.profile import resolve_profile

    options = artifact_solver_options()
    assert options.threads == 1 and not any("time" in f.name for f in dataclasses.fields(options))
    for path in _sample():
        plan = load_plan(path)
        work = plan.spec.workload
        assert (work.prompt_len, work.gen_len) == (PROMPT_LEN, GEN_LEN) and work.batch_size in BATCHES
        cfg, profile = resolve_model(plan.spec.model.name), resolve_profile(plan.spec.hardware.profile)
        point = compile_point(trace_model(cfg), cfg, profile, work.batch_size, PROMPT_LEN, GEN_LEN,
                              compile_budgets(profile), artifact_solver_options(), "latency")
        assert plan_to_yaml(point.plan) == path.read_text(), f"{path} differs when re-solved: {REFRESH}"


def test_repricing_sees_a_change_of_the_cost_model(monkeypatch):
    """The check's premise: a plan re-priced by changed code differs from the committed file (here, every CPU
    rate 1 % slower), and re-priced by the current code equals it."""
    from liac.api import compile_budgets, reprice_point
    from liac.models import resolve_model
    from liac.passes.trace import trace_model
    from liac.plan import load_plan, plan_to_yaml
    from liac.profile import resolve_profile

    path = REPO / "plans" / "opt-30b.spr-h100" / "opt-30b.spr-h100.b256-p128-g32.yaml"  # units on the CPU
    plan = load_plan(path)
    cfg, profile = resolve_model("opt-30b"), resolve_profile("spr-h100")
    graph = trace_model(cfg)
    point = reprice_point(graph, cfg, profile, plan, compile_budgets(profile))
    assert plan_to_yaml(point.plan) == path.read_text()
    import liac.passes.costs as costs

    original = costs.cpu_node_prices

    def slower(*args, **kwargs):
        seconds, beside = original(*args, **kwargs)
        return seconds * 1.01, beside
    monkeypatch.setattr(costs, "cpu_node_prices", slower)
    changed = reprice_point(graph, cfg, profile, plan, compile_budgets(profile))
    assert plan_to_yaml(changed.plan) != path.read_text()


def test_the_fingerprint_ignores_prose_but_not_code():
    code = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    assert _code_text(code) == _code_text('def f(x):\n\n    # a comment\n    """Other doc."""\n    return x + 1\n')
    assert _code_text(code) != _code_text(code.replace("x + 1", "x + 2"))
    assert _code_text('s = f"{a}b"\n') != _code_text('s = f"{a}c"\n')
