"""The GPU's bf16 GEMM rate on a decoder's own shapes, by rows (tokens), beside the 8192³ probe's rate.

The cost model prices every GPU GEMM at one rate, the profile's `gpu_bf16_tflops` (liac profile: an 8192³
matmul). Prefill at prompt 1024-4096 multiplies M = batch × prompt rows against the decoder's weight matrices,
whose shapes (K × N) are not square; this measures what those shapes reach on the GPU, so the prefill price's
rate question (docs/benchmarks.md, "Why the prompt-1024 prefill is priced 20-33 % high") has numbers.

    python3 bench/gpu_gemm_shapes.py --hidden 7168 --ffn 28672 --out results.json      # OPT-30B's shapes

Writes one JSON document: the square probe's TFLOP/s and, per (unit, rows), the median seconds and TFLOP/s of
`torch.nn.functional.linear` (the call the runtime makes) with CUDA events around 10 launches.
"""
from __future__ import annotations

import argparse
import json

import torch


def _median_seconds(fn, repeats: int = 10, sustain: float = 0.0) -> float:
    """Median GPU time of `fn` between CUDA events after `sustain` seconds of it back to back: liac.probe's timer,
    the one `liac profile`'s GPU GEMM curve uses (not its wall clock around a synchronise, whose ~10-20 µs of launch
    and sync would weigh on the 0.05-0.5 ms products at few rows)."""
    from liac.probe import _event_seconds

    return _event_seconds(fn, repeats, sustain)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--ffn", type=int, default=28672)
    parser.add_argument("--rows", default="1,8,32,128,256,512,1024,2048,4096,8192")
    parser.add_argument("--sustain-seconds", type=float, default=0.0,
                        help="run each product back to back this long before timing it (liac profile: 0.3)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    dev, dt = "cuda", torch.bfloat16
    h, f = args.hidden, args.ffn
    n = 8192
    a, b = torch.randn(n, n, device=dev, dtype=dt), torch.randn(n, n, device=dev, dtype=dt)
    square = 2 * n ** 3 / _median_seconds(lambda: a @ b) / 1e12
    del a, b
    units = {"qkv": (h, 3 * h), "out_proj": (h, h), "fc1": (h, f), "fc2": (f, h)}
    rows = [int(r) for r in args.rows.split(",")]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "square_8192_tflops": square,
              "sustain_seconds": args.sustain_seconds,
              "units": {}}
    for unit, (k, nout) in units.items():
        w = torch.randn(nout, k, device=dev, dtype=dt)
        per = {}
        for m in rows:
            x = torch.randn(m, k, device=dev, dtype=dt)
            s = _median_seconds(lambda: torch.nn.functional.linear(x, w), sustain=args.sustain_seconds)
            per[str(m)] = {"seconds": s, "tflops": 2 * m * k * nout / s / 1e12}
        result["units"][unit] = {"k": k, "n": nout, "rows": per}
        del w
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)
    print(f"square {square:.0f} TFLOP/s; " + "; ".join(
        f"{u} " + " ".join(f"{m}:{v['rows'][str(m)]['tflops']:.0f}" for m in rows if m >= 128)
        for u, v in result["units"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
