"""Does PCIe DMA stream beside a many-row CPU GEMM? (issue 12: prefill splits measured as if it did not.)

    python3 bench/amx_beside_dma.py --out DIR [--seconds 1.5] [--shapes M:N:K,...]

The cost model's Eq. 18a (docs/cost-model.md) had DMA read DDR at the PCIe rate beside a compute-bound CPU GEMM;
the H200 runs of 2026-12-02 measured prefills with CPU work as if it read almost nothing beside it, and the cost
model now prices that (Eq. 18a, prefill). This probe measures it directly, per GEMM shape the plans ran (OPT-30B's
qkv and fc1 at 10 % CPU over 1024 rows, fc1 at 50 % and a whole qkv over 128 rows, out_proj at 5 % over 2048
rows, the rates probe's square 7168² shape, and a batch-1 GEMV for reference):

- the GEMM alone: bf16 F.linear on the CPU (torch's oneDNN/AMX, every intra-op thread) over weights rotated so the
  caches do not hold them, in page-locked host memory as the runtime's arena is; median ms per call;
- pinned host → GPU copies alone (64 MiB each, one stream): GB/s;
- both at once: the copies queued for the whole window on a side stream while the CPU runs the GEMMs; the GEMM's
  ms per call beside the copies, and the GB/s the copies reached meanwhile (copies completed in the window).

`dma_share` = copy GB/s beside the GEMM / alone: 1 is the fluid model's full overlap, 0 the prefill rule's none.
Writes DIR/amx_beside_dma.json and prints one line per shape. About 5 s per shape on the H200 host (≈ 40 s in all,
with the weights' allocation); without CUDA it measures the GEMMs alone (the copies are null).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

SHAPES = (  # (M rows, N features, K) and what it is
    (1024, 2150, 7168, "qkv at 10 % CPU, batch 8 x 128"),
    (1024, 2867, 7168, "fc1 at 10 % CPU, batch 8 x 128"),
    (128, 14336, 7168, "fc1 at 50 % CPU, batch 1 x 128"),
    (128, 21504, 7168, "qkv on the CPU, batch 1 x 128"),
    (2048, 358, 7168, "out_proj at 5 % CPU, 16 x 128"),
    (1024, 7168, 7168, "the AMX probe's square shape"),
    (1, 21504, 7168, "qkv GEMV, decode batch 1"),
)
COPY_BYTES = 64 * 2**20
ROTATE_BYTES = 1 * 2**30  # weights rotated per shape: beyond any L3


def _parse_shapes(text: str) -> tuple:
    out = []
    for item in text.split(","):
        m, n, k = (int(v) for v in item.split(":"))
        out.append((m, n, k, f"{m}x{n}x{k}"))
    return tuple(out)


def _weights(n: int, k: int, rotate_bytes: int, pin) -> list:
    import torch

    count = max(2, min(64, rotate_bytes // (n * k * 2)))
    ws = []
    for _ in range(count):
        w = torch.empty(n, k, dtype=torch.bfloat16)
        w.normal_()
        pin(w)
        ws.append(w)
    return ws


def _gemm_loop(x, ws, calls: int) -> list[float]:
    import torch.nn.functional as F

    seconds = []
    for i in range(calls):
        began = time.perf_counter()
        F.linear(x, ws[i % len(ws)])
        seconds.append(time.perf_counter() - began)
    return seconds


def measure(shapes, seconds: float, rotate_bytes: int) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    pinned_regions = []

    def pin(tensor) -> None:
        if cuda:
            err = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), 0)
            if int(err) == 0:
                pinned_regions.append(tensor)

    result = {"threads": torch.get_num_threads(), "cuda": cuda, "torch": torch.__version__,
              "copy_bytes": COPY_BYTES, "rows": []}
    if cuda:
        device = torch.device("cuda", 0)
        src = torch.empty(COPY_BYTES, dtype=torch.uint8).pin_memory()
        dst = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
        stream = torch.cuda.Stream(device=device)

        def copies_alone(count: int) -> float:
            torch.cuda.synchronize(device)
            began = time.perf_counter()
            with torch.cuda.stream(stream):
                for _ in range(count):
                    dst.copy_(src, non_blocking=True)
            stream.synchronize()
            return count * COPY_BYTES / (time.perf_counter() - began) / 1e9

        copies_alone(4)  # warm
        result["h2d_alone_gb_per_s"] = round(statistics.median(copies_alone(16) for _ in range(3)), 2)

    for m, n, k, what in shapes:
        ws = _weights(n, k, rotate_bytes, pin)
        x = torch.randn(m, k, dtype=torch.bfloat16)
        _gemm_loop(x, ws, 3)  # oneDNN's primitive for this shape
        one = statistics.median(_gemm_loop(x, ws, 5))
        calls = max(5, int(seconds / max(one, 1e-6)))
        alone = _gemm_loop(x, ws, calls)
        row = {"m": m, "n": n, "k": k, "what": what, "gflop": round(2 * m * n * k / 1e9, 3),
               "weight_mb": round(n * k * 2 / 1e6, 1), "calls": calls,
               "gemm_alone_ms": round(statistics.median(alone) * 1e3, 3)}
        row["gemm_alone_tflops"] = round(2 * m * n * k / statistics.median(alone) / 1e12, 3)
        if cuda:
            window = sum(alone) * 1.5 + 0.2
            count = int(window * 60e9 / COPY_BYTES) + 8  # more than the window can copy at any PCIe rate
            events = [torch.cuda.Event() for _ in range(count)]
            torch.cuda.synchronize(device)
            with torch.cuda.stream(stream):
                for event in events:
                    dst.copy_(src, non_blocking=True)
                    event.record(stream)
            time.sleep(0.02)  # the copies are running
            done_before = sum(e.query() for e in events)
            began = time.perf_counter()
            beside = _gemm_loop(x, ws, calls)
            elapsed = time.perf_counter() - began
            done_after = sum(e.query() for e in events)
            stream.synchronize()
            if done_after >= count:
                row["note"] = "the copies ran out before the GEMMs did: the copy rate is a lower bound"
            row["gemm_beside_ms"] = round(statistics.median(beside) * 1e3, 3)
            row["gemm_slowdown"] = round(statistics.median(beside) / statistics.median(alone), 3)
            row["h2d_beside_gb_per_s"] = round((done_after - done_before) * COPY_BYTES / elapsed / 1e9, 2)
            row["dma_share"] = round(row["h2d_beside_gb_per_s"] / result["h2d_alone_gb_per_s"], 3)
        result["rows"].append(row)
        for w in ws:
            if cuda and any(w is p for p in pinned_regions):
                torch.cuda.cudart().cudaHostUnregister(w.data_ptr())
        pinned_regions.clear()
        del ws
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for amx_beside_dma.json")
    parser.add_argument("--seconds", type=float, default=1.5, help="GEMM time per shape and side (default 1.5)")
    parser.add_argument("--shapes", type=_parse_shapes, default=SHAPES, help="M:N:K,... (default: OPT-30B's)")
    parser.add_argument("--rotate-gib", type=float, default=ROTATE_BYTES / 2**30,
                        help="GiB of weights rotated per shape (default 1)")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rotate_gib <= 0:
        print("amx_beside_dma: --seconds and --rotate-gib must be positive", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    result = measure(args.shapes, args.seconds, int(args.rotate_gib * 2**30))
    (args.out / "amx_beside_dma.json").write_text(json.dumps(result, indent=1) + "\n")
    head = f"{result['threads']} threads; H2D alone {result.get('h2d_alone_gb_per_s', '-')} GB/s"
    print(head)
    for row in result["rows"]:
        print(f"{row['what']:34s} {row['m']:5d}x{row['n']:5d}x{row['k']}: alone {row['gemm_alone_ms']:8.3f} ms "
              f"({row['gemm_alone_tflops']:.2f} TFLOP/s), beside DMA {row.get('gemm_beside_ms', '-')} ms; "
              f"DMA beside it {row.get('h2d_beside_gb_per_s', '-')} GB/s (share {row.get('dma_share', '-')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
