"""LayerConfig columns + CostGraph → layers per configuration: the placement ILP's master problem (Eqs. 10-13).

`passes/ilp.py` generates each layer class's configurations (the columns); this module chooses how many layers
take each, under every tier's capacity, with the staging buffer and the GPU workspace counted once
(docs/cost-model.md §3). The staging buffer is sized by the largest configuration in use, so the master problem is
solved per staging level S (Eq. 12'): a branch and bound over intervals of levels, best bound first, with bounds
from Lagrange multipliers (every LP's duals) and LP relaxations, and each level's small ILP solved with the best
plan so far as a cutoff. When nothing fits, an elastic copy names the binding tier and its shortfall.

    solution = solve_master(costs, configs, SolverOptions())
    solution.counts[("decoder", 3)], solution.gap   # layers taking decoder configuration 3; 0.0
"""

from __future__ import annotations

import contextlib
import heapq
import os
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import pulp

from liac.errors import InfeasibleError, LiacError, require
from liac.passes.costs import CostGraph
from liac.passes.ilp_knapsack import applies, solve_level
from liac.passes.ilp_records import LayerConfig, SolverOptions
from liac.plan import TIERS
from liac.sizes import GIB

__all__ = ["MasterSolution", "solve_master", "check_capacity", "make_solver"]


@dataclass(frozen=True)
class MasterSolution:
    """The chosen counts: (layer class, configuration index) → layers (absent = 0), and how they were found."""

    counts: dict
    solver: str  # 'HiGHS' or 'PULP_CBC_CMD'
    gap: float  # relative gap proven by the solver
    proven: bool  # the solver proved the best level optimal


def make_solver(options: SolverOptions, cutoff: float | None = None):
    """(name, pulp solver). With `cutoff`, the solver may stop as soon as it proves no solution is below it (the
    best plan of another staging level): it then reports a worse solution (HiGHS) or none (CBC)."""
    name = options.solver
    if name == "auto":
        name = "highs" if "HiGHS" in pulp.listSolvers(onlyAvailable=True) else "cbc"
    if name == "highs":
        if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
            require("highspy", "--solver 'highs'")  # missing: one line naming the extra to install
            raise LiacError("--solver", "'highs': pulp does not find a usable HiGHS in the installed highspy")
        # Tight tolerances: at HiGHS's defaults (1e-6) the proof of optimality is only good to ~1e-6 relative.
        extra = {} if cutoff is None else {"objective_bound": cutoff}
        return "HiGHS", pulp.HiGHS(msg=False, gapRel=0.0, gapAbs=0.0, threads=options.threads,
                                   timeLimit=options.time_limit_seconds, mip_feasibility_tolerance=1e-9,
                                   primal_feasibility_tolerance=1e-9, **extra)
    if name == "cbc":
        with warnings.catch_warnings():  # pulp 3.3 warns that 4.0 unbundles CBC; the bundled one is what we use
            warnings.simplefilter("ignore", DeprecationWarning)
            return "PULP_CBC_CMD", pulp.PULP_CBC_CMD(msg=False, gapRel=0.0, gapAbs=0.0, threads=options.threads,
                                                      timeLimit=options.time_limit_seconds,
                                                      options=[] if cutoff is None else [f"cutoff {cutoff!r}"])
    raise LiacError("--solver", f"unsupported value '{name}': must be one of 'auto', 'cbc', 'highs'")


