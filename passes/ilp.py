"""CostGraph + SolverOptions → Assignment + SolverReport: place every unit and tensor, exactly, with an ILP.

A column formulation that exploits layer symmetry (docs/cost-model.md §3). Per layer class:

1. enumerate tier vectors: a tier (hbm/ddr/cxl) for each unit's weights and for the KV cache;
2. for each, price every placement per phase (numpy, one `price.LayerPricer` per phase for all tier vectors: the
   terms `price.layer_time` sums, tabulated once per share; vectors alike in HBM/host share their placements and
   their sums over the leading units, `LayerPricer.price_many`): all 2^U whole placements, and those
   where up to `max_split_units` weight GEMM units with weights off HBM split their output features between the
   CPU and the GPU at every share of the CostGraph's grid; keep the front over (phase seconds, staging bytes,
   uses the GPU): a placement goes only when another is no slower (up to float noise, `TIE_RELATIVE`) and needs
   no more staging and no more GPU;
3. combine the fronts into layer *configurations* (tiers, prefill placement, decode placement) with their
   objective contribution and bytes per tier, and drop those another one beats in everything a constraint can
   bind on.

The master problem (passes/ilp_master.py) then picks how many decoder layers take each configuration (integer
counts summing to N) and one configuration each for the embedding and the LM head, under every tier's capacity,
with the staging buffer and the GPU workspace counted once (Eqs. 10-13), searching the staging levels under
count-based work limits. Each layer's cost depends only on its own configuration (steady-state pricing,
approximation A1), so the optimum over configurations is the optimum over every per-layer assignment;
passes/ilp_check.py re-prices the answer, checks the budgets and reports the gap the search proved (0 unless a
work limit left a level open). Imports neither torch nor the models.

    assignment, report = solve_placement(costs, SolverOptions())
    report.status, report.gap      # 'optimal', 0.0
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from liac.errors import InfeasibleError, LiacError
from liac.passes.costs import ClassCosts, CostGraph
from liac.passes.ilp_check import GAP_TOLERANCE, certified_bound, check_solution
from liac.passes.ilp_master import check_capacity, solve_master
from liac.passes.ilp_records import (Assignment, ConfigList, LayerChoice, LayerConfig, SolverOptions,
                                    config_arrays)
from liac.passes.price import LayerPricer, layer_time, operand_tiers
from liac.plan import HOST_TIERS, TIERS, experts_permille

__all__ = ["SolverOptions", "Policy", "LayerConfig", "LayerChoice", "Assignment", "SolverReport", "POLICIES", "WHOLE",
           "EXPERT_GRID", "expert_counts", "parse_policy", "policy_label", "phase_placements", "layer_configs",
           "price_config",
           "assemble_assignment", "solve_placement"]

# Fixed policies of LIA (lia-paper.md §2.3) over the six decoder units (qkv, attn_score, attn_context, out_proj,
# fc1/gate_up/router, fc2/down/experts), 1 = GPU. Each comes with LIA's memory rule: a layer is either resident
# (Optimization-1: all its weights and its KV cache in HBM, computed on the GPU) or keeps all its weights in one host
# tier and its KV cache in host memory. 'lia' lets the solver pick among LIA's three per phase.
POLICIES: dict[str, tuple[tuple[int, ...], ...]] = {
    "lia-cpu": ((0, 0, 0, 0, 0, 0),),
    "lia-partial": ((1, 0, 0, 1, 1, 1),),
    "lia-gpu": ((1, 1, 1, 1, 1, 1),),
    "lia": ((0, 0, 0, 0, 0, 0), (1, 0, 0, 1, 1, 1), (1, 1, 1, 1, 1, 1)),
}
# The optimum over whole-sublayer placements only (no splits): what liac compiled before splits, and the baseline
# a split's gain is measured against.
WHOLE = "whole"
# An MoE layer's expert counts (resident in HBM, computed on the CPU) are enumerated one by one up to this many
# experts; beyond it, on a grid of this many steps (docs/cost-model.md §3: the optimum is exact over the grid).
EXPERT_GRID = 16


@dataclass(frozen=True)
class Policy:
    """A restriction of the decoder's placement space, per phase: allowed whole placements (None = any, as
    1 = GPU masks) and whether units may split."""

    name: str  # 'optimal' when unrestricted
    prefill: tuple[tuple[int, ...], ...] | None = None
    decode: tuple[tuple[int, ...], ...] | None = None
    prefill_split: bool = True
    decode_split: bool = True
    lia_memory: bool = False  # LIA's memory rule (POLICIES): whole layers resident, or all weights in one host tier

    def allowed(self, phase: str) -> tuple[tuple[tuple[int, ...], ...] | None, bool]:
        return (self.prefill, self.prefill_split) if phase == "prefill" else (self.decode, self.decode_split)


@dataclass(frozen=True)
class SolverReport:
    """How the assignment was found."""

    name: str  # 'HiGHS' or 'PULP_CBC_CMD'
    status: str  # 'optimal' (proven) or 'feasible'
    objective_seconds: float
    gap: float  # (objective − proven lower bound) / objective; 0 when within 1e-9 (passes/ilp_check.py)
    seconds: float  # wall time of column generation and solve (never written into a plan)
    policy: str  # 'optimal' when unrestricted, else the policy name
    configurations: int  # decoder configurations offered to the master problem


def policy_label(policy: str | None, resident_layers: bool = True) -> str:
    """The name a restriction goes by in plans and indexes: the policy's ('optimal' when free), with
    '.no-resident-layers' (alone for the optimum) when LIA's Optimization-1 is switched off."""
    name = parse_policy(policy).name
    if resident_layers:
        return name
    return "no-resident-layers" if name == "optimal" else f"{name}.no-resident-layers"


