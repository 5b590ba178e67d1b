"""LayerConfig columns + CostGraph → layers per configuration: the placement ILP's master problem (Eqs. 10-13).

`passes/ilp.py` generates each layer class's configurations (the columns); this module chooses how many layers
take each, under every tier's capacity, with the staging buffer and the GPU workspace counted once
(docs/cost-model.md §3). The staging buffer is sized by the largest configuration in use, so the search runs over
intervals of staging levels (Eq. 12'), best bound first: Lagrangian bounds from the duals of small LPs
(passes/ilp_lp.py), then each interval's relaxation solved exactly (passes/ilp_knapsack.py's group relaxation and
enumeration, or the ILP solver), each under a count-based work limit, never a time limit. An interval whose
relaxation's plan does not fit its own buffers splits at the middle and at that plan's largest stream (so no child
offers it again); a plan found along the way that fits is the incumbent, and a caller's `cutoff` (the best plan of
another prefill micro-batch) prunes from the start. It returns the counts and a certificate of what closed every
level, which passes/ilp_check.py turns into the proven gap. When nothing fits, an elastic copy names the binding
tier and its shortfall.

    solution = solve_master(costs, configs, SolverOptions())
    solution.counts[("decoder", 3)], solution.certificate   # layers taking decoder configuration 3
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import os
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import pulp

from liac.errors import InfeasibleError, LiacError, require
from liac.passes.costs import CostGraph
from liac.passes.ilp_knapsack import (ClassColumns, LevelProblem, LevelSolution, TooLarge, beats,
                                      solve_level, useful_columns)
from liac.passes.ilp_lp import solve_lp
from liac.passes.ilp_records import Certificate, LayerConfig, SolverOptions, config_arrays
from liac.plan import TIERS
from liac.sizes import GIB

__all__ = ["MasterSolution", "Certificate", "solve_master", "check_capacity", "make_solver"]


@dataclass(frozen=True)
class MasterSolution:
    """The chosen counts: (layer class, configuration index) → layers (absent = 0), and how they were found."""

    counts: dict | None  # None: nothing beats the cutoff `solve_master` was given (the certificate proves it)
    solver: str  # 'HiGHS' or 'PULP_CBC_CMD'
    certificate: Certificate  # why no other plan is better: what closed every staging level


def make_solver(options: SolverOptions, cutoff: float | None = None):
    """(name, pulp solver). With `cutoff`, the solver may stop as soon as it proves no solution is below it (the
    best plan of another staging level): it then reports a worse solution (HiGHS) or none (CBC). A worse solution
    from HiGHS proves that only when it searched to the end: stopped by the node limit, it reports its incumbent
    whatever the cutoff (`_solve_level_ilp` reads its bound instead)."""
    name = options.solver
    if name == "auto":
        name = "highs" if "HiGHS" in pulp.listSolvers(onlyAvailable=True) else "cbc"
    if name == "highs":
        if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
            require("highspy", "--solver 'highs'")  # missing: one line naming the extra to install
            raise LiacError("--solver", "'highs': pulp does not find a usable HiGHS in the installed highspy")
        # Tight tolerances: at HiGHS's defaults (1e-6) the proof of optimality is only good to ~1e-6 relative.
        extra = {} if cutoff is None else {"objective_bound": cutoff}
        return "HiGHS", _HiGHS(msg=False, gapRel=0.0, gapAbs=0.0, threads=options.threads,
                               mip_max_nodes=options.node_limit, mip_feasibility_tolerance=1e-9,
                               primal_feasibility_tolerance=1e-9, **extra)
    if name == "cbc":
        with warnings.catch_warnings():  # pulp 3.3 warns that 4.0 unbundles CBC; the bundled one is what we use
            warnings.simplefilter("ignore", DeprecationWarning)
            return "PULP_CBC_CMD", pulp.PULP_CBC_CMD(msg=False, gapRel=0.0, gapAbs=0.0, threads=options.threads,
                                                      maxNodes=options.node_limit,
                                                      options=[] if cutoff is None else [f"cutoff {cutoff!r}"])
    raise LiacError("--solver", f"unsupported value '{name}': must be one of 'auto', 'cbc', 'highs'")


class _HiGHS(pulp.HiGHS):
    """pulp's HiGHS, also reading a solve stopped by the node limit (pulp 3.3 knows time and iteration limits
    only): the best solution found, if any, as a feasible one."""

    def findSolutionValues(self, lp):
        try:
            return super().findSolutionValues(lp)
        except KeyError:  # HighsModelStatus.kSolutionLimit: mip_max_nodes reached (the values are assigned)
            if lp.solverModel.getInfo().primal_solution_status == 2:  # a feasible point
                return pulp.LpStatusOptimal, pulp.LpSolutionIntegerFeasible
            return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound


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
    tight = not elastic and _tight(costs)
    count = {}
    objective = []
    memory = {"hbm": [], "ddr": [], "cxl": []}
    stagers, workers = [], []
    host_workspace = max(cls.host_workspace_bytes for cls in costs.classes) / GIB
    integer = "Continuous" if relax else "Integer"
    for cls in costs.classes:
        options = configs[cls.layer_class]
        offered = []
        # the decoder's offered configurations only (in index order), not a test of each of its thousands
        indices = sorted(useful) if useful is not None and cls.layer_class == "decoder" else range(len(options))
        for index in indices:
            config = options[index]
            if staging_level is not None and config.staging_bytes > staging_level[1]:
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
        if tight and cls.count > 1 and not relax:
            _aggregate(problem, cls.layer_class, cls.count, [(options[index], count[(cls.layer_class, index)])
                                                             for index in indices
                                                             if (cls.layer_class, index) in count])
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


# The budgets of all tiers together leave fewer spare bytes than this many decoder layers hold: every tier is
# nearly full, and the level problems get the unit counts of `_aggregate`.
TIGHT_LAYERS = 4


def _tight(costs: CostGraph) -> bool:
    """Whether the budgets of all tiers together hold the model's weights, KV cache and host workspace with fewer
    than TIGHT_LAYERS decoder layers' bytes to spare (then nearly every byte has one tier it can go to)."""
    need = sum((sum(cls.weight_bytes) + cls.kv_cache_bytes) * cls.count for cls in costs.classes)
    need += max(cls.host_workspace_bytes for cls in costs.classes) - costs.tied_weight_bytes
    have = costs.budgets.hbm_bytes + costs.budgets.ddr_bytes + costs.budgets.cxl_bytes
    layer = max((sum(cls.weight_bytes) + cls.kv_cache_bytes for cls in costs.classes if cls.count > 1), default=0)
    return have - need < TIGHT_LAYERS * layer


