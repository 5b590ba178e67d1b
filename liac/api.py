"""The library calls behind the CLI: compile plans, write them, and re-price a plan for `liac explain`.

    from liac.api import compile_plans, write_plans
    result = compile_plans("opt-30b", "spr-h100", batches=(1, 8, 64), prompt_len=128, gen_len=32)
    write_plans(result, "plans/opt-30b")          # one plan per batch + index.yaml

Pipeline per workload point: trace_model (once per model) → annotate_costs → solve_placement → emit_plan.
Every plan is checked by the plan loader (`liac.plan.parse_plan`, the same checks `liac validate` starts with)
before anything is written, and written atomically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from liac.errors import InfeasibleError, LiacError
from liac.models.config import ModelConfig
from liac.plan import OBJECTIVES, OffloadPlan, parse_plan, plan_to_yaml, write_atomic, yaml_dump
from liac.profile import HardwareProfile, resolve_profile

__all__ = ["DEFAULT_PROFILE", "INDEX_NAME", "CompiledPoint", "CompileResult", "UnitPrice", "DdrSharing",
           "compile_plans", "write_plans", "plan_profile", "plan_costs", "unit_prices", "ddr_sharing",
           "parse_batches", "parse_bytes", "policy_summary"]

DEFAULT_PROFILE = "h200-amx16"  # the project's own machine (liac/profiles/h200-amx16.yaml)
INDEX_NAME = "index.yaml"


@dataclass(frozen=True)
class CompiledPoint:
    """One workload point: its plan, and what produced it (kept in memory, never written)."""

    plan: OffloadPlan
    costs: object  # liac.passes.costs.CostGraph
    assignment: object  # liac.passes.ilp.Assignment
    report: object  # liac.passes.ilp.SolverReport (with solve seconds)


@dataclass(frozen=True)
class CompileResult:
    """All points of one `compile_plans` call; `infeasible` lists (batch, one-line reason) of points with no plan."""

    points: tuple[CompiledPoint, ...]
    infeasible: tuple[tuple[int, str], ...]
    model: str
    profile: str
    objective: str
    policy: str

    def file_name(self, point: CompiledPoint) -> str:
        return f"{point.plan.metadata.name}.yaml"

    def index(self) -> dict:
        """The sweep's index.yaml as plain data (see docs/compile.md, "Output")."""
        rows = []
        for point in self.points:
            plan = point.plan
            predicted = plan.status.predicted
            rows.append({
                "file": self.file_name(point),
                "batch_size": plan.spec.workload.batch_size,
                "prompt_len": plan.spec.workload.prompt_len,
                "gen_len": plan.spec.workload.gen_len,
                "prefill": policy_summary(plan, "prefill"),
                "decode": policy_summary(plan, "decode"),
                "prefill_seconds": predicted.prefill_seconds,
                "decode_seconds_per_token": predicted.decode_seconds_per_token,
                "total_seconds": predicted.total_seconds,
                "tokens_per_second": predicted.tokens_per_second,
                "memory": {f"{usage.tier}_bytes": usage.used_bytes for usage in plan.status.memory},
                "solver": {"name": plan.status.solver.name, "status": plan.status.solver.status,
                           "gap": plan.status.solver.gap},
            })
        best = max(self.points, key=lambda p: (p.plan.status.predicted.tokens_per_second,
                                               -p.plan.spec.workload.batch_size), default=None)
        doc = {"apiVersion": "liac/v1", "kind": "OffloadPlanIndex", "model": self.model, "profile": self.profile,
               "objective": self.objective, "policy": self.policy, "points": rows,
               "infeasible": [{"batch_size": batch, "reason": reason} for batch, reason in self.infeasible]}
        if best is not None:
            # With --objective throughput the sweep's answer is the point with the most tokens/s.
            doc["best_throughput"] = self.file_name(best)
        return doc


# ---------------------------------------------------------------------------------------------------------------
# Small parsers (the CLI's flags; each has its own tests)


