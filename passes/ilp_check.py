"""CostGraph + Assignment + the search's Certificate → the proven gap: the solver's answer, re-verified.

`solve_placement` does not take the search's word for it. After the master problem (passes/ilp_master.py) returns,
this check

1. re-prices every chosen configuration from the CostGraph (`price.layer_time` with its tiers, placement and an
   MoE layer's experts resident in HBM), so the objective is what the cost model says the plan costs, not what
   the column generation stored;
2. recomputes the bytes per tier from the model's unit sizes (an MoE experts unit's resident experts in HBM, the
   others in its tier), the staging buffer from the re-priced streams and the workspace, and checks every budget
   (Eq. 11) in exact integers;
3. re-derives a lower bound for every staging level of the search (Eq. 12'): where a solve closed the level, its
   optimum (or the bound the ILP solver proved); elsewhere the Lagrangian bound under the certificate's
   multipliers, computed here from the configurations with its own loops. The least of them bounds every plan.

A failed 1 or 2 is a bug and raises; 3 gives the gap reported in the plan: 0 when the bound is within the 1e-9
relative tolerance of the objective (status 'optimal'), otherwise the gap itself (status 'feasible').

    gap = check_solution(costs, assignment, certificate, configs)
"""

from __future__ import annotations

import numpy as np

from liac.passes.costs import CostGraph
from liac.passes.ilp_records import Assignment, Certificate, LayerConfig, config_arrays
from liac.passes.price import layer_time, operand_tiers
from liac.plan import TIERS
from liac.sizes import GIB

__all__ = ["SolutionCheckError", "GAP_TOLERANCE", "PRICE_TOLERANCE", "check_solution", "verify_assignment",
           "certified_bound"]

GAP_TOLERANCE = 1e-9  # relative: the tolerance every level is closed to (the solvers' 1e-9)
PRICE_TOLERANCE = 1e-9  # relative: a stored configuration's seconds against its re-pricing


class SolutionCheckError(RuntimeError):
    """The master problem's answer does not hold up (a bug in the compiler, never a user error)."""


def check_solution(costs: CostGraph, assignment: Assignment, certificate: Certificate,
                   configs: dict[str, list[LayerConfig]]) -> float:
    """Re-verify `assignment` (steps 1-3 of the module docstring) and return its proven relative gap.

    Raises:
        SolutionCheckError: the objective or the memory the assignment claims does not match its re-pricing, or
            it does not fit the budgets.
    """
    objective = verify_assignment(costs, assignment)
    bound = certified_bound(costs, configs, certificate)
    gap = max(0.0, (objective - bound) / objective) if objective > 0 else 0.0
    return 0.0 if gap <= GAP_TOLERANCE else gap


def verify_assignment(costs: CostGraph, assignment: Assignment) -> float:
    """Steps 1 and 2 of the module docstring: re-price every chosen configuration, count the layers, check the
    buffers and every budget; returns the re-priced objective in seconds (also used by passes/ilp_serve.py on each
    batch size's placement of a serving plan).

    Raises:
        SolutionCheckError: as `check_solution`.
    """
    staging = workspace = 0
    objective = 0.0
    counts = {}
    for name, config, count in assignment.choices:
        cls = costs.layer_class(name)
        counts[name] = counts.get(name, 0) + count
        tiers = operand_tiers(cls, config.weights, config.kv_cache)
        experts = _experts(cls)
        if not 0 <= config.hbm_experts <= experts:
            raise SolutionCheckError(f"solver check: {name} configuration keeps {config.hbm_experts} experts in HBM, "
                                     f"the layer has {experts}")
        seconds = 0.0
        for phase in ("prefill", "decode"):
            priced = layer_time(costs, cls, phase, tiers, np.array([config.cpu_permille(phase)]), config.hbm_experts)
            if not priced.valid[0]:
                raise SolutionCheckError(f"solver check: {name} configuration {config} is not an allowed placement")
            seconds += float(priced.seconds[0])
            staging = max(staging, int(np.ceil(priced.staging_bytes[0])))
        if abs(seconds - config.seconds) > PRICE_TOLERANCE * max(seconds, 1e-300):
            raise SolutionCheckError(f"solver check: {name} configuration priced {config.seconds!r} s, re-priced "
                                     f"{seconds!r} s")
        objective += seconds * count
        if min(config.prefill_cpu_permille + config.decode_cpu_permille) < 1000:
            workspace = max(workspace, cls.workspace_bytes)
    for cls in costs.classes:
        if counts.get(cls.layer_class, 0) != cls.count:
            raise SolutionCheckError(f"solver check: {counts.get(cls.layer_class, 0)} '{cls.layer_class}' layers "
                                     f"placed, the model has {cls.count}")
    if staging > assignment.staging_bytes or workspace > assignment.workspace_bytes:
        raise SolutionCheckError(f"solver check: buffers of {staging} staging and {workspace} workspace bytes, "
                                 f"the assignment reserves {assignment.staging_bytes} and {assignment.workspace_bytes}")
    _check_memory(costs, assignment)
    if abs(objective - assignment.objective_seconds) > PRICE_TOLERANCE * objective:
        raise SolutionCheckError(f"solver check: objective {assignment.objective_seconds!r} s, re-priced "
                                 f"{objective!r} s")
    return objective


