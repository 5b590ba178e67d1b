"""LayerConfig columns at one staging level, HBM the only binding capacity → exact layer counts (a knapsack).

One level of the master problem (Eq. 12', passes/ilp_master.py) is, when DDR and CXL cannot bind (even the
most DDR-hungry choice fits DDR: `ilp_master._tiers_that_can_bind`), a knapsack with a cardinality constraint:
choose N decoder configurations (with repetition) and one each for the embedding and the head, minimising the
summed seconds (Eq. 13) with the HBM bytes (Eq. 11) under a capacity. Branch and bound in an ILP solver handles
this badly when many configurations fill HBM almost alike (transformer shapes make unit sizes nearly
commensurate: OPT's qkv + out_proj weigh one fc2 to within the biases), so every level closes only after
~10⁵ nodes; this module solves it exactly by enumeration instead:

1. the ends (embedding × head configurations, and whether the decoder uses the GPU, which sets the workspace
   reserved, Eq. 14) are few: each combination leaves the decoder a capacity C in bytes;
2. for the decoder, the LP relaxation is a segment a–b of the lower convex hull of (bytes, seconds); with its
   slope λ, a configuration's reduced cost r_c = t_c + λ·h_c − (t_a + λ·h_a) ≥ 0 and any plan costs
   LP* + Σ r_c·n_c + λ·(unused capacity) (Eq. 19 of docs/cost-model.md);
3. the counts of every configuration but a and b are enumerated, configurations in order of r_c, as states
   (layers used, bytes used) → least seconds (states with equal layers and bytes merged), each completed
   optimally with a and b (as many b as fit); a state is dropped when LP* + its Σ r_c·n_c, plus the least r_c
   of the configurations still to come, cannot beat the best plan found (1e-9 relative, the solvers' tolerance).

Bytes are exact integers, so the optimum is exact. When the enumeration generates more than `max_states` states
(near-twin configurations with small reduced costs, e.g. a layer with its few MB of KV cache in HBM or DDR, make
many combinations worth trying), the level is left to the ILP solver, which closes such instances quickly; the
cap counts states, not seconds, so which path solves a level does not depend on the machine.

    solution = solve_level(costs, configs, level_bytes, useful, cutoff)
    solution.seconds, solution.counts[("decoder", 3)]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from liac.passes.costs import CostGraph
from liac.passes.ilp_records import LayerConfig

__all__ = ["LevelSolution", "applies", "solve_level", "knapsack"]

MAX_STATES = 1_000_000  # states generated per knapsack before a level is left to the ILP solver (deterministic)
_RELATIVE = 1e-9  # a state is dropped when its bound cannot beat the best plan by more than this (the solvers' 1e-9)
_KEY = 2**40  # (layers, bytes) packed into one int64: bytes stay below 1 TiB per layer class


@dataclass(frozen=True)
class LevelSolution:
    """The best plan at one staging level: `seconds` (inf when none beats the cutoff) and the counts,
    (layer class, configuration index) → layers."""

    seconds: float
    counts: dict


class _TooLarge(Exception):
    """The enumeration generated more than MAX_STATES states: the level is left to the ILP solver."""


def applies(costs: CostGraph, bound_tiers: tuple[str, ...]) -> bool:
    """Whether levels can be solved here: HBM is the only capacity that can bind, and every class but the decoder
    has one layer (the embedding, the head)."""
    return bound_tiers == ("hbm",) and all(cls.count == 1 for cls in costs.classes if cls.layer_class != "decoder")


def solve_level(costs: CostGraph, configs: dict[str, list[LayerConfig]], level_bytes: int, useful: set[int],
                cutoff: float | None, max_states: int = MAX_STATES) -> LevelSolution | None:
    """The optimum at staging level `level_bytes` (configurations streaming more are not offered; of the
    decoder's, only those in `useful`), if it beats `cutoff`; None when the enumeration grew too large.

    The staging buffers reserve (prefetch_depth + 1)·level_bytes of HBM, the workspace the largest of the classes
    that compute on the GPU (Eq. 14); a tied embedding/LM-head matrix counts once when both ends keep it in HBM.
    """
    budgets = costs.budgets
    decoder = costs.layer_class("decoder")
    ends = [cls for cls in costs.classes if cls.layer_class != "decoder"]
    options = {cls.layer_class: [i for i, c in enumerate(configs[cls.layer_class]) if c.staging_bytes <= level_bytes]
               for cls in ends}
    rows = sorted(i for i in useful if configs["decoder"][i].staging_bytes <= level_bytes)
    sizes = np.array([configs["decoder"][i].hbm_bytes for i in rows], dtype=np.int64)
    seconds = np.array([configs["decoder"][i].seconds for i in rows], dtype=np.float64)
    on_gpu = np.array([configs["decoder"][i].uses_gpu for i in rows], dtype=bool)
    free = budgets.hbm_bytes - (budgets.prefetch_depth + 1) * level_bytes
    best = LevelSolution(np.inf if cutoff is None else cutoff, {})
    found = False
    for picks in itertools.product(*(options[cls.layer_class] for cls in ends)):
        chosen = [configs[cls.layer_class][i] for cls, i in zip(ends, picks)]
        end_seconds = sum(c.seconds for c in chosen)
        end_bytes = sum(c.hbm_bytes for c in chosen)
        if costs.tied_weight_bytes and all(c.weights_tier == "hbm" for c in chosen) and len(chosen) == 2:
            end_bytes -= costs.tied_weight_bytes
        end_workspace = max((cls.workspace_bytes for cls, c in zip(ends, chosen) if c.uses_gpu), default=0)
        for decoder_gpu in (False, True):
            offered = np.ones(len(rows), dtype=bool) if decoder_gpu else ~on_gpu
            workspace = max(end_workspace, decoder.workspace_bytes if decoder_gpu else 0)
            capacity = free - workspace - end_bytes
            if not offered.any() or capacity < 0:
                continue
            least = end_seconds + decoder.count * float(seconds[offered].min())
            if least >= best.seconds - _RELATIVE * abs(best.seconds):
                continue  # even the fastest decoder configuration everywhere cannot beat the best plan
            try:
                value, counts = knapsack(sizes[offered], seconds[offered], decoder.count, capacity,
                                         best.seconds - end_seconds, max_states)
            except _TooLarge:
                return None
            if counts is None:
                continue
            index = np.flatnonzero(offered)
            plan = {(cls.layer_class, i): 1 for cls, i in zip(ends, picks)}
            plan.update({("decoder", rows[index[k]]): int(n) for k, n in enumerate(counts) if n})
            best, found = LevelSolution(end_seconds + value, plan), True
    return best if found else LevelSolution(np.inf, {})


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


def knapsack(sizes: np.ndarray, seconds: np.ndarray, layers: int, capacity: int, cutoff: float = np.inf,
             max_states: int = MAX_STATES) -> tuple[float, np.ndarray | None]:
    """min Σ seconds_c·n_c  s.t.  Σ n_c = layers, Σ sizes_c·n_c ≤ capacity, n_c ≥ 0 integer.

    Returns (seconds, counts) of the optimum when it is below `cutoff` (by more than the 1e-9 relative
    tolerance), else (inf, None). See the module docstring for the method.

    Raises:
        _TooLarge: the enumeration generated more than `max_states` states.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    seconds = np.asarray(seconds, dtype=np.float64)
    counts = np.zeros(sizes.size, dtype=np.int64)
    if layers == 0:
        return (0.0, counts) if capacity >= 0 and 0.0 < cutoff else (np.inf, None)
    fits = np.flatnonzero(sizes * layers <= capacity)
    if fits.size:  # the fastest configuration that fits in every layer: nothing to trade
        j = fits[np.lexsort((sizes[fits], seconds[fits]))[0]]
        if seconds[j] <= seconds.min():
            counts[j] = layers
            value = float(seconds[j] * layers)
            return (value, counts) if _beats(value, cutoff) else (np.inf, None)
    hull = _lower_hull(sizes, seconds)
    if sizes[hull[0]] * layers > capacity:
        return np.inf, None  # not even the smallest configuration in every layer fits
    # The LP optimum: the hull segment a–b around the average bytes per layer (the fastest point does not fit).
    seg = next(k for k in range(len(hull) - 1) if sizes[hull[k + 1]] * layers > capacity)
    a, b = hull[seg], hull[seg + 1]
    span = int(sizes[b] - sizes[a])
    slope = (seconds[a] - seconds[b]) / span  # λ: seconds per byte
    reduced = np.maximum(seconds + slope * sizes - (seconds[a] + slope * sizes[a]), 0.0)

    def complete(used_layers, used_bytes, used_seconds):
        """Fill the remaining layers with a and b, as many b as fit (Eq. 19: least unused capacity)."""
        rest = layers - used_layers
        room = capacity - used_bytes - sizes[a] * rest
        with_b = np.minimum(rest, np.maximum(room, 0) // span)
        value = used_seconds + seconds[a] * (rest - with_b) + seconds[b] * with_b
        return np.where(room >= 0, value, np.inf), with_b

    others = [int(c) for c in np.argsort(reduced, kind="stable") if c not in (a, b)]
    stages = [(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1))]  # (layers, bytes, seconds)
    value, with_b = complete(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1))
    best = (float(value[0]), 0, 0, -1, 0, int(with_b[0])) if _beats(float(value[0]), cutoff) else (cutoff,)
    generated = 0
    for pos, c in enumerate(others):
        used_l, used_b, used_s = stages[-1]
        next_reduced = reduced[others[pos + 1]] if pos + 1 < len(others) else np.inf
        parts_l, parts_b, parts_s = [used_l], [used_b], [used_s]
        parent = np.arange(used_l.size)
        copies = 0
        while True:
            copies += 1
            cur_l, cur_b, cur_s = used_l[parent] + copies, used_b[parent] + copies * sizes[c], \
                used_s[parent] + copies * seconds[c]
            bound = cur_s + (layers - cur_l) * (seconds[a] + slope * sizes[a]) - slope * (capacity - cur_b)
            keep = (cur_l <= layers) & _beats_array(bound, best[0])
            parent, cur_l, cur_b, cur_s = parent[keep], cur_l[keep], cur_b[keep], cur_s[keep]
            if not parent.size:
                break
            value, with_b = complete(cur_l, cur_b, cur_s)
            k = int(np.argmin(value))
            if _beats(float(value[k]), best[0]):
                best = (float(value[k]), pos, int(parent[k]), c, copies, int(with_b[k]))
            generated += cur_l.size
            if generated > max_states:
                raise _TooLarge()
            parts_l.append(cur_l)
            parts_b.append(cur_b)
            parts_s.append(cur_s)
        used_l, used_b, used_s = np.concatenate(parts_l), np.concatenate(parts_b), np.concatenate(parts_s)
        bound = used_s + (layers - used_l) * (seconds[a] + slope * sizes[a]) - slope * (capacity - used_b)
        keep = _beats_array(bound + next_reduced, best[0]) if np.isfinite(next_reduced) else np.zeros(bound.size, bool)
        stages.append(_frontier(used_l[keep], used_b[keep], used_s[keep]))
        if not stages[-1][0].size:
            break
    if len(best) == 1:
        return np.inf, None
    value, pos, parent, c, copies, with_b = best
    counts = _walk_back(stages, others, sizes, seconds, pos, parent)
    if c >= 0:
        counts[c] += copies
    rest = layers - int(counts.sum())
    counts[b] += with_b
    counts[a] += rest - with_b
    return value, counts