@contextlib.contextmanager
def _quiet_stdout():
    """Silence file descriptor 1: highspy prints a banner from C++ whatever `msg` says, which would land in the
    middle of `liac compile`'s table."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real stdout (embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _levels(problem, name: str, members: list[tuple[float, object, str, int]], relax: bool = False):
    """A shared buffer sized by the largest member in use (Eq. 12), as a staircase of binaries.

    `members` are (size GiB, count variable, layer class, layers in the class). Level j (sizes sorted
    s_1 < … < s_m) has a binary z_j that must be 1 when any member of size ≥ s_j is used: Σ counts of those
    members ≤ bound · z_j, the bound being the layers of the classes they belong to (a class's counts sum to its
    layers, Eq. 10). The buffer is Σ_j (s_j − s_{j−1}) · z_j. Summing the counts per level (rather than one binary
    per configuration) gives a much tighter LP relaxation: when every layer streams, the relaxation already charges
    the full buffer.
    """
    sizes = sorted({size for size, _, _, _ in members if size > 0})
    total, previous, below = [], 0.0, None
    for level, size in enumerate(sizes):
        z = problem.add_variable(f"{name}_level[{level}]", lowBound=0, upBound=1,
                                 cat="Continuous" if relax else "Binary")
        users = [(var, layer_class, layers) for s, var, layer_class, layers in members if s >= size]
        bound = sum(dict((layer_class, layers) for _, layer_class, layers in users).values())
        problem += pulp.lpSum(var for var, _, _ in users) <= bound * z, f"{name}_used[{level}]"
        if below is not None:
            problem += z <= below, f"{name}_stair[{level}]"
        total.append((size - previous) * z)
        previous, below = size, z
    return pulp.lpSum(total)


def _build(costs: CostGraph, configs: dict[str, list[LayerConfig]], elastic: bool = False,
           staging_level: tuple[int, int] | None = None, relax: bool = False,
           elastic_tiers: tuple[str, ...] = TIERS, useful: set[int] | None = None):
    """The master problem (Eqs. 10-13).

    With `staging_level` = (R, S), only configurations that stream at most S bytes are offered (of the decoder's,
    those in `useful`: `_useful_at`) and the staging buffers reserve the constant (p + 1)·R: with R = S, one
    level of Eq. 12'; with R < S, a relaxation of the levels between them. Without it, the staircase of Eq. 12
    sizes the buffers. With
    `relax`, counts are continuous (the level's LP bound); with `elastic`, capacities may be exceeded at a price
    (diagnosis).
    """
    budgets = costs.budgets
    problem = pulp.LpProblem("placement", pulp.LpMinimize)
    count = {}
    objective = []
    memory = {"hbm": [], "ddr": [], "cxl": []}
    stagers, workers = [], []
    host_workspace = max(cls.host_workspace_bytes for cls in costs.classes) / GIB
    integer = "Continuous" if relax else "Integer"
    for cls in costs.classes:
        options = configs[cls.layer_class]
        offered = []
        for index, config in enumerate(options):
            if staging_level is not None and config.staging_bytes > staging_level[1]:
                continue
            if useful is not None and cls.layer_class == "decoder" and index not in useful:
                continue
            key = (cls.layer_class, index)
            if cls.count == 1:
                var = problem.add_variable(f"pick[{cls.layer_class},{index}]", lowBound=0, upBound=1,
                                           cat="Continuous" if relax else "Binary")
            else:
                var = problem.add_variable(f"n[{cls.layer_class},{index}]", lowBound=0, upBound=cls.count,
                                           cat=integer)
            count[key] = var
            offered.append(var)
            objective.append(config.seconds * var)
            for tier in memory:
                if config.tier_bytes(tier):
                    memory[tier].append(config.tier_bytes(tier) / GIB * var)
            stagers.append((config.staging_bytes / GIB, var, cls.layer_class, cls.count))
            if config.uses_gpu:
                workers.append((cls.workspace_bytes / GIB, var, cls.layer_class, cls.count))
        problem += pulp.lpSum(offered) == cls.count, f"layers[{cls.layer_class}]"  # Eq. 10
    if staging_level is None:
        staging = _levels(problem, "staging", stagers)
    else:
        staging = staging_level[0] / GIB
    workspace = _levels(problem, "workspace", workers, relax)
    memory["hbm"].append((budgets.prefetch_depth + 1) * staging + workspace)
    if costs.tied_weight_bytes:  # a tied matrix is stored once when embed and head put it in the same tier
        for tier in costs.tiers:
            both = problem.add_variable(f"tied[{tier}]", lowBound=0, upBound=1,
                                        cat="Continuous" if relax else "Binary")
            for name in ("embed", "head"):
                problem += both <= pulp.lpSum(count[(name, i)] for i, c in enumerate(configs[name])
                                              if (name, i) in count and c.weights_tier == tier), \
                    f"tied[{tier},{name}]"
            memory[tier].append(-costs.tied_weight_bytes / GIB * both)
    capacity = {"hbm": budgets.hbm_bytes / GIB, "ddr": (budgets.ddr_bytes / GIB) - host_workspace,
                "cxl": budgets.cxl_bytes / GIB}
    slack = {}
    for tier in TIERS:  # Eq. 11
        if elastic and tier in elastic_tiers:
            slack[tier] = problem.add_variable(f"short_gib[{tier}]", lowBound=0)
            problem += pulp.lpSum(memory[tier]) - slack[tier] <= capacity[tier], f"mem_{tier}"
        else:
            problem += pulp.lpSum(memory[tier]) <= capacity[tier], f"mem_{tier}"
    if elastic:
        problem += pulp.lpSum(slack.values())
    else:
        problem += pulp.lpSum(objective)  # Eq. 13
    return problem, count, slack


def _staging_levels(configs: dict[str, list[LayerConfig]]) -> list[int]:
    """The staging sizes S a master problem is solved at (Eq. 12'): each distinct size some configuration streams.
    (None is redundant: the configurations are a Pareto front that includes staging, so each size brings one that
    no configuration streaming less dominates.)"""
    return sorted({c.staging_bytes for options in configs.values() for c in options})


def _cannot_beat(bound: float, best: tuple) -> bool:
    """A level whose lower bound is within the solvers' 1e-9 tolerances of the best plan cannot improve it."""
    return bound >= best[0] - 1e-9 * abs(best[0])


def _solve(problem, solver) -> bool:
    with _quiet_stdout():
        problem.solve(solver)
    return problem.status == pulp.LpStatusOptimal and problem.sol_status in (pulp.LpSolutionOptimal,
                                                                            pulp.LpSolutionIntegerFeasible)


def _gap(problem, solver_name: str) -> float:
    """The relative gap the solver proved; below 1e-12 it is the rounding of the bound (the solves run at 1e-9
    tolerances), reported as 0."""
    if solver_name == "HiGHS":
        info = problem.solverModel.getInfo()
        gap = max(0.0, float(info.mip_gap)) if np.isfinite(info.mip_gap) else 0.0
        return 0.0 if gap < 1e-12 else gap
    # CBC through pulp reports no bound: an unproven answer is all we can say
    return 0.0 if problem.sol_status == pulp.LpSolutionOptimal else 1.0


def _useful_until(options: list[LayerConfig], tiers: tuple[str, ...] = TIERS, chunk: int = 256) -> np.ndarray:
    """Per decoder configuration, the staging level from which another configuration streaming at most that much
    dominates it in (seconds, bytes per tier in `tiers`, GPU use): at a fixed level staging no longer tells
    configurations apart, so from there on it is not worth offering (inf: never). Dominance only grows with the
    level, so configuration c is worth offering at level S exactly when staging_c ≤ S < useful_until[c]. Tiers
    left out of `tiers` are ones whose capacity no choice can exceed (`_tiers_that_can_bind`)."""
    table = np.array([[c.seconds, *(c.tier_bytes(t) for t in tiers), c.uses_gpu] for c in options],
                     dtype=np.float64).reshape(len(options), len(tiers) + 2)
    staging = np.array([c.staging_bytes for c in options], dtype=np.float64)
    until = np.full(len(options), np.inf)
    for start in range(0, len(options), chunk):
        block = table[start:start + chunk]  # [r, 5]
        dominated_by = (np.all(table[None, :, :] <= block[:, None, :], axis=2)
                        & np.any(table[None, :, :] < block[:, None, :], axis=2))  # [r, n]
        until[start:start + chunk] = np.where(dominated_by, staging[None, :], np.inf).min(axis=1)
    return until


def _tiers_that_can_bind(costs: CostGraph, configs: dict[str, list[LayerConfig]]) -> tuple[str, ...]:
    """Tiers whose capacity some choice of configurations could exceed. Without CXL a layer's weights and KV are in
    HBM or DDR, so using less of one means more of the other and no configuration dominates another in both; when
    even the most DDR-hungry choice fits DDR, DDR cannot bind and dominance need not look at it (near-twin
    configurations, e.g. fc1 or fc2 resident, then collapse, which keeps the level problems easy)."""
    host = max(cls.host_workspace_bytes for cls in costs.classes)
    capacity = {"hbm": None, "ddr": costs.budgets.ddr_bytes - host, "cxl": costs.budgets.cxl_bytes}
    out = []
    for tier in TIERS:
        most = sum(cls.count * max((c.tier_bytes(tier) for c in configs[cls.layer_class]), default=0)
                   for cls in costs.classes)
        if capacity[tier] is None or most > capacity[tier]:
            out.append(tier)
    return tuple(out)


def _useful_at(options: list[LayerConfig], until: np.ndarray, staging_level: int) -> set[int]:
    """Decoder configurations worth offering at a staging level (see `_useful_until`)."""
    return {i for i, c in enumerate(options) if c.staging_bytes <= staging_level < until[i]}


class _LevelBounds:
    """Lower bounds of the master problem over an interval of staging levels [S_i, S_j], from Lagrange
    multipliers of the capacities.

    Any plan whose staging level lies in the interval uses only configurations streaming at most S_j and reserves
    at least (p + 1)·S_i. For multipliers λ ≥ 0 (seconds per GiB, one per tier),
    Σ_class count · min over those configurations of (t_c + λ·m_c) − λ·(capacity at S_i + a tied matrix's
    credit) bounds it from below (weak duality; the workspace, which only adds HBM, is dropped). Configurations
    sorted by staging make each minimum a prefix minimum. Every LP solved lends its duals to all intervals.
    """

    def __init__(self, costs: CostGraph, configs: dict[str, list[LayerConfig]], levels: list[int]):
        self.levels = np.asarray(levels, dtype=np.float64)
        self.classes = []
        for cls in costs.classes:
            options = sorted(configs[cls.layer_class], key=lambda c: c.staging_bytes)
            staging = np.array([c.staging_bytes for c in options], dtype=np.float64)
            self.classes.append((cls.count, np.array([c.seconds for c in options]),
                                 np.array([[c.hbm_bytes, c.ddr_bytes, c.cxl_bytes] for c in options]) / GIB,
                                 np.searchsorted(staging, self.levels, side="right")))
        budgets = costs.budgets
        host = max(cls.host_workspace_bytes for cls in costs.classes)
        self.capacity = np.stack([(budgets.hbm_bytes - (budgets.prefetch_depth + 1) * self.levels) / GIB,
                                  np.full(self.levels.size, (budgets.ddr_bytes - host) / GIB),
                                  np.full(self.levels.size, budgets.cxl_bytes / GIB)], axis=1)
        self.capacity += costs.tied_weight_bytes / GIB
        self.multipliers = np.zeros((0, 3))
        self.prefix = []  # per class: [configs, multipliers] prefix minima of t + m·λ
        self.add(np.zeros(3))

    def add(self, multipliers: np.ndarray) -> None:
        self.multipliers = np.vstack([self.multipliers, multipliers[None, :]])
        self.prefix = [np.minimum.accumulate(seconds[:, None] + memory @ self.multipliers.T, axis=0)
                       for _, seconds, memory, _ in self.classes]

    def bound(self, first: int, last: int) -> float:
        """The best bound, over the multipliers so far, of plans with staging levels first..last."""
        total = -(self.multipliers @ self.capacity[first])
        for (count, _, _, allowed), prefix in zip(self.classes, self.prefix):
            if allowed[last] == 0:
                return np.inf  # some class has no configuration streaming so little
            total = total + count * prefix[allowed[last] - 1]
        return float(total.max())


def _multipliers(problem) -> np.ndarray:
    """λ per tier (seconds per GiB) from the duals of the capacity rows of a solved LP (0 when unavailable)."""
    out = []
    for tier in TIERS:
        pi = problem.get_constraint_by_name(f"mem_{tier}").pi
        out.append(max(0.0, -float(pi)) if pi is not None and np.isfinite(pi) else 0.0)
    return np.array(out)


def solve_master(costs: CostGraph, configs: dict[str, list[LayerConfig]], options: SolverOptions) -> MasterSolution:
    """The optimum of Eqs. 10-13 over `configs` (see the module docstring).

    Raises:
        InfeasibleError: no choice fits the budgets; names the binding tier(s) and the shortfall in GiB.
        LiacError: unknown solver.
    """
    solver_name, solver = make_solver(options)
    levels = _staging_levels(configs)
    bounds = _LevelBounds(costs, configs, levels)
    bound_tiers = _tiers_that_can_bind(costs, configs)
    until = _useful_until(configs["decoder"], bound_tiers)
    by_knapsack = applies(costs, bound_tiers)  # levels with HBM the only binding capacity: exact enumeration
    # Branch and bound over intervals of staging levels, best bound first. A node (first, last, relaxed) covers
    # the plans whose staging level is one of levels[first..last]; its LP relaxation offers every configuration
    # streaming at most levels[last] while reserving only (p + 1)·levels[first], so it bounds them all, and a
    # child's bound is at least its parent's.
    heap = [(bounds.bound(0, len(levels) - 1), 0, len(levels) - 1, False)]
    best = None  # (objective, counts, gap, proven optimal)
    while heap:
        bound, first, last, relaxed = heapq.heappop(heap)
        if not np.isfinite(bound) or (best is not None and _cannot_beat(bound, best)):
            break
        if not relaxed:  # tighten its bound: the LP, whose duals also bound every other interval
            useful = _useful_at(configs["decoder"], until, levels[last])
            problem, _, _ = _build(costs, configs, staging_level=(levels[first], levels[last]), relax=True,
                                   useful=useful)
            if _solve(problem, solver):
                bounds.add(_multipliers(problem))
                heapq.heappush(heap, (max(bound, float(pulp.value(problem.objective))), first, last, True))
            continue  # an infeasible relaxation closes the interval
        if first < last:
            middle = (first + last) // 2
            for low, high in ((first, middle), (middle + 1, last)):
                heapq.heappush(heap, (max(bound, bounds.bound(low, high)), low, high, False))
            continue
        useful = _useful_at(configs["decoder"], until, levels[first])
        if by_knapsack:
            level = solve_level(costs, configs, levels[first], useful, None if best is None else best[0])
            if level is not None:  # None: the enumeration grew too large, the ILP solver takes the level
                if level.counts:
                    best = (level.seconds, level.counts, 0.0, True)
                continue
        problem, count, _ = _build(costs, configs, staging_level=(levels[first], levels[first]), useful=useful)
        cutoff = None if best is None else best[0] - 1e-9 * abs(best[0])
        if not _solve(problem, solver if cutoff is None else make_solver(options, cutoff)[1]):
            continue  # no plan at this level (or, with a cutoff, none better than the best)
        value = float(pulp.value(problem.objective))
        if best is None or value < cutoff:  # below the cutoff, the level was solved to optimality
            counts = {key: int(round(var.value() or 0)) for key, var in count.items()}
            best = (value, counts, _gap(problem, solver_name), problem.sol_status == pulp.LpSolutionOptimal)
    if best is None:
        _diagnose(costs, configs, solver)
    return MasterSolution(counts=best[1], solver=solver_name, gap=best[2], proven=best[3])


def _size(num_bytes: float) -> str:
    """Bytes for an error message: GiB with one decimal, MiB below one GiB (a tiny model's shortfall shows)."""
    if abs(num_bytes) < GIB:
        return f"{num_bytes / 2**20:.1f} MiB"
    return f"{num_bytes / GIB:.1f} GiB"


def _budget_flag(tier: str) -> str:
    return {"hbm": "--gpu-mem", "ddr": "--cpu-mem", "cxl": "--cxl-mem"}[tier]


def check_capacity(costs: CostGraph, configs: dict[str, list[LayerConfig]]) -> None:
    """Before solving: the least bytes the model needs in all tiers together must fit their budgets."""
    for cls in costs.classes:
        if not configs[cls.layer_class]:
            raise InfeasibleError("compile", f"no placement of the '{cls.layer_class}' layers is allowed by the "
                                  "policy and tiers", tier="", short_bytes=0)
    need = sum(min(c.hbm_bytes + c.ddr_bytes + c.cxl_bytes for c in configs[cls.layer_class]) * cls.count
               for cls in costs.classes)
    need += max(cls.host_workspace_bytes for cls in costs.classes) - costs.tied_weight_bytes  # host workspace; tie
    have = costs.budgets.hbm_bytes + costs.budgets.ddr_bytes + costs.budgets.cxl_bytes
    if need > have:
        short = need - have
        raise InfeasibleError("compile", f"constraint mem_total: weights and KV cache need {_size(need)}, the budgets of "
                              f"all tiers allow {_size(have)} (short by {_size(short)})",
                              tier="all", short_bytes=short)


def _diagnose(costs: CostGraph, configs: dict[str, list[LayerConfig]], solver) -> None:
    """The master problem is infeasible: find the least total shortfall and name the tiers that bind.

    Shortfalls can often be shared between tiers (a unit moved from HBM to DDR moves its bytes' shortfall too):
    when one tier alone can take the least total, that tier is named alone.
    """
    problem, _, slack = _build(costs, configs, elastic=True)
    with _quiet_stdout():
        problem.solve(solver)
    least = sum(var.value() or 0.0 for var in slack.values())
    for tier in TIERS:
        alone, _, alone_slack = _build(costs, configs, elastic=True, elastic_tiers=(tier,))
        with _quiet_stdout():
            alone.solve(solver)
        if alone.status == pulp.LpStatusOptimal and (alone_slack[tier].value() or 0.0) <= least * (1 + 1e-9) + 1e-12:
            slack = alone_slack
            break
    budgets = {"hbm": costs.budgets.hbm_bytes, "ddr": costs.budgets.ddr_bytes, "cxl": costs.budgets.cxl_bytes}
    parts = []
    worst = ("", 0)
    for tier, var in slack.items():
        short = (var.value() or 0.0) * GIB
        if short > 1e-6 * GIB:
            allowed = budgets[tier]
            parts.append(f"constraint mem_{tier}: needs {_size(allowed + short)}, {_budget_flag(tier)} "
                         f"allows {_size(allowed)} (short by {_size(short)})")
            if short > worst[1]:
                worst = (tier, int(short))
    if not parts:  # cannot happen when the elastic problem solved; keep the error honest anyway
        parts.append("no placement fits the memory budgets")
    raise InfeasibleError("compile", "; ".join(parts), tier=worst[0], short_bytes=worst[1])
