"""Progress bars for long steps (sweeps, profiling; the runtime's weight loading and generation may use them too).

One rule for every CLI: a bar is drawn on stderr when stderr is a terminal, and nothing at all otherwise (a log,
a pipe, CI), so stdout stays the command's result and redirected stderr stays the errors. tqdm decides that
(`disable=None`: off when the stream is not a TTY).

    with progress_bar(len(batches), "compile opt-30b", unit="plan") as bar:
        for batch in batches:
            ...
            bar.update(1)
"""

from __future__ import annotations

import sys

from tqdm import tqdm

__all__ = ["progress_bar"]


def progress_bar(total: int | None, desc: str, unit: str = "step") -> tqdm:
    """A tqdm bar on stderr, drawn only when stderr is a terminal; it clears itself when closed."""
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=None, leave=False, dynamic_ncols=True)
