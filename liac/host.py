"""This machine as a hardware profile: measured, written where `liac compile` finds it by default.

`liac profile` measures the host (liac/probe.py) into a `HardwareProfile`; numbers it cannot measure here come from
a base profile and are listed under `estimates`. Without CUDA the profile has no GPU memory (`gpu_hbm_gib: 0`), so
plans for it run every sublayer on the CPU. `liac compile` without `--hw` plans for this host: it reads the profile
kept in the user's cache directory (`liac.profile.host_profile_path()`), and on first use measures it with a quick
probe, saying so on stderr.

    from liac.host import host_profile
    hw = host_profile()          # cached, or measured now (seconds) and cached

The CPU's instruction set decides how fast CPU sublayers run: AMX (Sapphire Rapids and later Xeons) is what liac
is built around; on AVX-512 or AVX2 alone the same bf16 GEMMs are several times slower. `cpu_isa()` names it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from liac.errors import LiacError
from liac.fileio import write_atomic, yaml_dump
from liac.models.config import ModelConfig
from liac.profile import (HOST_PROFILE, CurvePoint, HardwareProfile, host_profile_path, load_profile, parse_profile,
                          resolve_profile)
from liac.progress import progress_bar
from liac.schema_tools import stable_float, to_data
from liac.sizes import GIB, MIB

__all__ = ["CpuIsa", "DEFAULT_BASE", "cpu_isa", "isa_from_flags", "cpu_name", "profile_from_measurements",
           "measure_profile", "write_profile", "host_profile", "first_use_sizes", "FootprintProbe",
           "footprint_probes", "op_probes", "with_footprint", "runtime_op_seconds", "FOOTPRINT_MODELS",
           "FOOTPRINT_POINTS", "FOOTPRINT_POLICIES"]

DEFAULT_BASE = "h200-amx16"  # what this host cannot measure (GPU numbers without CUDA, CXL, reserves) comes from it


@dataclass(frozen=True)
class CpuIsa:
    """The widest bf16 matrix instruction set of this CPU: 'AMX', 'AVX-512' or 'AVX2' ('baseline' below that)."""

    name: str
    source: str  # where it was read: '/proc/cpuinfo flags' or "torch's CPU capability"

    @property
    def has_amx(self) -> bool:
        return self.name == "AMX"


def isa_from_flags(flags: set[str]) -> str:
    """CPU flags (as /proc/cpuinfo lists them) → 'AMX', 'AVX-512', 'AVX2' or 'baseline'."""
    if {"amx_tile", "amx_bf16"} <= flags:
        return "AMX"
    if "avx512f" in flags:
        return "AVX-512"
    if "avx2" in flags:
        return "AVX2"
    return "baseline"


def cpu_isa(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> CpuIsa:
    """This CPU's ISA from /proc/cpuinfo's flags; where there is none (not Linux), from torch's CPU capability
    (which names the vector ISA ATen dispatches to: 'AVX512', 'AVX2', ...; AMX it reports separately)."""
    try:
        with open(cpuinfo) as handle:
            for line in handle:
                if line.startswith("flags"):
                    return CpuIsa(isa_from_flags(set(line.split(":", 1)[1].split())), "/proc/cpuinfo flags")
    except OSError:
        pass
    import torch  # late import: only hosts without /proc/cpuinfo need it

    capability = torch.backends.cpu.get_cpu_capability()
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    name = "AMX" if amx else {"AVX512": "AVX-512", "AVX2": "AVX2"}.get(capability.split("_")[0], "baseline")
    return CpuIsa(name, "torch's CPU capability")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def profile_from_measurements(m, base: HardwareProfile, name: str, description: str, isa: CpuIsa,
                              gpu_present: bool) -> HardwareProfile:
    """Measurements + a base profile → HardwareProfile (measured fields replace the base's).

    Without a GPU on the host (`gpu_present` False) its GPU memory is 0, so plans for it are CPU plans; the GPU's
    rates stay the base's (a profile needs them), listed as estimates.
    """
    how = f"liac profile on this host ({m.cpu_threads} threads)"
    fields: dict = {}
    sources = dict(base.sources)
    estimates = set(base.estimates)

    def measured(field: str, value, text: str) -> None:
        fields[field] = value
        sources[field] = f"{how}: {text}"
        estimates.discard(field)

    isa_text = isa.name if isa.has_amx else f"{isa.name}, no AMX"
    measured("cpu_amx_bf16_tflops", tuple(CurvePoint(m=rows, tflops=stable_float(max(tflops, 1e-6), 4))
                                          for rows, tflops in m.cpu_gemm_tflops),
             f"bf16 F.linear over rotated weights ({isa_text}) at M = "
             + ", ".join(str(r) for r, _ in m.cpu_gemm_tflops))
    measured("cpu_ddr_read_gb_per_s", m.cpu_gemv_gb_per_s, f"GEMV ({m.cpu_gemv_kernel}) over rotated weights")
    measured("cpu_kv_read_gb_per_s", m.cpu_kv_read_gb_per_s, "scaled_dot_product_attention over a bf16 KV cache")
    measured("cpu_launch_seconds", m.cpu_launch_seconds, "median time of a tiny in-place op")
    if m.cpu_attention_tflops:
        measured("cpu_attention_bf16_tflops", tuple(CurvePoint(m=q, tflops=stable_float(max(t, 1e-6), 4))
                                                    for q, t in m.cpu_attention_tflops),
                 "bf16 scaled_dot_product_attention with a causal mask at Q = C = "
                 + ", ".join(str(q) for q, _ in m.cpu_attention_tflops) + " (4·Q·C·E FLOPs per head)")
    measured("split_sync_seconds", m.split_sync_seconds,
             "median of a split of tiny parts as the runtime runs it (GPU part launched, CPU part inline, event "
             "wait, merge launch) less its slower part alone" + ("" if m.gpu_bf16_tflops is not None
                                                                 else " (no GPU: both parts on the host)"))
    if m.split_cpu_start_seconds is not None:  # with a GPU only (probe.split_cpu_start)
        measured("split_cpu_start_seconds", m.split_cpu_start_seconds,
                 "median of a narrow bf16 F.linear right after the main thread's wait for the GPU (a spin kernel "
                 "and a copy to the host) less the same slices' median back to back (Eq. 15b)")
    if m.cpu_ddr_gib:
        measured("cpu_ddr_gib", m.cpu_ddr_gib, "MemTotal in /proc/meminfo")
    if not gpu_present:
        measured("gpu_hbm_gib", 0.0, "no CUDA device: plans for this host run every sublayer on the CPU")
        fields["gpu_reserve_gib"] = 0.0
    if m.gpu_gemm_tflops:
        measured("gpu_gemm_bf16_tflops", tuple(CurvePoint(m=rows, tflops=stable_float(max(t, 1e-6), 4))
                                               for rows, t in m.gpu_gemm_tflops),
                 "bf16 F.linear on decoder-shaped weights (d→3d, d→d, d→4d, 4d→d; summed FLOPs over summed CUDA-event "
                 "time) at M = " + ", ".join(str(r) for r, _ in m.gpu_gemm_tflops))
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
        if m.concurrent_kv_gb_per_s is not None:
            measured("ddr_shared_kv_gb_per_s", m.concurrent_kv_gb_per_s + m.concurrent_h2d_beside_kv_gb_per_s,
                     f"CPU fused decode attention over a KV cache ({m.concurrent_kv_gb_per_s:.1f} GB/s) while "
                     f"pinned H2D runs ({m.concurrent_h2d_beside_kv_gb_per_s:.1f} GB/s), summed")
    for field in set(base.sources) - set(fields):
        if field not in ("gpu_reserve_gib", "cpu_reserve_gib"):  # reserves are policy, not estimates
            estimates.add(field)
            sources[field] = f"from base profile '{base.name}': {base.sources[field]}"
    return dataclasses.replace(base, name=name, description=description, sources=sources,
                               estimates=tuple(sorted(estimates)), **fields)


def measure_profile(sizes, base: str | HardwareProfile = DEFAULT_BASE, name: str = HOST_PROFILE,
                    use_gpu: bool | None = None, quick: bool = False) -> HardwareProfile:
    """Measure this host (`sizes`: a `liac.probe.ProbeSizes`) into a profile, with a progress bar on stderr when
    stderr is a terminal. `use_gpu` None: measure the GPU when CUDA is available."""
    # late import: measuring loads torch; reading a cached profile does not
    import torch

    from liac.probe import measure_host

    base = base if isinstance(base, HardwareProfile) else resolve_profile(base, source="--base")
    gpu_present = torch.cuda.is_available()
    use_gpu = gpu_present if use_gpu is None else (use_gpu and gpu_present)
    with progress_bar(None, "measuring this host") as bar:
        def step(index: int, total: int, label: str) -> None:
            bar.total = total
            bar.n = index - 1
            bar.set_postfix_str(label)  # refreshes the bar

        measurements = measure_host(sizes, progress=step, use_gpu=use_gpu)
    isa = cpu_isa()
    gpu = torch.cuda.get_device_name(0) if use_gpu else (
        f"no GPU measured (GPU numbers from '{base.name}')" if gpu_present else "no GPU")
    description = (f"{cpu_name()}, {os.cpu_count()} CPUs, {isa.name}; {gpu}" + (" [quick probe]" if quick else ""))
    return profile_from_measurements(measurements, base, name, description, isa=isa, gpu_present=gpu_present)


def write_profile(profile: HardwareProfile, path: str | os.PathLike) -> Path:
    """Write a profile atomically, after checking that what is written loads."""
    path = Path(path)
    data = to_data(profile)
    parse_profile(data, str(path))  # a compiler bug would show here, not in the next compile
    write_atomic(path, yaml_dump(data))
    return path


def first_use_sizes():
    """How much the first-use probe measures: `ProbeSizes.quick()`, seconds (caches flatter it; `liac profile`
    measures at full size)."""
    from liac.probe import ProbeSizes  # late import: the probe loads torch

    return ProbeSizes.quick()


def host_profile(say=lambda text: print(text, file=sys.stderr, flush=True)) -> HardwareProfile:
    """This host's profile from the user's cache directory; on first use, measured with a quick probe and written
    there, which `say` announces (one line, before the probe starts).

    Raises:
        LiacError: the cached profile does not load (it names the file; `liac profile` rewrites it).
    """
    path = host_profile_path()
    if path.is_file():
        return load_profile(path)
    say(f"no profile of this host yet: measuring it with a quick probe (seconds) into {path}; "
        f"'liac profile' measures it fully, '--hw NAME' plans for another machine")
    profile = measure_profile(first_use_sizes(), quick=True)
    try:
        write_profile(profile, path)
    except OSError as e:
        raise LiacError(str(path), f"cannot write this host's profile: {e.strerror or e}") from e
    return profile


# ---------------------------------------------------------------------------------------------------------------
# The GPU footprint beyond weights, KV and staging (docs/cost-model.md Eq. 14): what `liac profile` measures by
# running the runtime (liac/commands/profile.py runs them: this module may not import the runtime)

FOOTPRINT_MODELS = (
    ModelConfig(name="probe-opt", family="opt", hidden_size=1024, num_layers=2, num_heads=16, num_kv_heads=16,
                head_dim=64, ffn_dim=4096, vocab_size=4096, max_position=1024, norm="layernorm", norm_eps=1e-5,
                activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True),
    ModelConfig(name="probe-llama", family="llama", hidden_size=1024, num_layers=2, num_heads=16, num_kv_heads=4,
                head_dim=64, ffn_dim=2816, vocab_size=4096, max_position=1024, norm="rmsnorm", norm_eps=1e-5,
                activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False, rope_theta=10000.0),
)
FOOTPRINT_POINTS = ((4, 256), (32, 32))  # (batch, prompt): long and short prompts, ~1000 tokens each
FOOTPRINT_POLICIES = ("lia-gpu", "lia-partial")  # every unit on the GPU; attention on the CPU
# The CUDA context grows after the probes: kernels are loaded lazily, on first use, and a real model's shapes and
# its random or checkpoint loading use kernels the probes did not. A plan fills its budget to the byte and the runtime
# refuses at start to run beside a larger context than the plan's, so the measured context is taken with this margin.
# Measured on the H200 machine (2026-12-01): 765 MiB after the probes, 880 MiB when an OPT-30B run started.
CONTEXT_MARGIN_MIB = 192


@dataclass(frozen=True)
class FootprintProbe:
    """One run `liac profile` measures: a plan, its request, and the cost model's activation peak for it."""

    plan: object  # OffloadPlan
    batch: int
    prompt_len: int
    activation_bytes: int  # Eq. 14's live-set model (the class maximum over the units on either device)
    # whether its measured-over-modelled activations count toward `gpu_activation_factor`: not for `op_probes`,
    # whose 2-3 MiB of modelled activations sit in the caching allocator's 20 MiB segments (an allocation of 1-10
    # MiB takes one), so that their ratio (8.0 on the H200, 2026-12-02 c) measures the allocator's granularity
    sets_factor: bool = True


def footprint_probes(base: HardwareProfile, models: tuple[ModelConfig, ...] = FOOTPRINT_MODELS) -> list[FootprintProbe]:
    """Plans of small models (`models` × FOOTPRINT_POINTS × FOOTPRINT_POLICIES) for a GPU, with their modelled
    activation peaks. Their weights sit in HBM where the policy lets them (a budget of 8 GiB)."""
    # late import: the compiler (numpy, pulp, torch for tracing) only when measuring a GPU
    from liac.api import compile_plans
    from liac.passes.costs import Workload, class_activation_peak
    from liac.passes.trace import trace_model

    probes = []
    for cfg in models:
        graph = trace_model(cfg)
        for batch, prompt in FOOTPRINT_POINTS:
            modelled = class_activation_peak(graph, "decoder", Workload(batch, prompt, 2))
            for policy in FOOTPRINT_POLICIES:
                result = compile_plans(cfg, base, batches=(batch,), prompt_len=prompt, gen_len=2, gpu_mem=8 * GIB,
                                       policy=policy, graph=graph)
                probes.extend(FootprintProbe(point.plan, batch, prompt, int(modelled)) for point in result.points)
    return probes


def runtime_op_seconds(profile: HardwareProfile, probes: list[FootprintProbe],
                       decode_step_seconds: tuple[float, ...]) -> tuple[float, int]:
    """Eq. 24's `runtime_op_seconds` from the footprint probes' timed decode steps: over the probes whose decode
    computes on both devices (their activations cross PCIe, as an offloading plan's do; the all-GPU probes never
    synchronise with the host), the median of (measured step − the step priced without it) / the ops the runtime
    runs per step (a unit one, a split unit `SPLIT_OPS`). Returns (seconds, probes used); (0.0, 0) when none."""
    from liac.passes.price import SPLIT_OPS, price_plan  # late import: the cost model only when measuring a GPU

    bare = dataclasses.replace(profile, runtime_op_seconds=0.0)
    per_op = []
    for probe, measured in zip(probes, decode_step_seconds):
        plan = probe.plan
        devices = {s.decode for g in plan.spec.layer_groups for s in g.sublayers}
        if not ({"cpu", "split"} & devices and {"gpu", "split"} & devices):
            continue
        ops = sum(g.layer_count * sum(SPLIT_OPS if s.decode == "split" else 1 for s in g.sublayers)
                  for g in plan.spec.layer_groups)
        priced = price_plan(plan, hw=bare).decode_seconds_per_token
        per_op.append(max(0.0, (measured - priced) / ops))
    if not per_op:
        return 0.0, 0
    return float(statistics.median(per_op)), len(per_op)


def op_probes(base: HardwareProfile, models: tuple[ModelConfig, ...] = FOOTPRINT_MODELS) -> list[FootprintProbe]:
    """Plans of the small models that cross PCIe in every layer, for `runtime_op_seconds` (Eq. 24): LIA's partial
    policy (attention on the CPU over a DDR cache) with no resident layers, so each layer streams its weights and
    hands its activations between the devices as an offloading plan does. Batch 4, prompt 32."""
    # late import: the compiler (numpy, pulp, torch for tracing) only when measuring a GPU
    from liac.api import compile_plans
    from liac.passes.costs import Workload, class_activation_peak
    from liac.passes.trace import trace_model

    probes = []
    for cfg in models:
        graph = trace_model(cfg)
        modelled = class_activation_peak(graph, "decoder", Workload(4, 32, 2))
        result = compile_plans(cfg, base, batches=(4,), prompt_len=32, gen_len=2, gpu_mem=8 * GIB,
                               policy="lia-partial", resident_layers=False, graph=graph)
        probes.extend(FootprintProbe(point.plan, 4, 32, int(modelled), sets_factor=False) for point in result.points)
    return probes


def with_footprint(profile: HardwareProfile, probes: list[FootprintProbe], library_bytes: int, context_bytes: int,
                   activation_bytes: tuple[int, ...], decode_step_seconds: tuple[float, ...] = ()) -> HardwareProfile:
    """The profile with the footprint fields measured on this GPU (`runtime.footprint.measure_footprint`): the
    activation factor is the largest measured-over-modelled ratio of the probes that size it (`sets_factor`: not
    the op probes), never below 1; with the probes' timed decode steps, also `runtime_op_seconds`
    (`runtime_op_seconds`, Eq. 24)."""
    ratios = [measured / probe.activation_bytes for probe, measured in zip(probes, activation_bytes)
              if probe.activation_bytes > 0 and probe.sets_factor]
    factor = max([1.0, *ratios])
    how = f"liac profile on this host ({os.cpu_count()} CPUs)"
    sources = dict(profile.sources)
    sources["gpu_context_mib"] = (f"{how}: GPU memory in use outside torch's caching allocator after "
                                  f"{len(probes)} small runs of the runtime (their kernels loaded), "
                                  f"{context_bytes / MIB:.0f} MiB, + {CONTEXT_MARGIN_MIB} MiB for kernels loaded later")
    sources["gpu_library_workspace_mib"] = f"{how}: allocator bytes the first GEMMs leave held (cuBLAS, cuBLASLt)"
    sources["gpu_activation_factor"] = (f"{how}: the largest of {len(ratios)} runs' reserved activation peak over "
                                        f"Eq. 14's model (" + ", ".join(f"{r:.2f}" for r in ratios) + ")")
    estimates = tuple(sorted(set(profile.estimates) - {"gpu_context_mib", "gpu_library_workspace_mib",
                                                        "gpu_activation_factor"}))
    profile = dataclasses.replace(profile, gpu_context_mib=stable_float(context_bytes / MIB + CONTEXT_MARGIN_MIB, 4),
                                  gpu_library_workspace_mib=stable_float(library_bytes / MIB, 4),
                                  gpu_activation_factor=stable_float(factor, 4), sources=sources, estimates=estimates)
    op_seconds, used = runtime_op_seconds(profile, probes, decode_step_seconds)
    if used:
        sources = dict(profile.sources)
        sources["runtime_op_seconds"] = (f"{how}: the median over {used} small runs of the runtime that cross PCIe of "
                                         "(decode step − its price without it) / ops per step (Eq. 24)")
        profile = dataclasses.replace(profile, runtime_op_seconds=stable_float(op_seconds, 4), sources=sources,
                                      estimates=tuple(e for e in profile.estimates if e != "runtime_op_seconds"))
    return profile
