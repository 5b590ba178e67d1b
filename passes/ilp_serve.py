"""CostGraphs (one per live batch size) + batch weights + SolverOptions → ServeAssignment + SolverReport: one memory
placement for every batch size, and per batch size its own compute placement and split shares given that memory.

A server's live batch changes every step, its weights cannot move between tiers per step, but where each sublayer
computes can (issue 15; docs/cost-model.md §5). The serving problem therefore shares one *tier vector* per layer
(a tier for each unit's weights and for the KV cache, sized for the largest batch) between all batch sizes b, and
gives every b its own placement; its objective is Σ_b w_b · T_b / Σ_b w_b, T_b = T_prefill + T_decode of a batch
of b (Eq. 8: the time of its gen_len tokens, so T_b / gen_len is its time per step with the prefill amortised).

It is the ILP of passes/ilp.py with other columns (Eqs. 22-23 of docs/cost-model.md):

1. per batch size b and tier vector τ, `ilp.layer_configs(..., per_tier_vector=True)` gives the front of
   placements (prefill and decode) over (seconds, staging, GPU use) — the same enumeration and pricing
   (passes/price.py) as a plan of one point;
2. per τ, the fronts fold over the batch sizes into *serving columns*: one placement per b, with seconds
   Σ_b share_b · T_b, staging the largest of the b's (one buffer serves every step), GPU use if any b uses the GPU,
   and the bytes of τ at the largest batch; only columns no other column of τ beats in all three are kept, which
   loses nothing (the master problem sees nothing else of a column);
3. columns of different τ are pruned as the ILP's configurations are, and `ilp_master.solve_master` picks the
   layer counts under every tier's capacity, with the staging buffer and the workspace (the largest batch's)
   counted once — exactly as for one point, under the same count-based work limits (no time limit), so its
   exactness argument (layer symmetry, staging levels) carries over;
4. the answer is re-verified as passes/ilp_check.py verifies one point's: each batch size's placement re-priced at
   its own batch, its layers counted, its buffers within the shared ones and every budget checked at the largest
   batch (`ilp_check.verify_assignment`); Σ share_b · T_b must be the objective the master problem reports; the
   gap is the one the search's certificate proves over the serving columns (`ilp_check.certified_bound`).

Mixture-of-experts models are refused before this (liac.api.compile_serving): a serving column has no expert
counts per batch size.

    serve, report = solve_serving((costs_b1, costs_b8, costs_b64), weights=(1, 1, 1))
    serve.per_batch[0].choices     # batch 1's configuration per layer group, over the shared tiers

tests/passes/test_ilp_serve.py checks it against brute force over every joint assignment on small instances.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from liac.errors import LiacError
from liac.passes.costs import CostGraph
from liac.passes.ilp import (Assignment, LayerChoice, LayerConfig, Policy, SolverOptions, SolverReport,
                             layer_configs, parse_policy, policy_label)
from liac.passes.ilp_check import (GAP_TOLERANCE, PRICE_TOLERANCE, SolutionCheckError, certified_bound,
                                   verify_assignment)
from liac.passes.ilp_knapsack import pareto
from liac.passes.ilp_master import check_capacity, solve_master

__all__ = ["ServeColumn", "ServeAssignment", "serving_columns", "solve_serving", "batch_shares"]


@dataclass(frozen=True)
class ServeColumn:
    """One layer's tier vector and its placement at every batch size: a column of the serving master problem.

    Attributes:
        column: what the master problem sees: the tiers, the weighted seconds (Σ share_b · prefill, · decode), the
            bytes per tier at the largest batch, the largest staging of any batch, GPU use at any batch.
        per_batch: per batch size (ascending), the layer's configuration at that batch (the same tiers).
        fronts: per batch size, the tier vector's front of configurations at that batch (to place a batch size
            of weight 0: the fastest that fits the shared buffers, `_placed_for_free`).
    """

    column: LayerConfig
    per_batch: tuple[LayerConfig, ...]
    fronts: tuple[tuple[LayerConfig, ...], ...] = ()  # per batch size, every placement of these tiers on its front


@dataclass(frozen=True)
class ServeAssignment:
    """The solver's choice: a memory placement shared by all batch sizes, and each batch size's placement.

    Attributes:
        batches: the batch sizes, ascending. weights: their weights in the objective.
        memory: the layer counts per column (its configs are `ServeColumn.column`), the shared buffers, the
            weighted objective; its `tier_used_bytes` is the plan's memory.
        per_batch: per batch size, the same layer counts with that batch's configurations (tiers unchanged, buffers
            the shared ones), the objective that batch's T_b.
    """

    batches: tuple[int, ...]
    weights: tuple[int, ...]
    memory: Assignment
    per_batch: tuple[Assignment, ...]


def batch_shares(weights: tuple[int, ...]) -> tuple[float, ...]:
    """Each batch size's share of the objective: its weight over their sum."""
    total = sum(weights)
    return tuple(w / total for w in weights)