def _aggregate(problem, layer_class: str, layers: int, offered: list[tuple[LayerConfig, object]]) -> None:
    """Integer unit counts beside the configuration counts: per (unit, tier) and (KV cache, tier), how many of the
    class's layers keep it there, y = Σ of the counts of the configurations that do. Every y is a sum of integer
    counts, so the rows add no constraint and leave the optimum as it is; they give the ILP solver something to
    branch on where nearly full tiers make the configuration counts alone a market-split problem (many
    configurations whose bytes differ by a unit's size or less: branching on one count barely moves the bound,
    branching on how many layers keep fc1 in CXL does)."""
    members: dict = {}
    for config, var in offered:
        for unit, tier in enumerate(config.weights):
            if tier != "none":
                members.setdefault((str(unit), tier), []).append(var)
        if config.kv_cache != "none":
            members.setdefault(("kv", config.kv_cache), []).append(var)
    for (unit, tier), vars_ in sorted(members.items()):
        y = problem.add_variable(f"y[{layer_class},{unit},{tier}]", lowBound=0, upBound=layers, cat="Integer")
        problem += y == pulp.lpSum(vars_), f"units[{layer_class},{unit},{tier}]"


def _staging_levels(configs: dict[str, list[LayerConfig]]) -> list[int]:
    """The staging sizes S a master problem is solved at (Eq. 12'): each distinct size some configuration streams.
    (None is redundant: the configurations are a Pareto front that includes staging, so each size brings one that
    no configuration streaming less dominates.)"""
    return sorted({int(size) for options in configs.values() for size in np.unique(config_arrays(options)[2])})


