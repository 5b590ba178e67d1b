"""The library call behind `liac compile`: compile plans, and write them as a sweep.

    from liac.api import compile_plans, compile_serving, write_plans
    result = compile_plans("opt-30b", "spr-h100", batches=(1, 8, 64), prompt_len=128, gen_len=32)
    write_plans(result, "plans/opt-30b")          # one plan per batch + index.yaml
    serving = compile_serving("opt-30b", "spr-h100", batches=(1, 8, 64))    # one serving plan (liac compile --serve)

Pipeline per workload point: trace_model (once per model) → annotate_costs → solve_placement → emit_plan; for a
serving plan, annotate_costs per batch size → solve_serving (passes/ilp_serve.py; and solve_placement per batch size
for its own optimum) → emit_serving_plan.
Every plan is checked by the plan loader (`liac.plan.parse_plan`, the same checks `liac validate` starts with)
before anything is written; a sweep is written as one transaction (`liac.fileio.SweepWriter`: the output checked
and locked before any compute by `output_target`, the old sweep or the new one, never a mix); the sweep's file
names are liac/sweep.py's. Re-pricing a
plan that exists (`liac explain`, `liac calibrate`) is `liac.passes.price.price_plan`; the CLI's flag parsers
are liac/commands/flags.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from liac.errors import InfeasibleError, LiacError, brief
from liac.fileio import SweepWriter, check_writable, parse_yaml, safe_name, write_atomic, yaml_dump
from liac.models import resolve_model
from liac.models.config import ModelConfig
from liac.passes.costs import SPLIT_PERMILLE, CostGraph, Microbatch, TierBudgets, Workload, annotate_costs
from liac.passes.emit import emit_plan
from liac.passes.emit_serve import emit_serving_plan
from liac.passes.ilp import (LayerChoice, SolverOptions, SolverReport, assemble_assignment, policy_label,
                             price_config, solve_placement)
from liac.passes.ilp_serve import solve_serving
from liac.passes.price import group_hbm_experts
from liac.plan import (MAX_BATCH, MAX_BYTES, MAX_PREFETCH_DEPTH, MAX_WEIGHT, OBJECTIVES, OffloadPlan, parse_plan,
                       plan_to_yaml)
from liac.profile import HardwareProfile, resolve_profile
from liac.schema_tools import to_data
from liac.sizes import GIB
from liac.sweep import INDEX_API_VERSION, INDEX_KIND, INDEX_NAME, is_sweep_file, policy_string

__all__ = ["DEFAULT_PROFILE", "CompiledPoint", "CompileResult", "compile_plans", "compile_budgets", "point_costs",
           "compile_point", "reprice_point", "check_serving_model", "compile_serving", "write_plans",
           "output_target"]

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
        """`<metadata.name>.yaml`, reduced to a safe file name (the name carries the model's and the profile's,
        which come from files)."""
        return f"{safe_name(point.plan.metadata.name)}.yaml"

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
    for batch in batches:
        if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_BATCH:
            raise LiacError("--batch", f"batch sizes must be integers from 1 to {MAX_BATCH}, got {brief(batch)}")
    for name, value in (("--prompt-len", prompt_len), ("--gen-len", gen_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LiacError(name, f"must be a positive integer, got {brief(value)}")
    if prompt_len + gen_len > cfg.max_position:
        raise LiacError("--gen-len", f"prompt_len + gen_len must be at most the model's {cfg.max_position} "
                        f"positions, got {prompt_len + gen_len}")
    if objective not in OBJECTIVES:
        raise LiacError("--objective", f"unsupported value {brief(objective)}: must be one of "
                        + ", ".join(f"'{o}'" for o in OBJECTIVES))


def _check_budgets(profile: HardwareProfile, gpu_mem, cpu_mem, cxl_mem) -> None:
    """A budget is bytes the machine has: at most the tier's capacity in the profile (a plan that assumes more
    memory than the card has would be refused by the runtime, or worse, be compiled for the wrong machine)."""
    if cxl_mem and profile.cxl_gib <= 0:
        raise LiacError("--cxl-mem", f"must be 0: hardware profile '{profile.name}' has no CXL memory")
    for flag, value, field in (("--gpu-mem", gpu_mem, "gpu_hbm_gib"), ("--cpu-mem", cpu_mem, "cpu_ddr_gib"),
                               ("--cxl-mem", cxl_mem, "cxl_gib")):
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BYTES:
            raise LiacError(flag, f"must be a number of bytes from 0 to {MAX_BYTES}, got {brief(value)}")
        capacity = getattr(profile, field) * GIB
        if value > capacity:
            raise LiacError(flag, f"must be at most the {getattr(profile, field):g} GiB hardware profile "
                                  f"'{profile.name}' has ({field}), got {value / GIB:.1f} GiB: compile for a profile "
                                  "of the machine the plan will run on ('liac profile -o host.yaml' measures one)")


def compile_budgets(profile: HardwareProfile, gpu_mem: int | None = None, cpu_mem: int | None = None,
                    cxl_mem: int | None = None, prefetch_depth: int = 1) -> TierBudgets:
    """The TierBudgets a compile works under: each given budget, else the profile's capacity less its reserve."""
    return TierBudgets(hbm_bytes=profile.gpu_budget_bytes if gpu_mem is None else int(gpu_mem),
                       ddr_bytes=profile.cpu_budget_bytes if cpu_mem is None else int(cpu_mem),
                       cxl_bytes=profile.cxl_budget_bytes if cxl_mem is None else int(cxl_mem),
                       prefetch_depth=prefetch_depth)


