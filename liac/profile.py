"""`HardwareProfile`: what the cost model knows about one machine (GPU, CPU with AMX, memory tiers, PCIe).

A profile is a YAML file with the fields of `HardwareProfile`, loaded with path-named errors
(`liac.schema_tools.from_data`). Rates are in GB/s (10⁹ bytes per second), capacities in GiB (2³⁰ bytes),
throughputs in TFLOP/s (10¹² FLOP/s), times in seconds unless a name says otherwise. Every number says where it
comes from (`sources`, field name → text) and which numbers are estimates rather than measurements (`estimates`).

Shipped profiles live in `liac/profiles/<name>.yaml` (package data); `resolve_profile` takes a shipped name
(`spr-h100`), a path to a user's file (`--hw my.yaml`), a bare file name whose stem is a shipped profile
(`spr-h100.yaml`), or `host`: this machine's profile in the user's cache directory (`host_profile_path()`, written
by `liac profile`, or by `liac compile` without `--hw` on first use; liac/host.py). `sha256()` hashes the canonical form, so a plan records exactly which numbers it was built on.

    from liac.profile import resolve_profile
    hw = resolve_profile("spr-h100")
    hw.cpu_tflops_at(16)   # AMX throughput for a 16-row GEMM, interpolated in log M
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import platformdirs

from liac.errors import LiacError, brief
from liac.fileio import parse_yaml, read_yaml
from liac.schema_tools import from_data, spec_field, to_data
from liac.sizes import GIB, MIB

__all__ = ["CurvePoint", "HardwareProfile", "HOST_PROFILE", "OPTIONAL_FIELDS", "load_profile", "parse_profile", "resolve_profile",
           "profile_names", "host_profile_path"]

HOST_PROFILE = "host"  # the name of this machine's own profile, kept in the user's cache directory


@dataclass(frozen=True)
class CurvePoint:
    """One measured (or estimated) point of a throughput curve over GEMM rows M."""

    m: int = spec_field("GEMM rows (tokens multiplied by the weight at once)", minimum=1, maximum=2**24)
    tflops: float = spec_field("bf16 TFLOP/s reached at this M", minimum=0)


@dataclass(frozen=True)
class HardwareProfile:
    """One machine, as the cost model sees it (see docs/cost-model.md for how each number is used)."""

    name: str = spec_field("profile name (the file stem for shipped profiles)")
    description: str = spec_field("what machine this is")
    # GPU
    gpu_bf16_tflops: float = spec_field("GPU dense bf16 GEMM throughput, TFLOP/s", minimum=0)
    gpu_hbm_gb_per_s: float = spec_field("GPU HBM bandwidth, GB/s", minimum=0)
    gpu_hbm_gib: float = spec_field("GPU memory capacity, GiB", minimum=0)
    gpu_reserve_gib: float = spec_field("GPU memory kept out of the default budget (other processes, headroom), "
                                        "GiB; the process's own footprint (context, library workspaces, "
                                        "activations) is counted inside the budget", minimum=0)
    gpu_launch_seconds: float = spec_field("GPU kernel launch overhead per kernel, s", minimum=0)
    # CPU
    cpu_amx_bf16_tflops: tuple[CurvePoint, ...] = spec_field("CPU AMX bf16 GEMM throughput over GEMM rows M "
                                                             "(interpolated in log M, clamped at the ends)")
    cpu_ddr_read_gb_per_s: float = spec_field("CPU reading weights from DDR (GEMV over large weights), GB/s",
                                              minimum=0)
    cpu_kv_read_gb_per_s: float = spec_field("CPU decode attention reading a KV cache in DDR, GB/s", minimum=0)
    cpu_ddr_gib: float = spec_field("host DDR capacity, GiB", minimum=0)
    cpu_reserve_gib: float = spec_field("DDR kept out of the default budget (OS, runtime, pinned buffers), GiB",
                                        minimum=0)
    cpu_launch_seconds: float = spec_field("CPU kernel (oneDNN primitive) overhead per kernel, s", minimum=0)
    ddr_shared_gb_per_s: float = spec_field("DDR bytes/s served in total when the CPU reads DDR while PCIe DMA "
                                            "reads DDR too", minimum=0)
    # CXL (all zero when the machine has none)
    cxl_gb_per_s: float = spec_field("CPU reading CXL memory, GB/s (0 without CXL)", minimum=0)
    cxl_gib: float = spec_field("CXL memory capacity, GiB (0 without CXL)", minimum=0)
    cxl_latency_ns: float = spec_field("latency CXL adds over DDR, ns", minimum=0)
    # PCIe
    pcie_h2d_gb_per_s: float = spec_field("pinned host-to-device copy, GB/s", minimum=0)
    pcie_d2h_gb_per_s: float = spec_field("pinned device-to-host copy, GB/s", minimum=0)
    pcie_bidir_gb_per_s: float = spec_field("both directions at once, total GB/s", minimum=0)
    pcie_latency_seconds: float = spec_field("fixed cost of one transfer, s", minimum=0)
    # Splits (docs/cost-model.md Eq. 15)
    split_sync_seconds: float = spec_field("one split sublayer's synchronisation: handing its CPU part to the "
                                           "runtime's worker thread and joining the parts (thread wake-up, event "
                                           "wait, the merge launch), s", minimum=0)
    # Provenance
    sources: dict = spec_field("field name → where its number comes from")
    estimates: tuple[str, ...] = spec_field("fields whose numbers are estimates, not measurements")
    # The process's GPU footprint beyond weights, KV and staging (docs/cost-model.md Eq. 14), all inside --gpu-mem.
    # Optional in a profile file (defaults below, said in `sources` and listed under `estimates`): profiles written
    # before these fields existed keep loading.
    gpu_context_mib: float = spec_field("GPU memory the process holds outside PyTorch's caching allocator once it "
                                        "has run its kernels: CUDA context, loaded kernels, library handles, MiB",
                                        minimum=0, default=512.0)
    gpu_library_workspace_mib: float = spec_field("GPU memory the CUDA libraries take from the caching allocator "
                                                  "for their workspaces (cuBLAS, cuBLASLt) and the allocator's "
                                                  "small-block segments, MiB", minimum=0, default=48.0)
    cpu_attention_bf16_tflops: tuple[CurvePoint, ...] = spec_field(
        "CPU attention (scaled_dot_product_attention, causal mask, bf16) over query length Q = context: FLOP/s "
        "at each Q, counted as the cost model counts attention (4·Q·C·E per head, no causal halving); prices "
        "attention nodes on the CPU in prefill (empty: the AMX GEMM curve at M = Q, as before)", default=())
    gpu_gemm_bf16_tflops: tuple[CurvePoint, ...] = spec_field(
        "GPU bf16 weight GEMM throughput over GEMM rows M (interpolated in log M, clamped at the ends): FLOP/s "
        "reached on a decoder layer's four weight GEMMs (d→3d, d→d, d→4d, 4d→d, their FLOPs over their summed "
        "time) at each M; prices a GPU `linear` node's FLOPs (docs/cost-model.md Eq. 1c; empty: "
        "`gpu_bf16_tflops` at every M, as before)", default=())
    gpu_activation_factor: float = spec_field("the runtime's GPU activation peak (allocator reserved bytes) over "
                                              "the cost model's live-set model of it (Eq. 14): allocator rounding "
                                              "and what the model does not see", minimum=1, default=1.25)
    runtime_op_seconds: float = spec_field("the runtime's host time per unit it runs, beyond the unit's kernels "
                                           "(Python dispatch, its activation moves and their synchronisation), "
                                           "measured on the runtime itself (docs/cost-model.md Eq. 24); a split "
                                           "unit costs SPLIT_OPS of them; 0: not measured, not priced", minimum=0,
                                           default=0.0)
    cpu_expert_beside_copy_gb_per_s: float = spec_field(
        "CPU reading an MoE expert's weights (its SwiGLU at one row, the runtime's kernel) while another expert's "
        "weights are copied to the GPU, GB/s: the CPU side of a split experts unit while its routed experts' copies "
        "run (docs/cost-model.md Eq. 21c); 0: not measured, not priced", minimum=0, default=0.0)
    runtime_op_seconds_beside_cpu: float = spec_field(
        "the runtime's host time per op of a decode layer whose MoE experts op has a CPU part: the one host thread "
        "runs the layer's ops (the routing read, the GPU's routed experts' dispatch, the merge, the other units' "
        "launches) beside that CPU part, not under the copies (docs/cost-model.md Eq. 21d; measured as the runs' "
        "host seconds per CPU part over the layer's ops, bench/reprice.py --chain-from-runs); 0: not measured, "
        "Eq. 24's runtime_op_seconds on the chain", minimum=0, default=0.0)
    ddr_shared_experts_gb_per_s: float = spec_field(
        "DDR bytes/s served in total while a split MoE experts unit runs: the CPU's expert reads (its SwiGLU at "
        "one row, several experts back to back) beside several routed experts' pinned copies to the GPU (the "
        "expert probe: both sides' bytes over the span; or the runs' timed CPU parts, bench/reprice.py "
        "--ddr-experts-from-runs), GB/s: Eq. 21b's DDR term (docs/cost-model.md); 0: not measured, "
        "`ddr_shared_gb_per_s` (the GEMV's beside one copy) stands for it", minimum=0, default=0.0)
    split_cpu_start_seconds: float = spec_field(
        "a decode split sublayer's CPU part beyond its roofline: what each CPU part costs to start (the main "
        "thread's OpenMP team after its wait for the part's input from the GPU, a narrow slice of the weights), s "
        "(docs/cost-model.md Eq. 15b; fitted from a call's profiled split parts, bench/reprice.py "
        "--split-start-from-runs, or probed by `liac profile` with a GPU, liac.probe.split_cpu_start: a lower "
        "bound, 4-6x under the runs' fit on the H200 machine); 0: not measured, not priced", minimum=0, default=0.0)
    ddr_shared_kv_gb_per_s: float = spec_field(
        "DDR bytes/s served in total when the CPU's fused decode attention reads a KV cache in DDR while pinned "
        "host-to-device copies read DDR too (the rates probe: the attention's KV read beside the copies plus "
        "theirs), GB/s: Eqs. 6 and 18 for that kernel (docs/cost-model.md); 0: not measured, "
        "`ddr_shared_gb_per_s` (the GEMV's) stands for it", minimum=0, default=0.0)

    def cpu_tflops_at(self, m: float) -> float:
        """AMX bf16 TFLOP/s for a GEMM of `m` rows: piecewise linear in log M between the curve's points."""
        return _curve_at(self.cpu_amx_bf16_tflops, m)

    @property
    def ddr_shared_kv(self) -> float:
        """GB/s DDR serves the fused decode attention's KV read and the copies beside it (Eqs. 6, 18):
        `ddr_shared_kv_gb_per_s`, or where not measured (0) the GEMV's `ddr_shared_gb_per_s`."""
        return self.ddr_shared_kv_gb_per_s or self.ddr_shared_gb_per_s

    def gpu_gemm_tflops_at(self, m: float) -> float:
        """GPU bf16 TFLOP/s of a weight GEMM of `m` rows (Eq. 1c): the measured curve, or without one (empty)
        `gpu_bf16_tflops` (the 8192³ probe) at every M."""
        return _curve_at(self.gpu_gemm_bf16_tflops, m) if self.gpu_gemm_bf16_tflops else self.gpu_bf16_tflops

    def cpu_attention_tflops_at(self, query: float) -> float:
        """CPU attention TFLOP/s in prefill at `query` tokens (the attention curve; the GEMM curve without one)."""
        return _curve_at(self.cpu_attention_bf16_tflops or self.cpu_amx_bf16_tflops, query)


    @property
    def gpu_budget_bytes(self) -> int:
        """Default `--gpu-mem`: HBM capacity minus the reserve."""
        return max(0, int((self.gpu_hbm_gib - self.gpu_reserve_gib) * GIB))

    @property
    def cpu_budget_bytes(self) -> int:
        """Default `--cpu-mem`: DDR capacity minus the reserve."""
        return max(0, int((self.cpu_ddr_gib - self.cpu_reserve_gib) * GIB))

    @property
    def gpu_context_bytes(self) -> int:
        """The GPU memory outside the caching allocator (Eq. 14's fixed part outside the runtime's allocator cap)."""
        return int(self.gpu_context_mib * MIB)

    @property
    def gpu_library_workspace_bytes(self) -> int:
        return int(self.gpu_library_workspace_mib * MIB)

    @property
    def cxl_budget_bytes(self) -> int:
        """Default `--cxl-mem`: the whole CXL capacity."""
        return int(self.cxl_gib * GIB)

    def canonical(self) -> dict:
        """Plain data with rounded floats: what `sha256` hashes and what `liac profile` would write. A profile that
        does not price the runtime's host time (`runtime_op_seconds` 0, Eq. 24), the CPU's expert reads beside the
        copies (`cpu_expert_beside_copy_gb_per_s` 0, Eq. 21c), the fused attention's own shared DDR rate
        (`ddr_shared_kv_gb_per_s` 0, Eq. 6) or the GPU's GEMM rate by rows (`gpu_gemm_bf16_tflops` empty, Eq. 1c)
        (every field of UNPRICED_WHEN_ZERO) leaves that field out: it prices every plan as before the field
        existed, so it hashes as it did and plans compiled for it stay valid."""
        data = to_data(self)
        for field in UNPRICED_WHEN_ZERO:
            if getattr(self, field) in (0.0, ()):
                del data[field]
                data["sources"].pop(field, None)
                data["estimates"] = [e for e in data["estimates"] if e != field]
        return data

    def sha256(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _curve_at(points: tuple[CurvePoint, ...], m: float) -> float:
    """A throughput curve at `m`: piecewise linear in log M between its points, clamped at both ends."""
    if m <= points[0].m:
        return points[0].tflops
    for low, high in zip(points, points[1:]):
        if m <= high.m:
            frac = (math.log(m) - math.log(low.m)) / (math.log(high.m) - math.log(low.m))
            return low.tflops + frac * (high.tflops - low.tflops)
    return points[-1].tflops


_FIELDS = {f.name: f for f in fields(HardwareProfile)}

# Rates that a division uses: zero would mean "infinitely slow", which no real machine has.
_POSITIVE = ("gpu_bf16_tflops", "gpu_hbm_gb_per_s", "cpu_ddr_read_gb_per_s", "cpu_kv_read_gb_per_s",
             "ddr_shared_gb_per_s", "pcie_h2d_gb_per_s", "pcie_d2h_gb_per_s", "pcie_bidir_gb_per_s")
# Physical ranges (inclusive) of every number (floats are finite already: liac.schema_tools). Beyond them a number
# is a typo, and the cost model's sums would overflow to infinity (a NaN in the ILP never converges).
_RATE = (1e-3, 1e6)  # GB/s: 1 MB/s .. 1 PB/s
_TFLOPS = (1e-6, 1e6)
_GIB = (0.0, 1e6)  # capacities: up to ~1 EiB
_SECONDS = (0.0, 1.0)  # per-kernel and per-transfer overheads
_GIB_AS_MIB = (0.0, _GIB[1] * 1024)  # footprints in MiB, within the same capacity bound
_RANGES = {"gpu_bf16_tflops": _TFLOPS, "gpu_hbm_gb_per_s": _RATE, "gpu_hbm_gib": _GIB, "gpu_reserve_gib": _GIB,
           "gpu_launch_seconds": _SECONDS, "cpu_ddr_read_gb_per_s": _RATE, "cpu_kv_read_gb_per_s": _RATE,
           "cpu_ddr_gib": _GIB, "cpu_reserve_gib": _GIB, "cpu_launch_seconds": _SECONDS,
           "ddr_shared_gb_per_s": _RATE, "cxl_gb_per_s": (0.0, _RATE[1]), "cxl_gib": _GIB,
           "cxl_latency_ns": (0.0, 1e6), "pcie_h2d_gb_per_s": _RATE, "pcie_d2h_gb_per_s": _RATE,
           "pcie_bidir_gb_per_s": _RATE, "pcie_latency_seconds": _SECONDS, "split_sync_seconds": _SECONDS,
           "gpu_context_mib": _GIB_AS_MIB, "gpu_library_workspace_mib": _GIB_AS_MIB,
           "gpu_activation_factor": (1.0, 1e3), "runtime_op_seconds": _SECONDS, "runtime_op_seconds_beside_cpu": _SECONDS,
           "cpu_expert_beside_copy_gb_per_s": (0.0, _RATE[1]), "ddr_shared_kv_gb_per_s": (0.0, _RATE[1]),
           "ddr_shared_experts_gb_per_s": (0.0, _RATE[1]),
           "split_cpu_start_seconds": _SECONDS}


# Optional fields (added after profiles were first written): a profile file without them gets the default, said so
# in `sources` and listed in `estimates`.
OPTIONAL_FIELDS = ("gpu_context_mib", "gpu_library_workspace_mib", "gpu_activation_factor",
                    "cpu_attention_bf16_tflops", "runtime_op_seconds", "cpu_expert_beside_copy_gb_per_s",
                    "ddr_shared_kv_gb_per_s", "runtime_op_seconds_beside_cpu", "ddr_shared_experts_gb_per_s",
                    "split_cpu_start_seconds", "gpu_gemm_bf16_tflops")
# Optional fields whose 0 (a curve: empty) means "not measured, not priced": left out of `canonical` (and the hash)
# when 0 or empty.
UNPRICED_WHEN_ZERO = ("runtime_op_seconds", "cpu_expert_beside_copy_gb_per_s", "ddr_shared_kv_gb_per_s",
                      "runtime_op_seconds_beside_cpu", "ddr_shared_experts_gb_per_s", "split_cpu_start_seconds",
                      "gpu_gemm_bf16_tflops")


def parse_profile(data, source: str) -> HardwareProfile:
    """Plain data (parsed YAML) → validated HardwareProfile; the first problem raises a path-named LiacError."""
    profile = from_data(HardwareProfile, data, source)
    absent = [name for name in OPTIONAL_FIELDS if name not in data]
    if absent:
        defaults = {name: f"liac's default (the profile file does not set it): {_FIELDS[name].metadata['doc']}"
                    for name in absent}
        # (the fields unpriced at 0 are appended, not sorted in: a profile without them keeps the canonical form
        # it had, as `canonical` leaves them out)
        earlier = [name for name in absent if name not in UNPRICED_WHEN_ZERO]
        estimates = tuple(sorted(set(profile.estimates) | set(earlier))) if earlier else tuple(profile.estimates)
        estimates += tuple(name for name in UNPRICED_WHEN_ZERO if name in absent and name not in estimates)
        profile = dataclasses.replace(profile, sources={**defaults, **profile.sources}, estimates=estimates)
    for name in _POSITIVE:
        if getattr(profile, name) <= 0:
            raise LiacError(source, f"must be greater than 0, got {getattr(profile, name)!r}", path=name)
    for name, (low, high) in _RANGES.items():
        value = getattr(profile, name)
        if not low <= value <= high:
            raise LiacError(source, f"must be between {low:g} and {high:g}, got {value!r}", path=name)
    if not profile.cpu_amx_bf16_tflops:
        raise LiacError(source, "must list at least one point", path="cpu_amx_bf16_tflops")
    for curve in ("cpu_amx_bf16_tflops", "cpu_attention_bf16_tflops", "gpu_gemm_bf16_tflops"):
        points = getattr(profile, curve)
        for index, (low, high) in enumerate(zip(points, points[1:])):
            if high.m <= low.m:
                raise LiacError(source, f"must be sorted by strictly increasing 'm' ({high.m} after {low.m})",
                                path=f"{curve}[{index + 1}].m")
        for index, point in enumerate(points):
            if point.tflops <= 0:
                raise LiacError(source, f"must be greater than 0, got {point.tflops!r}",
                                path=f"{curve}[{index}].tflops")
            if not _TFLOPS[0] <= point.tflops <= _TFLOPS[1]:
                raise LiacError(source, f"must be between {_TFLOPS[0]:g} and {_TFLOPS[1]:g}, got {point.tflops!r}",
                                path=f"{curve}[{index}].tflops")
    if profile.cxl_gib > 0 and profile.cxl_gb_per_s <= 0:
        raise LiacError(source, "must be greater than 0 when 'cxl_gib' is greater than 0", path="cxl_gb_per_s")
    known = {f.name for f in fields(HardwareProfile)} - {"sources", "estimates", "name", "description"}
    for key, text in profile.sources.items():
        if key not in known:
            raise LiacError(source, f"unknown field {brief(key)}: keys must name numeric fields of the profile",
                            path=f"sources.{brief(key, 60, quote=False)}")
        if not isinstance(text, str) or not text.strip():
            raise LiacError(source, "must be a non-empty string", path=f"sources.{key}")
    missing = sorted(known - set(profile.sources))
    if missing:
        raise LiacError(source, f"must say where '{missing[0]}' comes from", path="sources")
    for index, key in enumerate(profile.estimates):
        if key not in known:
            raise LiacError(source, f"unknown field {brief(key)}: must name a numeric field of the profile",
                            path=f"estimates[{index}]")
    return profile


def load_profile(path: str | os.PathLike) -> HardwareProfile:
    """Read and validate a profile file (YAML: safe types, no aliases, bounded size; `liac.fileio.read_yaml`)."""
    return parse_profile(read_yaml(path), str(path))


def profile_names() -> list[str]:
    """Names of the shipped profiles."""
    folder = resources.files("liac") / "profiles"
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def host_profile_path() -> Path:
    """Where this machine's profile lives: `<user cache dir>/liac/host.yaml` (platformdirs: $XDG_CACHE_HOME or
    ~/.cache on Linux)."""
    return platformdirs.user_cache_path("liac") / f"{HOST_PROFILE}.yaml"


def resolve_profile(name_or_path: str, source: str = "--hw", shipped_only: bool = False) -> HardwareProfile:
    """A shipped profile name, a path to a profile file, a bare file name of a shipped profile, or 'host' (this
    machine's profile in the user's cache directory; it is never measured here: see liac/host.py).

    Args:
        shipped_only: accept only a shipped profile's name: for names read from a file (a plan's
            `spec.hardware.profile`), which must never make liac open (and quote) an arbitrary path.

    Raises:
        LiacError: unknown name (listing the shipped ones), unreadable or invalid file, no host profile yet.
    """
    shipped = profile_names()
    if shipped_only and name_or_path not in shipped and name_or_path != HOST_PROFILE:
        raise LiacError(source, f"{brief(name_or_path)} is not a shipped hardware profile ('{HOST_PROFILE}' or one "
                        "of " + ", ".join(f"'{n}'" for n in shipped) + "): pass the profile file the plan was "
                        "compiled with as --hw")
    path = Path(name_or_path)
    if not shipped_only and path.is_file():
        return load_profile(path)
    if str(name_or_path) == HOST_PROFILE:
        host = host_profile_path()
        if not host.is_file():
            raise LiacError(source, f"no profile of this host yet ({host}): measure it with 'liac profile'")
        return load_profile(host)
    stem = path.stem if path.suffix in (".yaml", ".yml") and path.name == str(name_or_path) else str(name_or_path)
    if stem in shipped:
        entry = resources.files("liac") / "profiles" / f"{stem}.yaml"
        shipped_source = f"liac/profiles/{stem}.yaml"
        return parse_profile(parse_yaml(entry.read_text(), shipped_source), shipped_source)
    if path.suffix in (".yaml", ".yml") or os.sep in str(name_or_path):
        raise LiacError(source, f"file {brief(str(name_or_path))} does not exist")
    raise LiacError(source, f"unknown hardware profile {brief(str(name_or_path))}: must be a profile file, "
                    f"'{HOST_PROFILE}' (this machine) or one of " + ", ".join(f"'{n}'" for n in shipped))