def _cannot_beat(bound: float, best: tuple) -> bool:
    """A level whose lower bound is within the solvers' 1e-9 tolerances of the best plan cannot improve it."""
    return bound >= best[0] - 1e-9 * abs(best[0])


def _solve(problem, solver) -> bool:
    with _quiet_stdout():
        problem.solve(solver)
    return problem.status == pulp.LpStatusOptimal and problem.sol_status in (pulp.LpSolutionOptimal,
                                                                            pulp.LpSolutionIntegerFeasible)


def _tiers_that_can_bind(costs: CostGraph, configs: dict[str, list[LayerConfig]],
                         columns: dict[str, ClassColumns] | None = None) -> tuple[str, ...]:
    """Tiers whose capacity some choice of configurations could exceed (HBM always: the staging buffers use it).
    When even the most DDR-hungry choice fits DDR, DDR cannot bind and the level problems leave it out (near-twin
    configurations, e.g. fc1 or fc2 resident, then collapse, which keeps the level problems small)."""
    host = max(cls.host_workspace_bytes for cls in costs.classes)
    capacity = {"hbm": None, "ddr": costs.budgets.ddr_bytes - host, "cxl": costs.budgets.cxl_bytes}
    columns = columns if columns is not None else _columns(costs, configs)
    out = []
    for k, tier in enumerate(TIERS):
        most = sum(cls.count * (int(columns[cls.layer_class].tier_bytes[:, k].max())
                                if columns[cls.layer_class].tier_bytes.shape[0] else 0)
                   for cls in costs.classes)
        if capacity[tier] is None or most > capacity[tier]:
            out.append(tier)
    return tuple(out)


def _columns(costs: CostGraph, configs: dict[str, list[LayerConfig]]) -> dict[str, ClassColumns]:
    """Each class's configurations as arrays, sorted by staging bytes."""
    out = {}
    for cls in costs.classes:
        options = configs[cls.layer_class]
        seconds, tier_bytes, staging, uses_gpu = config_arrays(options)
        order = np.argsort(staging, kind="stable")  # by staging, then index
        tier_index = {t: k for k, t in enumerate(TIERS)}
        weights_tier = np.full(len(options), -1, dtype=np.int64) if cls.layer_class == "decoder" else \
            np.array([tier_index.get(c.weights_tier, -1) for c in options], dtype=np.int64)
        out[cls.layer_class] = ClassColumns(
            layer_class=cls.layer_class, count=cls.count, workspace_bytes=cls.workspace_bytes,
            index=order.astype(np.int64), seconds=seconds[order], tier_bytes=tier_bytes[order],
            staging=staging[order], uses_gpu=uses_gpu[order], weights_tier=weights_tier[order])
    return out


