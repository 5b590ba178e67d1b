"""CostGraph + SolverOptions → Assignment + SolverReport: place every unit and tensor, exactly, with an ILP.

A column formulation that exploits layer symmetry (docs/cost-model.md §3). Per layer class:

1. enumerate tier vectors: a tier (hbm/ddr/cxl) for each unit's weights and for the KV cache;
2. for each, price all 2^U placements per phase (numpy, `costs.layer_seconds`) and keep the Pareto front over
   (phase seconds, staging bytes, uses the GPU);
3. combine the fronts into layer *configurations* (tiers, prefill placement, decode placement) with their
   objective contribution and bytes per tier, and drop dominated ones.

The PuLP master problem then picks how many decoder layers take each configuration (integer counts summing to N)
and one configuration each for the embedding and the LM head, under every tier's capacity, with the staging
buffer and the GPU workspace counted once (Eqs. 10-13). Each layer's cost depends only on its own configuration
(steady-state pricing, approximation A1), so the optimum over configurations is the optimum over every per-layer
assignment: the gap is 0. Imports neither torch nor the models.

    assignment, report = solve_placement(costs, SolverOptions())
    report.status, report.gap      # 'optimal', 0.0
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pulp

from liac.errors import InfeasibleError, LiacError
from liac.passes.costs import ClassCosts, CostGraph, layer_seconds, placement_masks
from liac.profile import GIB

__all__ = ["SolverOptions", "LayerConfig", "Assignment", "SolverReport", "POLICIES", "parse_policy",
           "layer_configs", "solve_placement", "unit_tiers"]

# Fixed policies of LIA (lia-paper.md §2.3) over the six decoder units (qkv, attn_score, attn_context, out_proj,
# fc1/gate_up/router, fc2/down/experts), 1 = GPU. Each also allows LIA's Optimization-1: whole layers resident
# in HBM, computed on the GPU. 'lia' lets the solver pick among LIA's three per phase.
POLICIES: dict[str, tuple[tuple[int, ...], ...]] = {
    "lia-cpu": ((0, 0, 0, 0, 0, 0),),
    "lia-partial": ((1, 0, 0, 1, 1, 1),),
    "lia-gpu": ((1, 1, 1, 1, 1, 1),),
    "lia": ((0, 0, 0, 0, 0, 0), (1, 0, 0, 1, 1, 1), (1, 1, 1, 1, 1, 1)),
}


@dataclass(frozen=True)
class SolverOptions:
    """How to solve; nothing about the problem itself (that is the CostGraph)."""

    solver: str = "auto"  # 'auto' (HiGHS when highspy is installed, else CBC), 'cbc' or 'highs'
    time_limit_seconds: float = 120.0  # a safety net: the master problems solve in well under a second
    threads: int = 1  # one thread keeps runs deterministic
    policy: str | None = None  # None (free), a POLICIES name for both phases, or 'PREFILL/DECODE'


@dataclass(frozen=True)
class LayerConfig:
    """One configuration of one layer of a class: tiers, placements and what it costs.

    Attributes:
        weights: per unit, the tier of its weights ('none' for units without weights).
        kv_cache: tier of the layer's KV cache ('none' for embed/head).
        prefill: per unit, 1 = GPU, 0 = CPU, during prefill.
        decode: per unit, during decode.
        prefill_seconds: this layer's prefill time.
        decode_seconds: this layer's time summed over all decode steps.
        hbm_bytes, ddr_bytes, cxl_bytes: bytes this layer keeps in each tier (weights and KV cache).
        staging_bytes: the most bytes it streams to the GPU in one step (Eq. 9).
        uses_gpu: whether any unit computes on the GPU (then the class's workspace is reserved in HBM).
    """

    weights: tuple[str, ...]
    kv_cache: str
    prefill: tuple[int, ...]
    decode: tuple[int, ...]
    prefill_seconds: float
    decode_seconds: float
    hbm_bytes: int
    ddr_bytes: int
    cxl_bytes: int
    staging_bytes: int
    uses_gpu: bool

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    def tier_bytes(self, tier: str) -> int:
        return {"hbm": self.hbm_bytes, "ddr": self.ddr_bytes, "cxl": self.cxl_bytes}[tier]


@dataclass(frozen=True)
class Assignment:
    """The solver's choice: (layer class, configuration, layer count) in class order, and the shared buffers."""

    choices: tuple[tuple[str, LayerConfig, int], ...]
    staging_bytes: int  # one staging buffer; the GPU holds prefetch_depth + 1 of them
    workspace_bytes: int  # GPU activation workspace
    host_workspace_bytes: int  # DDR activation workspace
    objective_seconds: float
    tied_tier: str = "none"  # the tier holding a tied embedding/LM-head matrix once, when both units chose it
    tied_bytes: int = 0

    def tier_used_bytes(self, tier: str, prefetch_depth: int) -> int:
        used = sum(config.tier_bytes(tier) * count for _, config, count in self.choices)
        if tier == self.tied_tier:
            used -= self.tied_bytes
        if tier == "hbm":
            used += (prefetch_depth + 1) * self.staging_bytes + self.workspace_bytes
        if tier == "ddr":
            used += self.host_workspace_bytes
        return used


@dataclass(frozen=True)
class SolverReport:
    """How the assignment was found."""

    name: str  # 'HiGHS' or 'PULP_CBC_CMD'
    status: str  # 'optimal' (proven) or 'feasible'
    objective_seconds: float
    gap: float  # relative gap proven by the solver
    seconds: float  # wall time of column generation and solve (never written into a plan)
    policy: str  # 'optimal' when unrestricted, else the policy name
    configurations: int  # decoder configurations offered to the master problem


def parse_policy(policy: str | None, source: str = "--policy") -> tuple[str, tuple | None, tuple | None]:
    """'lia-cpu' or 'lia-gpu/lia-cpu' (prefill/decode) → (name, prefill masks, decode masks); None → free."""
    if policy is None or policy in ("", "optimal"):
        return "optimal", None, None
    parts = policy.split("/")
    if len(parts) > 2 or any(p not in POLICIES for p in parts):
        raise LiacError(source, f"unknown policy '{policy}': must be one of "
                        + ", ".join(f"'{p}'" for p in POLICIES) + " or 'PREFILL/DECODE' of two of them")
    prefill, decode = parts[0], parts[-1]
    return policy, POLICIES[prefill], POLICIES[decode]


def unit_tiers(cls: ClassCosts, weights: tuple[str, ...], kv_cache: str) -> tuple[str, ...]:
    """Per unit, the tier its operand lives in (what `costs.layer_seconds` takes)."""
    out = []
    for operand, tier in zip(cls.operands, weights):
        out.append(tier if operand == "weights" else kv_cache if operand == "kv" else "ddr")
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# Column generation


def _pareto(points: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Indices (ascending) of the rows of `points` [n, d] that no other row dominates (all ≤, one <, all
    minimised); of identical rows the first is kept.

    Rows are visited in lexicographic order (a dominating row sorts before the rows it dominates), each compared
    only with the rows kept so far and the earlier rows of its chunk: O(n · kept), not O(n²).
    """
    n = points.shape[0]
    order = np.lexsort(np.vstack([np.arange(n)[None, :], points.T[::-1]]))
    kept_rows = np.empty((0, points.shape[1]))
    keep = np.zeros(n, dtype=bool)
    for start in range(0, n, chunk):
        rows = order[start:start + chunk]
        block = points[rows]  # [r, d]
        dominated = np.all(kept_rows[None, :, :] <= block[:, None, :], axis=2).any(axis=1)
        earlier = np.all(block[None, :, :] <= block[:, None, :], axis=2)  # [i, j]: row j ≤ row i everywhere
        dominated |= np.tril(earlier, k=-1).any(axis=1)  # j before i in lexicographic order
        keep[rows[~dominated]] = True
        kept_rows = np.vstack([kept_rows, block[~dominated]])
    return np.nonzero(keep)[0]


def _allowed(masks: np.ndarray, allowed: tuple | None) -> np.ndarray:
    if allowed is None:
        return np.ones(masks.shape[0], dtype=bool)
    if masks.shape[1] != len(allowed[0]):
        raise LiacError("--policy", f"LIA's policies cover 6 decoder units, this model has {masks.shape[1]}")
    rows = {tuple(int(v) for v in m) for m in allowed}
    return np.array([tuple(int(v) for v in row) in rows for row in masks])


def layer_configs(costs: CostGraph, cls: ClassCosts, policy: tuple[tuple | None, tuple | None] = (None, None),
                  ) -> list[LayerConfig]:
    """Every non-dominated configuration of one layer of `cls` (steps 1-3 of the module docstring).

    `policy` restricts the decoder's (prefill, decode) placements; whole layers resident in HBM and computed on
    the GPU stay allowed (LIA's Optimization-1).
    """
    tiers = costs.tiers
    num_units = len(cls.units)
    masks = placement_masks(num_units)
    weight_units = [i for i, op in enumerate(cls.operands) if op == "weights"]
    kv_choices = tiers if "kv" in cls.operands or cls.kv_cache_bytes else ("none",)
    all_gpu = np.all(masks == 1, axis=1)
    allowed = {"prefill": _allowed(masks, policy[0]), "decode": _allowed(masks, policy[1])}
    candidates = []
    for weight_tiers in itertools.product(tiers, repeat=len(weight_units)):
        weights = ["none"] * num_units
        for unit, tier in zip(weight_units, weight_tiers):
            weights[unit] = tier
        for kv in kv_choices:
            resident = all(t == "hbm" for t in weight_tiers) and kv in ("hbm", "none")
            operand_tiers = unit_tiers(cls, tuple(weights), kv)
            fronts = {}
            for phase in ("prefill", "decode"):
                seconds, staging, valid, chain = layer_seconds(costs, cls, phase, operand_tiers, masks)
                ok = valid & (allowed[phase] | (all_gpu if resident else False))
                rows = np.nonzero(ok)[0]
                if rows.size == 0:
                    break
                # Of placements equally good for the objective (the max() of Eq. 7 hides a shorter chain when
                # streaming binds), keep the one with the shortest chain: it leaves the most slack.
                rows = rows[np.lexsort((rows, chain[rows], seconds[rows]))]
                uses_gpu = masks[rows].any(axis=1).astype(np.float64)
                front = rows[_pareto(np.stack([seconds[rows], staging[rows], uses_gpu], axis=1))]
                fronts[phase] = [(int(r), float(seconds[r]), float(staging[r])) for r in front]
            if len(fronts) < 2:
                continue
            memory = {"hbm": 0, "ddr": 0, "cxl": 0}
            for unit, tier in enumerate(weights):
                if tier != "none":
                    memory[tier] += cls.weight_bytes[unit]
            if kv != "none":
                memory[kv] += cls.kv_cache_bytes
            combos = []
            for (pre, pre_s, pre_stage), (dec, dec_s, dec_stage) in itertools.product(fronts["prefill"],
                                                                                     fronts["decode"]):
                policy_ok = allowed["prefill"][pre] and allowed["decode"][dec]
                if not policy_ok and not (resident and all_gpu[pre] and all_gpu[dec]):
                    continue  # a resident layer must be resident in both phases, not mixed with a policy
                combos.append(LayerConfig(
                    weights=tuple(weights), kv_cache=kv, prefill=tuple(int(v) for v in masks[pre]),
                    decode=tuple(int(v) for v in masks[dec]), prefill_seconds=pre_s, decode_seconds=dec_s,
                    hbm_bytes=memory["hbm"], ddr_bytes=memory["ddr"], cxl_bytes=memory["cxl"],
                    staging_bytes=int(round(max(pre_stage, dec_stage))),
                    uses_gpu=bool(masks[pre].any() or masks[dec].any())))
            if combos:  # same tiers, same memory: only (seconds, staging, GPU use) can tell them apart
                table = np.array([[c.seconds, c.staging_bytes, c.uses_gpu] for c in combos], dtype=np.float64)
                candidates.extend(combos[i] for i in _pareto(table))
    if not candidates:
        return []
    table = np.array([[c.seconds, c.hbm_bytes, c.ddr_bytes, c.cxl_bytes, c.staging_bytes, c.uses_gpu]
                      for c in candidates], dtype=np.float64)
    return [candidates[i] for i in _pareto(table)]


# ---------------------------------------------------------------------------------------------------------------
# Master problem


def _solver(options: SolverOptions):
    name = options.solver
    if name == "auto":
        name = "highs" if "HiGHS" in pulp.listSolvers(onlyAvailable=True) else "cbc"
    if name == "highs":
        if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
            raise LiacError("--solver", "'highs' needs the highspy package: pip install highspy")
        # Tight tolerances: at HiGHS's defaults (1e-6) the proof of optimality is only good to ~1e-6 relative.
        return "HiGHS", pulp.HiGHS(msg=False, gapRel=0.0, gapAbs=0.0, threads=options.threads,
                                   timeLimit=options.time_limit_seconds, mip_feasibility_tolerance=1e-9,
                                   primal_feasibility_tolerance=1e-9)
    if name == "cbc":
        with warnings.catch_warnings():  # pulp 3.3 warns that 4.0 unbundles CBC; the bundled one is what we use
            warnings.simplefilter("ignore", DeprecationWarning)
            return "PULP_CBC_CMD", pulp.PULP_CBC_CMD(msg=False, gapRel=0.0, gapAbs=0.0, threads=options.threads,
                                                      timeLimit=options.time_limit_seconds)
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


def _levels(problem, name: str, members: list[tuple[float, object, int]]):
    """A shared buffer sized by the largest member in use (Eq. 12), as a staircase of binaries.

    `members` are (size GiB, count variable, count bound). Level j (sizes sorted s_1 < … < s_m) has a binary z_j
    that must be 1 when any member of size ≥ s_j is used: Σ counts of those members ≤ bound · z_j. The buffer is
    Σ_j (s_j − s_{j−1}) · z_j. Summing the counts per level (rather than one binary per configuration) gives a much
    tighter LP relaxation: when every layer streams, the relaxation already charges the full buffer.
    """
    sizes = sorted({size for size, _, _ in members if size > 0})
    total, previous, below = [], 0.0, None
    for level, size in enumerate(sizes):
        z = problem.add_variable(f"{name}_level[{level}]", cat="Binary")
        users = [(var, bound) for s, var, bound in members if s >= size]
        problem += pulp.lpSum(var for var, _ in users) <= sum(bound for _, bound in users) * z, \
            f"{name}_used[{level}]"
        if below is not None:
            problem += z <= below, f"{name}_stair[{level}]"
        total.append((size - previous) * z)
        previous, below = size, z
    return pulp.lpSum(total)


def _build(costs: CostGraph, configs: dict[str, list[LayerConfig]], elastic: bool):
    """The master problem (Eqs. 10-13). With `elastic`, capacities may be exceeded at a price (diagnosis)."""
    budgets = costs.budgets
    problem = pulp.LpProblem("placement", pulp.LpMinimize)
    count = {}
    objective = []
    memory = {"hbm": [], "ddr": [], "cxl": []}
    stagers, workers = [], []
    host_workspace = max(cls.workspace_bytes for cls in costs.classes) / GIB
    for cls in costs.classes:
        options = configs[cls.layer_class]
        for index, config in enumerate(options):
            key = (cls.layer_class, index)
            if cls.count == 1:
                var = problem.add_variable(f"pick[{cls.layer_class},{index}]", cat="Binary")
            else:
                var = problem.add_variable(f"n[{cls.layer_class},{index}]", lowBound=0, upBound=cls.count,
                                           cat="Integer")
            count[key] = var
            objective.append(config.seconds * var)
            for tier in memory:
                if config.tier_bytes(tier):
                    memory[tier].append(config.tier_bytes(tier) / GIB * var)
            stagers.append((config.staging_bytes / GIB, var, cls.count))
            if config.uses_gpu:
                workers.append((cls.workspace_bytes / GIB, var, cls.count))
        problem += pulp.lpSum(count[(cls.layer_class, i)] for i in range(len(options))) == cls.count, \
            f"layers[{cls.layer_class}]"  # Eq. 10
    staging = _levels(problem, "staging", stagers)
    workspace = _levels(problem, "workspace", workers)
    memory["hbm"].append((budgets.prefetch_depth + 1) * staging + workspace)
    if costs.tied_weight_bytes:  # a tied matrix is stored once when embed and head put it in the same tier
        for tier in costs.tiers:
            both = problem.add_variable(f"tied[{tier}]", cat="Binary")
            for name in ("embed", "head"):
                problem += both <= pulp.lpSum(count[(name, i)] for i, c in enumerate(configs[name])
                                              if _weights_tier(c) == tier), f"tied[{tier},{name}]"
            memory[tier].append(-costs.tied_weight_bytes / GIB * both)
    capacity = {"hbm": budgets.hbm_bytes / GIB, "ddr": (budgets.ddr_bytes / GIB) - host_workspace,
                "cxl": budgets.cxl_bytes / GIB}
    slack = {}
    for tier in ("hbm", "ddr", "cxl"):  # Eq. 11
        if elastic:
            slack[tier] = problem.add_variable(f"short_gib[{tier}]", lowBound=0)
            problem += pulp.lpSum(memory[tier]) - slack[tier] <= capacity[tier], f"mem_{tier}"
        else:
            problem += pulp.lpSum(memory[tier]) <= capacity[tier], f"mem_{tier}"
    if elastic:
        problem += pulp.lpSum(slack.values())
    else:
        problem += pulp.lpSum(objective)  # Eq. 13
    return problem, count, staging, workspace, slack, host_workspace


def _weights_tier(config: LayerConfig) -> str:
    """The tier of an embed/head configuration's weights (their one unit)."""
    return next((t for t in config.weights if t != "none"), "none")


def solve_placement(costs: CostGraph, options: SolverOptions = SolverOptions()) -> tuple[Assignment, SolverReport]:
    """CostGraph → the optimal Assignment and how it was found.

    Raises:
        InfeasibleError: no placement fits the budgets; names the binding tier(s) and the shortfall in GiB.
        LiacError: unknown solver or policy.
    """
    start = time.perf_counter()
    policy_name, prefill_masks, decode_masks = parse_policy(options.policy)
    configs = {}
    for cls in costs.classes:
        restrict = (prefill_masks, decode_masks) if cls.layer_class == "decoder" else (None, None)
        configs[cls.layer_class] = layer_configs(costs, cls, restrict)
    _check_capacity(costs, configs)
    solver_name, solver = _solver(options)
    problem, count, staging, workspace, _, host_workspace = _build(costs, configs, elastic=False)
    with _quiet_stdout():
        problem.solve(solver)
    if problem.status != pulp.LpStatusOptimal or problem.sol_status not in (pulp.LpSolutionOptimal,
                                                                             pulp.LpSolutionIntegerFeasible):
        _diagnose(costs, configs, solver)
    gap = 0.0
    status = "optimal" if problem.sol_status == pulp.LpSolutionOptimal else "feasible"
    if solver_name == "HiGHS":
        info = problem.solverModel.getInfo()
        gap = max(0.0, float(info.mip_gap)) if np.isfinite(info.mip_gap) else 0.0
    elif status != "optimal":
        gap = 1.0  # CBC through pulp reports no bound: an unproven answer is all we can say
    choices = []
    for cls in costs.classes:
        for index, config in enumerate(configs[cls.layer_class]):
            value = int(round(count[(cls.layer_class, index)].value() or 0))
            if value:
                choices.append((cls.layer_class, config, value))
    # Buffers: recomputed from the choices (the solver only bounds them from below).
    staging_bytes = max((c.staging_bytes for _, c, _ in choices), default=0)
    workspace_bytes = max((costs.layer_class(name).workspace_bytes for name, c, _ in choices if c.uses_gpu),
                          default=0)
    objective = sum(config.seconds * n for _, config, n in choices)
    ends = {name: _weights_tier(c) for name, c, _ in choices if name in ("embed", "head")}
    tied_tier = ends["embed"] if costs.tied_weight_bytes and ends["embed"] == ends["head"] else "none"
    assignment = Assignment(choices=tuple(choices), staging_bytes=staging_bytes, workspace_bytes=workspace_bytes,
                            host_workspace_bytes=max(c.workspace_bytes for c in costs.classes), objective_seconds=objective,
                            tied_tier=tied_tier, tied_bytes=costs.tied_weight_bytes if tied_tier != "none" else 0)
    report = SolverReport(name=solver_name, status=status, objective_seconds=objective, gap=gap,
                          seconds=time.perf_counter() - start, policy=policy_name,
                          configurations=len(configs["decoder"]))
    return assignment, report


def _size(num_bytes: float) -> str:
    """Bytes for an error message: GiB with one decimal, MiB below one GiB (a tiny model's shortfall shows)."""
    if abs(num_bytes) < GIB:
        return f"{num_bytes / 2**20:.1f} MiB"
    return f"{num_bytes / GIB:.1f} GiB"


def _budget_flag(tier: str) -> str:
    return {"hbm": "--gpu-mem", "ddr": "--cpu-mem", "cxl": "--cxl-mem"}[tier]


def _check_capacity(costs: CostGraph, configs: dict[str, list[LayerConfig]]) -> None:
    """Before solving: the least bytes the model needs in all tiers together must fit their budgets."""
    for cls in costs.classes:
        if not configs[cls.layer_class]:
            raise InfeasibleError("compile", f"no placement of the '{cls.layer_class}' layers is allowed by the "
                                  "policy and tiers", tier="", short_bytes=0)
    need = sum(min(c.hbm_bytes + c.ddr_bytes + c.cxl_bytes for c in configs[cls.layer_class]) * cls.count
               for cls in costs.classes)
    need += max(cls.workspace_bytes for cls in costs.classes) - costs.tied_weight_bytes  # host workspace; tie
    have = costs.budgets.hbm_bytes + costs.budgets.ddr_bytes + costs.budgets.cxl_bytes
    if need > have:
        short = need - have
        raise InfeasibleError("compile", f"constraint mem_total: weights and KV cache need {_size(need)}, the budgets of "
                              f"all tiers allow {_size(have)} (short by {_size(short)})",
                              tier="all", short_bytes=short)


def _diagnose(costs: CostGraph, configs: dict[str, list[LayerConfig]], solver) -> None:
    """The master problem is infeasible: find the least total shortfall and name the tiers that bind."""
    problem, _, _, _, slack, host_workspace = _build(costs, configs, elastic=True)
    with _quiet_stdout():
        problem.solve(solver)
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
