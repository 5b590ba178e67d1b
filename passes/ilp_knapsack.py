"""Configurations at one staging level + the capacities that can bind → exact layer counts (a knapsack).

One level of the master problem (Eq. 12', passes/ilp_master.py) fixes the staging buffer, so what is left is a
knapsack with a cardinality constraint: choose N decoder configurations (with repetition) and one each for the
embedding and the head, minimising the summed seconds (Eq. 13) with the bytes of every tier that can bind (Eq. 11)
under its capacity. Branch and bound in an ILP solver handles this badly when many configurations fill memory
almost alike (transformer shapes make unit sizes nearly commensurate: OPT's qkv + out_proj weigh one fc2 to
within the biases; three tiers that all bind make it a market-split problem), so this module solves it exactly
by enumeration instead:

1. the ends (embedding × head configurations, and whether the decoder uses the GPU, which sets the workspace
   reserved, Eq. 14) are few: each combination leaves the decoder a capacity vector C in bytes;
2. for the decoder, the LP relaxation (passes/ilp_lp.py; one capacity: a segment of the lower convex hull of
   (bytes, seconds)) gives multipliers λ ≥ 0 and basic configurations; with φ = min_c (t_c + λ·m_c) every
   configuration's reduced cost r_c = t_c + λ·m_c − φ ≥ 0, and any plan costs
   N·φ − λ·C + Σ r_c·n_c + λ·(unused capacity) (Eq. 19 of docs/cost-model.md);
3. the counts of every configuration but two basic ones are enumerated, configurations in order of r_c, as
   states (layers used, bytes used per tier) → least seconds, each completed optimally with the two (a closed
   form: one free count, an interval); a state is dropped when its bound (valid for any λ ≥ 0, by weak duality),
   plus the least r_c still to come, cannot beat the best plan found (1e-9 relative, the solvers' tolerance), or
   when another state with as many layers uses no more of any tier and is no slower.

Bytes are exact integers and the bounds hold for any λ, so the optimum is exact whatever the LP's rounding. When
the enumeration generates more than `max_states` states, the level is left to the ILP solver with a node limit;
the cap counts states, not seconds, so which path solves a level does not depend on the machine.

    solution = solve_level(level, columns, cutoff)
    solution.seconds, solution.counts[("decoder", 3)]
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import numpy as np

from liac.passes.ilp_lp import solve_lp

__all__ = ["MAX_STATES", "RELATIVE", "LevelSolution", "LevelProblem", "ClassColumns", "TooLarge", "solve_level", "useful_columns",
           "knapsack", "beats", "pareto"]

MAX_STATES = 200_000  # states generated per knapsack before a level is left to the ILP solver (deterministic)
RELATIVE = 1e-9  # a plan must beat the best by more than this (relative) to replace it: the solvers' 1e-9
_GIB = float(2**30)  # the LP works in GiB (its tolerances are absolute)


@dataclass(frozen=True)
class LevelSolution:
    """The best plan at one staging level: `seconds` (inf when none beats the cutoff) and the counts,
    (layer class, configuration index) → layers."""

    seconds: float
    counts: dict


@dataclass(frozen=True)
class ClassColumns:
    """One layer class's configurations as arrays (passes/ilp_master.py builds them once per solve)."""

    layer_class: str
    count: int  # layers in the class
    workspace_bytes: int  # reserved in HBM when any of its configurations computes on the GPU (Eq. 14)
    index: np.ndarray  # [K] the configuration's index in the class's list
    seconds: np.ndarray  # [K]
    tier_bytes: np.ndarray  # [K, 3] int64: HBM, DDR, CXL
    staging: np.ndarray  # [K] int64
    uses_gpu: np.ndarray  # [K] bool
    weights_tier: np.ndarray  # [K] int: 0/1/2 = HBM/DDR/CXL for the ends' one weight unit, -1 otherwise
    useful: dict = field(default_factory=dict, compare=False, repr=False)  # `useful_columns` per (level, tiers)


