"""Does a narrow CPU GEMM (few output features N) run below the AMX curve the profile prices it at?

    python bench/narrow_gemm.py --out $OUT/narrow_gemm.json        # on the device, CPU only, ~2-4 minutes

The profile's GEMM curve (`cpu_amx_bf16_tflops`, liac profile) is measured by M alone, on square K × K weights
(K = 8192 on a large host), and its GEMV rate (`cpu_ddr_read_gb_per_s`) over a 1 GiB matrix. A split unit's CPU part
(docs/cost-model.md Eq. 15) computes only N · permille / 1000 of a unit's output features: 358 to 3942 features
in the splits call i12j/i12k profiled, where it ran 1.2-1.4x its price in decode (bench/reprice.py --split-parts).
This times `F.linear` (the runtime's CPU part) of bf16 weights [N, K] at each M and N, over rotated copies of the
weights that hold at least 1 GiB for M < 128 (memory-bound: each step reads fresh weights, as a decode step does),
one copy from M = 128 (compute-bound, as the profile's curve), on all the host's cores; writes one JSON row per
shape (seconds, TFLOP/s, weight GB/s) and prints the table. No GPU needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROWS_M = (1, 8, 32, 64, 128, 1024)
FEATURES_N = (358, 1792, 2867, 7168, 15081, 22622)
INNER_K = (7168, 28672)


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: kernel choice, page faults
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(rows_m=ROWS_M, features_n=FEATURES_N, inner_k=INNER_K, rotate_bytes: int = 1 << 30,
            repeats: int = 5) -> list[dict]:
    """One row per (K, N, M): the median seconds of one F.linear over a fresh weight, its TFLOP/s and weight GB/s."""
    out = []
    for k in inner_k:
        for n in features_n:
            one = n * k * 2
            weights = [torch.randn(n, k, dtype=torch.bfloat16) * 0.02 for _ in range(max(2, -(-rotate_bytes // one)))]
            for m in rows_m:
                ws = weights if m < 128 else weights[:1]
                x = torch.randn(m, k, dtype=torch.bfloat16)

                def run(ws=ws, x=x):
                    for w in ws:
                        F.linear(x, w)

                seconds = _median_seconds(run, repeats) / len(ws)
                out.append({"k": k, "n": n, "m": m, "seconds": seconds,
                            "tflops": 2.0 * m * n * k / seconds / 1e12, "weight_gb_per_s": one / seconds / 1e9})
            del weights
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small shapes (a check that the script runs)")
    args = parser.parse_args(argv)
    if args.quick:
        rows = measure(rows_m=(1, 128), features_n=(64, 256), inner_k=(256,), rotate_bytes=1 << 20, repeats=2)
    else:
        rows = measure(repeats=args.repeats)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"threads {torch.get_num_threads()}; F.linear bf16, TFLOP/s (weight GB/s) by N; rows M")
    for k in sorted({r["k"] for r in rows}):
        ns = sorted({r["n"] for r in rows if r["k"] == k})
        print(f"K = {k}: " + " ".join(f"{'N=' + str(n):>16s}" for n in ns))
        for m in sorted({r["m"] for r in rows if r["k"] == k}):
            cells = {r["n"]: r for r in rows if r["k"] == k and r["m"] == m}
            print(f"  M = {m:5d} " + " ".join(f"{cells[n]['tflops']:7.3f} ({cells[n]['weight_gb_per_s']:5.1f})"
                                             for n in ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