def parse_batches(text: str, source: str = "--batch") -> tuple[int, ...]:
    """'1..256' (powers of two from 1 to 256), '1,8,64', or '32' → sorted distinct batch sizes."""
    text = text.strip()
    match = re.fullmatch(r"(\d+)\.\.(\d+)", text)
    if match:
        low, high = int(match.group(1)), int(match.group(2))
        if low < 1 or high < low:
            raise LiacError(source, f"range '{text}' must have 1 <= low <= high")
        if low & (low - 1):
            raise LiacError(source, f"range '{text}' must start at a power of two (it steps by doubling)")
        values = []
        value = low
        while value <= high:
            values.append(value)
            value *= 2
        return tuple(values)
    values = []
    for part in text.split(","):
        part = part.strip()
        if not re.fullmatch(r"\d+", part) or int(part) < 1:
            raise LiacError(source, f"must be a positive integer, a list like '1,8,64' or a range like '1..256', "
                            f"got '{text}'")
        values.append(int(part))
    return tuple(sorted(set(values)))


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, source: str) -> int:
    """'24GiB', '24GB', '512MiB', '1.5TiB', '4096B' or '0' → bytes (GB = 10⁹, GiB = 2³⁰). A number without a
    unit other than 0 is refused: '24' meant as GiB would silently be 24 bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match and not unit and float(match.group(1)) == 0:
        return 0
    if not match or unit not in _UNITS:
        raise LiacError(source, f"must be a size with a unit, like '24GiB', '24GB' or '512MiB' (or 0), got '{text}'")
    return int(float(match.group(1)) * _UNITS[unit])


_LETTERS = {"cpu": "C", "gpu": "G", "split": "S"}


def policy_summary(plan: OffloadPlan, phase: str) -> str:
    """Decoder placements of one phase, per group: '20xGGGGGG+76xCCCCSC' (C = CPU, G = GPU, S = split; unit
    order)."""
    parts = []
    for group in plan.spec.layer_groups:
        if group.layer_class == "decoder":
            letters = "".join(_LETTERS[getattr(s, phase)] for s in group.sublayers)
            parts.append(f"{group.layer_count}x{letters}")
    return "+".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Compile


def _resolve(model, hw):
    from liac.models import resolve_model

    cfg = model if isinstance(model, ModelConfig) else resolve_model(model)
    profile = hw if isinstance(hw, HardwareProfile) else resolve_profile(hw)
    return cfg, profile


def _check_workload(cfg: ModelConfig, batches, prompt_len: int, gen_len: int, objective: str) -> None:
    if not batches:
        raise LiacError("--batch", "must name at least one batch size")
    for name, value in (("--prompt-len", prompt_len), ("--gen-len", gen_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LiacError(name, f"must be a positive integer, got {value!r}")
    if prompt_len + gen_len > cfg.max_position:
        raise LiacError("--gen-len", f"prompt_len + gen_len must be at most the model's {cfg.max_position} "
                        f"positions, got {prompt_len + gen_len}")
    if objective not in OBJECTIVES:
        raise LiacError("--objective", f"unsupported value '{objective}': must be one of "
                        + ", ".join(f"'{o}'" for o in OBJECTIVES))


def compile_plans(model, hw=DEFAULT_PROFILE, batches=(1,), prompt_len: int = 128, gen_len: int = 32,
                  gpu_mem: int | None = None, cpu_mem: int | None = None, cxl_mem: int | None = None,
                  objective: str = "latency", policy: str | None = None, solver: str = "auto",
                  prefetch_depth: int = 1, graph=None, progress=None) -> CompileResult:
    """Compile one plan per batch size (the one library call `liac compile` makes).

    Args:
        model: zoo name, config.json path, checkpoint directory, or a ModelConfig.
        hw: shipped profile name, profile file, or a HardwareProfile.
        batches: batch sizes (one plan each).
        prompt_len, gen_len: tokens per sequence in the prompt and generated.
        gpu_mem, cpu_mem, cxl_mem: budgets in bytes (default: the profile's capacity minus its reserve).
        objective: 'latency' (prefill + all decode steps) or 'throughput' (the same at a fixed batch; the sweep's
            index names the point with the most tokens/s).
        policy: None for the optimum, or a fixed policy ('lia-cpu', 'lia-partial', 'lia-gpu', 'lia', or
            'PREFILL/DECODE').
        solver: 'auto', 'cbc' or 'highs'.
        prefetch_depth: layers of streamed weights staged ahead (1 = double buffering).
        graph: an already traced SublayerGraph of `model` (skips tracing).
        progress: called with each batch size once its point is solved (feasible or not), e.g. to draw a bar.

    Raises:
        LiacError: bad input. InfeasibleError: no batch size has a plan that fits (one line naming the tier).
    """
    from liac.passes.costs import SPLIT_PERMILLE, TierBudgets, Workload, annotate_costs
    from liac.passes.emit import emit_plan
    from liac.passes.ilp import SolverOptions, parse_policy, solve_placement

    cfg, profile = _resolve(model, hw)
    batches = tuple(batches)
    _check_workload(cfg, batches, prompt_len, gen_len, objective)
    policy_name = parse_policy(policy).name
    if cxl_mem and profile.cxl_gib <= 0:
        raise LiacError("--cxl-mem", f"must be 0: hardware profile '{profile.name}' has no CXL memory")
    if not isinstance(prefetch_depth, int) or prefetch_depth < 1:
        raise LiacError("--prefetch-depth", f"must be a positive integer, got {prefetch_depth!r}")
    budgets = TierBudgets(hbm_bytes=profile.gpu_budget_bytes if gpu_mem is None else int(gpu_mem),
                          ddr_bytes=profile.cpu_budget_bytes if cpu_mem is None else int(cpu_mem),
                          cxl_bytes=profile.cxl_budget_bytes if cxl_mem is None else int(cxl_mem),
                          prefetch_depth=prefetch_depth)
    if graph is None:
        from liac.passes.trace import trace_model

        graph = trace_model(cfg)
    options = SolverOptions(solver=solver, policy=policy)
    points, infeasible = [], []
    for batch in batches:
        costs = annotate_costs(graph, profile, Workload(batch, prompt_len, gen_len), budgets,
                               split_permille=SPLIT_PERMILLE)
        try:
            assignment, report = solve_placement(costs, options)
        except InfeasibleError as e:
            infeasible.append((batch, e))
        else:
            plan = emit_plan(costs, assignment, report, cfg, objective)
            points.append(CompiledPoint(plan=plan, costs=costs, assignment=assignment, report=report))
        if progress is not None:
            progress(batch)
    if not points:
        batch, error = infeasible[0]
        raise InfeasibleError(error.source, f"batch {batch}: {error.message}", tier=error.tier,
                              short_bytes=error.short_bytes)
    return CompileResult(points=tuple(points), infeasible=tuple((b, e.message) for b, e in infeasible),
                         model=cfg.name, profile=profile.name, objective=objective, policy=policy_name)


def _checked_text(plan: OffloadPlan, source: str) -> str:
    """The plan's YAML, after the loader accepted it (schema and semantics): never write what cannot be read."""
    text = plan_to_yaml(plan)
    try:
        parse_plan(yaml.safe_load(text), source)
    except LiacError as e:  # a compiler bug, not a user mistake: keep the traceback
        raise ValueError(f"refusing to write an invalid plan {source}: {e.line()}") from e
    return text


def write_plans(result: CompileResult, out: str | Path) -> list[Path]:
    """Write the plans: to `out` itself when it ends in .yaml and there is one plan, else into directory `out`
    (one file per point, named `<metadata.name>.yaml`, plus index.yaml). Returns the paths written."""
    out = Path(out)
    if out.suffix in (".yaml", ".yml"):
        if len(result.points) != 1 or result.infeasible:
            raise LiacError("-o", f"'{out}' names one file, but the compile has {len(result.points)} plans and "
                            f"{len(result.infeasible)} infeasible points: give a directory")
        text = _checked_text(result.points[0].plan, str(out))
        write_atomic(out, text)
        return [out]
    if out.exists() and not out.is_dir():
        raise LiacError("-o", f"'{out}' exists and is not a directory")
    texts = {out / result.file_name(p): _checked_text(p.plan, str(out / result.file_name(p)))
             for p in result.points}
    stale = _previous_plans(out) - set(texts)
    written = []
    for path, text in texts.items():
        write_atomic(path, text)
        written.append(path)
    write_atomic(out / INDEX_NAME, yaml_dump(_stable(result.index())))
    written.append(out / INDEX_NAME)
    for path in sorted(stale):  # plans an earlier compile listed here and this one did not rewrite
        path.unlink(missing_ok=True)
    return written


def _previous_plans(out: Path) -> set[Path]:
    """Plan files the directory's current index.yaml lists (written by an earlier compile), if any."""
    try:
        doc = yaml.safe_load((out / INDEX_NAME).read_text())
    except (OSError, yaml.YAMLError):
        return set()
    if not isinstance(doc, dict) or doc.get("kind") != "OffloadPlanIndex":
        return set()
    names = [row.get("file") for row in doc.get("points") or [] if isinstance(row, dict)]
    return {out / name for name in names if isinstance(name, str) and "/" not in name and name.endswith(".yaml")}


def _stable(data):
    from liac.schema_tools import to_data

    return to_data(data)


# ---------------------------------------------------------------------------------------------------------------
# Re-pricing a plan (for `liac explain`)


@dataclass(frozen=True)
class UnitPrice:
    """One unit of one group in one phase: its predicted time on each device, as the plan places its tensors.

    `cpu_seconds` is None when the CPU may not compute it there (weights in HBM, or a decode KV cache in HBM).
    Transfers: the PCIe seconds its incoming and outgoing activations (and KV writes) cost with the unit wholly on
    each device, given where the plan puts its neighbours (a split neighbour's parts per Eq. 17);
    `stream_seconds_on_gpu` is what streaming its operand would take (0 when in HBM). `device` is the plan's
    placement ('cpu', 'gpu' or 'split'); for a split, `cpu_permille` is the CPU's share and `split_seconds` the
    slower of its two parts plus the profile's `split_sync_seconds` (Eq. 15).
    """

    group: str
    unit: str
    phase: str
    device: str
    cpu_seconds: float | None
    gpu_seconds: float
    transfer_seconds_on_cpu: float
    transfer_seconds_on_gpu: float
    stream_seconds_on_gpu: float
    cpu_permille: int = 0
    split_seconds: float | None = None


def plan_profile(plan: OffloadPlan, hw: HardwareProfile | str | None = None) -> HardwareProfile:
    """The profile a plan was compiled for: the shipped one it names, unless `hw` (name, file or profile) is given.

    Raises:
        LiacError: the profile named by the plan has changed since (its sha256 differs) and no `hw` was given.
    """
    spec = plan.spec
    profile = resolve_profile(spec.hardware.profile, source="spec.hardware.profile") if hw is None else (
        hw if isinstance(hw, HardwareProfile) else resolve_profile(hw))
    if hw is None and profile.sha256() != spec.hardware.sha256:
        raise LiacError("spec.hardware.sha256", f"profile '{profile.name}' has changed since the plan was compiled "
                        "(sha256 differs): pass the profile file it was compiled with")
    return profile


def plan_costs(plan: OffloadPlan, hw: HardwareProfile | str | None = None, graph=None):
    """The CostGraph a plan was compiled from, rebuilt from its spec (profile by name unless `hw` is given),
    pricing splits at the compiler's grid and at every share the plan uses.

    Raises:
        LiacError: the profile named by the plan has changed since (its sha256 differs) and no `hw` was given.
    """
    from liac.passes.costs import SPLIT_PERMILLE, TierBudgets, Workload, annotate_costs

    spec = plan.spec
    profile = plan_profile(plan, hw)
    cfg = plan.model_config
    if graph is None:
        from liac.passes.trace import trace_model

        graph = trace_model(cfg)
    depth = max(spec.execution.prefetch_depth, 1)
    budgets = TierBudgets(spec.budgets.gpu_bytes, spec.budgets.cpu_bytes, spec.budgets.cxl_bytes, depth)
    work = Workload(spec.workload.batch_size, spec.workload.prompt_len, spec.workload.gen_len)
    shares = {s.cpu_permille(phase) for g in spec.layer_groups for s in g.sublayers for phase in ("prefill", "decode")}
    grid = tuple(sorted(set(SPLIT_PERMILLE) | {p for p in shares if 0 < p < 1000}))
    return annotate_costs(graph, profile, work, budgets, split_permille=grid)


@dataclass(frozen=True)
class DdrSharing:
    """How the CPU and PCIe DMA share DDR on a profile (docs/cost-model.md Eqs. 6, 18): why a split pays.

    `beside_gb_per_s` is what DMA can read while the CPU reads DDR at its own rate, min(PCIe, shared − CPU): 0
    when the CPU alone saturates DDR, and then a split gains only from DMA reading while the CPU does not.
    """

    cpu_gb_per_s: float
    pcie_gb_per_s: float
    shared_gb_per_s: float
    split_sync_seconds: float

    @property
    def beside_gb_per_s(self) -> float:
        return max(0.0, min(self.pcie_gb_per_s, self.shared_gb_per_s - self.cpu_gb_per_s))


def ddr_sharing(plan: OffloadPlan, hw: HardwareProfile | str | None = None) -> DdrSharing:
    """The DDR-sharing numbers of the plan's profile (see `plan_profile` for `hw`)."""
    profile = plan_profile(plan, hw)
    return DdrSharing(profile.cpu_ddr_read_gb_per_s, profile.pcie_h2d_gb_per_s, profile.ddr_shared_gb_per_s,
                      profile.split_sync_seconds)


def unit_prices(plan: OffloadPlan, costs=None, hw=None, graph=None) -> list[UnitPrice]:
    """Per group, unit and phase: the unit's time on both devices and the transfers each choice implies."""
    import numpy as np

    from liac.passes.costs import TIERS, unit_breakdown
    from liac.passes.ilp import unit_tiers

    costs = costs or plan_costs(plan, hw=hw, graph=graph)
    mean = (lambda values: float(np.mean(values)) if len(values) else 0.0)
    out = []
    for group in plan.spec.layer_groups:
        cls = costs.layer_class(group.layer_class)
        weights = tuple(s.weights for s in group.sublayers)
        tiers = unit_tiers(cls, weights, group.kv_cache)
        for phase in ("prefill", "decode"):
            pc = cls.phase(phase)
            shares = [1.0 - s.cpu_permille(phase) / 1000.0 for s in group.sublayers]  # GPU shares
            planned = unit_breakdown(costs, cls, phase, tiers, tuple(shares))
            for index, unit in enumerate(pc.units):
                tier = tiers[index]
                cpu_ok = tier != "hbm" or unit.cpu_allows_hbm
                transfer = {}
                for device in (0.0, 1.0):  # this unit wholly on the CPU (0) or the GPU (1), neighbours as planned
                    moved = list(shares)
                    moved[index] = device
                    transfer[device] = _unit_transfer_seconds(costs, pc, index, moved, group.kv_cache)
                stream = 0.0
                if tier in ("ddr", "cxl"):
                    rate = costs.h2d_gb_per_s if tier == "ddr" else costs.cxl_stream_gb_per_s
                    stream = mean(unit.stream_bytes) / (rate * 1e9)
                permille = group.sublayers[index].cpu_permille(phase)
                out.append(UnitPrice(group=group.name, unit=unit.name, phase=phase,
                                     device=getattr(group.sublayers[index], phase),
                                     cpu_seconds=mean(unit.cpu_seconds[TIERS.index(tier)]) if cpu_ok else None,
                                     gpu_seconds=mean(unit.gpu_seconds), transfer_seconds_on_cpu=transfer[0.0],
                                     transfer_seconds_on_gpu=transfer[1.0], stream_seconds_on_gpu=stream,
                                     cpu_permille=permille,
                                     split_seconds=planned[index][2] if 0 < permille < 1000 else None))
    return out


def _unit_transfer_seconds(costs, pc, index: int, shares: list[float], kv_cache: str) -> float:
    """Mean PCIe seconds per step of the activations into and out of unit `index` and its KV writes, with every
    unit at its GPU share in `shares` (Eqs. 2, 3, 17)."""
    import numpy as np

    from liac.passes.costs import share_transfer_seconds

    if pc.steps == 0:
        return 0.0
    g = np.asarray(shares, dtype=np.float64)[None, :]
    latency = costs.pcie_latency_seconds
    total = np.zeros((1, pc.steps))
    for edge in pc.edges:
        if index in (edge.src, edge.dst):
            src, dst = g[:, edge.src], g[:, edge.dst]
            total += share_transfer_seconds(edge.h2d_seconds, (1.0 - src) * (dst > 0), latency)
            total += share_transfer_seconds(edge.d2h_seconds, src * (dst < 1), latency)
    unit = pc.units[index]
    if kv_cache == "hbm":
        total += share_transfer_seconds(unit.kv_to_gpu_seconds, 1.0 - g[:, index], latency)
    elif kv_cache != "none":
        total += share_transfer_seconds(unit.kv_to_host_seconds, g[:, index], latency)
    return float(total.mean())