def _check_inputs(costs: tuple[CostGraph, ...], weights: tuple[int, ...]) -> None:
    if not costs:
        raise LiacError("--batch", "must name at least one batch size")
    batches = [c.workload.batch_size for c in costs]
    if batches != sorted(set(batches)):
        raise ValueError(f"cost graphs must be in ascending batch order, one per size, got batches {batches}")
    if any(unit.experts for c in costs for cls in c.classes for unit in cls.prefill.units):
        raise LiacError("--serve", "a mixture-of-experts model has no serving plan (experts are placed by count "
                        "per batch size only in plans of one point): compile it without --serve")
    if len(weights) != len(costs) or any(not isinstance(w, int) or w < 0 for w in weights) or sum(weights) <= 0:
        raise LiacError("--batch-weights", f"must give one integer weight at least 0 per batch size ({len(costs)}), "
                        f"not all 0, got {list(weights)}")
    first = costs[0]
    for other in costs[1:]:
        same = (other.budgets == first.budgets and other.tiers == first.tiers
                and other.workload.prompt_len == first.workload.prompt_len
                and other.workload.gen_len == first.workload.gen_len
                and [(c.layer_class, c.count, c.units, c.weight_bytes) for c in other.classes]
                == [(c.layer_class, c.count, c.units, c.weight_bytes) for c in first.classes])
        if not same:
            raise ValueError("cost graphs of one serving problem must share the model, budgets and workload lengths")


def _fold(fronts: list[list[LayerConfig]], shares: tuple[float, ...]) -> list[tuple[float, float, int, bool, tuple]]:
    """Per batch size one configuration of the same tier vector → the combinations no other one beats in
    (Σ share · seconds, largest staging, GPU use), as (prefill, decode, staging, uses_gpu, chosen indices)."""
    states = [(0.0, 0.0, 0, False, ())]
    for front, share in zip(fronts, shares):
        grown = [(pre + share * c.prefill_seconds, dec + share * c.decode_seconds, max(stage, c.staging_bytes),
                  gpu or c.uses_gpu, chosen + (index,))
                 for pre, dec, stage, gpu, chosen in states for index, c in enumerate(front)]
        table = np.array([[pre + dec, stage, gpu] for pre, dec, stage, gpu, _ in grown], dtype=np.float64)
        states = [grown[i] for i in pareto(table)]
    return states


def serving_columns(costs: tuple[CostGraph, ...], layer_class: str, shares: tuple[float, ...],
                    policy: Policy = Policy("optimal"), max_split_units: int = 1,
                    resident_layers: bool = True) -> list[ServeColumn]:
    """Every non-dominated serving column of one layer of `layer_class` (steps 1-3 of the module docstring)."""
    by_tiers: list[dict[tuple, list[LayerConfig]]] = []
    for graph in costs:
        fronts = defaultdict(list)
        for config in layer_configs(graph, graph.layer_class(layer_class), policy, max_split_units,
                                    resident_layers=resident_layers, per_tier_vector=True):
            fronts[(config.weights, config.kv_cache)].append(config)
        by_tiers.append(fronts)
    columns = []
    for tiers in sorted(set.intersection(*(set(f) for f in by_tiers))):  # a tier vector every batch can place
        fronts = [f[tiers] for f in by_tiers]
        for pre, dec, stage, gpu, chosen in _fold(fronts, shares):
            per_batch = tuple(front[index] for front, index in zip(fronts, chosen))
            top = per_batch[-1]  # bytes at the largest batch: its KV cache is what the memory placement holds
            column = dataclasses.replace(top, prefill_seconds=pre, decode_seconds=dec, staging_bytes=int(stage),
                                         uses_gpu=bool(gpu))
            columns.append(ServeColumn(column, per_batch, tuple(tuple(front) for front in fronts)))
    if not columns:
        return []
    table = np.array([[s.column.seconds, s.column.hbm_bytes, s.column.ddr_bytes, s.column.cxl_bytes,
                       s.column.staging_bytes, s.column.uses_gpu] for s in columns], dtype=np.float64)
    return [columns[i] for i in pareto(table)]


def _placed_for_free(front: tuple[LayerConfig, ...], staging: int, gpu: bool) -> LayerConfig:
    """A batch size of weight 0 is not in the objective, so the solver may give it any placement of the tiers; it
    gets the fastest one within the shared buffers instead (staging at most `staging`, the GPU only if `gpu`: its
    class's workspace is reserved). One always exists: the one the fold chose for it counts in both buffers."""
    fits = [c for c in front if c.staging_bytes <= staging and (gpu or not c.uses_gpu)]
    return min(fits, key=lambda c: (c.seconds, c.staging_bytes))


