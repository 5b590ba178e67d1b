"""The library call behind `liac compile`: compile plans, and write them as a sweep.

    from liac.api import compile_plans, write_plans
    result = compile_plans("opt-30b", "spr-h100", batches=(1, 8, 64), prompt_len=128, gen_len=32)
    write_plans(result, "plans/opt-30b")          # one plan per batch + index.yaml

Pipeline per workload point: trace_model (once per model) → annotate_costs → solve_placement → emit_plan.
Every plan is checked by the plan loader (`liac.plan.parse_plan`, the same checks `liac validate` starts with)
before anything is written, and written atomically; the sweep's file names are liac/sweep.py's. Re-pricing a
plan that exists (`liac explain`, `liac calibrate`) is `liac.passes.price.price_plan`; the CLI's flag parsers
are liac/commands/flags.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from liac.errors import InfeasibleError, LiacError
from liac.fileio import parse_yaml, write_atomic, yaml_dump
from liac.models import resolve_model
from liac.models.config import ModelConfig
from liac.passes.costs import SPLIT_PERMILLE, CostGraph, TierBudgets, Workload, annotate_costs
from liac.passes.emit import emit_plan
from liac.passes.ilp import SolverOptions, SolverReport, parse_policy, solve_placement
from liac.plan import OBJECTIVES, OffloadPlan, parse_plan, plan_to_yaml
from liac.profile import HardwareProfile, resolve_profile
from liac.schema_tools import to_data
from liac.sweep import INDEX_API_VERSION, INDEX_KIND, INDEX_NAME, policy_string, read_index

__all__ = ["DEFAULT_PROFILE", "CompiledPoint", "CompileResult", "compile_plans", "write_plans"]

DEFAULT_PROFILE = "h200-amx16"  # the project's own machine (liac/profiles/h200-amx16.yaml)


@dataclass(frozen=True)
class CompiledPoint:
    """One workload point: its plan, and what produced it (kept in memory, never written)."""

    plan: OffloadPlan
    costs: CostGraph
    report: SolverReport  # with the solve's seconds


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
                "prefill": policy_string(plan, "prefill"),
                "decode": policy_string(plan, "decode"),
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
        doc = {"apiVersion": INDEX_API_VERSION, "kind": INDEX_KIND, "model": self.model, "profile": self.profile,
               "objective": self.objective, "policy": self.policy, "points": rows,
               "infeasible": [{"batch_size": batch, "reason": reason} for batch, reason in self.infeasible]}
        if best is not None:
            # With --objective throughput the sweep's answer is the point with the most tokens/s.
            doc["best_throughput"] = self.file_name(best)
        return doc


# ---------------------------------------------------------------------------------------------------------------
# Compile


def _resolve(model, hw):
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
        from liac.passes.trace import trace_model  # late import: tracing loads torch; a given graph needs none

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
            points.append(CompiledPoint(plan=plan, costs=costs, report=report))
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
        parse_plan(parse_yaml(text, source), source)
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
    write_atomic(out / INDEX_NAME, yaml_dump(to_data(result.index())))
    written.append(out / INDEX_NAME)
    for path in sorted(stale):  # plans an earlier compile listed here and this one did not rewrite
        path.unlink(missing_ok=True)
    return written


def _previous_plans(out: Path) -> set[Path]:
    """Plan files the directory's current index.yaml lists (written by an earlier compile), if any."""
    doc, problems = read_index(out)
    if problems or not isinstance(doc, dict) or doc.get("kind") != INDEX_KIND:
        return set()
    names = [row.get("file") for row in doc.get("points") or [] if isinstance(row, dict)]
    return {out / name for name in names if isinstance(name, str) and "/" not in name and name.endswith(".yaml")}
