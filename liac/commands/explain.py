"""`liac explain PLAN`: where each sublayer runs and why (prices on both devices, transfers, binding memory).

Re-prices the plan from its spec with the compiler's pricing (liac/passes/price.py); see liac/artifacts/explain.py.
"""

from __future__ import annotations

import json
import sys

from liac.plan import load_plan

__all__ = ["register", "run"]


def register(sub) -> None:
    parser = sub.add_parser("explain", help="where each sublayer of a plan runs and why",
                            description="Re-price a plan from its spec (same trace, profile and cost equations "
                                        "as the compiler) and show, per layer group, phase and unit: its time on "
                                        "the CPU and on the GPU, the PCIe transfers and streaming each choice "
                                        "implies, what moving it would cost, and which memory tier binds.")
    parser.add_argument("plan", metavar="PLAN", help="plan file (.yaml)")
    parser.add_argument("--hw", default=None, help="hardware profile file to price with, when the shipped "
                                                   "profile the plan names has changed since it was compiled")
    parser.add_argument("--batch", type=int, default=None, help="serving plan: the live batch size whose placement "
                                                                "to explain (default: the largest)")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from liac.artifacts.explain import explain_plan, render_text  # late import: pricing loads numpy and the tracer

    explanation = explain_plan(load_plan(args.plan), source=args.plan, hw=args.hw, batch=args.batch)
    if args.format == "json":
        sys.stdout.write(json.dumps(explanation.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render_text(explanation))
    return 0