@dataclass(frozen=True)
class LevelProblem:
    """What one staging level leaves to choose: capacities after the staging buffers and the host workspace."""

    level_bytes: int  # configurations streaming more than this are not offered
    reserve_bytes: int  # the staging buffer reserved ((p + 1) of them are in `capacity`); a plan must use a
    # configuration streaming at least this much (plans streaming less belong to lower levels)
    tiers: tuple[int, ...]  # tiers whose capacity can bind (0/1/2 = HBM/DDR/CXL); the others are left out
    capacity: np.ndarray  # [3] int64: HBM less (p + 1)·level, DDR less the host workspace, CXL
    tied_bytes: int  # a tied embedding/LM-head matrix, counted once when both ends keep it in one tier
    multipliers: np.ndarray | None = None  # [3] λ of the level's LP relaxation, if known: tiers it prices bind


class TooLarge(Exception):
    """The enumeration generated more than its cap of states: the level is left to the ILP solver."""


def solve_level(level: LevelProblem, columns: dict[str, ClassColumns], cutoff: float,
                max_states: int = MAX_STATES, group_states: int | None = None) -> LevelSolution:
    """The optimum at one staging level if it beats `cutoff` (else seconds = inf and no counts).

    The workspace reserved in HBM is the largest of the classes that compute on the GPU (Eq. 14); a tied matrix
    counts once in a tier when both ends keep it there. Every class but the decoder has one layer.
    `group_states` (default `max_states`) caps the residues the group relaxation labels before the enumeration
    takes over.

    Raises:
        TooLarge: a knapsack generated more than `max_states` states.
    """
    decoder = columns["decoder"]
    ends = [c for name, c in columns.items() if name != "decoder"]
    offered = {c.layer_class: np.flatnonzero(c.staging <= level.level_bytes) for c in ends}
    rows = useful_columns(decoder, level)
    # Tiers other than HBM join the knapsack only once a plan overfills them: a plan that is best under fewer
    # constraints and fits the others is best under all (fewer tiers also make the enumeration far smaller).
    priced = level.multipliers if level.multipliers is not None else np.zeros(3)
    tracked = [t for t in level.tiers if t == 0 or priced[t] > 0] or list(level.tiers[:1])
    # Every (ends, decoder on the GPU or not) combination with a lower bound, best first: N·φ(λ) − λ·C + the ends'
    # seconds bounds the combination's plans for any λ ≥ 0 (λ from the decoder's LP at the loosest capacity).
    combos = []
    for picks in itertools.product(*(offered[c.layer_class] for c in ends)):
        end_seconds = sum(float(c.seconds[k]) for c, k in zip(ends, picks))
        end_bytes = sum(c.tier_bytes[k] for c, k in zip(ends, picks))
        tied = [int(c.weights_tier[k]) for c, k in zip(ends, picks)]
        if level.tied_bytes and len(tied) == 2 and tied[0] == tied[1] >= 0:
            end_bytes = end_bytes - level.tied_bytes * np.eye(3, dtype=np.int64)[tied[0]]
        end_workspace = max((c.workspace_bytes for c, k in zip(ends, picks) if c.uses_gpu[k]), default=0)
        # A plan belongs to the level of its largest stream: if no end streams exactly the level, a decoder layer
        # must (plans streaming less are the lower levels' business).
        end_at_level = any(c.staging[k] >= level.reserve_bytes for c, k in zip(ends, picks))
        for decoder_gpu in (False, True):
            workspace = max(end_workspace, decoder.workspace_bytes if decoder_gpu else 0)
            capacity = level.capacity - end_bytes - np.array([workspace, 0, 0], dtype=np.int64)
            if (capacity[list(level.tiers)] >= 0).all():
                combos.append((picks, decoder_gpu, end_seconds, capacity, end_at_level))
    branches = {}
    for decoder_gpu in (False, True):
        chosen = rows if decoder_gpu else rows[~decoder.uses_gpu[rows]]
        loosest = [c for _, g, _, c, _ in combos if g == decoder_gpu]
        if chosen.size == 0 or not loosest:
            continue
        capacity = np.max(loosest, axis=0)
        relaxed = _relaxation(decoder.tier_bytes[chosen][:, tracked], decoder.seconds[chosen], decoder.count,
                              capacity[tracked])
        multipliers = np.zeros(3)
        if relaxed is not None:
            multipliers[tracked] = relaxed[0]
        floor = float((decoder.seconds[chosen] + decoder.tier_bytes[chosen] @ multipliers).min())
        at_level = np.flatnonzero(decoder.staging[chosen] >= level.reserve_bytes)
        branches[decoder_gpu] = (chosen, multipliers, floor, at_level)
    ranked = sorted(((end_seconds + decoder.count * branches[g][2] - float(capacity @ branches[g][1]), n, picks, g,
                      end_seconds, capacity, end_at_level)
                     for n, (picks, g, end_seconds, capacity, end_at_level) in enumerate(combos)
                     if g in branches and (end_at_level or branches[g][3].size)), key=lambda item: (item[0], item[1]))
    best = LevelSolution(cutoff, {})
    found = False
    for bound, _, picks, decoder_gpu, end_seconds, capacity, end_at_level in ranked:
        if not beats(bound, best.seconds):
            break  # neither this combination nor any after it can beat the best plan
        chosen, _, _, at_level = branches[decoder_gpu]
        while True:
            value, counts = _decoder_knapsack(decoder, chosen, tracked, capacity, best.seconds - end_seconds,
                                              max_states, None if end_at_level else at_level, group_states)
            if counts is None:
                break
            over = [t for t in level.tiers if counts @ decoder.tier_bytes[chosen][:, t] > capacity[t]]
            if not over:
                break
            tracked = sorted(set(tracked) | set(over))
        if counts is None:
            continue
        plan = {(c.layer_class, int(c.index[k])): 1 for c, k in zip(ends, picks)}
        plan.update({("decoder", int(decoder.index[chosen[k]])): int(n) for k, n in enumerate(counts) if n})
        best, found = LevelSolution(end_seconds + value, plan), True
    return best if found else LevelSolution(np.inf, {})


