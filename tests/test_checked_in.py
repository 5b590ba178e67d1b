"""The checked-in artifacts are fresh (like a lock file) and valid.

plans/, docs/plans/*.md and docs/plan-format.md are regenerated into a temporary directory with the current code
(`liac.artifacts.refresh.refresh_artifacts`, what scripts/refresh-artifacts runs) and compared with what is
committed: plans byte for byte, pages as text. Figures are not compared byte for byte (PNG bytes change with the
matplotlib/FreeType version); their file names hash the data they plot and the drawing code, so a page's text
changes whenever one of its figures would, and the test checks that every figure a page names is committed.

Marked slow, and justified: regenerating every sweep (six models × five profiles, BATCHES of refresh.py) takes
about one to two minutes on two cores; it runs once for the whole module and in the default test run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from liac.artifacts.refresh import MODELS, PROFILES, refresh_artifacts
from liac.artifacts.validate import validate_path

REPO = Path(__file__).resolve().parents[1]
REFRESH = "run scripts/refresh-artifacts (or `make artifacts`) and commit plans/ and docs/"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    root = tmp_path_factory.mktemp("artifacts")
    refresh_artifacts(root)
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
    import yaml

    catalog = yaml.safe_load((REPO / "plans" / "sweeps.yaml").read_text())
    pairs = {(entry["model"], entry["hardware"]) for entry in catalog["sweeps"]}
    assert pairs == {(model, profile) for model in MODELS for profile in PROFILES}
    for entry in catalog["sweeps"]:
        assert ("directory" in entry) != ("reason" in entry)
        if "directory" in entry:
            assert (REPO / "plans" / entry["directory"] / "index.yaml").is_file()