def parse_policy(policy: str | None, source: str = "--policy") -> Policy:
    """'lia-cpu', 'whole' or 'lia-gpu/lia-cpu' (prefill/decode) → Policy; None or 'optimal' → unrestricted."""
    if policy is None or policy in ("", "optimal"):
        return Policy("optimal")
    parts = policy.split("/")
    if len(parts) > 2 or any(p not in POLICIES and p != WHOLE for p in parts):
        raise LiacError(source, f"unknown policy '{policy}': must be one of "
                        + ", ".join(f"'{p}'" for p in (*POLICIES, WHOLE)) + " or 'PREFILL/DECODE' of two of them")
    prefill, decode = parts[0], parts[-1]
    return Policy(policy, POLICIES.get(prefill), POLICIES.get(decode), False, False,
                  lia_memory=prefill in POLICIES or decode in POLICIES)


# ---------------------------------------------------------------------------------------------------------------
# Column generation


# Seconds within this relative difference are a tie, broken by the resources (less staging, no GPU, fewer bytes
# win). A layer's seconds is a sum over its steps (pairwise, numpy) of a max of sums of a few dozen prices; two
# placements whose times are equal in exact arithmetic (a step bound by shared DDR reads the same bytes whatever a
# split's share) differ in float64 by a few ulps of those sums, below 1e-14 relative. 1e-12 is a hundred times
# that, and treating such near-ties as ties costs at most 1e-12 of the objective per pruning, far below the 1e-9
# to which the master problem proves optimality.
TIE_RELATIVE = 1e-12


def _front(seconds: np.ndarray, staging: np.ndarray, uses_gpu: np.ndarray, prefer: tuple[np.ndarray, ...] = (),
           tolerance: float = TIE_RELATIVE, prefiltered: bool = False) -> np.ndarray:
    """Indices (ascending) of the rows no other row beats: one is dropped when a kept row streams no more, uses
    the GPU only if it does, and is at most `tolerance` (relative) slower. So of two placements equally fast up
    to float noise, the one needing less staging (or no GPU) stays.

    Every dropped row has a kept row that fits wherever it fits (every constraint bounds staging and GPU use from
    above) and is at most `tolerance` slower: rows are compared with kept rows only, so tolerances never chain.
    Of rows with equal staging and GPU use, the one kept is, among those within `tolerance` of the fastest, the
    first by `prefer` (keys, most significant first), then by index.

    Args:
        seconds: [n] the objective (non-negative).
        staging: [n] staging bytes.
        uses_gpu: [n] bool.
        prefer: [n] arrays breaking ties among equally fast rows with the same staging and GPU use.
        prefiltered: the rows are `_clearly_beaten`'s survivors already (the filter would keep them all: a row no
            row of a set beats by its margin has no such rival in a subset either).
    """
    n = seconds.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n > _PREFILTER_ROWS and not prefiltered:
        # Rows another row beats by more than three tolerances (no more staging, the GPU only if it uses it) can
        # go first: their block's representative, whichever it is, falls to that row's in step 2, so the result
        # is the same (tests/passes/test_ilp.py checks it against the unfiltered front), only much cheaper.
        rows = _clearly_beaten(seconds, staging, uses_gpu, tolerance)
        if rows.size < n:
            keep = _front(seconds[rows], staging[rows], uses_gpu[rows], tuple(key[rows] for key in prefer), tolerance,
                          prefiltered=True)
            return rows[keep]
    gpu = uses_gpu.astype(np.int64)
    # 1. one representative per (GPU use, staging)
    order = np.lexsort((np.arange(n), seconds, staging, gpu))
    key_g, key_s = gpu[order], staging[order]
    starts = np.r_[True, (key_g[1:] != key_g[:-1]) | (key_s[1:] != key_s[:-1])]
    block = np.cumsum(starts) - 1
    fastest = seconds[order][starts][block]
    near = seconds[order] <= fastest + tolerance * fastest
    rank = np.lexsort((order,) + tuple(key[order] for key in reversed(prefer)) + (~near, block))
    reps = order[rank[np.r_[True, block[rank][1:] != block[rank][:-1]]]]  # sorted by (GPU use, staging)
    # 2. exact dominance, a staircase per GPU use: slower than a row streaming less (a CPU-only row streaming no
    # more, for a row using the GPU)
    sec, stg, g = seconds[reps], staging[reps], gpu[reps]
    cpu_only = g == 0
    dominated = np.zeros(reps.size, dtype=bool)
    for mask in (cpu_only, ~cpu_only):
        t = sec[mask]
        before = np.r_[np.inf, np.minimum.accumulate(t)[:-1]]  # the fastest streaming less (same GPU use)
        dominated[mask] = before <= t
    if cpu_only.any() and (~cpu_only).any():
        best_cpu = np.minimum.accumulate(sec[cpu_only])
        upto = np.searchsorted(stg[cpu_only], stg[~cpu_only], side="right")
        dominated[~cpu_only] |= np.where(upto > 0, best_cpu[np.maximum(upto - 1, 0)], np.inf) <= sec[~cpu_only]
    reps, sec, stg, g = reps[~dominated], sec[~dominated], stg[~dominated], g[~dominated]
    # 3. tolerance: a survivor at most `tolerance` faster than one that streams no more and uses the GPU no more
    by_seconds = np.argsort(sec, kind="stable")
    upper = np.searchsorted(sec[by_seconds], sec[by_seconds] * (1 + tolerance), side="right")
    suspects = [int(by_seconds[pos]) for pos in np.nonzero(upper > np.arange(reps.size) + 1)[0]]
    keep = np.ones(reps.size, dtype=bool)
    for i in sorted(suspects, key=lambda i: (stg[i], g[i])):  # a dominator sorts before what it dominates
        rival = (sec > sec[i]) & (sec <= sec[i] * (1 + tolerance)) & (stg <= stg[i]) & (g <= g[i]) & keep
        rival[i] = False
        if rival.any():
            keep[i] = False
    return np.sort(reps[keep])


