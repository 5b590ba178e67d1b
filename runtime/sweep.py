"""A sweep (a directory of plans with its index.yaml, from `liac compile --batch 1..256`) → the plan for a request.

    path = plan_for_request("plans/opt-30b", batch=3, prompt_len=40, new_tokens=32)   # → .../b4-p128-g32.yaml

Plans are maxima (`liac.runtime.engine.check_request`): a plan holds a request when the request's batch is at most
the plan's batch_size, its prompt at most the plan's prompt_len, and prompt + new tokens at most the plan's context
(prompt_len + gen_len). Of the plans that hold it, the one with the smallest batch is chosen (then the smallest
context), because a plan compiled for a smaller batch reserves less memory and was optimised for a workload nearer
to the request. The index is read for the choice; the chosen plan itself is then loaded and checked as any plan.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from liac.errors import LiacError, brief
from liac.fileio import inside, read_yaml
from liac.sweep import INDEX_KIND, INDEX_NAME

__all__ = ["SweepPoint", "is_sweep", "sweep_points", "plan_for_request"]


@dataclass(frozen=True)
class SweepPoint:
    """One plan of a sweep, as its index lists it."""

    file: Path
    batch_size: int
    prompt_len: int
    gen_len: int

    def holds(self, batch: int, prompt_len: int | None, new_tokens: int | None) -> bool:
        if batch > self.batch_size:
            return False
        if prompt_len is not None and prompt_len > self.prompt_len:
            return False
        total = (prompt_len or 0) + (new_tokens or 0)
        return total <= self.prompt_len + self.gen_len


def _index_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path / INDEX_NAME if path.is_dir() else path


def is_sweep(path: str | os.PathLike) -> bool:
    """A directory holding an index.yaml, or an index.yaml itself (not a plan file)."""
    path = Path(path)
    return (path.is_dir() and (path / INDEX_NAME).is_file()) or (path.name == INDEX_NAME and path.is_file())


def sweep_points(path: str | os.PathLike) -> list[SweepPoint]:
    """The plans a sweep's index lists (directory or index.yaml), in its order.

    Raises:
        LiacError: the index cannot be read, is not an OffloadPlanIndex, or lists no plan.
    """
    index = _index_path(path)
    source = str(index)
    if Path(path).is_dir() and not index.is_file():
        raise LiacError(str(path), f"must be a plan file or a sweep directory holding '{INDEX_NAME}'")
    doc = read_yaml(index, source)
    if not isinstance(doc, dict) or doc.get("kind") != INDEX_KIND:
        raise LiacError(source, f"must be a sweep index (kind '{INDEX_KIND}', written by 'liac compile')",
                        path="kind")
    rows = doc.get("points")
    if not isinstance(rows, list) or not rows:
        raise LiacError(source, "must list at least one plan (every point of the sweep was infeasible)",
                        path="points")
    points = []
    for at, row in enumerate(rows):
        where = f"points[{at}]"
        if not isinstance(row, dict):
            raise LiacError(source, "must be a mapping", path=where)
        name = row.get("file")
        file = inside(index.parent, name, source, path=f"{where}.file")  # no absolute path, no '..'
        if file.name != name or not name.endswith((".yaml", ".yml")) or "\\" in name:
            raise LiacError(source, f"must name a plan file beside the index, got {brief(name)}",
                            path=f"{where}.file")
        sizes = []
        for key in ("batch_size", "prompt_len", "gen_len"):
            value = row.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < 2**31:
                raise LiacError(source, f"must be a positive integer below 2^31, got {brief(value)}",
                                path=f"{where}.{key}")
            sizes.append(value)
        points.append(SweepPoint(file, *sizes))
    return points


def plan_for_request(path: str | os.PathLike, batch: int, prompt_len: int | None = None,
                     new_tokens: int | None = None) -> Path:
    """The plan file of the sweep at `path` for a request (see the module docstring); prompt_len / new_tokens None:
    not known yet (random prompts of the plan's own length), only the batch decides.

    Raises:
        LiacError: no plan of the sweep holds the request (one line: what was asked, what the sweep has).
    """
    points = sweep_points(path)
    fitting = [p for p in points if p.holds(batch, prompt_len, new_tokens)]
    if not fitting:
        batches = ", ".join(str(b) for b in sorted({p.batch_size for p in points}))
        largest = max(points, key=lambda p: (p.batch_size, p.prompt_len + p.gen_len))
        asked = f"batch {batch}" + (f", a {prompt_len}-token prompt" if prompt_len is not None else "") + \
            (f" and {new_tokens} new tokens" if new_tokens is not None else "")
        raise LiacError(str(_index_path(path)), f"no plan of this sweep holds {asked}: planned batches are "
                        f"{batches}, prompts up to {largest.prompt_len} tokens and contexts up to "
                        f"{largest.prompt_len + largest.gen_len} tokens (compile a sweep with a larger --batch, "
                        f"--prompt-len or --gen-len)")
    chosen = min(fitting, key=lambda p: (p.batch_size, p.prompt_len + p.gen_len, p.file.name))
    if not chosen.file.is_file():
        raise LiacError(str(_index_path(path)), f"lists '{chosen.file.name}', which does not exist beside it")
    return chosen.file