class _Bounds:
    """Lower bounds of the master problem over intervals of staging levels, from Lagrange multipliers.

    A plan whose largest stream lies in [S_i, S_j] uses only configurations streaming at most S_j, at least one of
    them streaming at least S_i, and reserves at least (p + 1)·S_i of HBM. For multipliers λ ≥ 0 (seconds per
    GiB, one per tier), with P_class(λ) the least t + λ·m over the class's configurations streaming at most S_j,

        Σ_class count · P_class(λ) + min_class (least t + λ·m streaming in [S_i, S_j] − P_class(λ)) − λ·(capacity at S_i)

    bounds it from below (weak duality, one layer forced onto a configuration of the interval; the capacity counts
    a tied matrix's credit in every tier and no workspace, which only loosens it). Configurations sorted by staging
    make P a prefix minimum. Every LP solved adds its duals to the pool.
    """

    def __init__(self, costs: CostGraph, columns: dict[str, ClassColumns], levels: np.ndarray):
        self.levels = levels
        self.columns = list(columns.values())
        self.upto = [np.searchsorted(c.staging, levels, side="right") for c in self.columns]
        self.at = [np.searchsorted(c.staging, levels, side="left") for c in self.columns]
        budgets = costs.budgets
        host = max(cls.host_workspace_bytes for cls in costs.classes)
        self.capacity = np.stack([(budgets.hbm_bytes - (budgets.prefetch_depth + 1) * levels.astype(np.float64)),
                                  np.full(levels.size, float(budgets.ddr_bytes - host)),
                                  np.full(levels.size, float(budgets.cxl_bytes))], axis=1) / GIB
        self.capacity += costs.tied_weight_bytes / GIB
        self.memory = [c.tier_bytes / GIB for c in self.columns]
        self.multipliers = np.zeros((0, 3))
        self.priced = [np.zeros((c.seconds.size, 0)) for c in self.columns]  # [K, P] t + λ·m
        self.prefix = [np.zeros((c.seconds.size, 0)) for c in self.columns]  # [K, P] its prefix minima
        self.add(np.zeros(3))

    def add(self, multipliers: np.ndarray) -> None:
        """One more λ (seconds per GiB, per tier)."""
        self.multipliers = np.vstack([self.multipliers, multipliers[None, :]])
        for k, c in enumerate(self.columns):
            priced = c.seconds + self.memory[k] @ multipliers
            self.priced[k] = np.column_stack([self.priced[k], priced])
            self.prefix[k] = np.column_stack([self.prefix[k], np.minimum.accumulate(priced)])

    def bound(self, first: int, last: int) -> float:
        """The best bound, over the multipliers so far, of plans whose largest stream is in levels first..last."""
        total = -(self.capacity[first] @ self.multipliers.T)  # [P]
        extra = np.full(self.multipliers.shape[0], np.inf)
        for k, c in enumerate(self.columns):
            upto, at = self.upto[k][last], self.at[k][first]
            if upto == 0:
                return np.inf  # some class has no configuration streaming so little
            least = self.prefix[k][upto - 1]
            total = total + c.count * least
            if at < upto:
                extra = np.minimum(extra, self.priced[k][at:upto].min(axis=0) - least)
        return float((total + extra).max())


def _level_problem(costs: CostGraph, first: int, last: int, levels: np.ndarray, tiers: tuple[str, ...],
                   multipliers: np.ndarray | None = None) -> LevelProblem:
    """Levels first..last relaxed into one problem: configurations streaming up to levels[last], buffers reserved
    for levels[first], at least one configuration streaming levels[first] or more."""
    budgets = costs.budgets
    host = max(cls.host_workspace_bytes for cls in costs.classes)
    capacity = np.array([budgets.hbm_bytes - (budgets.prefetch_depth + 1) * int(levels[first]),
                         budgets.ddr_bytes - host, budgets.cxl_bytes], dtype=np.int64)
    return LevelProblem(level_bytes=int(levels[last]), reserve_bytes=int(levels[first]),
                        tiers=tuple(TIERS.index(t) for t in tiers), capacity=capacity,
                        tied_bytes=costs.tied_weight_bytes, multipliers=multipliers)


