"""Does the page size of host memory change the rates that bound decode? (issue 12/16: the CPU read and the copies.)

    python3 bench/thp_probe.py --out thp.json [--gib 8] [--rounds 3]

The runtime's host arenas are plain `torch.empty` blocks page-locked with cudaHostRegister (runtime/memory.py):
whether the kernel backs them with 2 MiB pages depends on the machine's transparent-huge-page mode and on how
fragmented memory is by then. This allocates two blocks of `--gib` GiB each, one as the runtime does and one with
`madvise(MADV_HUGEPAGE)` before its pages are first touched, and times on each, alternating A B B A per round:

  gemv      bf16 `F.linear` of one row against [7168, 7168] weight slices rotated over the whole block (the decode
            GEMV's shape on OPT-30B), all of torch's CPU threads → GB/s of weights read
  h2d       where there is a GPU: the block page-locked (cudaHostRegister), then 256 MiB pinned copies to the GPU
            rotated over it → GB/s

and records the machine's THP mode, each block's AnonHugePages share (from /proc/self/smaps), and the rates.
No wall-clock assertion anywhere: a measurement for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

MADV_HUGEPAGE = 14
GIB = 2**30


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        return f"unreadable: {e}"


def huge_share(address: int, nbytes: int) -> float:
    """AnonHugePages / Rss of the mappings overlapping [address, address + nbytes) (from /proc/self/smaps)."""
    rss = huge = 0
    inside = False
    for line in _read("/proc/self/smaps").splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < address + nbytes and hi > address
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1])
        elif inside and line.startswith("AnonHugePages:"):
            huge += int(line.split()[1])
    return huge / rss if rss else 0.0


def block(nbytes: int, hugepage: bool) -> tuple[torch.Tensor, object]:
    """A host block of `nbytes`: torch.empty as the runtime allocates, or an anonymous mmap advised MADV_HUGEPAGE
    (2 MiB aligned) before any page is touched; touched either way (zero_, parallel)."""
    if not hugepage:
        t = torch.empty(nbytes, dtype=torch.uint8)
        t.zero_()
        return t, None
    m = mmap.mmap(-1, nbytes + 2 * 2**20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    rc = libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(nbytes + 2 * 2**20), MADV_HUGEPAGE)
    offset = (-base) % (2 * 2**20)
    t = torch.frombuffer(m, dtype=torch.uint8, count=nbytes, offset=offset)
    t.zero_()
    return t, {"mmap": m, "madvise_rc": rc}


def gemv_gb_per_s(storage: torch.Tensor, hidden: int = 7168, passes: int = 2) -> float:
    weights = storage[: (storage.numel() // (hidden * hidden * 2)) * hidden * hidden * 2].view(torch.bfloat16)
    mats = weights.view(-1, hidden, hidden)
    x = torch.randn(1, hidden, dtype=torch.bfloat16)
    F.linear(x, mats[0])  # oneDNN's first-call setup outside the timing
    began = time.perf_counter()
    for _ in range(passes):
        for w in mats:
            F.linear(x, w)
    return passes * mats.numel() * 2 / (time.perf_counter() - began) / 1e9


def h2d_gb_per_s(storage: torch.Tensor, chunk: int = 256 * 2**20, passes: int = 2) -> float | None:
    if not torch.cuda.is_available():
        return None
    nbytes = storage.numel()
    err = torch.cuda.cudart().cudaHostRegister(storage.data_ptr(), nbytes, 0)
    if int(err) != 0:
        return None
    try:
        dst = torch.empty(chunk, dtype=torch.uint8, device="cuda")
        stream = torch.cuda.Stream()
        count = nbytes // chunk
        with torch.cuda.stream(stream):
            dst.copy_(storage[:chunk], non_blocking=True)
        stream.synchronize()
        began = time.perf_counter()
        with torch.cuda.stream(stream):
            for _ in range(passes):
                for i in range(count):
                    dst.copy_(storage[i * chunk:(i + 1) * chunk], non_blocking=True)
        stream.synchronize()
        return passes * count * chunk / (time.perf_counter() - began) / 1e9
    finally:
        torch.cuda.cudart().cudaHostUnregister(storage.data_ptr())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gib", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    nbytes = int(args.gib * GIB)
    record = {"thp_enabled": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
              "thp_defrag": _read("/sys/kernel/mm/transparent_hugepage/defrag"),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "gib": args.gib, "rounds": []}
    began = time.perf_counter()
    plain, _ = block(nbytes, hugepage=False)
    plain_s = time.perf_counter() - began
    began = time.perf_counter()
    huge, keep = block(nbytes, hugepage=True)
    huge_s = time.perf_counter() - began
    record["touch_seconds"] = {"plain": round(plain_s, 2), "madvise": round(huge_s, 2)}
    record["madvise_rc"] = keep["madvise_rc"]
    record["huge_share"] = {"plain": round(huge_share(plain.data_ptr(), nbytes), 3),
                            "madvise": round(huge_share(huge.data_ptr(), nbytes), 3)}
    for r in range(args.rounds):
        order = [("plain", plain), ("madvise", huge)]
        order = order + order[::-1]
        row = {"gemv": {"plain": [], "madvise": []}, "h2d": {"plain": [], "madvise": []}}
        for name, t in order:
            row["gemv"][name].append(round(gemv_gb_per_s(t), 2))
        for name, t in order:
            rate = h2d_gb_per_s(t)
            if rate is not None:
                row["h2d"][name].append(round(rate, 2))
        record["rounds"].append(row)
        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "rounds"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
