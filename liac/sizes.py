"""Sizes and rates: the byte units every part of liac counts in, and the element count of a shape.

Rates are in GB/s (`GB` = 10⁹ bytes), capacities in GiB (`GIB` = 2³⁰ bytes), as the hardware profile's field names
say (`pcie_h2d_gb_per_s`, `gpu_hbm_gib`). Imports nothing: the compiler, the runtime and the tools all use it.

    from liac.sizes import GIB, format_gib, numel
    numel((4, 8)) * 2 / GIB     # bytes of a [4, 8] bf16 tensor, in GiB
"""

from __future__ import annotations

import math
from typing import Iterable

__all__ = ["GB", "GIB", "MIB", "numel", "format_gib"]

GB = 10**9  # rates: GB/s
GIB = 2**30  # capacities: GiB
MIB = 2**20


def numel(shape: Iterable[int]) -> int:
    """Elements of a tensor of `shape` (1 for a scalar's empty shape)."""
    return math.prod(shape)


def format_gib(num_bytes: float) -> str:
    """Bytes as GiB with one decimal ('23.8 GiB'), or MiB below one GiB."""
    if abs(num_bytes) < GIB:
        return f"{num_bytes / MIB:.1f} MiB"
    return f"{num_bytes / GIB:.1f} GiB"
