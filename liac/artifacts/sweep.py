"""Sweep directory → its plan files, its `index.yaml`, and their agreement (used by validate, diff and docs).

A sweep directory is what `liac compile --batch 1..256 -o DIR` writes: one plan file per workload point and an
`index.yaml` summarising them. Plans are paired, listed and rendered by file name; `index.yaml` is checked against
the plans it lists (each listed file exists and is valid, every plan file is listed, the summary repeats the plan).

A directory of sweeps (like `plans/`) holds one sweep per subdirectory and may hold `sweeps.yaml`, the catalog
written by scripts/refresh-artifacts (every model × hardware tried, with its directory or why it has none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["INDEX_NAME", "CATALOG_NAME", "plan_files", "validate_sweep", "validate_catalog", "read_index"]

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


def validate_catalog(directory: Path):
    """A directory of sweeps (like plans/) → (sources checked, findings): every sweep in it, and its sweeps.yaml
    when present (each entry names a model and hardware and either an existing sweep directory or a reason)."""
    from liac.artifacts.validate import Finding

    checked, findings = [], []
    sweeps = [d for d in sorted(directory.iterdir()) if d.is_dir() and plan_files(d)]
    for sweep in sweeps:
        done, found = validate_sweep(sweep)
        checked += done
        findings += found
    path = directory / CATALOG_NAME
    if not path.is_file():
        return checked, findings
    checked.append(str(path))
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        return checked, findings + [Finding(str(path), "", f"not valid YAML: {' '.join(str(e).split())}")]
    if not isinstance(doc, dict) or not isinstance(doc.get("sweeps"), list):
        return checked, findings + [Finding(str(path), "sweeps", "must be a list of {model, hardware, directory "
                                                                 "or reason}")]
    listed = set()
    for index, entry in enumerate(doc["sweeps"]):
        where = f"sweeps[{index}]"
        if not isinstance(entry, dict) or not {"model", "hardware"} <= set(entry) \
                or ("directory" in entry) == ("reason" in entry):
            findings.append(Finding(str(path), where, "must name 'model' and 'hardware', and either 'directory' or "
                                                      "'reason'"))
            continue
        if "directory" in entry:
            listed.add(entry["directory"])
            if not (directory / str(entry["directory"]) / INDEX_NAME).is_file():
                findings.append(Finding(str(path), f"{where}.directory", f"'{entry['directory']}' must be a sweep "
                                                                         f"directory beside {CATALOG_NAME}"))
    for sweep in sweeps:
        if sweep.name not in listed:
            findings.append(Finding(str(path), "sweeps", f"must list every sweep directory: '{sweep.name}' is "
                                                         "missing"))
    return checked, findings
