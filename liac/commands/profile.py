"""`liac profile [-o HOST.yaml]`: measure this host and write a hardware profile `liac compile --hw` accepts.

Without `-o` the profile is this host's own (`host`, in the user's cache directory), which `liac compile` uses when
no `--hw` is given. Numbers this host cannot measure (the GPU's, without CUDA; CXL, without a CPU-less NUMA node;
the reserves, which are policy) come from `--base` (a shipped profile or a file) and are listed under `estimates`;
without CUDA the profile has no GPU memory, so plans for it are CPU plans. It says which CPU instruction set it
measured (AMX, AVX-512, AVX2) and warns when there is no AMX.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from liac import host
from liac.errors import LiacError
from liac.fileio import check_writable
from liac.profile import host_profile_path, load_profile, resolve_profile

__all__ = ["register", "run"]


def register(sub) -> None:
    parser = sub.add_parser("profile", help="measure this host and write a hardware profile",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", help="profile file to write (YAML; default: this host's profile in the "
                                               "user's cache directory, what 'liac compile' uses without --hw)")
    parser.add_argument("--name", help="profile name (default: the output file's stem; 'host' without -o)")
    parser.add_argument("--base", default=host.DEFAULT_BASE,
                        help=f"profile supplying what cannot be measured here (default: {host.DEFAULT_BASE})")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (seconds; caches inflate the numbers): for a first look and tests")
    parser.add_argument("--no-gpu", action="store_true", help="skip GPU and PCIe measurements even with CUDA")
    parser.set_defaults(func=run)


def run(args) -> int:
    from liac.probe import ProbeSizes  # late import: measuring loads torch; `liac --help` does not

    base = resolve_profile(args.base, source="--base")
    out = Path(args.output) if args.output else host_profile_path()
    if out.suffix not in (".yaml", ".yml"):
        raise LiacError("--output", f"must end in '.yaml' or '.yml', got '{args.output}'")
    check_writable(out, "--output")  # before minutes of measuring
    isa = host.cpu_isa()
    if not isa.has_amx:
        sys.stderr.write(f"liac profile: warning: this CPU has no AMX (widest bf16 ISA: {isa.name}, from "
                         f"{isa.source}): its bf16 GEMMs run several times slower than on a Xeon with AMX "
                         f"(Sapphire Rapids or later), and the profile's 'cpu_amx_bf16_tflops' holds this "
                         f"{isa.name} rate\n")
    sizes = ProbeSizes.quick() if args.quick else ProbeSizes.full()
    profile = host.measure_profile(sizes, base, name=args.name or out.stem, use_gpu=not args.no_gpu, quick=args.quick)
    if "gpu_bf16_tflops" not in profile.estimates and not args.quick:
        profile = _with_gpu_footprint(profile)
    try:
        host.write_profile(profile, out)
    except OSError as e:
        raise LiacError(str(out), f"cannot write: {e.strerror or e}") from e
    curve = ", ".join(f"M={p.m}: {p.tflops:.2f}" for p in profile.cpu_amx_bf16_tflops)
    print(f"wrote {out}: CPU ISA {isa.name}{'' if isa.has_amx else ' (no AMX)'}; CPU GEMV "
          f"{profile.cpu_ddr_read_gb_per_s:.1f} GB/s, KV read {profile.cpu_kv_read_gb_per_s:.1f} GB/s, "
          f"bf16 TFLOP/s ({isa.name}) {curve}")
    if "gpu_bf16_tflops" not in profile.estimates:
        print(f"  PCIe H2D {profile.pcie_h2d_gb_per_s:.1f} GB/s, D2H {profile.pcie_d2h_gb_per_s:.1f}, both "
              f"{profile.pcie_bidir_gb_per_s:.1f}; CPU+H2D together {profile.ddr_shared_gb_per_s:.1f} GB/s; "
              f"GPU {profile.gpu_bf16_tflops:.0f} TFLOP/s, HBM {profile.gpu_hbm_gb_per_s:.0f} GB/s")
        print(f"  GPU footprint: context {profile.gpu_context_mib:.0f} MiB, library workspaces "
              f"{profile.gpu_library_workspace_mib:.0f} MiB, activations {profile.gpu_activation_factor:.2f}x the "
              f"model (docs/cost-model.md Eq. 14); the runtime's host time {profile.runtime_op_seconds * 1e3:.3f} ms "
              "per unit (Eq. 24)")
    elif profile.gpu_hbm_gib == 0:
        print("  no GPU on this host: its profile has no GPU memory, so plans for it run on the CPU")
    return 0


def _with_gpu_footprint(profile):
    """Run small plans through the runtime on this GPU (liac/host.py `footprint_probes`) and measure what the process
    holds beside a plan's arena (runtime/footprint.py): the footprint fields of Eq. 14, and from the decode steps of
    those that cross PCIe (`op_probes`) the runtime's host time per unit (Eq. 24).

    The runs go in a child process, as a `lia-run` starts: in this one the GPU benchmarks before them left the caching
    allocator with partly used segments (and cuBLAS its workspaces), whose free space hid the probes' activations.
    Measured on the H200 (2026-12-02, call i12v): in-process the probes' activation peaks read 0.00-1.75x the model
    and the workspaces 1 MiB; a fresh process read 2.33x and 33 MiB, and a plan compiled for 1.75x ran out of
    memory in its warm-up."""
    probes = host.footprint_probes(profile) + host.op_probes(profile)
    measured = measure_footprint_in_child(profile)
    return host.with_footprint(profile, probes, measured["library_bytes"], measured["context_bytes"],
                               tuple(measured["activation_bytes"]), tuple(measured["decode_step_seconds"]))


def measure_footprint_in_child(profile, python: str = sys.executable) -> dict:
    """runtime/footprint.py `measure_footprint` over `profile`'s footprint and op probes, in a fresh process
    (`python -m liac.commands.profile PROFILE.yaml`) → its `Footprint` fields as a dict. A failure there is one
    LiacError line (the child's last line of stderr)."""
    with tempfile.TemporaryDirectory(prefix="liac-profile-") as tmp:
        path = host.write_profile(profile, Path(tmp) / "profile.yaml")
        done = subprocess.run([python, "-m", "liac.commands.profile", str(path)], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise LiacError("liac profile", f"measuring the GPU footprint in a fresh process failed: {last}")
    return json.loads(lines[-1])


def _footprint_main(argv: list[str]) -> int:
    """The child of `measure_footprint_in_child`: the probes of the profile at argv[0], measured; one JSON line."""
    from liac.runtime.footprint import measure_footprint  # late import: the runtime a command calls

    profile = load_profile(argv[0])
    probes = host.footprint_probes(profile) + host.op_probes(profile)
    measured = measure_footprint([(p.plan, p.batch, p.prompt_len) for p in probes])
    print(json.dumps(dataclasses.asdict(measured)))
    return 0


if __name__ == "__main__":
    sys.exit(_footprint_main(sys.argv[1:]))
