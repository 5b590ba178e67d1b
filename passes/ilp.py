"""CostGraph + SolverOptions → Assignment + SolverReport: place every unit and tensor, exactly, with an ILP.

A column formulation that exploits layer symmetry (docs/cost-model.md §3). Per layer class:

1. enumerate tier vectors: a tier (hbm/ddr/cxl) for each unit's weights and for the KV cache;
2. for each, price every placement per phase (numpy, `costs.layer_seconds`): all 2^U whole placements, and those
   where up to `max_split_units` weight GEMM units with weights off HBM split their output features between the
   CPU and the GPU at a share of the CostGraph's grid; keep the Pareto front over (phase seconds, staging bytes,
   uses the GPU);
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
import heapq
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

__all__ = ["SolverOptions", "Policy", "LayerConfig", "Assignment", "SolverReport", "POLICIES", "WHOLE",
           "parse_policy", "phase_placements", "layer_configs", "solve_placement", "unit_tiers"]

TIER_NAMES = ("hbm", "ddr", "cxl")
# Fixed policies of LIA (lia-paper.md §2.3) over the six decoder units (qkv, attn_score, attn_context, out_proj,
# fc1/gate_up/router, fc2/down/experts), 1 = GPU. Each also allows LIA's Optimization-1: whole layers resident
# in HBM, computed on the GPU. 'lia' lets the solver pick among LIA's three per phase.
POLICIES: dict[str, tuple[tuple[int, ...], ...]] = {
    "lia-cpu": ((0, 0, 0, 0, 0, 0),),
    "lia-partial": ((1, 0, 0, 1, 1, 1),),
    "lia-gpu": ((1, 1, 1, 1, 1, 1),),
    "lia": ((0, 0, 0, 0, 0, 0), (1, 0, 0, 1, 1, 1), (1, 1, 1, 1, 1, 1)),
}
# The optimum over whole-sublayer placements only (no splits): what liac compiled before splits, and the baseline
# a split's gain is measured against.
WHOLE = "whole"


@dataclass(frozen=True)
class SolverOptions:
    """How to solve; nothing about the problem itself (that is the CostGraph)."""

    solver: str = "auto"  # 'auto' (HiGHS when highspy is installed, else CBC), 'cbc' or 'highs'
    time_limit_seconds: float = 120.0  # a safety net: the master problems solve in well under a second
    threads: int = 1  # one thread keeps runs deterministic
    policy: str | None = None  # None (free), a POLICIES name or 'whole' for both phases, or 'PREFILL/DECODE'
    max_split_units: int = 1  # split units per layer and phase (docs/cost-model.md §3: why one is enough)


@dataclass(frozen=True)
class Policy:
    """A restriction of the decoder's placement space, per phase: allowed whole placements (None = any, as
    1 = GPU masks) and whether units may split."""

    name: str  # 'optimal' when unrestricted
    prefill: tuple[tuple[int, ...], ...] | None = None
    decode: tuple[tuple[int, ...], ...] | None = None
    prefill_split: bool = True
    decode_split: bool = True

    def allowed(self, phase: str) -> tuple[tuple[tuple[int, ...], ...] | None, bool]:
        return (self.prefill, self.prefill_split) if phase == "prefill" else (self.decode, self.decode_split)


@dataclass(frozen=True)
class LayerConfig:
    """One configuration of one layer of a class: tiers, placements and what it costs.

    Attributes:
        weights: per unit, the tier of its weights ('none' for units without weights).
        kv_cache: tier of the layer's KV cache ('none' for embed/head).
        prefill_cpu_permille: per unit, the CPU's share of its output features during prefill, in permille:
            1000 = CPU, 0 = GPU, in between a split.
        decode_cpu_permille: per unit, during decode.
        prefill_seconds: this layer's prefill time.
        decode_seconds: this layer's time summed over all decode steps.
        hbm_bytes, ddr_bytes, cxl_bytes: bytes this layer keeps in each tier (weights and KV cache).
        staging_bytes: the most bytes it streams to the GPU in one step (Eq. 9).
        uses_gpu: whether any unit computes on the GPU (then the class's workspace is reserved in HBM).
    """

    weights: tuple[str, ...]
    kv_cache: str
    prefill_cpu_permille: tuple[int, ...]
    decode_cpu_permille: tuple[int, ...]
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

    def cpu_permille(self, phase: str) -> tuple[int, ...]:
        return self.prefill_cpu_permille if phase == "prefill" else self.decode_cpu_permille

    def gpu_shares(self, phase: str) -> tuple[float, ...]:
        """Per unit, the GPU's share of its output features (what `costs.layer_seconds` takes)."""
        return tuple(1.0 - p / 1000.0 for p in self.cpu_permille(phase))

    @property
    def splits(self) -> bool:
        return any(0 < p < 1000 for p in self.prefill_cpu_permille + self.decode_cpu_permille)

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


def parse_policy(policy: str | None, source: str = "--policy") -> Policy:
    """'lia-cpu', 'whole' or 'lia-gpu/lia-cpu' (prefill/decode) → Policy; None or 'optimal' → unrestricted."""
    if policy is None or policy in ("", "optimal"):
        return Policy("optimal")
    parts = policy.split("/")
    if len(parts) > 2 or any(p not in POLICIES and p != WHOLE for p in parts):
        raise LiacError(source, f"unknown policy '{policy}': must be one of "
                        + ", ".join(f"'{p}'" for p in (*POLICIES, WHOLE)) + " or 'PREFILL/DECODE' of two of them")
    prefill, decode = parts[0], parts[-1]
    return Policy(policy, POLICIES.get(prefill), POLICIES.get(decode), False, False)


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


def phase_placements(cls: ClassCosts, phase: str, tiers: tuple[str, ...], split_permille: tuple[int, ...],
                     allowed: tuple | None = None, split: bool = True, max_split_units: int = 1,
                     resident: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every placement of one layer in one phase that the rules and the policy allow.

    Args:
        cls: the layer class.
        phase: 'prefill' or 'decode'.
        tiers: per unit, the tier of its operand (`unit_tiers`).
        split_permille: the CPU shares a split may take (the CostGraph's grid).
        allowed: the policy's whole placements (1 = GPU masks), or None for any.
        split: whether units may split (then up to `max_split_units` of them at once).
        resident: the layer's weights and KV cache are all in HBM: all-GPU stays allowed whatever the policy
            (LIA's Optimization-1).

    Returns:
        (CPU permille [P, U] (1000 = CPU, 0 = GPU, in between a split), in_policy [P] bool: False for the
        all-GPU row that only `resident` allows).
    """
    units = cls.phase(phase).units
    if allowed is not None and len(allowed[0]) != len(units):
        raise LiacError("--policy", f"LIA's policies cover {len(allowed[0])} decoder units, this model has "
                        f"{len(units)}")
    # A unit computes on the CPU only with its operand off HBM (or without one); it splits only from DDR/CXL.
    whole = [(0, 1000) if tiers[u] != "hbm" or unit.cpu_allows_hbm else (0,) for u, unit in enumerate(units)]
    rows = [row for row in itertools.product(*whole)]
    in_policy = [True] * len(rows)
    if allowed is not None:
        masks = {tuple(0 if on_gpu else 1000 for on_gpu in mask) for mask in allowed}
        all_gpu = (0,) * len(units)
        in_policy = [row in masks for row in rows]
        keep = [ok or (resident and row == all_gpu) for row, ok in zip(rows, in_policy)]
        rows = [row for row, ok in zip(rows, keep) if ok]
        in_policy = [ok for ok, k in zip(in_policy, keep) if k]
    if split and split_permille and max_split_units > 0:
        can = [u for u, unit in enumerate(units) if unit.can_split and tiers[u] in ("ddr", "cxl")]
        for count in range(1, max_split_units + 1):
            for chosen in itertools.combinations(can, count):
                options = [split_permille if u in chosen else whole[u] for u in range(len(units))]
                added = list(itertools.product(*options))
                rows.extend(added)
                in_policy.extend([True] * len(added))
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(units)), np.array(in_policy, dtype=bool)


def _balanced(permille: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Rows to keep [P]: every placement without a split, and of each split *family* (the same units split, the
    others placed alike) only the grid share that minimises the phase's time, the largest CPU share among equal
    times (it streams least). A split exists to balance the CPU part against PCIe; shares past that point trade
    time for staging bytes, which whole placements and other families already offer, at a fraction of the
    configurations (docs/cost-model.md §3)."""
    split = (permille > 0) & (permille < 1000)
    keep = ~split.any(axis=1)
    rows = np.nonzero(~keep)[0]
    if rows.size == 0:
        return keep
    family = np.where(split[rows], -1, permille[rows])  # the split units' shares blanked out
    cpu_total = permille[rows].sum(axis=1)
    order = np.lexsort((-cpu_total, seconds[rows]) + tuple(family.T[::-1]))
    ordered = family[order]
    first = np.ones(order.size, dtype=bool)
    first[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    keep[rows[order[first]]] = True
    return keep


def layer_configs(costs: CostGraph, cls: ClassCosts, policy: Policy = Policy("optimal"),
                  max_split_units: int = 1) -> list[LayerConfig]:
    """Every non-dominated configuration of one layer of `cls` (steps 1-3 of the module docstring).

    `policy` restricts the decoder's placements; whole layers resident in HBM and computed on the GPU stay allowed
    (LIA's Optimization-1).
    """
    tiers = costs.tiers
    num_units = len(cls.units)
    weight_units = [i for i, op in enumerate(cls.operands) if op == "weights"]
    kv_choices = tiers if "kv" in cls.operands or cls.kv_cache_bytes else ("none",)
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
                allowed, split = policy.allowed(phase)
                permille, in_policy = phase_placements(cls, phase, operand_tiers, costs.split_permille, allowed,
                                                       split, max_split_units, resident)
                if permille.shape[0] == 0:
                    break
                seconds, staging, valid, chain = layer_seconds(costs, cls, phase, operand_tiers,
                                                               1.0 - permille / 1000.0)
                rows = np.nonzero(valid & _balanced(permille, seconds))[0]
                if rows.size == 0:
                    break
                # Of placements equally good for the objective (the max() of Eq. 7 hides a shorter chain when
                # streaming binds), keep a whole one over a split, then the shortest chain: it leaves the most slack.
                splits = ((permille > 0) & (permille < 1000)).sum(axis=1)
                rows = rows[np.lexsort((rows, chain[rows], splits[rows], seconds[rows]))]
                uses_gpu = (permille[rows] < 1000).any(axis=1).astype(np.float64)
                front = rows[_pareto(np.stack([seconds[rows], staging[rows], uses_gpu], axis=1))]
                fronts[phase] = [(tuple(int(v) for v in permille[r]), float(seconds[r]), float(staging[r]),
                                  bool(in_policy[r])) for r in front]
            if len(fronts) < 2:
                continue
            memory = {"hbm": 0, "ddr": 0, "cxl": 0}
            for unit, tier in enumerate(weights):
                if tier != "none":
                    memory[tier] += cls.weight_bytes[unit]
            if kv != "none":
                memory[kv] += cls.kv_cache_bytes
            combos = []
            for (pre, pre_s, pre_stage, pre_ok), (dec, dec_s, dec_stage, dec_ok) in itertools.product(
                    fronts["prefill"], fronts["decode"]):
                if not (pre_ok and dec_ok) and not (max(pre) == 0 and max(dec) == 0):
                    continue  # a resident layer must be resident in both phases, not mixed with a policy
                combos.append(LayerConfig(
                    weights=tuple(weights), kv_cache=kv, prefill_cpu_permille=pre, decode_cpu_permille=dec,
                    prefill_seconds=pre_s, decode_seconds=dec_s,
                    hbm_bytes=memory["hbm"], ddr_bytes=memory["ddr"], cxl_bytes=memory["cxl"],
                    staging_bytes=int(np.ceil(max(pre_stage, dec_stage))),
                    uses_gpu=min(pre) < 1000 or min(dec) < 1000))
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


def _solver(options: SolverOptions, cutoff: float | None = None):
    """(name, pulp solver). With `cutoff`, the solver may stop as soon as it proves no solution is below it (the
    best plan of another staging level): it then reports a worse solution (HiGHS) or none (CBC)."""
    name = options.solver
    if name == "auto":
        name = "highs" if "HiGHS" in pulp.listSolvers(onlyAvailable=True) else "cbc"
    if name == "highs":
        if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
            raise LiacError("--solver", "'highs' needs the highspy package: pip install highspy")
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


def _levels(problem, name: str, members: list[tuple[float, object, int]], relax: bool = False):
    """A shared buffer sized by the largest member in use (Eq. 12), as a staircase of binaries.

    `members` are (size GiB, count variable, count bound). Level j (sizes sorted s_1 < … < s_m) has a binary z_j
    that must be 1 when any member of size ≥ s_j is used: Σ counts of those members ≤ bound · z_j. The buffer is
    Σ_j (s_j − s_{j−1}) · z_j. Summing the counts per level (rather than one binary per configuration) gives a much
    tighter LP relaxation: when every layer streams, the relaxation already charges the full buffer.
    """
    sizes = sorted({size for size, _, _ in members if size > 0})
    total, previous, below = [], 0.0, None
    for level, size in enumerate(sizes):
        z = problem.add_variable(f"{name}_level[{level}]", lowBound=0, upBound=1,
                                 cat="Continuous" if relax else "Binary")
        users = [(var, bound) for s, var, bound in members if s >= size]
        problem += pulp.lpSum(var for var, _ in users) <= sum(bound for _, bound in users) * z, \
            f"{name}_used[{level}]"
        if below is not None:
            problem += z <= below, f"{name}_stair[{level}]"
        total.append((size - previous) * z)
        previous, below = size, z
    return pulp.lpSum(total)


def _build(costs: CostGraph, configs: dict[str, list[LayerConfig]], elastic: bool = False,
           staging_level: tuple[int, int] | None = None, relax: bool = False,
           elastic_tiers: tuple[str, ...] = TIER_NAMES, useful: set[int] | None = None):
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
    host_workspace = max(cls.workspace_bytes for cls in costs.classes) / GIB
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
            stagers.append((config.staging_bytes / GIB, var, cls.count))
            if config.uses_gpu:
                workers.append((cls.workspace_bytes / GIB, var, cls.count))
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
                                              if (name, i) in count and _weights_tier(c) == tier), \
                    f"tied[{tier},{name}]"
            memory[tier].append(-costs.tied_weight_bytes / GIB * both)
    capacity = {"hbm": budgets.hbm_bytes / GIB, "ddr": (budgets.ddr_bytes / GIB) - host_workspace,
                "cxl": budgets.cxl_bytes / GIB}
    slack = {}
    for tier in TIER_NAMES:  # Eq. 11
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


def _weights_tier(config: LayerConfig) -> str:
    """The tier of an embed/head configuration's weights (their one unit)."""
    return next((t for t in config.weights if t != "none"), "none")


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


def _useful_until(options: list[LayerConfig], chunk: int = 256) -> np.ndarray:
    """Per decoder configuration, the staging level from which another configuration streaming at most that much
    dominates it in (seconds, bytes per tier, GPU use): at a fixed level staging no longer tells configurations
    apart, so from there on it is not worth offering (inf: never). Dominance only grows with the level, so
    configuration c is worth offering at level S exactly when staging_c ≤ S < useful_until[c]."""
    table = np.array([[c.seconds, c.hbm_bytes, c.ddr_bytes, c.cxl_bytes, c.uses_gpu] for c in options],
                     dtype=np.float64).reshape(len(options), 5)
    staging = np.array([c.staging_bytes for c in options], dtype=np.float64)
    until = np.full(len(options), np.inf)
    for start in range(0, len(options), chunk):
        block = table[start:start + chunk]  # [r, 5]
        dominated_by = (np.all(table[None, :, :] <= block[:, None, :], axis=2)
                        & np.any(table[None, :, :] < block[:, None, :], axis=2))  # [r, n]
        until[start:start + chunk] = np.where(dominated_by, staging[None, :], np.inf).min(axis=1)
    return until


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
        host = max(cls.workspace_bytes for cls in costs.classes)
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
    for tier in TIER_NAMES:
        pi = problem.get_constraint_by_name(f"mem_{tier}").pi
        out.append(max(0.0, -float(pi)) if pi is not None and np.isfinite(pi) else 0.0)
    return np.array(out)


def solve_placement(costs: CostGraph, options: SolverOptions = SolverOptions()) -> tuple[Assignment, SolverReport]:
    """CostGraph → the optimal Assignment and how it was found.

    The staging buffer is sized by the largest configuration in use (Eq. 12); the master problem is solved per
    staging level S (Eq. 12'), best bound first: a level whose lower bound (Lagrangian, then its LP relaxation)
    cannot beat the best plan found is closed without solving; the best over all levels is the optimum of
    Eqs. 10-13.

    Raises:
        InfeasibleError: no placement fits the budgets; names the binding tier(s) and the shortfall in GiB.
        LiacError: unknown solver or policy.
    """
    start = time.perf_counter()
    policy = parse_policy(options.policy)
    configs = {}
    for cls in costs.classes:
        # Policies restrict the decoder; the embedding and the head keep whole placements under any policy.
        restrict = policy if cls.layer_class == "decoder" or policy.name == "optimal" else Policy(
            policy.name, prefill_split=False, decode_split=False)
        configs[cls.layer_class] = layer_configs(costs, cls, restrict, options.max_split_units)
    _check_capacity(costs, configs)
    solver_name, solver = _solver(options)
    levels = _staging_levels(configs)
    bounds = _LevelBounds(costs, configs, levels)
    until = _useful_until(configs["decoder"])
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
        problem, count, _ = _build(costs, configs, staging_level=(levels[first], levels[first]), useful=useful)
        cutoff = None if best is None else best[0] - 1e-9 * abs(best[0])
        if not _solve(problem, solver if cutoff is None else _solver(options, cutoff)[1]):
            continue  # no plan at this level (or, with a cutoff, none better than the best)
        value = float(pulp.value(problem.objective))
        if best is None or value < cutoff:  # below the cutoff, the level was solved to optimality
            counts = {key: int(round(var.value() or 0)) for key, var in count.items()}
            best = (value, counts, _gap(problem, solver_name), problem.sol_status == pulp.LpSolutionOptimal)
    if best is None:
        _diagnose(costs, configs, solver)
    _, counts, gap, proven = best
    choices = []
    for cls in costs.classes:
        for index, config in enumerate(configs[cls.layer_class]):
            value = counts.get((cls.layer_class, index), 0)
            if value:
                choices.append((cls.layer_class, config, value))
    # Buffers: recomputed from the choices (the level only bounds them from above).
    staging_bytes = max((c.staging_bytes for _, c, _ in choices), default=0)
    workspace_bytes = max((costs.layer_class(name).workspace_bytes for name, c, _ in choices if c.uses_gpu),
                          default=0)
    objective = sum(config.seconds * n for _, config, n in choices)
    ends = {name: _weights_tier(c) for name, c, _ in choices if name in ("embed", "head")}
    tied_tier = ends["embed"] if costs.tied_weight_bytes and ends["embed"] == ends["head"] else "none"
    assignment = Assignment(choices=tuple(choices), staging_bytes=staging_bytes, workspace_bytes=workspace_bytes,
                            host_workspace_bytes=max(c.workspace_bytes for c in costs.classes), objective_seconds=objective,
                            tied_tier=tied_tier, tied_bytes=costs.tied_weight_bytes if tied_tier != "none" else 0)
    report = SolverReport(name=solver_name, status="optimal" if proven else "feasible",
                          objective_seconds=objective, gap=gap, seconds=time.perf_counter() - start,
                          policy=policy.name, configurations=len(configs["decoder"]))
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
    """The master problem is infeasible: find the least total shortfall and name the tiers that bind.

    Shortfalls can often be shared between tiers (a unit moved from HBM to DDR moves its bytes' shortfall too):
    when one tier alone can take the least total, that tier is named alone.
    """
    problem, _, slack = _build(costs, configs, elastic=True)
    with _quiet_stdout():
        problem.solve(solver)
    least = sum(var.value() or 0.0 for var in slack.values())
    for tier in ("hbm", "ddr", "cxl"):
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
