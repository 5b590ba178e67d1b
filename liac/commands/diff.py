"""`liac diff A B`: semantic differences between two plans, or two sweep directories paired by file name.

Exit status as diff(1): 0 when there is no semantic difference (prints "no semantic differences"), 1 when there
is one, 2 on bad input (a file that does not load, a file compared with a directory).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from liac.artifacts.diff import SweepPairs, diff_plans, pair_sweeps
from liac.errors import EXIT_NEGATIVE, LiacError
from liac.plan import load_plan

__all__ = ["register", "run", "render_text"]


def register(sub) -> None:
    parser = sub.add_parser("diff", help="semantic differences between two plans or two sweep directories",
                            description="Compare two plans layer by layer: placement per phase, weight and KV tiers, "
                                        "workload, budgets, memory per tier, predicted latency and tokens/s (in %). "
                                        "Directories are compared plan by plan, paired by file name. Exit status "
                                        "0: equivalent, 1: different, 2: bad input.")
    parser.add_argument("a", metavar="A", help="plan file or sweep directory")
    parser.add_argument("b", metavar="B", help="plan file or sweep directory")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    parser.set_defaults(func=run)


def _diffs(a: Path, b: Path) -> tuple[list, SweepPairs]:
    """(the diff of every pair, the pairing: plan files in one directory only); two files are one pair."""
    if a.is_dir() != b.is_dir():
        raise LiacError("diff", f"must compare two plan files or two sweep directories, got '{a}' and '{b}'")
    paired = pair_sweeps(a, b) if a.is_dir() else SweepPairs([(a, b)], [], [])
    return [diff_plans(load_plan(x), load_plan(y), str(x), str(y)) for x, y in paired.pairs], paired


def render_text(diffs, only_a, only_b) -> str:
    """Text report: a '--- A / +++ B' header per differing pair, one line per change."""
    lines = []
    for diff in diffs:
        if not diff.changes:
            continue
        lines += [f"--- {diff.a}", f"+++ {diff.b}"]
        lines += [f"  {change.line()}" for change in diff.changes]
    lines += [f"only in A: {path}" for path in only_a] + [f"only in B: {path}" for path in only_b]
    return "\n".join(lines) + "\n" if lines else "no semantic differences\n"


def run(args) -> int:
    diffs, paired = _diffs(Path(args.a), Path(args.b))
    only_a, only_b = paired.only_a, paired.only_b
    different = bool(only_a or only_b or any(d.changes for d in diffs))
    if args.format == "json":
        doc = {"different": different,
               "plans": [{"a": d.a, "b": d.b, "changes": [c.to_json() for c in d.changes]} for d in diffs],
               "only_in_a": [str(p) for p in only_a], "only_in_b": [str(p) for p in only_b]}
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render_text(diffs, only_a, only_b))
    return EXIT_NEGATIVE if different else 0
