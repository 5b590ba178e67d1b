"""`liac`: the compiler's command line. Thin: parse, call one library function, write, exit.

Each subcommand lives in `liac/commands/<name>.py` with `register(subparsers)`; its handler returns an exit code.
A `LiacError` prints as one line on stderr and exits 2, as does an OSError (a file or directory the system refused:
name too long, no space left); Ctrl-C anywhere, imports included, prints one line and exits 130 (every writer is
atomic, so nothing is half-written); anything else is a bug and keeps its traceback. Exit codes (docs/cli.md):
0 success, 1 a negative result, 2 bad input, 3 some compile points infeasible, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
from importlib import metadata

import liac
from liac.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, LiacError, brief

__all__ = ["main", "build_parser", "version_text", "COMMANDS", "OneLineParser", "report_os_error", "interrupted",
           "checked_type", "seed_type"]

COMMANDS = ("inspect", "compile", "validate", "explain", "diff", "docs", "profile", "calibrate", "demo")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line ('liac compile: --batch: ...') and exit 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        sys.stderr.write(f"{self.prog}: {one_line(message)} (see '{self.prog} --help')\n")
        sys.exit(EXIT_USER_ERROR)


def checked_type(convert, ok, rule: str):
    """An argparse type: `convert`, then `ok`, else the one-line error 'must be <rule>, got '<text>''."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got '{text}'")
        return value
    return parse


# a seed: below 2⁶³, what torch's generators take (lia-run --random-weights / --seed, lia-serve --random-weights)
seed_type = checked_type(int, lambda v: 0 <= v < 2**63, "an integer at least 0")


def one_line(text: str, limit: int = 1000) -> str:
    """`text` as one bounded line: control characters (a newline inside an argument argparse quotes) escaped, and
    at most `limit` characters."""
    text = "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit] + "…"


def version_text(prog: str) -> str:
    """'liac 0.1.0 (torch 2.13.0+cpu, Python 3.11.9)': torch's version from its package metadata, so `--version`
    answers without importing torch."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    return f"{prog} {liac.__version__} (torch {torch_version}, Python {platform.python_version()})"


def build_parser() -> OneLineParser:
    """The `liac` parser with every subcommand registered (docs/cli.md documents each flag; a test checks it)."""
    parser = OneLineParser(prog="liac", description="Compile offload plans for single-GPU LLM inference with "
                                                    "CPU (AMX) compute.")
    parser.add_argument("--version", action="version", version=version_text("liac"))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        importlib.import_module(f"liac.commands.{name}").register(sub)
    return parser


def interrupted(command: str, note: str = "") -> int:
    """Ctrl-C: one line on stderr ('<command>: interrupted (<note>)'); returns exit status 130."""
    sys.stderr.write(f"{command}: interrupted" + (f" ({note})" if note else "") + "\n")
    # Note: a KeyboardInterrupt that passed through C++ running Python code (pybind11's exec inside torch, for
    # one) leaves CPython's "unhandled KeyboardInterrupt" flag set, and the interpreter would then end by killing
    # itself with SIGINT instead of exiting 130. Running a string through exec() resets that flag.
    exec("")  # noqa: S102
    return EXIT_INTERRUPTED


def report_os_error(e: OSError) -> str:
    """An OSError as one line: the file it is about and the system's reason."""
    where = f"{brief(str(e.filename), 120, quote=False)}: " if e.filename is not None else ""
    return f"{where}{e.strerror or brief(str(e), 200, quote=False)}"


def main(argv: list[str] | None = None) -> int:
    command = "liac"
    try:
        args = build_parser().parse_args(argv)  # inside the try: Ctrl-C while the commands import is one line
        command = f"liac {args.command}"
        return int(args.func(args) or 0)
    except LiacError as e:
        sys.stderr.write(f"{command}: {e.line()}\n")
        return EXIT_USER_ERROR
    except OSError as e:
        sys.stderr.write(f"{command}: {report_os_error(e)}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return interrupted(command)


if __name__ == "__main__":
    sys.exit(main())
