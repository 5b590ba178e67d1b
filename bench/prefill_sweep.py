"""Re-price every committed device call's prefills with today's cost model: the error per call and overall.

    python bench/prefill_sweep.py --out after.json                       # every i12* call of 2026-12-01..03
    python bench/prefill_sweep.py --out after.json --before before.json  # beside an earlier sweep, per call
    python bench/prefill_sweep.py --out x.json --gpu-gemm-shapes bench/results/h200-2026-12-03/i12b1/gemm-shapes.json

Each call is re-priced as `bench/reprice.py CALL` does (the call's run-profile.yaml, its plans), in one process;
`--gpu-gemm-shapes` sets the profile's `gpu_gemm_bf16_tflops` (Eq. 1c) from bench/gpu_gemm_shapes.py's output for
every call (the calls' profiles predate the field; `--gpu-gemm-cap T` caps it at T TFLOP/s), `--set FIELD=NUMBER`
any number field. Prints, per call, the
median and worst |prefill error| (re-priced / measured − 1) and the median |decode error|, the same over all runs,
and the runs of the two points issue 12 named as over-priced (prompt 1024 batch 8 in i12w and i12wp; the whole
plan's prompt 128 batch 1 in i12b1 and i12wp). No GPU; writes only `--out` (the runs' rows, JSON).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reprice import _number, gemm_curve_from_shapes, load_call_plans, reprice  # noqa: E402

CALLS = "bench/results/h200-2026-12-0[123]/i12*"


def _error(row: dict, phase: str) -> float | None:
    measured, priced = row.get(f"measured_{phase}_ms"), row.get(f"repriced_{phase}_ms")
    return (priced / measured - 1.0) * 100.0 if measured and priced else None


def sweep(pattern: str, overrides: dict) -> dict[str, list[dict]]:
    """Call folder → its runs' rows (bench/reprice.py's `reprice`), each call priced with its own profile plus
    `overrides`."""
    from liac.profile import parse_profile, resolve_profile
    from liac.schema_tools import to_data

    out = {}
    for call in sorted(glob.glob(pattern)):
        folder = Path(call)
        if not (folder / "runs.json").is_file() or not (folder / "run-profile.yaml").is_file():
            continue
        profile = resolve_profile(str(folder / "run-profile.yaml"))
        if overrides:
            data = to_data(profile)
            data.update(overrides)
            data["sources"] = {**data["sources"], **{k: "bench/prefill_sweep.py override" for k in overrides}}
            profile = parse_profile(data, "--set")
        rows = [r for r in reprice(folder, profile, load_call_plans(folder)) if _error(r, "prefill") is not None]
        if rows:
            out[call] = rows
    return out


def _bad_point(call: str, row: dict) -> bool:
    name = Path(call).name
    if name in ("i12w", "i12wp") and row["prompt"] == 1024 and row["batch"] == 8:
        return True
    return name in ("i12b1", "i12wp") and row["prompt"] == 128 and row["batch"] == 1 and row["plan"].endswith(".whole")


def report(after: dict, before: dict | None) -> str:
    lines = []
    head = f"{'call':22s} {'runs':>4s} {'prefill |err| median':>20s} {'worst':>6s} {'decode median':>13s}"
    lines.append(head + (f"   {'before: prefill':>15s} {'worst':>6s} {'decode':>6s}" if before else ""))
    pooled = {"after": ([], []), "before": ([], [])}
    for call, rows in after.items():
        pre = [abs(_error(r, "prefill")) for r in rows]
        dec = [abs(e) for e in (_error(r, "decode") for r in rows) if e is not None]
        pooled["after"][0].extend(pre)
        pooled["after"][1].extend(dec)
        name = "/".join(Path(call).parts[-2:])[len("h200-"):]
        line = (f"{name:22s} {len(rows):4d} {statistics.median(pre):19.1f}% {max(pre):5.1f}% "
                f"{statistics.median(dec) if dec else float('nan'):12.1f}%")
        if before and call in before:
            bpre = [abs(_error(r, "prefill")) for r in before[call]]
            bdec = [abs(e) for e in (_error(r, "decode") for r in before[call]) if e is not None]
            pooled["before"][0].extend(bpre)
            pooled["before"][1].extend(bdec)
            line += (f"   {statistics.median(bpre):14.1f}% {max(bpre):5.1f}% "
                     f"{statistics.median(bdec) if bdec else float('nan'):5.1f}%")
        lines.append(line)
    for key in ("after", "before") if before else ("after",):
        pre, dec = pooled[key]
        if pre:
            lines.append(f"{'all (' + key + ')':22s} {len(pre):4d} {statistics.median(pre):19.2f}% {max(pre):5.1f}% "
                         f"{statistics.median(dec):12.2f}%   (prefill mean |error| {statistics.mean(pre):.2f}%)")
    lines.append("the two over-priced points (issue 12):")
    for call, rows in after.items():
        for i, row in enumerate(rows):
            if _bad_point(call, row):
                was = ""
                if before and call in before and i < len(before[call]) and before[call][i]["plan"] == row["plan"]:
                    was = f" (before {before[call][i]['repriced_prefill_ms']:.1f}, {_error(before[call][i], 'prefill'):+.1f}%)"
                lines.append(f"  {Path(call).name:6s} {row['plan']:40s} measured {row['measured_prefill_ms']:7.1f} "
                             f"priced {row['repriced_prefill_ms']:7.1f} ms {_error(row, 'prefill'):+6.1f}%{was}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", default=CALLS, help=f"glob of call folders (default {CALLS})")
    parser.add_argument("--out", type=Path, required=True, help="write the rows here (JSON)")
    parser.add_argument("--before", type=Path, help="an earlier --out to set beside, per call")
    parser.add_argument("--gpu-gemm-shapes", type=Path, metavar="JSON")
    parser.add_argument("--gpu-gemm-cap", type=float, default=0.0, metavar="TFLOPS",
                        help="cap that curve at this rate (the sustained rate a seconds-long pass keeps)")
    parser.add_argument("--set", type=_number, action="append", default=[], metavar="FIELD=NUMBER")
    args = parser.parse_args(argv)
    overrides = dict(args.set)
    if args.gpu_gemm_shapes:
        overrides["gpu_gemm_bf16_tflops"] = [{"m": m, "tflops": min(t, args.gpu_gemm_cap or t)}
                                             for m, t in gemm_curve_from_shapes(args.gpu_gemm_shapes)]
    after = sweep(args.calls, overrides)
    args.out.write_text(json.dumps(after, indent=0))
    before = json.loads(args.before.read_text()) if args.before else None
    print(report(after, before))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
