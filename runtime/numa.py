"""The CXL tier: find a CPU-less NUMA node and allocate host memory on it through libnuma.

CXL Type-3 memory shows up in Linux as a NUMA node with memory and no CPUs. The plan names no node (profiles do not
carry one yet), so the runtime takes the first CPU-less node with memory. Where there is none, 'cxl' tensors stay in
DDR and the run says so once (`CxlPlacement.note`).

Two halves, kept apart on purpose:
    find_cxl_node(read_nodes())   pure placement logic over /sys/devices/system/node (tested on fake trees)
    numa_empty(nbytes, node)      the real allocation: libnuma's numa_alloc_onnode through ctypes, freed by
                                  numa_free when the last tensor viewing it is gone
"""

from __future__ import annotations

import ctypes
import ctypes.util
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from liac.sizes import GIB

__all__ = ["NumaNode", "CxlPlacement", "read_nodes", "find_cxl_node", "plan_cxl_placement", "numa_empty",
           "libnuma", "SYSFS_NODES", "NUMA_STATS"]

SYSFS_NODES = "/sys/devices/system/node"


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node as the OS shows it."""

    index: int
    cpus: tuple[int, ...]
    mem_bytes: int


@dataclass(frozen=True)
class CxlPlacement:
    """Where 'cxl' tensors go on this host: a node index, or None for the DDR fallback (with its note)."""

    node: int | None
    note: str


def _parse_cpulist(text: str) -> tuple[int, ...]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-")
            cpus.extend(range(int(low), int(high) + 1))
        else:
            cpus.append(int(part))
    return tuple(cpus)


def _mem_total_bytes(meminfo: str) -> int:
    for line in meminfo.splitlines():  # "Node 1 MemTotal:       67108864 kB"
        if "MemTotal:" in line:
            return int(line.split("MemTotal:")[1].split()[0]) * 1024
    return 0


def read_nodes(root: str | Path = SYSFS_NODES) -> list[NumaNode]:
    """The NUMA nodes under `root` (sysfs layout: nodeN/cpulist, nodeN/meminfo); empty when unreadable."""
    nodes = []
    root = Path(root)
    if not root.is_dir():
        return nodes
    for path in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            cpus = _parse_cpulist((path / "cpulist").read_text())
            mem = _mem_total_bytes((path / "meminfo").read_text())
        except (OSError, ValueError):
            continue
        nodes.append(NumaNode(int(path.name[4:]), cpus, mem))
    return nodes


def find_cxl_node(nodes: list[NumaNode]) -> NumaNode | None:
    """The first node with memory and no CPUs (how CXL memory expanders appear), or None."""
    for node in sorted(nodes, key=lambda n: n.index):
        if not node.cpus and node.mem_bytes > 0:
            return node
    return None


def plan_cxl_placement(nodes: list[NumaNode], cxl_bytes: int, have_libnuma: bool) -> CxlPlacement:
    """Decide where `cxl_bytes` of 'cxl' tensors go; the note is printed once and written to the metrics."""
    if cxl_bytes == 0:
        return CxlPlacement(None, "")
    node = find_cxl_node(nodes)
    if node is None:
        return CxlPlacement(None, f"no CPU-less NUMA node on this host: {cxl_bytes / GIB:.2f} GiB of 'cxl' tier "
                                  f"tensors are placed in DDR")
    if not have_libnuma:
        return CxlPlacement(None, f"NUMA node {node.index} has no CPUs (CXL) but libnuma cannot be loaded: "
                                  f"{cxl_bytes / GIB:.2f} GiB of 'cxl' tier tensors are placed in DDR")
    if node.mem_bytes < cxl_bytes:
        return CxlPlacement(None, f"CPU-less NUMA node {node.index} holds {node.mem_bytes / GIB:.2f} GiB, less "
                                  f"than the {cxl_bytes / GIB:.2f} GiB of 'cxl' tier tensors: placed in DDR")
    return CxlPlacement(node.index, f"'cxl' tier tensors ({cxl_bytes / GIB:.2f} GiB) are on CPU-less NUMA node "
                                    f"{node.index}")


# ---------------------------------------------------------------------------------------------------------------
# The real allocation path (libnuma through ctypes).

_LIBNUMA: ctypes.CDLL | None = None
NUMA_STATS = {"allocated_bytes": 0, "freed_bytes": 0}  # diagnostics: what numa_empty handed out and got back


def libnuma() -> ctypes.CDLL | None:
    """libnuma, loaded once, or None when it is missing or reports NUMA unavailable."""
    global _LIBNUMA
    if _LIBNUMA is None:
        name = ctypes.util.find_library("numa") or "libnuma.so.1"
        try:
            lib = ctypes.CDLL(name, use_errno=True)
        except OSError:
            return None
        lib.numa_available.restype = ctypes.c_int
        lib.numa_alloc_onnode.restype = ctypes.c_void_p
        lib.numa_alloc_onnode.argtypes = [ctypes.c_size_t, ctypes.c_int]
        lib.numa_free.restype = None
        lib.numa_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        if lib.numa_available() < 0:
            return None
        _LIBNUMA = lib
    return _LIBNUMA


def numa_empty(nbytes: int, node: int) -> torch.Tensor:
    """An uninitialised uint8 host tensor of `nbytes` whose pages are bound to NUMA node `node`.

    The memory is returned with numa_free once the last tensor viewing it is garbage (a finalizer on the ctypes
    buffer that the tensor keeps alive).

    Raises:
        MemoryError: libnuma is missing or the node cannot supply the memory.
    """
    lib = libnuma()
    if lib is None:
        raise MemoryError("libnuma is not available")
    size = max(int(nbytes), 1)
    pointer = lib.numa_alloc_onnode(size, node)
    if not pointer:
        raise MemoryError(f"numa_alloc_onnode({size}, {node}) failed")
    NUMA_STATS["allocated_bytes"] += size
    buffer = (ctypes.c_uint8 * size).from_address(pointer)
    weakref.finalize(buffer, _free, lib, pointer, size)
    return torch.frombuffer(buffer, dtype=torch.uint8)[:nbytes]


def _free(lib: ctypes.CDLL, pointer: int, size: int) -> None:
    lib.numa_free(pointer, size)
    NUMA_STATS["freed_bytes"] += size
