"""A sweep directory on disk: the names of its files, its plan files, its index, and the policy letters.

`liac compile --batch 1..256 -o DIR` writes a *sweep*: one plan per workload point, named `<metadata.name>.yaml`,
and `index.yaml` summarising them (`liac.api.write_plans`; docs/compile.md, "Output"). A directory of sweeps (like
`plans/`) holds one sweep per subdirectory and may hold `sweeps.yaml`, the catalog scripts/refresh-artifacts writes
(every model × hardware tried, with its directory or why it has none). The writer, the tools that read sweeps
(`liac validate`, `diff`, `docs`) and `liac calibrate` take these names from here.

    from liac.sweep import plan_files, policy_string
    [policy_string(load_plan(p), "decode") for p in plan_files("plans/opt-30b.spr-h100")]   # ['48xCGGGGG', ...]
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from liac.errors import LiacError
from liac.fileio import read_yaml

__all__ = ["INDEX_NAME", "CATALOG_NAME", "INDEX_KIND", "INDEX_API_VERSION", "plan_files", "is_sweep_file", "read_index",
           "policy_string", "microbatch_string"]

INDEX_NAME = "index.yaml"  # a sweep's summary, written by `liac compile`
CATALOG_NAME = "sweeps.yaml"  # in a directory of sweeps: every model × hardware tried, with why when infeasible
INDEX_KIND = "OffloadPlanIndex"  # index.yaml's `kind` and `apiVersion`
INDEX_API_VERSION = "liac/v1"
_LETTERS = {"cpu": "C", "gpu": "G", "split": "S"}
# The file names a sweep owns: its index, its plans (`liac.fileio.safe_name` of passes.emit.plan_name, + '.yaml'),
# and the temp files of an atomic write of either. `liac compile` replaces or drops exactly these; any other file
# in the directory is the user's and is kept.
_PLAN_FILE = r"[A-Za-z0-9_+~-][A-Za-z0-9._+~-]*\.(?:b\d+|serve-b\d+-\d+)-p\d+-g\d+(?:\.[A-Za-z0-9_+~-]+)?\.yaml"
_OWNED = re.compile(rf"(?:index\.yaml|{_PLAN_FILE})|\.(?:index\.yaml|{_PLAN_FILE})\.[a-z0-9_]{{8}}\.tmp")


def plan_files(directory: str | Path) -> list[Path]:
    """Plan files of a sweep directory (every *.yaml but index.yaml, sweeps.yaml and hidden temp files), by name."""
    directory = Path(directory)
    return sorted(p for p in directory.iterdir()
                  if p.suffix in (".yaml", ".yml") and p.name not in (INDEX_NAME, CATALOG_NAME)
                  and not p.name.startswith(".") and p.is_file())


def is_sweep_file(name: str) -> bool:
    """Whether a file name belongs to a sweep (see `_OWNED`): 'index.yaml', 'opt-30b.spr-h100.b1-p128-g32.yaml',
    'x.h.b1-p1-g1.lia-gpu+lia-cpu.yaml', a serving plan's 'opt-30b.h200-amx16.serve-b1-32-p256-g64.yaml'; not
    'notes.yaml' or 'sweeps.yaml'."""
    return _OWNED.fullmatch(name) is not None


def read_index(directory: str | Path) -> tuple[Any, list[tuple[str, str]]]:
    """index.yaml of a sweep → (parsed document or None, [(path, message)] problems reading it)."""
    path = Path(directory) / INDEX_NAME
    if not path.is_file():
        return None, [("", f"holds no {INDEX_NAME}: a sweep directory written by 'liac compile' has one")]
    try:
        return read_yaml(path), []
    except LiacError as e:
        return None, [("", e.message)]


def policy_string(plan, phase: str) -> str:
    """'20xGGGGGG+76xCCCCSC': per decoder group of an OffloadPlan, its layer count × one letter per unit in
    execution order (G GPU, C CPU, S split), for `phase`."""
    return "+".join(f"{g.layer_count}x" + "".join(_LETTERS[getattr(s, phase)] for s in g.sublayers)
                    for g in plan.spec.layer_groups if g.layer_class == "decoder")


def microbatch_string(plan) -> str:
    """'8x2016': the decoder's prefill micro-batch of an OffloadPlan, sequences x prompt tokens."""
    execution = plan.spec.execution
    return f"{execution.prefill_microbatch_sequences}x{execution.prefill_microbatch_tokens}"