def point_costs(graph, profile: HardwareProfile, batch: int, prompt_len: int, gen_len: int,
                budgets: TierBudgets, microbatches: tuple[Microbatch, ...] | None = None) -> CostGraph:
    """The CostGraph `compile_plans` solves for one workload point (splits priced at the compiler's grid; the
    prefill micro-batch candidates of `costs.prefill_microbatches`, or only `microbatches`)."""
    return annotate_costs(graph, profile, Workload(batch, prompt_len, gen_len), budgets, split_permille=SPLIT_PERMILLE,
                          microbatches=microbatches)


def compile_point(graph, cfg: ModelConfig, profile: HardwareProfile, batch: int, prompt_len: int, gen_len: int,
                  budgets: TierBudgets, options: SolverOptions, objective: str) -> CompiledPoint:
    """One workload point: price (`point_costs`), solve, emit. Raises InfeasibleError when nothing fits."""
    costs = point_costs(graph, profile, batch, prompt_len, gen_len, budgets)
    assignment, report = solve_placement(costs, options)
    return CompiledPoint(plan=emit_plan(costs, assignment, report, cfg, objective),
                         costs=costs.with_prefill(assignment.prefill_microbatch), report=report)


def reprice_point(graph, cfg: ModelConfig, profile: HardwareProfile, plan: OffloadPlan,
                  budgets: TierBudgets) -> CompiledPoint | None:
    """A plan re-emitted by the current compiler from the choice it records, without solving: the same costs as
    `compile_point` (its workload, `budgets`), each layer group's configuration priced afresh as the solver prices
    its columns (`liac.passes.ilp.price_config`), the buffers and objective assembled as the solver's are, and the
    solver's report (name, status, gap) carried over. Byte-identical to the file when neither the trace, the cost
    model, the emitter, the inputs nor the format changed (tests/test_checked_in.py); None when the recorded choice
    is no longer a valid configuration.
    """
    work, execution = plan.spec.workload, plan.spec.execution
    recorded = Microbatch(execution.prefill_microbatch_sequences, execution.prefill_microbatch_tokens)
    costs = point_costs(graph, profile, work.batch_size, work.prompt_len, work.gen_len, budgets, (recorded,))
    choices = []
    for group in plan.spec.layer_groups:
        cls = costs.layer_class(group.layer_class)
        if tuple(s.name for s in group.sublayers) != tuple(cls.units):
            return None
        config = price_config(costs, cls, tuple(s.weights for s in group.sublayers), group.kv_cache,
                              tuple(s.prefill_cpu_permille for s in group.sublayers),
                              tuple(s.decode_cpu_permille for s in group.sublayers),
                              group_hbm_experts(cls, group))
        if config is None:
            return None
        choices.append(LayerChoice(group.layer_class, config, group.layer_count))
    assignment = assemble_assignment(costs, tuple(choices))
    solver = plan.status.solver
    report = SolverReport(name=solver.name, status=solver.status, objective_seconds=assignment.objective_seconds,
                          gap=solver.gap, seconds=0.0, policy="optimal", configurations=0)
    return CompiledPoint(plan=emit_plan(costs, assignment, report, cfg, work.objective), costs=costs, report=report)