def _level_lp(level: LevelProblem, columns: dict[str, ClassColumns]) -> np.ndarray | None:
    """λ per GiB ([3], 0 for tiers left out) from the LP relaxation of a level problem (workspace left out, a tied
    matrix credited in every tier: a relaxation), or None when even that is infeasible."""
    tiers = list(level.tiers)
    blocks, rows = [], []
    for c in columns.values():
        offered = useful_columns(c, level) if c.layer_class == "decoder" else np.flatnonzero(c.staging <= level.level_bytes)
        if offered.size == 0:
            return None
        blocks.append((c, offered))
    cost = np.concatenate([c.seconds[o] for c, o in blocks])
    memory = np.concatenate([c.tier_bytes[o][:, tiers] for c, o in blocks]).T / GIB
    equal = np.zeros((len(blocks), cost.size))
    start = 0
    for k, (c, o) in enumerate(blocks):
        equal[k, start:start + o.size] = 1.0
        rows.append(c.count)
        start += o.size
    capacity = (level.capacity[tiers] + level.tied_bytes) / GIB
    result = solve_lp(cost, equal, rows, memory, capacity)
    if result is None:
        return None
    out = np.zeros(3)
    out[tiers] = result.capacity_duals
    return out


def _largest_stream(columns: dict[str, ClassColumns], counts: dict) -> int:
    """The staging bytes of the largest configuration a plan uses."""
    return max(int(columns[name].staging[np.flatnonzero(columns[name].index == index)[0]])
               for (name, index), n in counts.items() if n)


def _fits(costs: CostGraph, columns: dict[str, ClassColumns], counts: dict) -> bool:
    """Whether a plan found for a relaxed interval also fits with the staging buffer its own largest stream needs."""
    budgets = costs.budgets
    used = np.zeros(3, dtype=np.int64)
    staging = workspace = 0
    ends = []
    for (name, index), n in counts.items():
        c = columns[name]
        k = int(np.flatnonzero(c.index == index)[0])
        used += n * c.tier_bytes[k]
        staging = max(staging, int(c.staging[k]))
        if c.uses_gpu[k]:
            workspace = max(workspace, c.workspace_bytes)
        if name != "decoder":
            ends.append(int(c.weights_tier[k]))
    if costs.tied_weight_bytes and len(ends) == 2 and ends[0] == ends[1] >= 0:
        used[ends[0]] -= costs.tied_weight_bytes
    used[0] += (budgets.prefetch_depth + 1) * staging + workspace
    used[1] += max(cls.host_workspace_bytes for cls in costs.classes)
    return bool((used <= np.array([budgets.hbm_bytes, budgets.ddr_bytes, budgets.cxl_bytes])).all())


