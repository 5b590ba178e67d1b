"""`liac compile` (not yet implemented)."""

from __future__ import annotations

from liac.errors import LiacError

__all__ = ["register"]


def register(sub) -> None:
    parser = sub.add_parser("compile", help="(not yet implemented)")
    parser.set_defaults(func=run)


def run(args) -> int:
    raise LiacError("compile", "not implemented yet")