def _decoder_knapsack(decoder: ClassColumns, chosen: np.ndarray, tracked: list[int], capacity: np.ndarray,
                      cutoff: float, max_states: int, required, group_states: int | None = None):
    """The decoder's knapsack over the tracked tiers. Without CXL every configuration holds the same bytes in HBM
    and DDR together, so a DDR capacity is a floor on the HBM bytes: one capacity with a floor, which the group
    relaxation settles in most cases; otherwise (or when it does not) both tiers are enumerated."""
    sizes = decoder.tier_bytes[chosen]
    if tracked == [0, 1] and not sizes[:, 2].any():
        total = sizes[:, 0] + sizes[:, 1]
        if (total == total[0]).all():
            floor = decoder.count * int(total[0]) - int(capacity[1])
            value, counts = knapsack(sizes[:, 0], decoder.seconds[chosen], decoder.count, capacity[0], cutoff,
                                     max_states, required, floor=floor, group_states=group_states)
            if value is not None:
                return value, counts
    return knapsack(sizes[:, tracked], decoder.seconds[chosen], decoder.count, capacity[tracked], cutoff,
                    max_states, required, group_states=group_states)


def useful_columns(decoder: ClassColumns, level: LevelProblem) -> np.ndarray:
    """Decoder columns worth offering at a level (sorted ascending): those streaming at most the level that no
    other one beats, i.e. uses no more bytes of any tier that can bind, is no slower and uses the GPU only if it
    does (a column without the GPU needs no workspace). At a fixed level staging no longer tells columns apart.
    Kept per (level, tiers) in `decoder.useful` (read-only: the search asks again for each interval it solves)."""
    key = (level.level_bytes, level.tiers)
    if key not in decoder.useful:
        rows = _useful_columns(decoder, level)
        rows.flags.writeable = False
        decoder.useful[key] = rows
    return decoder.useful[key]


def _useful_columns(decoder: ClassColumns, level: LevelProblem) -> np.ndarray:
    rows = np.flatnonzero(decoder.staging <= level.level_bytes)
    if rows.size == 0:
        return rows
    # first the fastest of each (bytes in the tiers that can bind, GPU use): cheap, and most of the pruning
    memory = decoder.tier_bytes[rows][:, list(level.tiers)]
    gpu = decoder.uses_gpu[rows]
    order = np.lexsort((rows, decoder.seconds[rows], gpu) + tuple(memory.T[::-1]))
    key = np.column_stack([memory, gpu])[order]
    rows = np.sort(rows[order[np.r_[True, np.any(key[1:] != key[:-1], axis=1)]]])
    points = np.column_stack([decoder.seconds[rows], decoder.tier_bytes[rows][:, list(level.tiers)],
                              decoder.uses_gpu[rows]]).astype(np.float64)
    return rows[pareto(points)]


