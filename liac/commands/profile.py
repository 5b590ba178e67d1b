"""`liac profile -o HOST.yaml`: measure this host and write a hardware profile `liac compile --hw` accepts.

Numbers this host cannot measure (the GPU's, without CUDA; CXL, without a CPU-less NUMA node; the reserves, which
are policy) come from `--base` (a shipped profile or a file) and are listed under `estimates`.
"""

from __future__ import annotations

import os
import platform
import sys

from liac.errors import LiacError

__all__ = ["register", "profile_from_measurements"]


def register(sub) -> None:
    parser = sub.add_parser("profile", help="measure this host and write a hardware profile",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", required=True, help="profile file to write (YAML)")
    parser.add_argument("--name", help="profile name (default: the output file's stem)")
    parser.add_argument("--base", default="h200-amx16",
                        help="profile supplying what cannot be measured here (default: h200-amx16)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (seconds; caches inflate the numbers): for a first look and tests")
    parser.add_argument("--no-gpu", action="store_true", help="skip GPU and PCIe measurements even with CUDA")
    parser.set_defaults(func=run)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def profile_from_measurements(m, base, name: str, description: str):
    """Measurements + a base profile → HardwareProfile (measured fields replace the base's)."""
    import dataclasses

    from liac.profile import CurvePoint
    from liac.schema_tools import stable_float

    how = f"liac profile on this host ({m.cpu_threads} threads)"
    fields: dict = {}
    sources = dict(base.sources)
    estimates = set(base.estimates)

    def measured(field: str, value, text: str) -> None:
        fields[field] = value
        sources[field] = f"{how}: {text}"
        estimates.discard(field)

    measured("cpu_amx_bf16_tflops", tuple(CurvePoint(m=rows, tflops=stable_float(max(tflops, 1e-6), 4))
                                          for rows, tflops in m.cpu_gemm_tflops),
             "bf16 F.linear over rotated weights at M = " + ", ".join(str(r) for r, _ in m.cpu_gemm_tflops))
    measured("cpu_ddr_read_gb_per_s", m.cpu_gemv_gb_per_s, f"GEMV ({m.cpu_gemv_kernel}) over rotated weights")
    measured("cpu_kv_read_gb_per_s", m.cpu_kv_read_gb_per_s, "scaled_dot_product_attention over a bf16 KV cache")
    measured("cpu_launch_seconds", m.cpu_launch_seconds, "median time of a tiny in-place op")
    measured("split_sync_seconds", m.split_sync_seconds,
             "median round trip of a tiny op handed to a persistent worker thread and joined, plus the merge's "
             "concatenation, less the same ops inline" + (" (with a CUDA event record and wait)"
                                                           if m.gpu_bf16_tflops is not None else " (no GPU: CPU side only)"))
    if m.cpu_ddr_gib:
        measured("cpu_ddr_gib", m.cpu_ddr_gib, "MemTotal in /proc/meminfo")
    if m.gpu_bf16_tflops is not None:
        for field, text in [("gpu_bf16_tflops", "8192³ bf16 matmul"), ("gpu_hbm_gb_per_s", "device copy, read+write"),
                            ("gpu_hbm_gib", "device total memory"), ("gpu_launch_seconds", "tiny kernel launches"),
                            ("pcie_h2d_gb_per_s", "pinned host-to-device copy"),
                            ("pcie_d2h_gb_per_s", "pinned device-to-host copy"),
                            ("pcie_bidir_gb_per_s", "H2D and D2H on two streams at once"),
                            ("pcie_latency_seconds", "4 KiB pinned copy")]:
            measured(field, getattr(m, field), text)
        measured("ddr_shared_gb_per_s", m.concurrent_cpu_gb_per_s + m.concurrent_h2d_gb_per_s,
                 f"CPU GEMV ({m.concurrent_cpu_gb_per_s:.1f} GB/s) while pinned H2D runs "
                 f"({m.concurrent_h2d_gb_per_s:.1f} GB/s), summed")
    for field in set(base.sources) - set(fields):
        if field not in ("gpu_reserve_gib", "cpu_reserve_gib"):  # reserves are policy, not estimates
            estimates.add(field)
            sources[field] = f"from base profile '{base.name}': {base.sources[field]}"
    return dataclasses.replace(base, name=name, description=description, sources=sources,
                               estimates=tuple(sorted(estimates)), **fields)


def run(args) -> int:
    from pathlib import Path

    import torch

    from liac.plan import write_atomic, yaml_dump
    from liac.probe import ProbeSizes, measure_host
    from liac.profile import parse_profile, resolve_profile

    base = resolve_profile(args.base, source="--base")
    out = Path(args.output)
    if out.suffix not in (".yaml", ".yml"):
        raise LiacError("--output", f"must end in '.yaml' or '.yml', got '{args.output}'")
    name = args.name or out.stem
    use_gpu = torch.cuda.is_available() and not args.no_gpu
    sizes = ProbeSizes.quick() if args.quick else ProbeSizes.full()
    measurements = measure_host(sizes, progress=lambda text: print(text, file=sys.stderr, flush=True),
                                use_gpu=use_gpu)
    gpu_name = torch.cuda.get_device_name(0) if use_gpu else f"no GPU measured (GPU numbers from '{base.name}')"
    description = f"{_cpu_name()}, {os.cpu_count()} CPUs; {gpu_name}" + (" [--quick sizes]" if args.quick else "")
    profile = profile_from_measurements(measurements, base, name, description)
    from liac.schema_tools import to_data
    data = to_data(profile)
    parse_profile(data, str(out))  # what we write must load
    write_atomic(out, yaml_dump(data))
    curve = ", ".join(f"M={p.m}: {p.tflops:.2f}" for p in profile.cpu_amx_bf16_tflops)
    print(f"wrote {out}: CPU GEMV {profile.cpu_ddr_read_gb_per_s:.1f} GB/s, KV read "
          f"{profile.cpu_kv_read_gb_per_s:.1f} GB/s, AMX TFLOP/s {curve}")
    if use_gpu:
        print(f"  PCIe H2D {profile.pcie_h2d_gb_per_s:.1f} GB/s, D2H {profile.pcie_d2h_gb_per_s:.1f}, both "
              f"{profile.pcie_bidir_gb_per_s:.1f}; CPU+H2D together {profile.ddr_shared_gb_per_s:.1f} GB/s; "
              f"GPU {profile.gpu_bf16_tflops:.0f} TFLOP/s, HBM {profile.gpu_hbm_gb_per_s:.0f} GB/s")
    return 0
