"""`liac validate PLAN|SWEEP_DIR...`: every schema, semantic and capacity problem, one line each.

Prints each problem as `<file>: <yaml path>: <message>` on stdout and exits 2 when there is any error; otherwise
prints one OK line per argument and exits 0. Warnings print with a 'warning: ' prefix and do not fail.
"""

from __future__ import annotations

import sys

__all__ = ["register", "run"]


def register(sub) -> None:
    parser = sub.add_parser("validate", help="check plan files and sweep directories (schema, semantics, "
                                             "memory capacities, status)",
                            description="Check offload plans: schema, semantics (known sublayers, layer ranges, "
                                        "config hash), memory per tier recomputed from the model config against "
                                        "spec.memory and spec.budgets, and the compiler's status against spec. "
                                        "A directory is checked as a sweep: every plan plus its index.yaml.")
    parser.add_argument("paths", nargs="+", metavar="PLAN", help="plan file (.yaml) or sweep directory")
    parser.set_defaults(func=run)


def run(args) -> int:
    from liac.artifacts.validate import validate_path

    failed = False
    for path in args.paths:
        checked, findings = validate_path(path)
        errors = [f for f in findings if f.severity == "error"]
        for finding in findings:
            sys.stdout.write(finding.line() + "\n")
        failed = failed or bool(errors)
        if not errors:
            what = f"{len(checked) - 1} plans and index.yaml" if len(checked) > 1 else "valid plan"
            sys.stdout.write(f"{path}: OK ({what})\n")
    return 2 if failed else 0
