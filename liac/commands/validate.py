"""`liac validate PLAN|SWEEP_DIR...`: every schema, semantic and capacity problem, one line each.

Prints each problem as `<file>: <yaml path>: <message>` on stdout and exits 1 when there is any error (the command
ran and found problems; docs/cli.md); otherwise prints one OK line per argument and exits 0. Warnings print with a
'warning: ' prefix and do not fail.
"""

from __future__ import annotations

import sys

from liac.artifacts.validate import validate_path
from liac.errors import EXIT_NEGATIVE
from liac.sweep import CATALOG_NAME, INDEX_NAME

__all__ = ["register", "run"]


def register(sub) -> None:
    parser = sub.add_parser("validate", help="check plan files and sweep directories (schema, semantics, "
                                             "memory capacities, status)",
                            description="Check offload plans: schema, semantics (known sublayers, layer ranges, "
                                        "config hash), memory per tier recomputed from the model config against "
                                        "spec.memory and spec.budgets, and the compiler's status against spec. "
                                        "A directory is checked as a sweep: every plan plus its index.yaml; a "
                                        "directory of sweeps (like plans/) as every sweep plus its sweeps.yaml.")
    parser.add_argument("paths", nargs="+", metavar="PLAN", help="plan file (.yaml), sweep directory, or "
                                                                 "directory of sweeps")
    parser.set_defaults(func=run)


def run(args) -> int:
    failed = False
    for path in args.paths:
        checked, findings = validate_path(path)
        errors = [f for f in findings if f.severity == "error"]
        for finding in findings:
            sys.stdout.write(finding.line() + "\n")
        failed = failed or bool(errors)
        if not errors:
            sys.stdout.write(f"{path}: OK ({_summary(path, checked)})\n")
    return EXIT_NEGATIVE if failed else 0


def _summary(path, checked: list[str]) -> str:
    """'valid plan', '3 plans and index.yaml', '73 plans, 25 index.yaml and sweeps.yaml'."""
    if checked == [str(path)] and not str(path).endswith((INDEX_NAME, CATALOG_NAME)):
        return "valid plan"
    indexes = sum(c.endswith(INDEX_NAME) for c in checked)
    plans = len(checked) - indexes - sum(c.endswith(CATALOG_NAME) for c in checked)
    parts = [f"{plans} plan{'s' if plans != 1 else ''}"]
    if indexes:
        parts.append(INDEX_NAME if indexes == 1 else f"{indexes} {INDEX_NAME}")
    if any(c.endswith(CATALOG_NAME) for c in checked):
        parts.append(CATALOG_NAME)
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
