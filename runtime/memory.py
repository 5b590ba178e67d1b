"""Memory tiers as arenas: sized exactly from the schedule before anything is allocated, then carved into tensors.

    'hbm'  GPU memory (host memory under the emulated backend)
    'ddr'  host memory, page-locked with cudaHostRegister when there is a GPU, so streaming copies are asynchronous
    'cxl'  host memory on a CPU-less NUMA node (runtime/numa.py), or inside the DDR arena when the host has none

One arena per tier means one allocation per tier: a plan that cannot fit fails at the first allocation with a
one-line LiacError (never a CUDA OOM traceback half way through loading), and the bytes a run reserved per tier
are exact, for the metrics.
"""

from __future__ import annotations

import weakref

import torch

from liac.errors import LiacError
from liac.plan import TIERS
from liac.runtime.backend import Backend
from liac.runtime.numa import CxlPlacement, numa_empty
from liac.sizes import GIB, numel

__all__ = ["ALIGN_BYTES", "HOME", "aligned", "Arena", "TierMemory", "pin_host"]

ALIGN_BYTES = 256  # every tensor starts on a 256-byte boundary (cuBLAS / oneDNN friendly, any dtype can view it)

# The device whose memory a tier is: what computes on a tensor without a copy.
HOME = {"hbm": "gpu", "ddr": "cpu", "cxl": "cpu"}


def aligned(nbytes: int) -> int:
    return (int(nbytes) + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


class Arena:
    """A flat uint8 tensor handed out in aligned pieces (never freed piecewise: the run's layout is static)."""

    def __init__(self, tier: str, storage: torch.Tensor):
        self.tier = tier
        self.storage = storage
        self.used_bytes = 0

    @property
    def capacity_bytes(self) -> int:
        return self.storage.numel()

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel(shape) * torch.empty((), dtype=dtype).element_size()
        start = self.used_bytes
        if start + nbytes > self.capacity_bytes:
            raise RuntimeError(f"arena '{self.tier}' overflow: {start + nbytes} > {self.capacity_bytes} bytes "
                               f"(the schedule's sizing and the loader disagree)")
        self.used_bytes = aligned(start + nbytes)
        return self.storage[start:start + nbytes].view(dtype).view(shape)


class TierMemory:
    """The arenas of one run, keyed by the tier the plan names ('cxl' may be served from the DDR arena)."""

    def __init__(self, backend: Backend, arenas: dict[str, Arena], cxl: CxlPlacement, notes: list[str],
                 pinned: dict[str, bool] | None = None):
        self.backend = backend
        self.arenas = arenas
        self.cxl = cxl
        self.notes = notes  # what the run must say once (a tier left pageable)
        self.pinned = pinned or {}  # host tier → page-locked (checked with is_pinned, not assumed)

    @classmethod
    def allocate(cls, backend: Backend, sizes: dict[str, int], cxl: CxlPlacement) -> "TierMemory":
        """One arena per tier of `sizes[tier]` bytes (already aligned per tensor by the caller).

        Raises:
            LiacError: the GPU or the host cannot supply an arena (names the tier and the size).
        """
        sizes = dict(sizes)
        if cxl.node is None and sizes.get("cxl", 0):  # fallback: 'cxl' tensors live in the DDR arena
            sizes["ddr"] = sizes.get("ddr", 0) + sizes.pop("cxl")
        arenas: dict[str, Arena] = {}
        notes: list[str] = []
        pinned: dict[str, bool] = {}
        for tier, nbytes in sorted(sizes.items()):
            if nbytes == 0 and tier != "ddr":
                continue
            storage = _allocate(backend, tier, nbytes, cxl)
            arenas[tier] = Arena(tier, storage)
            if tier == "hbm" or nbytes == 0:
                continue
            pinned[tier] = pin_host(backend, storage, arenas[tier])
            if backend.pin_memory and not pinned[tier]:
                notes.append(f"the '{tier}' tier could not be page-locked (cudaHostRegister failed): its "
                             f"streaming copies are synchronous")
        if "cxl" not in arenas and "ddr" in arenas:
            arenas["cxl"] = arenas["ddr"]
        return cls(backend, arenas, cxl, notes, pinned)

    def take(self, tier: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return self.arenas[tier].take(shape, dtype)

    def placed_in(self, tier: str) -> str:
        """The tier that really holds tensors of `tier` ('ddr' for 'cxl' without a CXL node)."""
        return self.arenas[tier].tier if tier in self.arenas else tier

    def reserved_bytes(self) -> dict[str, int]:
        """Bytes allocated per physical tier."""
        out = {tier: 0 for tier in TIERS}
        for arena in {id(a): a for a in self.arenas.values()}.values():
            out[arena.tier] += arena.capacity_bytes
        return out


def pin_host(backend: Backend, storage: torch.Tensor, owner: object) -> bool:
    """Page-lock `storage` for as long as `owner` lives; True when it is (the backend checks, not assumes).

    Unregistering must happen before the memory can be freed: the finalizer holds `storage` until `owner` goes.
    """
    if not backend.pin_memory or not backend.pin(storage):
        return False
    weakref.finalize(owner, backend.unpin, storage)
    return True


def _allocate(backend: Backend, tier: str, nbytes: int, cxl: CxlPlacement) -> torch.Tensor:
    gib = nbytes / GIB
    if tier == "hbm":
        device = backend.devices["gpu"]
        if device is None:
            raise LiacError("host", f"the plan puts {gib:.2f} GiB in 'hbm' but there is no GPU")
        try:
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError, or the host allocator under emulation
            raise LiacError("host", f"cannot allocate {gib:.2f} GiB of GPU memory for the 'hbm' tier "
                                    f"(CUDA out of memory): the plan does not fit this GPU") from e
    try:
        if tier == "cxl":
            return numa_empty(nbytes, cxl.node)
        return torch.empty(nbytes, dtype=torch.uint8)
    except (RuntimeError, MemoryError) as e:
        raise LiacError("host", f"cannot allocate {gib:.2f} GiB of host memory for the '{tier}' tier: "
                                f"{' '.join(str(e).split())[:120]}") from e