def solve_serving(costs: tuple[CostGraph, ...], weights: tuple[int, ...],
                  options: SolverOptions = SolverOptions()) -> tuple[ServeAssignment, SolverReport]:
    """Cost graphs of one model at each live batch size (ascending) → the optimal serving assignment.

    Args:
        costs: one CostGraph per batch size, ascending, all with the same model, budgets, prompt and gen lengths.
        weights: per batch size, its weight in the objective (integers, not all 0).
        options: as for `solve_placement` (policy, solver, split units).

    Returns:
        The ServeAssignment and a SolverReport whose objective is Σ share_b · T_b in seconds.

    Raises:
        InfeasibleError: no memory placement fits the budgets with the largest batch's KV cache; names the tier.
        LiacError: bad weights, unknown solver or policy.
    """
    start = time.perf_counter()
    costs, weights = tuple(costs), tuple(weights)
    _check_inputs(costs, weights)
    shares = batch_shares(weights)
    policy = parse_policy(options.policy)
    columns: dict[str, list[ServeColumn]] = {}
    for cls in costs[-1].classes:
        restrict = policy if cls.layer_class == "decoder" or policy.name == "optimal" else Policy(
            policy.name, prefill_split=False, decode_split=False)
        columns[cls.layer_class] = serving_columns(costs, cls.layer_class, shares, restrict, options.max_split_units,
                                                   options.resident_layers)
    # The master problem of one point, on the largest batch's graph with each class's workspace the largest any
    # batch needs (one workspace serves every step).
    workspace = {cls.layer_class: max(c.layer_class(cls.layer_class).workspace_bytes for c in costs)
                 for cls in costs[-1].classes}
    master_costs = dataclasses.replace(costs[-1], classes=tuple(
        dataclasses.replace(cls, workspace_bytes=workspace[cls.layer_class]) for cls in costs[-1].classes))
    configs = {name: [s.column for s in options_] for name, options_ in columns.items()}
    check_capacity(master_costs, configs)
    solution = solve_master(master_costs, configs, options)
    picked = []  # (class, serving column, count), in class order
    for cls in master_costs.classes:
        for index, serve in enumerate(columns[cls.layer_class]):
            count = solution.counts.get((cls.layer_class, index), 0)
            if count:
                picked.append((cls.layer_class, serve, count))
    staging = max((s.column.staging_bytes for _, s, _ in picked), default=0)
    gpu_workspace = max((workspace[name] for name, s, _ in picked if s.column.uses_gpu), default=0)
    host_workspace = max(workspace.values())
    ends = {name: s.column.weights_tier for name, s, _ in picked if name in ("embed", "head")}
    tied_tier = ends["embed"] if master_costs.tied_weight_bytes and ends["embed"] == ends["head"] else "none"
    tied_bytes = master_costs.tied_weight_bytes if tied_tier != "none" else 0

    def assignment(choices: list[LayerChoice]) -> Assignment:
        objective = sum(config.seconds * count for _, config, count in choices)
        return Assignment(choices=tuple(choices), staging_bytes=staging, workspace_bytes=gpu_workspace,
                          host_workspace_bytes=host_workspace, objective_seconds=objective, tied_tier=tied_tier,
                          tied_bytes=tied_bytes, prefill_microbatch=costs[-1].microbatch)

    memory = assignment([LayerChoice(name, s.column, count) for name, s, count in picked])
    per_batch = tuple(assignment([LayerChoice(name, s.per_batch[k] if weights[k] else
                                              _placed_for_free(s.fronts[k], staging, gpu_workspace >= workspace[name]),
                                              count) for name, s, count in picked])
                      for k in range(len(costs)))
    serve = ServeAssignment(batches=tuple(c.workload.batch_size for c in costs), weights=weights, memory=memory,
                            per_batch=per_batch)
    gap = _check(costs, master_costs, serve, shares, configs, solution.certificate)
    report = SolverReport(name=solution.solver, status="optimal" if gap == 0.0 else "feasible",
                          objective_seconds=memory.objective_seconds, gap=gap,
                          seconds=time.perf_counter() - start,
                          policy=policy_label(options.policy, options.resident_layers),
                          configurations=len(columns["decoder"]))
    return serve, report


def _check(costs: tuple[CostGraph, ...], master_costs: CostGraph, serve: ServeAssignment,
           shares: tuple[float, ...], configs: dict[str, list[LayerConfig]], certificate) -> float:
    """Step 4 of the module docstring: every batch size's placement re-verified at its own batch, the objective
    re-summed from them, and the gap the certificate proves. Raises SolutionCheckError (a compiler bug)."""
    objective = 0.0
    for graph, share, assignment in zip(costs, shares, serve.per_batch):
        objective += share * verify_assignment(graph, assignment)
    claimed = serve.memory.objective_seconds
    if abs(objective - claimed) > PRICE_TOLERANCE * max(objective, 1e-300):
        raise SolutionCheckError(f"solver check: serving objective {claimed!r} s, re-priced per batch size "
                                 f"{objective!r} s")
    bound = certified_bound(master_costs, configs, certificate)
    gap = max(0.0, (objective - bound) / objective) if objective > 0 else 0.0
    return 0.0 if gap <= GAP_TOLERANCE else gap