_PREFILTER_ROWS = 256  # fronts of more rows drop the clearly beaten ones first (`_clearly_beaten`)


def _clearly_beaten(seconds: np.ndarray, staging: np.ndarray, uses_gpu: np.ndarray, tolerance: float) -> np.ndarray:
    """Indices (ascending) of the rows that no row beats by a margin: row r goes when some row q streams no more,
    uses the GPU only if r does, and q's seconds · (1 + 3·tolerance) < r's.

    Why `_front` is unchanged without them: the least-seconds row among those streaming no more (and using the GPU
    no more) than r has no such rival itself, so it stays; then every row of r's (GPU use, staging) block is either
    not within `tolerance` of the block's fastest (never its representative) or the whole block is beaten, and the
    block's representative, whichever it is, has at least (1 + 3·tol) / (1 + tol) ≥ 1 + tol times the seconds of
    q's block's representative: step 2's exact dominance drops it with or without r. Steps 2 and 3 see the same
    survivors.
    """
    order = np.argsort(staging, kind="stable")
    sorted_staging = staging[order]
    if not sorted_staging[-1] == sorted_staging[-1]:  # NaN (sorted last): the plain search
        upto = np.searchsorted(sorted_staging, staging, side="right") - 1  # last position streaming no more than r
        least_any = np.minimum.accumulate(seconds[order])
        least_cpu = np.minimum.accumulate(np.where(uses_gpu[order], np.inf, seconds[order]))
        rival = np.where(uses_gpu, least_any[upto], least_cpu[upto])
        return np.flatnonzero(~(rival * (1 + 3 * tolerance) < seconds))
    # in sorted order: the last position streaming no more than a row is the end of its run of equal staging
    changes = sorted_staging[1:] != sorted_staging[:-1]
    ends = np.flatnonzero(np.r_[changes, True])
    upto = ends[np.r_[0, np.cumsum(changes)]]
    sorted_seconds = seconds[order]
    sorted_gpu = uses_gpu[order]
    least_any = np.minimum.accumulate(sorted_seconds)  # any GPU use: a rival for a row using the GPU
    least_cpu = np.minimum.accumulate(np.where(sorted_gpu, np.inf, sorted_seconds))  # CPU-only rivals: the only
    # ones for a CPU-only row
    rival = np.where(sorted_gpu, least_any[upto], least_cpu[upto])
    keep = np.empty(order.size, dtype=bool)
    keep[order] = ~(rival * (1 + 3 * tolerance) < sorted_seconds)
    return np.flatnonzero(keep)


def _pair_survivors(pre: "_PhaseFront", dec: "_PhaseFront", tolerance: float = TIE_RELATIVE) -> np.ndarray | None:
    """`_clearly_beaten` of every (prefill, decode) pair of two fronts (flat indices i · len(dec) + j, ascending),
    without sorting the pairs: the same rows (None where a NaN would make the two differ; the caller then filters
    the pairs themselves).

    A pair's seconds are fl(s_i + s_j), its staging max(g_i, g_j), and it uses the GPU when either does. The pairs
    streaming no more than S are exactly those whose two halves each stream no more than S (and the CPU-only ones
    those whose halves are both CPU-only), so the least seconds among them is fl(P(S) + D(S)) with P, D the least
    seconds of each front's rows streaming no more than S (CPU-only rows alone for a CPU-only pair): rounding is
    monotone, so no pair's rounded sum is below that of the two least halves, which is itself a pair's. For pair
    (i, j), S is the larger of its two stagings, so its rival is the one computed at row i's staging when
    g_i ≥ g_j, else at row j's."""
    if (np.isnan(pre.staging).any() or np.isnan(dec.staging).any() or np.isnan(pre.seconds).any()
            or np.isnan(dec.seconds).any()):
        return None

    def least(front, query):  # ([Q] least seconds of any row, of CPU-only rows) streaming at most `query`
        order = np.argsort(front.staging, kind="stable")
        upto = np.searchsorted(front.staging[order], query, side="right") - 1
        seconds = front.seconds[order]
        out = []
        for values in (seconds, np.where(front.uses_gpu[order], np.inf, seconds)):
            running = np.minimum.accumulate(values)
            out.append(np.where(upto >= 0, running[np.maximum(upto, 0)], np.inf))
        return out

    rivals = []
    for front in (pre, dec):  # rivals at each row's own staging: (any GPU use, CPU-only)
        least_pre, least_dec = least(pre, front.staging), least(dec, front.staging)
        rivals.append((least_pre[0] + least_dec[0], least_pre[1] + least_dec[1]))
    (pre_any, pre_cpu), (dec_any, dec_cpu) = rivals
    gpu = pre.uses_gpu[:, None] | dec.uses_gpu[None, :]
    at_pre = pre.staging[:, None] >= dec.staging[None, :]
    rival = np.where(at_pre, np.where(gpu, pre_any[:, None], pre_cpu[:, None]),
                     np.where(gpu, dec_any[None, :], dec_cpu[None, :]))
    seconds = pre.seconds[:, None] + dec.seconds[None, :]
    return np.flatnonzero(~(rival * (1 + 3 * tolerance) < seconds))


