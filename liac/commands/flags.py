"""The command line's small parsers: flag text → value, or one LiacError line naming the flag.

Each has a twin in the library's own arguments (`liac.api.compile_plans(batches=(1, 8), gpu_mem=24 * GIB)`), so
these turn what a user types into those values and nothing more. Not a command: `liac.cli.COMMANDS` lists those.

    parse_batches("1..256")            # (1, 2, 4, ..., 256)
    parse_bytes("24GiB", "--gpu-mem")  # 25769803776
    parse_batch_weights("1:4,8:2")     # {1: 4, 8: 2}; '4,2,1' → (4, 2, 1), one per batch size
"""

from __future__ import annotations

import re

from liac.errors import LiacError, brief
from liac.plan import MAX_BATCH, MAX_BYTES

__all__ = ["parse_batches", "parse_bytes", "positive_int", "parse_batch_weights"]


def parse_batches(text: str, source: str = "--batch") -> tuple[int, ...]:
    """'1..256' (powers of two from 1 to 256), '1,8,64', or '32' → sorted distinct batch sizes."""
    text = text.strip()
    match = re.fullmatch(r"(\d+)\.\.(\d+)", text)
    if match:
        low, high = int(match.group(1)), int(match.group(2))
        if low < 1 or high < low:
            raise LiacError(source, f"range {brief(text)} must have 1 <= low <= high")
        if high > MAX_BATCH:
            raise LiacError(source, f"range {brief(text)} must end at most at {MAX_BATCH}")
        if low & (low - 1):
            raise LiacError(source, f"range {brief(text)} must start at a power of two (it steps by doubling)")
        values = []
        value = low
        while value <= high:
            values.append(value)
            value *= 2
        return tuple(values)
    values = []
    for part in text.split(","):
        part = part.strip()
        if not re.fullmatch(r"\d+", part) or not 1 <= int(part) <= MAX_BATCH:
            raise LiacError(source, f"must be a positive integer (at most {MAX_BATCH}), a list like '1,8,64' or a "
                            f"range like '1..256', got {brief(text)}")
        values.append(int(part))
    return tuple(sorted(set(values)))


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, source: str) -> int:
    """'24GiB', '24GB', '512MiB', '1.5TiB', '4096B' or '0' → bytes (GB = 10⁹, GiB = 2³⁰). A number without a
    unit other than 0 is refused: '24' meant as GiB would silently be 24 bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match and not unit and float(match.group(1)) == 0:
        return 0
    if not match or unit not in _UNITS:
        raise LiacError(source, f"must be a size with a unit, like '24GiB', '24GB' or '512MiB' (or 0), got "
                                f"{brief(str(text))}")
    value = float(match.group(1)) * _UNITS[unit]
    if not value <= MAX_BYTES:  # also an overflow to infinity
        raise LiacError(source, f"must be at most {MAX_BYTES} bytes (1 EiB), got {brief(str(text))}")
    return int(value)


def positive_int(text: str, flag: str) -> int:
    """'8' → 8; anything but a positive integer raises LiacError naming the flag."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise LiacError(flag, f"must be a positive integer, got {brief(str(text))}") from None
    if value < 1:
        raise LiacError(flag, f"must be a positive integer, got {brief(str(text))}")
    return value


def parse_batch_weights(text: str, source: str = "--batch-weights") -> dict[int, int] | tuple[int, ...]:
    """'1:4,8:2,64:1' (batch: weight; sizes left out weigh 0) → {1: 4, 8: 2, 64: 1}, or '4,2,1' (one weight per
    batch size, in ascending order) → (4, 2, 1). Weights are integers at least 0 (relative: a histogram of live
    batch sizes works as it is); `liac.api.compile_serving` checks them against the batch sizes."""
    parts = [part.strip() for part in text.split(",")]
    keyed = [re.fullmatch(r"(\d+)\s*:\s*(\d+)", part) for part in parts]
    if all(keyed):
        out = {}
        for match in keyed:
            batch, weight = int(match.group(1)), int(match.group(2))
            if batch < 1 or batch in out:
                raise LiacError(source, f"batch sizes must be positive and named once, got '{text}'")
            out[batch] = weight
        return out
    if all(re.fullmatch(r"\d+", part) for part in parts):
        return tuple(int(part) for part in parts)
    raise LiacError(source, f"must be weights per batch size like '1:4,8:2,64:1', or one per batch size like "
                            f"'4,2,1', got '{text}'")