def _frontier(used_l: np.ndarray, used_b: np.ndarray, used_s: np.ndarray):
    """States sorted by (layers, bytes), keeping per layer count only those faster than every state using fewer or
    as many bytes: a state with more bytes and no fewer seconds is dominated (every completion of it, with the
    configurations still to come, also completes the other: more room never hurts)."""
    order = np.lexsort((used_s, used_b, used_l))
    used_l, used_b, used_s = used_l[order], used_b[order], used_s[order]
    keep = np.zeros(used_l.size, dtype=bool)
    starts = np.flatnonzero(np.r_[True, used_l[1:] != used_l[:-1]]) if used_l.size else np.zeros(0, dtype=np.int64)
    for start, end in zip(starts, np.r_[starts[1:], used_l.size]):
        seconds = used_s[start:end]
        before = np.r_[np.inf, np.minimum.accumulate(seconds)[:-1]]
        keep[start:end] = seconds < before
    return used_l[keep], used_b[keep], used_s[keep]


def _walk_back(stages, others, sizes, seconds, pos: int, index: int) -> np.ndarray:
    """Counts of the state `index` of stages[pos] (after `others[:pos]` were enumerated): each stage's state came
    from the previous stage's state with `m` fewer copies of that stage's configuration and m·seconds less."""
    counts = np.zeros(sizes.size, dtype=np.int64)
    layers, nbytes, secs = (int(stages[pos][0][index]), int(stages[pos][1][index]), float(stages[pos][2][index]))
    for stage in range(pos, 0, -1):
        c = others[stage - 1]
        prev_l, prev_b, prev_s = stages[stage - 1]
        keys = prev_l * _KEY + prev_b  # stages are sorted by (layers, bytes)
        for m in range(0, layers + 1):
            key = (layers - m) * _KEY + (nbytes - m * int(sizes[c]))
            k = int(np.searchsorted(keys, key))
            if k < keys.size and keys[k] == key and abs(prev_s[k] + m * seconds[c] - secs) <= 1e-9 * max(1.0, secs):
                counts[c] += m
                layers, nbytes, secs = layers - m, nbytes - m * int(sizes[c]), float(prev_s[k])
                break
        else:  # cannot happen: every stored state was built from a stored state of the previous stage
            raise AssertionError("knapsack: lost a state's history")
    return counts


def _beats(value: float, best: float) -> bool:
    return value < best - _RELATIVE * abs(best) if np.isfinite(best) else np.isfinite(value)


def _beats_array(values: np.ndarray, best: float) -> np.ndarray:
    return values < best - _RELATIVE * abs(best) if np.isfinite(best) else np.isfinite(values)