def solve_master(costs: CostGraph, configs: dict[str, list[LayerConfig]], options: SolverOptions,
                 diagnose: bool = True, cutoff: float = np.inf) -> MasterSolution:
    """The optimum of Eqs. 10-13 over `configs` (see the module docstring).

    With a finite `cutoff` (the objective of a plan found elsewhere, e.g. at another prefill micro-batch), only a
    plan that beats it by more than the 1e-9 relative tolerance counts: the search prunes with it from the start,
    and when no plan beats it, `counts` is None and the certificate bounds every level from below (by the cutoff
    where the search closed a level with it), so the caller still gets a proven bound.

    Raises:
        InfeasibleError: no choice fits the budgets; names the binding tier(s) and the shortfall in GiB (with
            `diagnose` False, only that nothing fits: the elastic problems that find the shortfall are skipped).
        LiacError: unknown solver.
    """
    solver_name, solver = make_solver(options)
    columns = _columns(costs, configs)
    levels = np.array(_staging_levels(configs), dtype=np.int64)
    tiers = _tiers_that_can_bind(costs, configs, columns)
    bounds = _Bounds(costs, columns, levels)
    # Branch and bound over intervals of levels, best bound first. An interval's relaxation offers every
    # configuration streaming up to its last level but reserves only its first level's buffers, so it bounds all
    # its levels, and its children's bounds are at least its own. A popped interval whose bound the pool has since
    # raised goes back; one without an LP gets its LP (whose duals bound every interval); one with an LP gets its
    # relaxation solved exactly: nothing that beats the best plan closes it, a plan that also fits with its own
    # buffers closes it (no plan of the interval is better), anything else splits it.
    heap = [(bounds.bound(0, levels.size - 1), 0, levels.size - 1, False)]
    best = None if not np.isfinite(cutoff) else (float(cutoff), None)  # (objective, counts)
    solved = np.full(levels.size, np.nan)  # per level: the lower bound a solve proved, where one closed it
    priced = {}  # (first, last) → λ of the interval's LP
    # A first plan, so that the search prunes from the start: the level with the least bound under the root LP's
    # multipliers, solved exactly (its result also stands as that level's certificate).
    root = _level_lp(_level_problem(costs, 0, levels.size - 1, levels, tiers), columns)
    if root is not None:
        bounds.add(root)
        single = np.array([bounds.bound(j, j) for j in range(levels.size)])
        j = int(np.argmin(single))
        if np.isfinite(single[j]):
            multipliers = _level_lp(_level_problem(costs, j, j, levels, tiers), columns)
            if multipliers is not None:
                bounds.add(multipliers)
                problem = _level_problem(costs, j, j, levels, tiers, multipliers)
                # Only the small budgets: this level is a guess, and the loop below solves it again if needed.
                found, lower, _ = _solve_exactly(costs, configs, columns, problem, options,
                                                 np.inf if best is None else best[0], True, full=False)
                if found is not None:
                    solved[j] = lower
                    if found.counts:
                        best = (found.seconds, found.counts)
    while heap:
        bound, first, last, relaxed = heapq.heappop(heap)
        if not np.isfinite(bound):
            solved[first:last + 1] = np.inf
            continue
        if best is not None and _cannot_beat(bound, best):
            heapq.heappush(heap, (bound, first, last, relaxed))
            break
        fresh = bounds.bound(first, last)
        if fresh > bound * (1 + 1e-12) + 1e-300:
            heapq.heappush(heap, (fresh, first, last, relaxed))
            continue
        if not relaxed:
            multipliers = _level_lp(_level_problem(costs, first, last, levels, tiers), columns)
            if multipliers is None:
                solved[first:last + 1] = np.inf  # an infeasible relaxation closes the interval
                continue
            bounds.add(multipliers)
            priced[(first, last)] = multipliers
            heapq.heappush(heap, (max(bound, bounds.bound(first, last)), first, last, True))
            continue
        problem = _level_problem(costs, first, last, levels, tiers, priced.get((first, last)))
        cutoff = np.inf if best is None else best[0]
        found, lower, settled = _solve_exactly(costs, configs, columns, problem, options, cutoff, first == last)
        if first == last:
            solved[first] = lower
            if found is not None and found.counts and beats(found.seconds, cutoff):
                best = (found.seconds, found.counts)
            continue
        fits = found is not None and bool(found.counts) and _fits(costs, columns, found.counts)
        if settled and not found.counts:
            solved[first:last + 1] = cutoff  # nothing in the interval beats the best plan
            continue
        if settled and fits:
            solved[first:last + 1] = found.seconds  # the interval's optimum
            best = (found.seconds, found.counts)
            continue
        if fits:  # the solver's budget ran out on a plan that fits: not proven best here, but a plan
            best = (found.seconds, found.counts)
        # Split at the middle and, when the relaxation found a plan, at the level of its largest stream: then no
        # child offers that plan again if it does not fit (below it the plan's stream is not offered, from it on
        # its buffers do not fit), and no child is more than half the interval.
        cuts = {(first + last) // 2 + 1}
        if found is not None and found.counts:
            stream = int(np.searchsorted(levels, _largest_stream(columns, found.counts)))
            if first < stream <= last:
                cuts.add(stream)
        floor = max(bound, found.seconds if settled else lower)
        edges = [first] + sorted(cuts) + [last + 1]
        for low, high in zip(edges[:-1], edges[1:]):
            heapq.heappush(heap, (max(floor, bounds.bound(low, high - 1)), low, high - 1, False))
    if best is None:  # (with a cutoff, no plan beating it is an answer: counts None)
        open_levels = np.flatnonzero(~(solved == np.inf))  # neither a plan nor a proof that none exists
        if open_levels.size:
            # The solver stopped at its work limit there (or had numerical trouble on a huge model). Saying
            # "infeasible" would be a lie that the other solver, or a larger limit, can contradict.
            raise LiacError("compile", f"the {solver_name} solver stopped at staging level "
                                       f"{_size(levels[open_levels[0]])} without a plan or a proof that none exists "
                                       f"(work limits: {options.max_states} states, {options.node_limit} nodes): "
                                       f"retry with --solver {'cbc' if solver_name == 'HiGHS' else 'highs'}")
        if not diagnose:
            raise InfeasibleError("compile", "no placement fits the memory budgets", tier="", short_bytes=0)
        _diagnose(costs, configs, solver)
    for bound, first, last, _ in heap:  # closed by their bounds: a solved relaxation's, or the multipliers'
        if bound > bounds.bound(first, last) * (1 + 1e-12):
            solved[first:last + 1] = np.fmin(solved[first:last + 1], bound)
    return MasterSolution(counts=best[1], solver=solver_name,
                          certificate=Certificate(levels, solved, bounds.multipliers.copy()))


def _solve_level_ilp(costs, configs, columns, level: LevelProblem, options: SolverOptions, cutoff: float,
                     node_limit: int):
    """A level problem through the ILP solver, with a node limit and the best plan as a cutoff (without the
    requirement that a configuration stream at least the reserve: a relaxation for an interval of levels).
    Returns (LevelSolution, a proven lower bound, whether the solver settled it)."""
    useful = {int(columns["decoder"].index[k]) for k in useful_columns(columns["decoder"], level)}
    problem, count, _ = _build(costs, configs, staging_level=(level.reserve_bytes, level.level_bytes), useful=useful)
    limited = dataclasses.replace(options, node_limit=node_limit)
    name, solver = make_solver(limited, None if not np.isfinite(cutoff) else cutoff - 1e-9 * abs(cutoff))
    if not _solve(problem, solver):
        if problem.status == pulp.LpStatusInfeasible or problem.sol_status == pulp.LpSolutionInfeasible:
            return LevelSolution(np.inf, {}), cutoff, True  # nothing below the cutoff (or nothing at all)
        return LevelSolution(np.inf, {}), _relaxed_bound(costs, configs, level, useful, options), False
    value = float(pulp.value(problem.objective))
    proven = problem.sol_status == pulp.LpSolutionOptimal
    if not beats(value, cutoff):
        if proven:
            return LevelSolution(np.inf, {}), cutoff, True  # searched to the end: nothing below the cutoff
        # Stopped by the node limit with a plan no better than the cutoff: that proves nothing about the plans
        # below it (HiGHS reports the incumbent it has; the cutoff only prunes); only the solver's bound does.
        bound = _solver_bound(problem, name)
        if bound is None:
            bound = _relaxed_bound(costs, configs, level, useful, options)
        if not beats(bound, cutoff):
            return LevelSolution(np.inf, {}), cutoff, True
        return LevelSolution(np.inf, {}), bound, False
    counts = {key: int(round(var.value() or 0)) for key, var in count.items() if round(var.value() or 0)}
    if proven:
        return LevelSolution(value, counts), value, True
    bound = _solver_bound(problem, name)
    return (LevelSolution(value, counts),
            bound if bound is not None else _relaxed_bound(costs, configs, level, useful, options), False)


def _solve_exactly(costs, configs, columns, level: LevelProblem, options: SolverOptions, cutoff: float,
                   single: bool, full: bool = True) -> tuple[LevelSolution | None, float, bool]:
    """A level problem by deterministic work limits, cheap attempts first: the enumeration and the ILP solver
    each with a small budget, then (a single level only, unless not `full`) each with the full one. Returns (the
    best plan that beats `cutoff`, or none; a proven lower bound; whether it is settled). Unsettled, the plan is
    the best the ILP solver found within its budget (it fits the level problem, not necessarily the buffers of
    its own largest stream) or none, and the bound is what the solver proved."""
    small_states, small_nodes = max(1, options.max_states // 40), max(1, options.node_limit // 50)
    attempts = [("enumerate", small_states), ("ilp", small_nodes if single else max(1, small_nodes // 4))]
    if single and full:
        attempts += [("enumerate", options.max_states), ("ilp", options.node_limit)]
    last = (None, -np.inf, False)
    for method, budget in attempts:
        if method == "enumerate":
            try:
                # the cheap attempt gives the group relaxation a tenth of its states: where it does not settle
                # within them, the enumeration usually does at once (the full attempt gives it all of them)
                found = solve_level(level, columns, cutoff, budget,
                                    max(1, budget // 10) if budget < options.max_states else budget)
            except TooLarge:
                continue
            return found, min(found.seconds, cutoff), True
        found, bound, settled = _solve_level_ilp(costs, configs, columns, level, options, cutoff, budget)
        if settled:
            return found, bound, True
        last = (found, bound, False)
    return last


def _relaxed_bound(costs, configs, level: LevelProblem, useful: set[int], options: SolverOptions) -> float:
    """The level's LP relaxation: a lower bound when the solver proved none."""
    problem, _, _ = _build(costs, configs, staging_level=(level.reserve_bytes, level.level_bytes), relax=True,
                           useful=useful)
    _, solver = make_solver(options)
    return float(pulp.value(problem.objective)) if _solve(problem, solver) else -np.inf


def _solver_bound(problem, name: str) -> float | None:
    """The lower bound the MILP solver proved (HiGHS reports it; CBC through pulp does not)."""
    if name != "HiGHS":
        return None
    info = problem.solverModel.getInfo()
    bound = float(info.mip_dual_bound)
    return bound if np.isfinite(bound) else None


def _size(num_bytes: float) -> str:
    """Bytes for an error message: GiB with one decimal, MiB below one GiB (a tiny model's shortfall shows)."""
    if abs(num_bytes) < GIB:
        return f"{num_bytes / 2**20:.1f} MiB"
    return f"{num_bytes / GIB:.1f} GiB"


def _budget_flag(tier: str) -> str:
    return {"hbm": "--gpu-mem", "ddr": "--cpu-mem", "cxl": "--cxl-mem"}[tier]


def check_capacity(costs: CostGraph, configs: dict[str, list[LayerConfig]] | None = None) -> None:
    """Before solving: the bytes the model needs in all tiers together must fit their budgets (every configuration
    of a class holds the same bytes, only in different tiers, so this needs no configurations); with `configs`,
    every class must also have one the policy allows."""
    for cls in costs.classes:
        if configs is not None and not configs[cls.layer_class]:
            raise InfeasibleError("compile", f"no placement of the '{cls.layer_class}' layers is allowed by the "
                                  "policy and tiers", tier="", short_bytes=0)
    need = sum((sum(cls.weight_bytes) + cls.kv_cache_bytes) * cls.count for cls in costs.classes)
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
    if not parts:  # the elastic problem needs no extra memory: the budgets fit, the solver failed to see it
        raise LiacError("compile", f"the {'HiGHS' if isinstance(solver, pulp.HiGHS) else 'CBC'} solver found no "
                                   "plan although the memory budgets suffice (numerical trouble on this model): retry "
                                   "with the other --solver")
    raise InfeasibleError("compile", "; ".join(parts), tier=worst[0], short_bytes=worst[1])