def expert_counts(num_experts: int, up_to: int | None = None) -> tuple[int, ...]:
    """Expert counts 0 … `up_to` (default all) the ILP enumerates: every count up to EXPERT_GRID experts, else a
    grid of EXPERT_GRID steps over the layer's experts (and `up_to` itself)."""
    up_to = num_experts if up_to is None else up_to
    if num_experts <= EXPERT_GRID:
        return tuple(range(up_to + 1))
    grid = {round(num_experts * step / EXPERT_GRID) for step in range(EXPERT_GRID + 1)}
    return tuple(sorted({c for c in grid if c <= up_to} | {up_to}))


def _expert_splits(unit, tier: str, hbm_experts: int) -> tuple[int, ...]:
    """An experts unit's CPU shares (permille) that split it between the devices: c experts on the CPU, the rest
    (resident or streamed) on the GPU."""
    if tier not in HOST_TIERS:
        return ()
    experts = unit.experts
    return tuple(experts_permille(c, experts) for c in expert_counts(experts, experts - hbm_experts)
                 if c > 0 and (c < experts or hbm_experts > 0) and experts_permille(c, experts) < 1000)


def phase_placements(cls: ClassCosts, phase: str, tiers: tuple[str, ...], split_permille: tuple[int, ...],
                     allowed: tuple | None = None, split: bool = True, max_split_units: int = 1,
                     resident: bool = False, hbm_experts: int = 0) -> tuple[np.ndarray, np.ndarray]:
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
        hbm_experts: an MoE layer's experts resident in HBM; its experts unit splits by count (Eq. 21): c of the
            others on the CPU, the rest streamed, one split unit like any other.

    Returns:
        (CPU permille [P, U] (1000 = CPU, 0 = GPU, in between a split), in_policy [P] bool: False for the
        all-GPU row that only `resident` allows).
    """
    units = cls.phase(phase).units
    if allowed is not None and len(allowed[0]) != len(units):
        raise LiacError("--policy", f"LIA's policies cover {len(allowed[0])} decoder units, this model has "
                        f"{len(units)}")
    # A unit computes on the CPU only with its operand off HBM (or without one); it splits only from DDR/CXL. All of
    # an MoE layer's experts on the CPU leaves none in HBM.
    whole = [(0, 1000) if (tiers[u] != "hbm" or unit.cpu_allows_hbm) and not (unit.experts and hbm_experts) else (0,)
             for u, unit in enumerate(units)]
    rows = [row for row in itertools.product(*whole)]
    in_policy = [True] * len(rows)
    if allowed is not None:
        masks = {tuple(0 if on_gpu else 1000 for on_gpu in mask) for mask in allowed}
        all_gpu = (0,) * len(units)
        in_policy = [row in masks for row in rows]
        keep = [ok or (resident and row == all_gpu) for row, ok in zip(rows, in_policy)]
        rows = [row for row, ok in zip(rows, keep) if ok]
        in_policy = [ok for ok, k in zip(in_policy, keep) if k]
    if split and max_split_units > 0:
        shares = {u: split_permille for u, unit in enumerate(units)
                  if unit.can_split and tiers[u] in HOST_TIERS and split_permille}
        shares.update({u: _expert_splits(unit, tiers[u], hbm_experts) for u, unit in enumerate(units) if unit.experts})
        can = [u for u in sorted(shares) if shares[u]]
        for count in range(1, max_split_units + 1):
            for chosen in itertools.combinations(can, count):
                options = [shares[u] if u in chosen else whole[u] for u in range(len(units))]
                added = list(itertools.product(*options))
                rows.extend(added)
                in_policy.extend([True] * len(added))
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(units)), np.array(in_policy, dtype=bool)


@dataclass(frozen=True)
class _PhaseFront:
    """The placements of one layer in one phase (fixed tiers) that no other one beats in (seconds, staging
    bytes, GPU use), as arrays over the front's rows."""

    permille: np.ndarray  # [F, U] CPU permille per unit
    seconds: np.ndarray  # [F] summed over the phase's steps
    staging: np.ndarray  # [F] most bytes streamed in one step (Eq. 9), whole bytes
    uses_gpu: np.ndarray  # [F] bool
    in_policy: np.ndarray  # [F] bool: False for the all-GPU row only a resident layer may take (Optimization-1)
    splits: np.ndarray  # [F] split units
    chain: np.ndarray  # [F] the sequential part alone (Eq. 4)


def _phase_fronts(costs: CostGraph, cls: ClassCosts, phase: str,
                  vectors: list[tuple[tuple[str, ...], bool, int]], policy: Policy,
                  max_split_units: int) -> list[_PhaseFront | None]:
    """Per tier vector ((operand tiers, resident, experts resident in HBM) in `vectors`), every allowed placement
    of one phase, priced, reduced to its front (None when none is allowed).

    Every split share of the grid is a candidate (and every CPU count of an MoE layer's experts unit): a share past
    the time-optimal one is slower but streams less, which a tight HBM budget may need (the staging buffer), so
    only dominance decides. Of placements equally fast with equal staging and GPU use (the max() of Eq. 7 hides a
    shorter chain when streaming binds), a whole one is kept over a split, then the shortest chain: it leaves the
    most slack.
    """
    allowed, split = policy.allowed(phase)
    # A placement's rules read a unit's tier only as HBM, host (DDR or CXL) or none: tier vectors alike in that
    # share their placements (one array, never written to).
    shapes: dict = {}
    placements, keys = [], []
    for tiers, resident, hbm_experts in vectors:
        shape = (tuple("host" if t in HOST_TIERS else t for t in tiers), resident, hbm_experts)
        if shape not in shapes:
            shapes[shape] = phase_placements(cls, phase, tiers, costs.split_permille, allowed, split,
                                             max_split_units, resident, hbm_experts)
        placements.append(shapes[shape])
        keys.append(shape)
    # one pricer for every tier vector: each unit's and edge's terms priced once per share (price.LayerPricer)
    pricer = LayerPricer(costs, cls, phase, np.concatenate([rows for rows, _ in shapes.values()])
                         if placements else np.zeros((0, len(cls.units)), dtype=np.int64))
    # vectors sharing placements share their sums over the leading units where their tiers agree
    prices = pricer.price_many([(tiers, permille, hbm_experts, key) for (tiers, _, hbm_experts), (permille, _), key
                                in zip(vectors, placements, keys) if permille.shape[0]])
    prices.reverse()
    fronts = []
    for (tiers, resident, hbm_experts), (permille, in_policy) in zip(vectors, placements):
        if permille.shape[0] == 0:
            fronts.append(None)
            continue
        priced = prices.pop()
        seconds, staging, valid, chain = priced.seconds, priced.staging_bytes, priced.valid, priced.chain_seconds
        rows = np.nonzero(valid)[0]
        if rows.size == 0:
            fronts.append(None)
            continue
        permille = permille[rows]
        staging = np.ceil(staging[rows])
        uses_gpu = (permille < 1000).any(axis=1)
        splits = ((permille > 0) & (permille < 1000)).sum(axis=1)
        keep = _front(seconds[rows], staging, uses_gpu, prefer=(splits, chain[rows]))
        fronts.append(_PhaseFront(permille[keep], seconds[rows][keep], staging[keep], uses_gpu[keep],
                                  in_policy[rows][keep], splits[keep], chain[rows][keep]))
    return fronts


