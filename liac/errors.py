"""One error family for everything a user can get wrong.

A `LiacError` names where the problem is (a file, a CLI flag, a YAML path) and what was expected. The CLIs print
it as one line and exit with status 2; any other exception is a bug and keeps its traceback.

    plans/opt-30b.yaml: spec.layer_groups[0].sublayers[2].weights: unsupported value 'nvme': must be one of 'hbm', 'ddr', 'cxl'
    compile: constraint mem_hbm: needs 31.2 GiB, --gpu-mem allows 24.0 GiB (short by 7.2 GiB)
"""

from __future__ import annotations

import importlib
import reprlib
from types import ModuleType

__all__ = ["LiacError", "InfeasibleError", "EXIT_NEGATIVE", "EXIT_USER_ERROR", "EXIT_INFEASIBLE", "EXIT_INTERRUPTED",
           "EXTRAS", "require", "brief"]

# Exit codes shared by every CLI (docs/cli.md): 0 success, 1 a negative result (differences, problems found),
# 2 bad input / usage / environment, 3 `liac compile`: some points infeasible, 130 interrupted.
EXIT_NEGATIVE = 1
EXIT_USER_ERROR = 2
EXIT_INFEASIBLE = 3
EXIT_INTERRUPTED = 130

# Optional packages → the extra of pyproject.toml that installs each (tests/test_cli.py keeps the two in step).
EXTRAS = {"matplotlib": "docs", "highspy": "highs", "intel_extension_for_pytorch": "ipex", "accelerate": "bench",
          "fastapi": "serve", "uvicorn": "serve", "pydantic": "serve", "prometheus_client": "serve"}

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8
_REPR.maxlevel = 3


def _size_at_most(value: object, budget: int) -> bool:
    """Whether `value` has at most `budget` elements and characters, counted without building its repr (a
    structure whose repr would be huge is never walked far)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            budget -= len(item)
        elif isinstance(item, dict):
            budget -= len(item)
            if budget >= 0:
                stack.extend(item.keys())
                stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            budget -= len(item)
            if budget >= 0:
                stack.extend(item)
        elif isinstance(item, int) and item.bit_length() > 256:
            return False
        else:
            budget -= 1
        if budget < 0:
            return False
    return True


def brief(value: object, limit: int = 100, quote: bool = True) -> str:
    """A value quoted in an error message, bounded: a long string or a huge (or deeply nested) structure from a
    hostile file must not become a megabyte line (a large value is abbreviated by reprlib, which never builds the
    full repr). `quote=False` for text that is already a message."""
    if isinstance(value, str):
        text = value if not quote else repr(value[:limit + 1])
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        text = f"an integer of {value.bit_length()} bits"
    elif _size_at_most(value, limit):
        text = repr(value)
    else:
        text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


class LiacError(Exception):
    """A problem with the user's input, printed as `<source>: <path>: <message>`.

    Args:
        source: the file, flag or command the problem comes from (e.g. 'plans/a.yaml', '--batch', 'compile').
        message: what is wrong and what was expected ("must be ...").
        path: where inside the source (a YAML path like 'spec.workload.batch_size'); empty when not applicable.
    """

    def __init__(self, source: str, message: str, path: str = ""):
        self.source = str(source)
        self.path = path
        self.message = message
        super().__init__(self.line())

    def line(self) -> str:
        parts = [self.source]
        if self.path:
            parts.append(self.path)
        parts.append(self.message)
        return ": ".join(parts)


class InfeasibleError(LiacError):
    """No placement fits: names the binding memory tier and how many GiB it is short."""

    def __init__(self, source: str, message: str, tier: str = "", short_bytes: int = 0):
        self.tier = tier
        self.short_bytes = short_bytes
        super().__init__(source, message)


def require(module: str, needed_by: str) -> ModuleType:
    """Import an optional package, or raise a one-line LiacError naming the extra that installs it.

    Example: `require("matplotlib", "figures")` without matplotlib raises a LiacError whose line is
    `figures: needs the optional package 'matplotlib': pip install 'liac[docs]'`.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise LiacError(needed_by, f"needs the optional package '{module}': "
                                   f"pip install 'liac[{EXTRAS[module]}]'") from None