def compile_plans(model, hw=DEFAULT_PROFILE, batches=(1,), prompt_len: int = 128, gen_len: int = 32,
                  gpu_mem: int | None = None, cpu_mem: int | None = None, cxl_mem: int | None = None,
                  objective: str = "latency", policy: str | None = None, solver: str = "auto",
                  prefetch_depth: int = 1, resident_layers: bool = True, graph=None, progress=None) -> CompileResult:
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
        resident_layers: False switches off LIA's Optimization-1: no decoder layer keeps all its weights in HBM
            (`--no-resident-layers`; the plans' policy name says so).
        graph: an already traced SublayerGraph of `model` (skips tracing).
        progress: called with each batch size once its point is solved (feasible or not), e.g. to draw a bar.

    Raises:
        LiacError: bad input. InfeasibleError: no batch size has a plan that fits (one line naming the tier).
    """
    cfg, profile = _resolve(model, hw)
    batches = tuple(batches)
    _check_workload(cfg, batches, prompt_len, gen_len, objective)
    policy_name = policy_label(policy, resident_layers)
    budgets = _budgets(profile, gpu_mem, cpu_mem, cxl_mem, prefetch_depth)
    graph = _traced(cfg, graph)
    options = SolverOptions(solver=solver, policy=policy, resident_layers=resident_layers)
    points, infeasible = [], []
    for batch in batches:
        try:
            points.append(compile_point(graph, cfg, profile, batch, prompt_len, gen_len, budgets, options, objective))
        except InfeasibleError as e:
            infeasible.append((batch, e))
        if progress is not None:
            progress(batch)
    if not points:
        batch, error = infeasible[0]
        raise InfeasibleError(error.source, f"batch {batch}: {error.message}", tier=error.tier,
                              short_bytes=error.short_bytes)
    return CompileResult(points=tuple(points), infeasible=tuple((b, e.message) for b, e in infeasible),
                         model=cfg.name, profile=profile.name, objective=objective, policy=policy_name)


def _budgets(profile: HardwareProfile, gpu_mem, cpu_mem, cxl_mem, prefetch_depth) -> TierBudgets:
    """The checked budgets (`_check_budgets`, the prefetch depth's range) as `compile_budgets` gives them."""
    _check_budgets(profile, gpu_mem, cpu_mem, cxl_mem)
    if not isinstance(prefetch_depth, int) or isinstance(prefetch_depth, bool) or \
            not 1 <= prefetch_depth <= MAX_PREFETCH_DEPTH:
        raise LiacError("--prefetch-depth", f"must be an integer from 1 to {MAX_PREFETCH_DEPTH}, got "
                                            f"{brief(prefetch_depth)}")
    return compile_budgets(profile, gpu_mem, cpu_mem, cxl_mem, prefetch_depth)


def _traced(cfg: ModelConfig, graph):
    if graph is None:
        from liac.passes.trace import trace_model  # late import: tracing loads torch; a given graph needs none

        graph = trace_model(cfg)
    return graph


def _batch_weights(batches: tuple[int, ...], batch_weights) -> tuple[int, ...]:
    """`batch_weights` (None: uniform; a sequence aligned with `batches`; or a mapping batch → weight, others 0)
    → one integer weight per batch size."""
    if batch_weights is None:
        return (1,) * len(batches)
    if isinstance(batch_weights, dict):
        unknown = sorted(set(batch_weights) - set(batches))
        if unknown:
            raise LiacError("--batch-weights", f"batch {unknown[0]} is not one of the batch sizes "
                            + ", ".join(str(b) for b in batches))
        weights = tuple(batch_weights.get(b, 0) for b in batches)
    else:
        weights = tuple(batch_weights)
        if len(weights) != len(batches):
            raise LiacError("--batch-weights", f"must give one weight per batch size ({len(batches)}: "
                            + ", ".join(str(b) for b in batches) + f"), got {len(weights)}")
    if any(not isinstance(w, int) or isinstance(w, bool) or not 0 <= w <= MAX_WEIGHT for w in weights) \
            or sum(weights) == 0:
        raise LiacError("--batch-weights", f"weights must be integers from 0 to {MAX_WEIGHT}, not all 0, got "
                                           f"{brief(list(weights))}")
    return weights


def check_serving_model(cfg: ModelConfig) -> None:
    """Serving plans are for dense models: a mixture of experts places its experts by count (Eq. 21), which a serving
    plan's per-batch placements do not record. Raises LiacError naming `--serve`."""
    if cfg.is_moe:
        raise LiacError("--serve", f"model '{cfg.name}' is a mixture of experts ({cfg.num_experts} experts): serving "
                        "plans are for dense models only; compile it without --serve (lia-run runs it)")


def compile_serving(model, hw=DEFAULT_PROFILE, batches=(1, 2, 4, 8, 16, 32, 64), batch_weights=None,
                    prompt_len: int = 128, gen_len: int = 32, gpu_mem: int | None = None,
                    cpu_mem: int | None = None, cxl_mem: int | None = None, policy: str | None = None,
                    solver: str = "auto", prefetch_depth: int = 1, resident_layers: bool = True, graph=None,
                    progress=None) -> CompileResult:
    """Compile one serving plan (`liac compile --serve`): one memory placement for every live batch size in
    `batches`, a compute placement per batch size, minimising Σ_b weight_b · (prefill + decode of a batch of b) /
    Σ weights (passes/ilp_serve.py). Each batch size is also compiled alone, for `status.serving`'s comparison.

    Args:
        batches: the live batch sizes (the largest sizes the KV cache).
        batch_weights: their weights in the objective: None (uniform), integers aligned with `batches`, or a
            mapping batch → integer weight (sizes left out weigh 0).
        progress: called with each batch size once its own optimum is solved, then with the largest once more
            when the serving plan is.
        The others: as `compile_plans`.

    Returns:
        A CompileResult with one point, the serving plan (at the largest batch size).

    Raises:
        LiacError: bad input. InfeasibleError: no memory placement holds the largest batch (one line naming the
        tier).
    """
    cfg, profile = _resolve(model, hw)
    check_serving_model(cfg)
    batches = tuple(sorted(set(batches)))
    _check_workload(cfg, batches, prompt_len, gen_len, "latency")
    weights = _batch_weights(batches, batch_weights)
    policy_name = policy_label(policy, resident_layers)
    budgets = _budgets(profile, gpu_mem, cpu_mem, cxl_mem, prefetch_depth)
    graph = _traced(cfg, graph)
    options = SolverOptions(solver=solver, policy=policy, resident_layers=resident_layers)
    # The prefill of every batch size is priced whole (one micro-batch): the continuous batcher bounds each
    # prefill by its token budget instead (runtime/batching.py).
    costs = tuple(point_costs(graph, profile, batch, prompt_len, gen_len, budgets, (Microbatch(batch, prompt_len),))
                  for batch in batches)
    serve, report = solve_serving(costs, weights, options)
    own = []
    for graph_b in costs:  # each batch size alone: feasible whenever the serving problem is (a smaller KV cache)
        own.append(solve_placement(graph_b, options)[1].objective_seconds)
        if progress is not None:
            progress(graph_b.workload.batch_size)
    plan = emit_serving_plan(costs, serve, report, tuple(own), cfg, "latency")
    return CompileResult(points=(CompiledPoint(plan=plan, costs=costs[-1], report=report),), infeasible=(),
                         model=cfg.name, profile=profile.name, objective="latency", policy=policy_name)


def _checked_text(plan: OffloadPlan, source: str) -> str:
    """The plan's YAML, after the loader accepted it (schema and semantics): never write what cannot be read."""
    text = plan_to_yaml(plan)
    try:
        parse_plan(parse_yaml(text, source), source)
    except LiacError as e:  # a compiler bug, not a user mistake: keep the traceback
        raise ValueError(f"refusing to write an invalid plan {source}: {e.line()}") from e
    return text


def write_plans(result: CompileResult, out: str | Path, sweep: SweepWriter | None = None) -> list[Path]:
    """Write the plans: to `out` itself when it ends in .yaml and there is one plan, else into directory `out`
    (one file per point, named `<metadata.name>.yaml`, plus index.yaml), as one transaction (`SweepWriter`: the
    old sweep or the new one, never a mix; the user's other files in `out` are kept). Returns the paths written.

    Args:
        sweep: the SweepWriter `output_target(out)` opened before compiling (it holds the directory's lock);
            None to open one here.
    """
    out = Path(out)
    if out.suffix in (".yaml", ".yml"):
        if len(result.points) != 1 or result.infeasible:
            raise LiacError("-o", f"'{out}' names one file, but the compile has {len(result.points)} plans and "
                            f"{len(result.infeasible)} infeasible points: give a directory")
        text = _checked_text(result.points[0].plan, str(out))
        write_atomic(out, text, source="-o")
        return [out]
    texts = {result.file_name(p): _checked_text(p.plan, str(out / result.file_name(p))) for p in result.points}
    texts[INDEX_NAME] = yaml_dump(to_data(result.index()))
    if sweep is not None:
        return sweep.commit(texts)
    with SweepWriter(out, owned=is_sweep_file) as writer:
        return writer.commit(texts)


@contextlib.contextmanager
def output_target(out: str | Path, source: str = "-o"):
    """Check where `write_plans` will write before any compute: a .yaml file's directory must be writable; a sweep
    directory is created if needed, checked and locked (a second compile into it is refused) until the block
    ends. Yields the SweepWriter to hand to `write_plans` (None for a single file).

        with output_target("plans/opt-30b") as target:
            write_plans(compile_plans(...), "plans/opt-30b", target)
    """
    if Path(out).suffix in (".yaml", ".yml"):
        check_writable(out, source)
        yield None
        return
    with SweepWriter(out, owned=is_sweep_file, source=source) as writer:
        yield writer