def _allowed_tiers(cls: ClassCosts, weight_tiers: tuple[str, ...], kv: str, policy: Policy,
                   resident_layers: bool) -> bool:
    """Whether a decoder layer may keep its weights in `weight_tiers` and its KV cache in `kv`. A *resident* layer
    keeps all its weights in HBM (LIA's Optimization-1); `resident_layers` False forbids it. Under LIA's memory rule
    a resident layer keeps its KV cache in HBM too, and any other layer keeps all its weights in one host tier and
    its KV cache in host memory."""
    if cls.layer_class != "decoder" or not weight_tiers:
        return True
    resident = all(t == "hbm" for t in weight_tiers)
    if resident and not resident_layers:
        return False
    if policy.lia_memory:
        return kv == "hbm" if resident else len(set(weight_tiers)) == 1 and "hbm" not in (weight_tiers[0], kv)
    return True


def layer_configs(costs: CostGraph, cls: ClassCosts, policy: Policy = Policy("optimal"),
                  max_split_units: int = 1, resident_layers: bool = True, memo: dict | None = None,
                  memo_phases: tuple[str, ...] = ("decode",), per_tier_vector: bool = False) -> list[LayerConfig]:
    """Every non-dominated configuration of one layer of `cls` (steps 1-3 of the module docstring).

    A configuration is kept unless another one is at most as slow (up to `TIE_RELATIVE`) and uses no more of
    anything a constraint can bind on: bytes per tier, staging bytes, GPU use. Every constraint of the master
    problem is an upper bound on a sum or a max of these, so the dropped ones are never needed for an optimum
    (docs/cost-model.md §3). `policy` restricts the decoder's placements; whole layers resident in HBM and
    computed on the GPU stay allowed (LIA's Optimization-1) unless `resident_layers` is False (`_allowed_tiers`).
    `memo` keeps the phase fronts of `memo_phases` between calls on CostGraphs that price those phases alike (the
    prefill micro-batches of one point: their decode is the same).
    With `per_tier_vector`, the last pruning across tier vectors is skipped: every tier vector keeps its own
    front over (seconds, staging, GPU use), which passes/ilp_serve.py combines over batch sizes (a tier vector
    dominated at one batch size may still be the best memory placement for the mix).
    """
    tiers = costs.tiers
    num_units = len(cls.units)
    weight_units = [i for i, op in enumerate(cls.operands) if op == "weights"]
    kv_choices = tiers if "kv" in cls.operands or cls.kv_cache_bytes else ("none",)
    units = cls.prefill.units
    # Per weight unit, (tier, experts resident in HBM): an MoE experts unit may keep some of its experts in HBM and
    # the rest in a host tier (Eq. 21); every other unit has one tier. The router's few kB of weights follow its
    # experts (in HBM when they all are, else in their host tier): a choice of its own would only double the
    # configurations with near-twins that differ by those kB, which the master problem's levels solve badly.
    expert_unit = next((u for u in weight_units if units[u].experts), None)
    router = next((u for u in weight_units if cls.units[u] == "router"), None) if expert_unit is not None else None
    choices = []
    for u in weight_units:
        experts = units[u].experts
        if experts:
            choices.append([(t, experts if t == "hbm" else r) for t in tiers
                            for r in ((experts,) if t == "hbm" else expert_counts(experts, experts - 1))])
        elif u != router:
            choices.append([(t, 0) for t in tiers])
    free_units = [u for u in weight_units if u != router]
    parts = []  # per tier vector: (weights, kv, memory, prefill rows, decode rows, arrays of the combinations, experts)
    layouts = []  # (weights, kv, operand tiers, resident, experts resident in HBM)
    for weight_choice in itertools.product(*choices):
        weights = ["none"] * num_units
        hbm_experts = 0
        for unit, (tier, resident_experts) in zip(free_units, weight_choice):
            weights[unit] = tier
            hbm_experts = max(hbm_experts, resident_experts)
        if router is not None:
            weights[router] = weights[expert_unit]
        weight_tiers = [weights[u] for u in weight_units]
        for kv in kv_choices:
            if not _allowed_tiers(cls, weight_tiers, kv, policy, resident_layers):
                continue
            resident = all(t == "hbm" for t in weight_tiers) and kv in ("hbm", "none")
            layouts.append((tuple(weights), kv, operand_tiers(cls, tuple(weights), kv), resident, hbm_experts))
    vectors = [(operand, resident, experts) for _, _, operand, resident, experts in layouts]
    fronts = {}
    for phase in ("prefill", "decode"):
        key = (cls.layer_class, phase)
        if memo is not None and key in memo:
            fronts[phase] = memo[key]
            continue
        fronts[phase] = _phase_fronts(costs, cls, phase, vectors, policy, max_split_units)
        if memo is not None and phase in memo_phases:
            memo[key] = fronts[phase]
    prefill, decode = fronts["prefill"], fronts["decode"]
    for (weights, kv, _, _, hbm_experts), pre, dec in zip(layouts, prefill, decode):
        if pre is None or dec is None:
            continue
        # every (prefill, decode) pair: seconds add, staging is the larger, GPU use either
        seconds = pre.seconds[:, None] + dec.seconds[None, :]
        staging = np.maximum(pre.staging[:, None], dec.staging[None, :])
        uses_gpu = pre.uses_gpu[:, None] | dec.uses_gpu[None, :]
        resident_pair = (pre.permille.max(axis=1) == 0)[:, None] & (dec.permille.max(axis=1) == 0)[None, :]
        # a resident layer must be resident in both phases, not mixed with a policy's placement
        ok = (pre.in_policy[:, None] & dec.in_policy[None, :]) | resident_pair
        pairs = np.nonzero(ok.ravel())[0]
        if pairs.size == 0:
            continue
        prefiltered = False
        if pairs.size == ok.size and pairs.size > _PREFILTER_ROWS:
            # every pair allowed: `_front`'s prefilter computed from the two fronts (`_pair_survivors`)
            survivors = _pair_survivors(pre, dec)
            if survivors is not None:
                pairs, prefiltered = survivors, True
        splits = (pre.splits[:, None] + dec.splits[None, :]).ravel()[pairs]
        chain = (pre.chain[:, None] + dec.chain[None, :]).ravel()[pairs]
        keep = pairs[_front(seconds.ravel()[pairs], staging.ravel()[pairs], uses_gpu.ravel()[pairs],
                            prefer=(splits, chain), prefiltered=prefiltered)]
        memory = _tier_bytes(cls, weights, kv, hbm_experts)
        parts.append((tuple(weights), kv, memory, pre, dec, keep // dec.seconds.size, keep % dec.seconds.size,
                      hbm_experts))
    if not parts:
        return []
    # Across tier vectors: every configuration of a class holds the same bytes in all tiers together (each
    # tensor lives in exactly one), so one can use no more of every tier than another only with the same bytes in
    # each; tier vectors with identical memory (units of equal size swapped) are merged into one front. An MoE
    # layer's expert counts multiply its tier vectors; a host tier that could hold the whole model cannot bind, so
    # there its bytes are left out of the key: vectors that differ only there merge too (twins the master problem
    # would never offer).
    roomy = _roomy_tiers(costs) if expert_unit is not None else ()
    keyed = tuple(t for t in TIERS if t not in roomy)
    groups: dict[tuple[int, ...], list[int]] = {}
    for k, p in enumerate(parts):
        groups.setdefault((k,) if per_tier_vector else tuple(p[2][t] for t in keyed), []).append(k)
    chosen = []  # per group: (part, prefill row, decode row) arrays
    for members in groups.values():
        index = np.concatenate([np.full(parts[k][5].size, k) for k in members])
        first = np.concatenate([parts[k][5] for k in members])
        second = np.concatenate([parts[k][6] for k in members])
        if len(members) > 1:
            seconds = np.concatenate([parts[k][3].seconds[parts[k][5]] + parts[k][4].seconds[parts[k][6]]
                                      for k in members])
            staging = np.concatenate([np.maximum(parts[k][3].staging[parts[k][5]], parts[k][4].staging[parts[k][6]])
                                      for k in members])
            uses_gpu = np.concatenate([parts[k][3].uses_gpu[parts[k][5]] | parts[k][4].uses_gpu[parts[k][6]]
                                       for k in members])
            keep = _front(seconds, staging, uses_gpu)
            index, first, second = index[keep], first[keep], second[keep]
        chosen.append((index, first, second))
    index, first, second = (np.concatenate([c[i] for c in chosen]).astype(np.int64) for i in range(3))
    order = np.lexsort((second, first, index))  # by (part, prefill row, decode row): each triple occurs once
    index, first, second = index[order], first[order], second[order]
    bounds = np.flatnonzero(np.r_[True, index[1:] != index[:-1], True])
    # part by part: each configuration's part, rows and numbers as arrays; the LayerConfig objects are made when
    # asked for (ConfigList)
    columns = []
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        weights, kv, memory, pre, dec = parts[int(index[start])][:5]
        rows_pre, rows_dec = first[start:end], second[start:end]
        columns.append((pre.seconds[rows_pre] + dec.seconds[rows_dec],  # LayerConfig.seconds: the same sum
                        np.broadcast_to(np.array([memory["hbm"], memory["ddr"], memory["cxl"]], dtype=np.int64),
                                        (end - start, 3)),
                        np.maximum(pre.staging[rows_pre], dec.staging[rows_dec]).astype(np.int64),
                        pre.uses_gpu[rows_pre] | dec.uses_gpu[rows_dec]))
    out = ConfigList([(p[0], p[1], p[2], p[3], p[4], p[7]) for p in parts], index, first, second,
                     *(np.concatenate([c[k] for c in columns]) for k in range(4)))
    return out


