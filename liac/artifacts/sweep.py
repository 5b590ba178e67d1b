"""Sweep directory → its plan files, its `index.yaml`, and their agreement (used by validate, diff and docs).

A sweep directory is what `liac compile --batch 1..256 -o DIR` writes: one plan file per workload point and an
`index.yaml` summarising them. Plans are paired, listed and rendered by file name; `index.yaml` is checked against
the plans it lists (each listed file exists and is valid, every plan file is listed, the summary repeats the plan).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["INDEX_NAME", "CATALOG_NAME", "plan_files", "load_sweep", "validate_sweep", "read_index"]

INDEX_NAME = "index.yaml"  # a sweep's summary, written by `liac compile`
CATALOG_NAME = "sweeps.yaml"  # in a directory of sweeps: every model × hardware tried, with why when infeasible


def plan_files(directory: str | Path) -> list[Path]:
    """Plan files of a sweep directory (every *.yaml but index.yaml, sweeps.yaml and hidden temp files), by name."""
    directory = Path(directory)
    return sorted(p for p in directory.iterdir()
                  if p.suffix in (".yaml", ".yml") and p.name not in (INDEX_NAME, CATALOG_NAME)
                  and not p.name.startswith(".") and p.is_file())


def read_index(directory: str | Path) -> tuple[Any, list[tuple[str, str]]]:
    """index.yaml of a sweep → (parsed document or None, [(path, message)] problems reading it)."""
    path = Path(directory) / INDEX_NAME
    if not path.is_file():
        return None, [("", f"holds no {INDEX_NAME}: a sweep directory written by 'liac compile' has one")]
    try:
        return yaml.safe_load(path.read_text()), []
    except (OSError, UnicodeDecodeError) as e:
        return None, [("", f"cannot read: {e}")]
    except yaml.YAMLError as e:
        return None, [("", f"not valid YAML: {' '.join(str(e).split())}")]


def load_sweep(directory: str | Path) -> list[tuple[Path, Any]]:
    """Every plan of a sweep directory, loaded (raises the loader's LiacError on the first invalid one)."""
    from liac.plan import load_plan

    return [(path, load_plan(path)) for path in plan_files(directory)]


def validate_sweep(directory: Path):
    """A sweep directory → (sources checked, findings): each plan, and index.yaml against the plans."""
    from liac.artifacts.index import index_problems
    from liac.artifacts.validate import Finding, validate_plan_file

    checked, findings, plans = [], [], {}
    files = plan_files(directory)
    if not files:
        return [str(directory)], [Finding(str(directory), "", "holds no plan files (*.yaml)")]
    for path in files:
        plan, found = validate_plan_file(path)
        checked.append(str(path))
        findings.extend(found)
        plans[path.name] = plan
    index_source = str(directory / INDEX_NAME)
    doc, problems = read_index(directory)
    checked.append(index_source)
    if problems:
        findings += [Finding(index_source if path else str(directory), path, message) for path, message in problems]
    else:
        findings += [Finding(index_source, path, message) for path, message in index_problems(doc, plans)]
    return checked, findings
