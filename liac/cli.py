"""`liac`: the compiler's command line. Thin: parse, call one library function, write, exit.

Each subcommand lives in `liac/commands/<name>.py` with `register(subparsers)`; its handler returns an exit code.
A `LiacError` prints as one line on stderr and exits 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from liac.errors import EXIT_USER_ERROR, LiacError

__all__ = ["main", "COMMANDS", "OneLineParser"]

COMMANDS = ("inspect", "compile", "validate", "explain", "diff", "docs", "profile", "calibrate", "demo")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line ('liac compile: --batch: ...') and exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"{self.prog}: {message} (see '{self.prog} --help')\n")
        sys.exit(EXIT_USER_ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="liac", description="Compile offload plans for single-GPU LLM inference with "
                                                    "CPU (AMX) compute.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        importlib.import_module(f"liac.commands.{name}").register(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LiacError as e:
        sys.stderr.write(f"liac {args.command}: {e.line()}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