def _tier_bytes(cls: ClassCosts, weights: tuple[str, ...], kv_cache: str, hbm_experts: int = 0) -> dict[str, int]:
    """Bytes one layer keeps in each tier: its units' weights (an MoE experts unit's `hbm_experts` resident experts
    in HBM, the others in its tier) and its KV cache."""
    memory = {"hbm": 0, "ddr": 0, "cxl": 0}
    for unit, tier in enumerate(weights):
        if tier != "none":
            spec = cls.prefill.units[unit]
            resident = hbm_experts * spec.expert_slot_bytes if spec.experts else 0
            memory["hbm"] += resident
            memory[tier] += cls.weight_bytes[unit] - resident
    if kv_cache != "none":
        memory[kv_cache] += cls.kv_cache_bytes
    return memory


def _config(weights, kv_cache, prefill, decode, prefill_seconds, decode_seconds, prefill_staging, decode_staging,
            memory, hbm_experts: int = 0) -> LayerConfig:
    return LayerConfig(weights=weights, kv_cache=kv_cache, prefill_cpu_permille=prefill, decode_cpu_permille=decode,
                       prefill_seconds=prefill_seconds, decode_seconds=decode_seconds, hbm_bytes=memory["hbm"],
                       ddr_bytes=memory["ddr"], cxl_bytes=memory["cxl"],
                       staging_bytes=int(np.ceil(max(prefill_staging, decode_staging))),
                       uses_gpu=min(prefill) < 1000 or min(decode) < 1000, hbm_experts=hbm_experts)


