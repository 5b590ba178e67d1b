"""CostGraph + SolverOptions → Assignment + SolverReport: place every unit and tensor, exactly, with an ILP.

A column formulation that exploits layer symmetry (docs/cost-model.md §3). Per layer class:

1. enumerate tier vectors: a tier (hbm/ddr/cxl) for each unit's weights and for the KV cache;
2. for each, price every placement per phase (numpy, `price.layer_time`): all 2^U whole placements, and those
   where up to `max_split_units` weight GEMM units with weights off HBM split their output features between the
   CPU and the GPU at a share of the CostGraph's grid; keep the Pareto front over (phase seconds, staging bytes,
   uses the GPU);
3. combine the fronts into layer *configurations* (tiers, prefill placement, decode placement) with their
   objective contribution and bytes per tier, and drop dominated ones.

The PuLP master problem (passes/ilp_master.py) then picks how many decoder layers take each configuration (integer
counts summing to N) and one configuration each for the embedding and the LM head, under every tier's capacity,
with the staging buffer and the GPU workspace counted once (Eqs. 10-13), solved per staging level. Each layer's
cost depends only on its own configuration (steady-state pricing, approximation A1), so the optimum over
configurations is the optimum over every per-layer assignment: the gap is 0. Imports neither torch nor the models.

    assignment, report = solve_placement(costs, SolverOptions())
    report.status, report.gap      # 'optimal', 0.0
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from liac.errors import LiacError
from liac.passes.costs import ClassCosts, CostGraph
from liac.passes.ilp_master import check_capacity, solve_master
from liac.passes.ilp_records import LayerConfig, SolverOptions
from liac.passes.price import layer_time, operand_tiers
from liac.plan import HOST_TIERS

__all__ = ["SolverOptions", "Policy", "LayerConfig", "LayerChoice", "Assignment", "SolverReport", "POLICIES", "WHOLE",
           "parse_policy", "phase_placements", "layer_configs", "solve_placement"]

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


class LayerChoice(NamedTuple):
    """`count` layers of `layer_class` take `config`."""

    layer_class: str
    config: LayerConfig
    count: int


@dataclass(frozen=True)
class Assignment:
    """The solver's choice: its layer choices in class order, and the shared buffers."""

    choices: tuple[LayerChoice, ...]
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
        tiers: per unit, the tier of its operand (`price.operand_tiers`).
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
        can = [u for u, unit in enumerate(units) if unit.can_split and tiers[u] in HOST_TIERS]
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
            operands = operand_tiers(cls, tuple(weights), kv)
            fronts = {}
            for phase in ("prefill", "decode"):
                allowed, split = policy.allowed(phase)
                permille, in_policy = phase_placements(cls, phase, operands, costs.split_permille, allowed,
                                                       split, max_split_units, resident)
                if permille.shape[0] == 0:
                    break
                priced = layer_time(costs, cls, phase, operands, permille)
                seconds, staging, chain = priced.seconds, priced.staging_bytes, priced.chain_seconds
                valid = priced.valid
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
    check_capacity(costs, configs)
    solution = solve_master(costs, configs, options)
    choices = []
    for cls in costs.classes:
        for index, config in enumerate(configs[cls.layer_class]):
            value = solution.counts.get((cls.layer_class, index), 0)
            if value:
                choices.append(LayerChoice(cls.layer_class, config, value))
    # Buffers: recomputed from the choices (the level only bounds them from above).
    staging_bytes = max((c.staging_bytes for _, c, _ in choices), default=0)
    workspace_bytes = max((costs.layer_class(name).workspace_bytes for name, c, _ in choices if c.uses_gpu),
                          default=0)
    objective = sum(config.seconds * n for _, config, n in choices)
    ends = {name: c.weights_tier for name, c, _ in choices if name in ("embed", "head")}
    tied_tier = ends["embed"] if costs.tied_weight_bytes and ends["embed"] == ends["head"] else "none"
    assignment = Assignment(choices=tuple(choices), staging_bytes=staging_bytes, workspace_bytes=workspace_bytes,
                            host_workspace_bytes=max(c.host_workspace_bytes for c in costs.classes), objective_seconds=objective,
                            tied_tier=tied_tier, tied_bytes=costs.tied_weight_bytes if tied_tier != "none" else 0)
    report = SolverReport(name=solution.solver, status="optimal" if solution.proven else "feasible",
                          objective_seconds=objective, gap=solution.gap, seconds=time.perf_counter() - start,
                          policy=policy.name, configurations=len(configs["decoder"]))
    return assignment, report