def pareto(points: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Indices (ascending) of the rows of `points` [n, d] that no other row dominates (all ≤, all minimised); of
    identical rows the first is kept.

    Rows are visited in lexicographic order (a dominating row sorts before the rows it dominates), each compared
    only with the rows kept so far and the earlier rows of its chunk: O(n · kept), not O(n²).
    """
    n = points.shape[0]
    order = np.lexsort(np.vstack([np.arange(n)[None, :], points.T[::-1]]))
    if points.shape[1] == 3:
        return _pareto3(points, order, min(chunk, 32))
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


def _pareto3(points: np.ndarray, order: np.ndarray, chunk: int) -> np.ndarray:
    """`pareto` for three columns (seconds and two tracked tiers: the enumeration's states): the same rows, with
    the earlier rows as a staircase. In lexicographic order a row is dominated exactly when an earlier row is no
    larger in the last two columns (the first is no larger by the order; an identical earlier row counts), and
    the least last column among earlier rows no larger in the middle one is read off the staircase of their
    minimal (middle, last) pairs by a binary search, instead of comparing with every row kept so far."""
    n = points.shape[0]
    keep = np.zeros(n, dtype=bool)
    stair_x, stair_y = np.empty(0), np.empty(0)  # middle ascending, last strictly descending
    for start in range(0, n, chunk):
        rows = order[start:start + chunk]
        block = points[rows]
        x, y = block[:, 1], block[:, 2]
        at = np.searchsorted(stair_x, x, side="right") - 1  # the staircase's least last column with middle ≤ x
        dominated = (at >= 0) & (stair_y[np.maximum(at, 0)] <= y) if stair_x.size else np.zeros(rows.size, dtype=bool)
        earlier = np.all(block[None, :, :] <= block[:, None, :], axis=2)  # [i, j]: row j ≤ row i everywhere
        dominated |= np.tril(earlier, k=-1).any(axis=1)  # j before i in lexicographic order
        keep[rows[~dominated]] = True
        xs, ys = np.concatenate([stair_x, x]), np.concatenate([stair_y, y])
        by = np.lexsort((ys, xs))
        xs, ys = xs[by], ys[by]
        minimal = ys < np.concatenate([[np.inf], np.minimum.accumulate(ys)[:-1]])
        stair_x, stair_y = xs[minimal], ys[minimal]
    return np.nonzero(keep)[0]


# ---------------------------------------------------------------------------------------------------------------
# The knapsack


def knapsack(sizes: np.ndarray, seconds: np.ndarray, layers: int, capacity, cutoff: float = np.inf,
             max_states: int = MAX_STATES, required: np.ndarray | None = None,
             floor: int | None = None, group_states: int | None = None) -> tuple[float | None, np.ndarray | None]:
    """min Σ seconds_c·n_c  s.t.  Σ n_c = layers, Σ sizes_c·n_c ≤ capacity (per column of sizes), n_c ≥ 0 integer,
    and, with `required` (column indices), n_c ≥ 1 for at least one of them.

    With `floor` (one capacity only), also Σ sizes_c·n_c ≥ floor; only the group relaxation handles it, and
    (None, None) means it did not settle the problem (the caller then tracks the floor's tier as a capacity).

    `sizes` is [K] (one capacity) or [K, m] with `capacity` [m], in bytes (integers). Returns (seconds, counts) of
    the optimum when it beats `cutoff` (by more than the 1e-9 relative tolerance), else (inf, None). See the
    module docstring for the method.

    Raises:
        TooLarge: the enumeration generated more than `max_states` states.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    sizes = sizes.reshape(sizes.shape[0], -1)
    capacity = np.asarray(capacity, dtype=np.int64).reshape(-1)
    seconds = np.asarray(seconds, dtype=np.float64)
    count = seconds.size
    counts = np.zeros(count, dtype=np.int64)
    if floor is not None and floor <= 0:
        floor = None  # the floor cannot bind
    if required is not None and (layers == 0 or len(required) == 0):
        return np.inf, None
    if layers == 0:
        return (0.0, counts) if (capacity >= 0).all() and beats(0.0, cutoff) else (np.inf, None)
    fits = np.flatnonzero((sizes * layers <= capacity).all(axis=1))
    if fits.size:  # the fastest configuration that fits in every layer: nothing to trade
        j = fits[np.lexsort((fits, seconds[fits]))[0]]
        if seconds[j] <= seconds.min() and (required is None or j in set(int(r) for r in required)) and \
                (floor is None or int(sizes[j].sum()) * layers >= floor):
            counts[j] = layers
            value = float(seconds[j] * layers)
            return (value, counts) if beats(value, cutoff) else (np.inf, None)
    relaxed = _relaxation(sizes, seconds, layers, capacity)
    if relaxed is None:
        return np.inf, None  # the LP relaxation is infeasible, so is every integer plan
    if floor is not None and len(relaxed[1]) != 2:
        return None, None
    multipliers, basis = relaxed
    priced = seconds + sizes @ multipliers
    least = float(priced.min())  # φ: the least seconds a layer costs at these prices
    reduced = np.maximum(priced - least, 0.0)
    if sizes.shape[1] == 1 and len(basis) == 2:
        grouped = _group_relaxation(sizes[:, 0], seconds, layers, int(capacity[0]), basis, float(multipliers[0]),
                                    least, reduced, cutoff, required,
                                    max_states if group_states is None else group_states, floor)
        if grouped is not None:
            return grouped
    if floor is not None:
        return None, None
    completing = basis[:2]  # completed in closed form; other basic columns are enumerated first (r = 0)
    others = [c for c in basis[2:]] + [int(c) for c in np.argsort(reduced, kind="stable") if c not in basis]
    search = _Search(sizes, seconds, layers, capacity, multipliers, least, completing, max_states)
    return search.run(others, reduced, cutoff, None if required is None else np.asarray(required, dtype=np.int64))


def _group_relaxation(sizes, seconds, layers: int, capacity: int, basis, slope: float, least: float, reduced,
                      cutoff: float, required, max_states: int, floor: int | None = None):
    """One capacity: the knapsack through its group relaxation (Gomory), or None when that does not settle it.

    With the LP's basic columns a (fewer bytes) and b, every plan costs N·φ − λ·C + Σ r_c·n_c + λ·slack, and once
    the other columns' counts are fixed, the best a/b completion leaves slack = (C − s_a·N − Σ (s_c − s_a)·n_c) mod
    (s_b − s_a), if its a and b counts come out non-negative. Dropping that condition leaves a shortest-path
    problem over the residues mod (s_b − s_a): label-setting (Dijkstra) in order of Σ r_c·n_c finds its optimum,
    a lower bound on the knapsack. When it cannot beat the cutoff, neither can the knapsack; when its a and b
    counts are non-negative (and it uses a required column, at most N layers), it is the knapsack's optimum.
    Otherwise, or past `max_states` labels, the caller enumerates.
    """
    b, a = (basis[0], basis[1]) if sizes[basis[0]] > sizes[basis[1]] else (basis[1], basis[0])
    span = int(sizes[b]) - int(sizes[a])
    if span <= 0:
        return None
    relaxed_value = layers * least - slope * capacity  # the LP optimum
    spare = np.inf if floor is None else capacity - floor  # the most slack a plan may leave (a floor on bytes)
    limit = cutoff - relaxed_value if np.isfinite(cutoff) else np.inf  # what Σ r + λ·slack must stay below
    base = capacity - int(sizes[a]) * layers
    offset = [(int(v) - int(sizes[a])) % span for v in sizes]
    wanted = None if required is None else {int(c) for c in required}
    if wanted is not None and (a in wanted or b in wanted):
        starts, wanted_later = [(0.0, 0, -1)], wanted  # the basis may satisfy it: checked at the end
    elif wanted is not None:
        starts, wanted_later = [(float(reduced[c]), offset[c], int(c)) for c in sorted(wanted)], None
    else:
        starts, wanted_later = [(0.0, 0, -1)], None
    items = sorted((c for c in range(sizes.size) if c not in (a, b) and offset[c] != 0), key=lambda c: reduced[c])
    # the inner loop in plain Python numbers (the same doubles: numpy's float64 arithmetic is IEEE's)
    steps = [(c, float(reduced[c]), offset[c]) for c in items]
    distance, parent, heap = {}, {}, []
    for cost, residue, column in starts:
        if cost < distance.get(residue, np.inf):
            distance[residue], parent[residue] = cost, (None, column)
            heapq.heappush(heap, (cost, residue))
    best, best_residue = np.inf, None
    settled = 0
    inf, heappush = np.inf, heapq.heappush
    while heap:
        cost, residue = heapq.heappop(heap)
        if cost > distance[residue]:
            continue
        if cost >= min(best, limit):
            break
        settled += 1
        if settled > max_states:
            return None
        slack = (base - residue) % span
        total = cost + slope * slack
        if total < best and slack <= spare:
            best, best_residue = total, residue
        cap = min(best, limit)
        for c, r, o in steps:
            step = cost + r
            if step >= cap:
                break
            nxt = (residue + o) % span
            if step < distance.get(nxt, inf):
                distance[nxt], parent[nxt] = step, (residue, c)
                heappush(heap, (step, nxt))
    if best_residue is None or not best < limit:
        return np.inf, None  # the relaxation cannot beat the cutoff: neither can the knapsack
    counts = np.zeros(sizes.size, dtype=np.int64)
    residue = best_residue
    while True:
        previous, column = parent[residue]
        if column >= 0:
            counts[column] += 1
        if previous is None:
            break
        residue = previous
    rest = layers - int(counts.sum())
    room = capacity - int(counts @ sizes) - int(sizes[a]) * rest
    if rest < 0 or room < 0:
        return None
    with_b = min(rest, room // span)
    counts[b] += with_b
    counts[a] += rest - with_b
    if wanted_later is not None and not any(counts[c] for c in wanted_later):
        return None
    value = float(counts @ seconds)
    used = int(counts @ sizes)
    if value > relaxed_value + best + 1e-9 * abs(value) or used > capacity or (floor is not None and used < floor):
        return None  # the completion hit a bound of a or b: the relaxation's optimum is not a plan
    return (value, counts) if beats(value, cutoff) else (np.inf, None)


def _relaxation(sizes, seconds, layers, capacity) -> tuple[np.ndarray, list[int]] | None:
    """(λ per byte [m] ≥ 0, basic columns, most used first) of the LP relaxation, or None when it is infeasible.
    One capacity: the lower convex hull of (bytes, seconds), exactly; more: the simplex of passes/ilp_lp.py."""
    if sizes.shape[1] == 1:
        hull = _lower_hull(sizes[:, 0], seconds)
        if sizes[hull[0], 0] * layers > capacity[0]:
            return None  # not even the smallest configuration in every layer fits
        # the fastest point does not fit (checked by the caller): the segment a–b around the average bytes
        seg = next((k for k in range(len(hull) - 1) if sizes[hull[k + 1], 0] * layers > capacity[0]), None)
        if seg is None:
            return np.zeros(1), [hull[-1]]
        a, b = hull[seg], hull[seg + 1]
        slope = (seconds[a] - seconds[b]) / float(sizes[b, 0] - sizes[a, 0])
        return np.array([slope]), [int(b), int(a)]
    result = solve_lp(seconds, np.ones((1, seconds.size)), [layers], sizes.T / _GIB, capacity / _GIB)
    if result is None:
        return None
    basis = sorted(result.basis, key=lambda c: (-result.x[c], c))
    return result.capacity_duals / _GIB, [int(c) for c in basis]


def _lower_hull(sizes: np.ndarray, seconds: np.ndarray) -> list[int]:
    """Indices of the lower convex hull of (bytes, seconds), bytes ascending, seconds strictly descending."""
    hull: list[int] = []
    for i in np.lexsort((seconds, sizes)):
        if hull and seconds[i] >= seconds[hull[-1]]:
            continue  # more bytes and no faster: never on the descending hull
        while len(hull) >= 2:
            p, q = hull[-2], hull[-1]
            # drop q when it lies on or above the segment p–i
            if (seconds[q] - seconds[p]) * (sizes[i] - sizes[p]) >= (seconds[i] - seconds[p]) * (sizes[q] - sizes[p]):
                hull.pop()
            else:
                break
        hull.append(int(i))
    return hull


class _Search:
    """The enumeration of step 3: stages of states, one stage per enumerated configuration."""

    def __init__(self, sizes, seconds, layers, capacity, multipliers, floor, completing, max_states):
        self.sizes, self.seconds, self.layers, self.capacity = sizes, seconds, layers, capacity
        self.multipliers, self.floor, self.completing, self.max_states = multipliers, floor, completing, max_states

    def bound(self, used_l, used_b, used_s):
        """Weak duality: no completion of a state costs less (any λ ≥ 0)."""
        return used_s + (self.layers - used_l) * self.floor - (self.capacity[None, :] - used_b) @ self.multipliers

    def complete(self, used_l, used_b, used_s):
        """The best completion of each state with the completing columns: (seconds, counts [S, q])."""
        rest = self.layers - used_l
        room = self.capacity[None, :] - used_b
        q = len(self.completing)
        if q == 0:
            return np.where(rest == 0, used_s, np.inf), np.zeros((used_l.size, 0), dtype=np.int64)
        last = self.completing[-1]
        if q == 1:
            ok = (rest[:, None] * self.sizes[last][None, :] <= room).all(axis=1)
            return np.where(ok, used_s + rest * self.seconds[last], np.inf), rest[:, None]
        first = self.completing[0]
        # n_first in [low, high]; the rest take `last`: per tier, n·(s_first − s_last) ≤ room − rest·s_last
        coef = (self.sizes[first] - self.sizes[last])[None, :]
        rhs = room - rest[:, None] * self.sizes[last][None, :]
        low = np.zeros(used_l.size, dtype=np.int64)
        high = rest.copy()
        safe = np.where(coef == 0, 1, np.abs(coef))
        high = np.minimum(high, np.where(coef > 0, rhs // safe, high[:, None]).min(axis=1))
        low = np.maximum(low, np.where(coef < 0, -(rhs // safe), 0).max(axis=1))
        ok = (low <= high) & np.where(coef == 0, rhs >= 0, True).all(axis=1)
        n_first = high if self.seconds[first] < self.seconds[last] else low
        value = used_s + n_first * self.seconds[first] + (rest - n_first) * self.seconds[last]
        return np.where(ok, value, np.inf), np.stack([n_first, rest - n_first], axis=1)

    def run(self, others, reduced, cutoff, required=None):
        m = self.sizes.shape[1]
        if required is None:  # one empty state
            first = np.zeros(1, dtype=np.int64)
            forced = np.full(1, -1, dtype=np.int64)
        else:  # one state per required column, holding one layer of it
            first = np.ones(required.size, dtype=np.int64)
            forced = required
        start_b = np.where(forced[:, None] >= 0, self.sizes[np.maximum(forced, 0)], 0).reshape(-1, m)
        start_s = np.where(forced >= 0, self.seconds[np.maximum(forced, 0)], 0.0)
        keep = (start_b <= self.capacity[None, :]).all(axis=1) & beats_array(self.bound(first, start_b, start_s),
                                                                              cutoff)
        first, start_b, start_s, forced = first[keep], start_b[keep], start_s[keep], forced[keep]
        if not first.size:
            return np.inf, None
        self.forced = forced
        stages = [(first, start_b, start_s, np.zeros(first.size, dtype=np.int64), np.zeros(first.size, dtype=np.int64))]
        value, completion = self.complete(first, start_b, start_s)
        k = int(np.argmin(value))
        best = (float(value[k]), 0, k, completion[k]) if beats(float(value[k]), cutoff) else (cutoff,)
        generated = 0
        for pos, c in enumerate(others):
            used_l, used_b, used_s = stages[-1][:3]
            next_reduced = reduced[others[pos + 1]] if pos + 1 < len(others) else np.inf
            parts = [(used_l, used_b, used_s, np.arange(used_l.size), np.zeros(used_l.size, dtype=np.int64))]
            parent = np.arange(used_l.size)
            copies = 0
            while True:
                copies += 1
                cur_l = used_l[parent] + copies
                cur_b = used_b[parent] + copies * self.sizes[c][None, :]
                cur_s = used_s[parent] + copies * self.seconds[c]
                keep = (cur_l <= self.layers) & (cur_b <= self.capacity[None, :]).all(axis=1)
                keep &= beats_array(self.bound(cur_l, cur_b, cur_s), best[0])
                parent, cur_l, cur_b, cur_s = parent[keep], cur_l[keep], cur_b[keep], cur_s[keep]
                if not parent.size:
                    break
                value, completion = self.complete(cur_l, cur_b, cur_s)
                k = int(np.argmin(value))
                if beats(float(value[k]), best[0]):
                    best = (float(value[k]), pos + 1, -1, completion[k], int(parent[k]), copies)
                generated += cur_l.size
                if generated > self.max_states:
                    raise TooLarge()
                parts.append((cur_l, cur_b, cur_s, parent, np.full(cur_l.size, copies, dtype=np.int64)))
            merged = [np.concatenate([p[i] for p in parts]) for i in range(5)]
            if np.isfinite(next_reduced):
                keep = beats_array(self.bound(*merged[:3]) + next_reduced, best[0])
            else:
                keep = np.zeros(merged[0].size, dtype=bool)
            merged = [array[keep] for array in merged]
            stages.append(tuple(array[_frontier(*merged[:3])] for array in merged))
            if not stages[-1][0].size:
                break
        if len(best) == 1:
            return np.inf, None
        return best[0], self._counts(stages, others, best)

    def _counts(self, stages, others, best) -> np.ndarray:
        counts = np.zeros(self.seconds.size, dtype=np.int64)
        for column, n in zip(self.completing, best[3]):
            counts[column] += int(n)
        if len(best) == 4:  # a first state's completion
            index = best[2]
        else:
            _, stage, _, _, parent, copies = best
            counts[others[stage - 1]] += copies
            index = parent
            for level in range(stage - 1, 0, -1):  # stage s holds states after others[:s]
                _, _, _, parents, added = stages[level]
                counts[others[level - 1]] += int(added[index])
                index = int(parents[index])
        if self.forced[index] >= 0:
            counts[self.forced[index]] += 1
        return counts


def _frontier(used_l: np.ndarray, used_b: np.ndarray, used_s: np.ndarray) -> np.ndarray:
    """Indices of the states worth keeping, sorted by (layers, bytes): per layer count, those no other state beats
    in seconds while using no more of any tier (every completion of a dominated state also completes the other:
    more room never hurts). One tier: a staircase; more: pairwise within each layer count."""
    if used_l.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((used_s,) + tuple(used_b.T[::-1]) + (used_l,))
    ls, bs, ss = used_l[order], used_b[order], used_s[order]
    if bs.shape[1] == 1:
        # sorted by (layers, bytes): keep a state faster than every earlier one with as many layers. Seconds as
        # dense ranks, offset so that every earlier layer count ranks above the current one's: one exact running
        # minimum then serves every layer count at once.
        _, rank = np.unique(ss, return_inverse=True)
        group = np.cumsum(np.concatenate([[True], ls[1:] != ls[:-1]]))
        key = (group[-1] - group) * (rank.max() + 1) + rank
        before = np.concatenate([[np.iinfo(np.int64).max], np.minimum.accumulate(key)[:-1]])
        return order[key < before]
    same = ls[1:] == ls[:-1]
    total = bs.sum(axis=1)
    if (total[1:][same] == total[:-1][same]).all():
        # Every state with as many layers holds the same bytes over the tiers together (each configuration holds
        # its layer's bytes in some tier, and every tier is tracked): a state using no more of any tier than
        # another then uses exactly as much of each, so only states with equal bytes dominate each other, and of
        # those (sorted by seconds, then position) the first is the one `pareto` keeps.
        return order[np.r_[True, ~same | (bs[1:] != bs[:-1]).any(axis=1)]]
    keep = np.zeros(order.size, dtype=bool)
    starts = np.flatnonzero(np.concatenate([[True], ls[1:] != ls[:-1]]))
    for start, end in zip(starts, np.concatenate([starts[1:], [ls.size]])):
        points = np.column_stack([ss[start:end], bs[start:end]]).astype(np.float64)
        keep[start + pareto(points)] = True
    return order[keep]


def beats(value: float, best: float) -> bool:
    """Whether `value` improves on `best` by more than the 1e-9 relative tolerance."""
    return value < best - RELATIVE * abs(best) if np.isfinite(best) else np.isfinite(value)


def beats_array(values: np.ndarray, best: float) -> np.ndarray:
    return values < best - RELATIVE * abs(best) if np.isfinite(best) else np.isfinite(values)