def price_config(costs: CostGraph, cls: ClassCosts, weights: tuple[str, ...], kv_cache: str,
                 prefill_cpu_permille: tuple[int, ...], decode_cpu_permille: tuple[int, ...],
                 hbm_experts: int = 0) -> LayerConfig | None:
    """One given configuration of a layer of `cls` (with `hbm_experts` of an MoE layer's experts resident in HBM),
    priced as `layer_configs` prices its columns; None when the rules forbid it (`price.layer_time` marks it
    invalid). Re-prices a plan's recorded choice without solving
    (`liac.api.reprice_point`, tests/test_checked_in.py)."""
    operands = operand_tiers(cls, tuple(weights), kv_cache)
    priced = {}
    for phase, permille in (("prefill", prefill_cpu_permille), ("decode", decode_cpu_permille)):
        time = layer_time(costs, cls, phase, operands, np.array([permille], dtype=np.int64), hbm_experts)
        if not time.valid[0]:
            return None
        priced[phase] = (float(time.seconds[0]), float(time.staging_bytes[0]))
    return _config(tuple(weights), kv_cache, tuple(prefill_cpu_permille), tuple(decode_cpu_permille),
                   priced["prefill"][0], priced["decode"][0], priced["prefill"][1], priced["decode"][1],
                   _tier_bytes(cls, tuple(weights), kv_cache, hbm_experts), hbm_experts)


def assemble_assignment(costs: CostGraph, choices: tuple[LayerChoice, ...]) -> Assignment:
    """The configurations and counts chosen per class → the Assignment: the shared buffers sized by the choices
    (the staging level only bounds them from above), the objective, a tied embedding held once, at the prefill
    micro-batch `costs` prices (`CostGraph.with_prefill`)."""
    staging_bytes = max((c.staging_bytes for _, c, _ in choices), default=0)
    workspace_bytes = max((costs.layer_class(name).workspace_bytes for name, c, _ in choices if c.uses_gpu),
                          default=0)
    objective = sum(config.seconds * n for _, config, n in choices)
    ends = {name: c.weights_tier for name, c, _ in choices if name in ("embed", "head")}
    tied_tier = ends["embed"] if costs.tied_weight_bytes and ends["embed"] == ends["head"] else "none"
    return Assignment(choices=tuple(choices), staging_bytes=staging_bytes, workspace_bytes=workspace_bytes,
                      host_workspace_bytes=max(c.host_workspace_bytes for c in costs.classes),
                      objective_seconds=objective, tied_tier=tied_tier,
                      tied_bytes=costs.tied_weight_bytes if tied_tier != "none" else 0,
                      prefill_microbatch=costs.microbatch)


def _roomy_tiers(costs: CostGraph) -> tuple[str, ...]:
    """Host tiers whose budget holds every weight and KV cache of the model beside the host workspace: no choice of
    configurations can exceed them."""
    total = sum(cls.count * (sum(cls.weight_bytes) + cls.kv_cache_bytes) for cls in costs.classes)
    host = max(cls.host_workspace_bytes for cls in costs.classes)
    room = {"ddr": costs.budgets.ddr_bytes - host, "cxl": costs.budgets.cxl_bytes}
    return tuple(t for t in HOST_TIERS if t in costs.tiers and total <= room[t])