def _experts(cls) -> int:
    """The experts of an MoE layer's experts unit (0 without one)."""
    return max((unit.experts for unit in cls.prefill.units), default=0)


def _check_memory(costs: CostGraph, assignment: Assignment) -> None:
    """Bytes per tier from the units' sizes (not the configurations' fields), against every budget (Eq. 11)."""
    used = dict.fromkeys(TIERS, 0)
    ends = {}
    for name, config, count in assignment.choices:
        cls = costs.layer_class(name)
        for unit, (tier, spec) in enumerate(zip(config.weights, cls.prefill.units)):
            if tier != "none":
                resident = min(config.hbm_experts, spec.experts) * spec.expert_slot_bytes if spec.experts else 0
                used["hbm"] += resident * count
                used[tier] += (cls.weight_bytes[unit] - resident) * count
        if config.kv_cache != "none":
            used[config.kv_cache] += cls.kv_cache_bytes * count
        if name in ("embed", "head"):
            ends[name] = config.weights_tier
    if costs.tied_weight_bytes and ends.get("embed") == ends.get("head") and ends.get("embed") in TIERS:
        used[ends["embed"]] -= costs.tied_weight_bytes
    budgets = costs.budgets
    used["hbm"] += (budgets.prefetch_depth + 1) * assignment.staging_bytes + assignment.workspace_bytes
    used["ddr"] += max(c.host_workspace_bytes for c in costs.classes)
    for tier, budget in (("hbm", budgets.hbm_bytes), ("ddr", budgets.ddr_bytes), ("cxl", budgets.cxl_bytes)):
        if used[tier] > budget:
            raise SolutionCheckError(f"solver check: the plan needs {used[tier]} bytes of {tier}, the budget is "
                                     f"{budget}")


def certified_bound(costs: CostGraph, configs: dict[str, list[LayerConfig]], certificate: Certificate) -> float:
    """The least lower bound over the staging levels (step 3 of the module docstring), in seconds.

    A plan whose largest stream is S uses configurations streaming at most S, one of them exactly S, and reserves
    (p + 1)·S of HBM; for any λ ≥ 0 its seconds are at least Σ_class count·min(t + λ·m) (over configurations
    streaming at most S), plus the least extra of putting one layer on a configuration streaming exactly S, less
    λ·(capacity at S + a tied matrix's credit). Every plan has some largest stream, so the least over levels bounds
    them all.
    """
    budgets = costs.budgets
    host = max(cls.host_workspace_bytes for cls in costs.classes)
    open_levels = np.isnan(certificate.solved)
    lower = float(np.min(certificate.solved[~open_levels], initial=np.inf))
    levels = certificate.levels[open_levels].astype(np.float64)
    if levels.size == 0:
        return lower
    capacity = np.stack([budgets.hbm_bytes - (budgets.prefetch_depth + 1) * levels,
                         np.full(levels.size, float(budgets.ddr_bytes - host)),
                         np.full(levels.size, float(budgets.cxl_bytes))], axis=1)
    capacity = (capacity + costs.tied_weight_bytes) / GIB  # [L, 3]
    per_class = []
    for cls in costs.classes:
        seconds, memory, staging, _ = config_arrays(configs[cls.layer_class])
        order = np.argsort(staging, kind="stable")  # by staging (a stable sort, as `sorted`)
        staging = staging[order].astype(np.float64)
        seconds = seconds[order]
        memory = memory[order].astype(np.float64) / GIB  # TIERS order
        upto = np.searchsorted(staging, levels, side="right")  # configurations streaming at most the level
        starts = np.flatnonzero(np.r_[True, staging[1:] != staging[:-1]]) if staging.size else np.zeros(0, int)
        group = np.minimum(np.searchsorted(staging[starts], levels), max(starts.size - 1, 0))
        exact_here = (starts.size > 0) & (staging[starts][group] == levels) if starts.size else \
            np.zeros(levels.size, dtype=bool)
        per_class.append((cls.count, seconds, memory, upto, starts, group, exact_here))
    best = np.full(levels.size, -np.inf)
    for multipliers in certificate.multipliers:
        total = -(capacity @ multipliers)
        extra = np.full(levels.size, np.inf)
        for count, seconds, memory, upto, starts, group, exact_here in per_class:
            if seconds.size == 0:
                total = total + np.inf
                continue
            priced = seconds + memory @ multipliers
            least = np.where(upto > 0, np.minimum.accumulate(priced)[np.maximum(upto - 1, 0)], np.inf)
            total = total + count * least
            exact = np.where(exact_here, np.minimum.reduceat(priced, starts)[group], np.inf)
            # A class with nothing streaming at most a level leaves no plan there: `total` is already inf, and its
            # extra must stay inf too (inf − inf is nan, which np.minimum would carry into the bound and
            # `best.min()` would then turn into a bound that ignores every open level).
            extra = np.minimum(extra, np.subtract(exact, least, out=np.full(levels.size, np.inf),
                                                  where=np.isfinite(least)))
        best = np.maximum(best, total + extra)
    return min(lower, float(best.min()))