def solve_placement(costs: CostGraph, options: SolverOptions = SolverOptions()) -> tuple[Assignment, SolverReport]:
    """CostGraph → the optimal Assignment and how it was found.

    The decoder's prefill micro-batch is chosen among `costs.microbatches` (Eq. 20): of the candidates in order of
    fewest micro-batches, a later one wins only when better by more than 1e-9 (relative). They are solved most
    micro-batches first (the least workspace: usually the best plan, found first), each with the least objective
    found so far (plus 3e-9) as its master search's cutoff, which is all the rule needs (`_NEAR`); a candidate
    whose bound without memory limits cannot beat that is skipped. At one micro-batch, the staging buffer is sized
    by the largest configuration in use (Eq. 12); the master problem is solved per staging level S (Eq. 12'), best bound
    first: a level whose lower bound (Lagrangian, then its LP relaxation) cannot beat the best plan found is closed
    without solving; the best over all levels is the optimum of Eqs. 10-13.

    Raises:
        InfeasibleError: no placement fits the budgets at any micro-batch; names the binding tier(s) and the
            shortfall in GiB at the one with the least workspace.
        LiacError: unknown solver or policy.
    """
    start = time.perf_counter()
    policy = parse_policy(options.policy)
    candidates = costs.microbatches
    check_capacity(costs.with_prefill(candidates[-1]))  # before the columns: an oversized model fails fast
    lower = np.inf  # the least lower bound proven over the micro-batches solved
    ends = {}  # the embedding's and the head's configurations: the same at every micro-batch
    memo = {}  # the decoder's decode fronts: the same at every micro-batch
    found = {}  # position → (assignment, solution, decoder configurations) of the candidates that gave a plan
    least = np.inf  # the least objective found so far
    last_problem = None  # the last candidate's (costs, configs): it says why nothing fits, if nothing does
    # Most micro-batches first: the least workspace, usually the best plan, whose objective then prunes the
    # others from the start. The winner is the one the rule "in order of fewest micro-batches, a later candidate
    # replaces the best only when better by more than 1e-9 (relative)" picks (`_first_best`), so a candidate
    # needs to be found only when it comes within 3e-9 of the least objective: one that does not is never picked
    # (it is 2e-9 above the least at least, and that candidate, or one the rule kept before it, replaces it).
    for position in reversed(range(len(candidates))):
        priced = costs.with_prefill(candidates[position])
        configs = {}
        for cls in priced.classes:
            if cls.layer_class != "decoder":
                if cls.layer_class not in ends:
                    ends[cls.layer_class] = layer_configs(priced, cls, _class_policy(policy, cls),
                                                          options.max_split_units, options.resident_layers)
                configs[cls.layer_class] = ends[cls.layer_class]
            else:
                configs[cls.layer_class] = layer_configs(priced, cls, policy, options.max_split_units,
                                                         options.resident_layers, memo)
        if position == len(candidates) - 1:
            last_problem = (priced, configs)
        cutoff = least * (1 + _NEAR) if np.isfinite(least) else np.inf
        if _free_bound(priced, configs) >= cutoff:
            continue  # its bound without memory limits is no lower than the cutoff: never picked
        try:
            check_capacity(priced, configs)
            # The elastic problems that find the shortfall cost more than the solve: only if nothing fits (below).
            solution = solve_master(priced, configs, options, diagnose=False, cutoff=cutoff)
        except InfeasibleError:
            continue  # no plan at this micro-batch: it bounds nothing
        if solution.counts is None:  # nothing here beats the cutoff: the certificate's bound says by how much
            lower = min(lower, certified_bound(priced, configs, solution.certificate))
            continue
        assignment = _assignment(priced, configs, solution)
        # The search's answer re-verified at this micro-batch; its gap gives the bound it proved there.
        gap = check_solution(priced, assignment, solution.certificate, configs)
        lower = min(lower, assignment.objective_seconds * (1 - gap))
        found[position] = (assignment, solution, len(configs["decoder"]))
        least = min(least, assignment.objective_seconds)
    if not found:
        # Only the last candidate (the least workspace) says why nothing fits.
        priced, configs = last_problem
        check_capacity(priced, configs)
        solve_master(priced, configs, options, diagnose=True)
        raise InfeasibleError("compile", "no placement fits the memory budgets", tier="", short_bytes=0)
    best = _first_best([found[p] for p in sorted(found)])
    assignment, solution, count = best
    objective = assignment.objective_seconds
    gap = max(0.0, (objective - lower) / objective) if objective > 0 else 0.0
    gap = 0.0 if gap <= GAP_TOLERANCE else gap
    report = SolverReport(name=solution.solver, status="optimal" if gap == 0.0 else "feasible",
                          objective_seconds=objective, gap=gap, seconds=time.perf_counter() - start,
                          policy=policy_label(options.policy, options.resident_layers), configurations=count)
    return assignment, report


# A candidate micro-batch is searched for plans within this (relative) of the least objective found: with the
# 1e-9 by which a plan must beat its cutoff, every plan below (1 + 2e-9) times the least is found.
_NEAR = 3e-9


def _first_best(found: list[tuple]) -> tuple:
    """Of (assignment, ...) in order of fewest micro-batches, the best: a later one replaces the best so far only
    when its objective is lower by more than 1e-9 (relative)."""
    best = found[0]
    for item in found[1:]:
        if item[0].objective_seconds < best[0].objective_seconds * (1 - 1e-9):
            best = item
    return best


def _class_policy(policy: Policy, cls: ClassCosts) -> Policy:
    """Policies restrict the decoder; the embedding and the head keep whole placements under any policy."""
    if cls.layer_class == "decoder" or policy.name == "optimal":
        return policy
    return Policy(policy.name, prefill_split=False, decode_split=False)


def _free_bound(costs: CostGraph, configs: dict[str, list[LayerConfig]]) -> float:
    """A lower bound of the objective without any memory limit: each class's layers at their fastest."""
    total = 0
    for cls in costs.classes:
        seconds = config_arrays(configs[cls.layer_class])[0]
        total += cls.count * (float(seconds.min()) if seconds.size else np.inf)
    return total


def _cannot_improve(bound: float, best: float) -> bool:
    return bound >= best * (1 - GAP_TOLERANCE)


def _assignment(costs: CostGraph, configs: dict[str, list[LayerConfig]], solution) -> Assignment:
    """The master problem's counts as an Assignment at the micro-batch `costs` prices (`assemble_assignment`)."""
    choices = []
    for cls in costs.classes:  # in index order, as the configurations are listed
        for (name, index), value in sorted(solution.counts.items()):
            if name == cls.layer_class and value:
                choices.append(LayerChoice(cls.layer_class, configs[cls.layer_class][index], value))
    return assemble_assignment(costs, tuple(choices))
