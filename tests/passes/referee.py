"""An independent referee for the placement ILP: the optimum over every per-layer choice, layer by layer.

Written apart from passes/ilp*.py, reusing only liac's per-layer pricing (`price.layer_time`): for every layer
of every class it enumerates, with its own loops, every tier of every weight unit and of the KV cache and every
placement per phase: each unit on the CPU or the GPU, or (at most one unit per phase, with its weights in DDR or
CXL) split at every share of the cost graph's grid. An MoE experts unit's tier is (tier, experts resident in HBM)
for every count, its split every count of experts on the CPU that leaves the GPU some, and a unit named 'router'
keeps its experts' tier (the compiler's rule, docs/cost-model.md §3). Then it combines the layers one at a time, every choice for the
next layer with every partial plan so far, keeping partial plans by (bytes per tier, largest stream, GPU use):
of two with the same memory, the one no slower that streams no more and uses the GPU only if the other does is as
good for every completion (the capacities bound those from above), so nothing that could be optimal is dropped.
No staging levels, no LP, no knapsack, no solver, no tolerance. Each prefill micro-batch the cost graph offers is
refereed apart, and the least wins.

    best = referee_optimum(costs)    # seconds, or None when nothing fits
"""

from __future__ import annotations

import itertools

import numpy as np

from liac.passes.costs import ClassCosts, CostGraph
from liac.passes.price import layer_time
from liac.plan import TIERS

__all__ = ["referee_optimum", "layer_choices"]


def _placements(cls: ClassCosts, phase: str, operand_tiers: tuple[str, ...], grid: tuple[int, ...], hbm: int = 0):
    """Every placement of one phase as CPU permille per unit (1000 = CPU, 0 = GPU, in between a split); an experts
    unit with `hbm` experts resident splits by count."""
    units = cls.phase(phase).units
    whole = []
    for unit, tier in zip(units, operand_tiers):
        cpu_ok = (tier != "hbm" or unit.cpu_allows_hbm) and not (unit.experts and hbm)
        whole.append((0, 1000) if cpu_ok else (0,))
    rows = list(itertools.product(*whole))
    for index, (unit, tier) in enumerate(zip(units, operand_tiers)):
        if tier not in ("ddr", "cxl"):
            continue
        if unit.experts:
            shares = [1000 * c // unit.experts for c in range(1, unit.experts - hbm + 1)
                      if 1000 * c // unit.experts < 1000]
        elif unit.can_split:
            shares = grid
        else:
            continue
        others = [options for k, options in enumerate(whole) if k != index]
        for rest in itertools.product(*others):
            for share in shares:
                rows.append(rest[:index] + (share,) + rest[index:])
    return np.array(rows, dtype=np.int64)


def _phase_options(costs, cls, phase, operand_tiers, hbm=0):
    """(seconds, staging, uses GPU) of every valid placement of one phase, exactly dominated ones dropped."""
    permille = _placements(cls, phase, operand_tiers, costs.split_permille, hbm)
    priced = layer_time(costs, cls, phase, operand_tiers, permille, hbm)
    seconds, staging, valid = priced.seconds, priced.staging_bytes, priced.valid
    rows = [(float(s), int(np.ceil(g)), bool((p < 1000).any()))
            for s, g, ok, p in zip(seconds, staging, valid, permille) if ok]
    return _undominated(rows)


def _undominated(rows):
    """Rows (seconds, staging, gpu) that no other row beats in all three (exact comparisons)."""
    if not rows:
        return []
    table = np.array(sorted(set(rows)), dtype=np.float64)  # by seconds, then staging, then GPU use
    keep = _staircase(np.zeros(len(table)), table[:, 0], table[:, 1], table[:, 2])
    return [(float(t), int(g), bool(u)) for t, g, u in table[keep]]


def _staircase(group, seconds, staging, gpu) -> np.ndarray:
    """Keep-mask of rows that no row of the same group beats: no slower, streaming no more, using the GPU only
    if it does. Per GPU use, a running minimum of seconds over rows sorted by (group, staging) (seconds as dense
    ranks, offset per group so that one exact running minimum serves every group); a GPU row is also checked
    against the fastest CPU-only row of its group streaming no more."""
    rank = np.unique(seconds, return_inverse=True)[1].ravel().astype(np.int64)
    group = np.asarray(group, dtype=np.int64)
    staging = np.asarray(staging, dtype=np.int64)
    top, last = int(rank.max()) + 1, int(group.max())
    keep = np.zeros(len(rank), dtype=bool)
    running = {}
    for uses in (0, 1):
        rows = np.flatnonzero(gpu == uses)
        if not rows.size:
            continue
        rows = rows[np.lexsort((rank[rows], staging[rows], group[rows]))]
        key = (last - group[rows]) * top + rank[rows]
        least = np.minimum.accumulate(key)
        mine = key < np.r_[np.iinfo(np.int64).max, least[:-1]]
        if uses == 1 and 0 in running:  # the fastest CPU-only row of the same group streaming no more
            cpu_rows, cpu_least = running[0]
            position = np.searchsorted(group[cpu_rows] * (staging.max() + 1) + staging[cpu_rows],
                                       group[rows] * (staging.max() + 1) + staging[rows], side="right") - 1
            found = position >= 0
            same = found & (group[cpu_rows[np.maximum(position, 0)]] == group[rows])
            beaten = same & (cpu_least[np.maximum(position, 0)] - (last - group[rows]) * top <= rank[rows])
            mine &= ~beaten
        running[uses] = (rows, least)
        keep[rows[mine]] = True
    return keep


def layer_choices(costs: CostGraph, cls: ClassCosts):
    """Every choice for one layer of `cls`, as rows (seconds, hbm, ddr, cxl, staging, gpu, weights tier index)."""
    tiers = costs.tiers
    specs = cls.prefill.units
    weight_units = [k for k, op in enumerate(cls.operands) if op == "weights"]
    expert_unit = next((k for k in weight_units if specs[k].experts), None)
    router = next((k for k in weight_units if cls.units[k] == "router"), None) if expert_unit is not None else None
    has_kv = "kv" in cls.operands
    out = []
    for weight_tiers in itertools.product(tiers, repeat=len(weight_units)):
        chosen = dict(zip(weight_units, weight_tiers))
        if router is not None and chosen[router] != chosen[expert_unit]:
            continue
        experts = specs[expert_unit].experts if expert_unit is not None else 0
        hbm_counts = (0,) if expert_unit is None else \
            (experts,) if chosen[expert_unit] == "hbm" else tuple(range(experts))
        for hbm, kv in itertools.product(hbm_counts, tiers if has_kv else ("none",)):
            operand = ["ddr"] * len(cls.units)
            for unit, tier in zip(weight_units, weight_tiers):
                operand[unit] = tier
            for k, op in enumerate(cls.operands):
                if op == "kv":
                    operand[k] = kv
            operand = tuple(operand)
            memory = dict.fromkeys(TIERS, 0)
            for unit, tier in zip(weight_units, weight_tiers):
                resident = hbm * specs[unit].expert_slot_bytes if unit == expert_unit else 0
                memory["hbm"] += resident
                memory[tier] += cls.weight_bytes[unit] - resident
            if has_kv:
                memory[kv] += cls.kv_cache_bytes
            prefill = _phase_options(costs, cls, "prefill", operand, hbm)
            decode = _phase_options(costs, cls, "decode", operand, hbm)
            pairs = _undominated([(p[0] + d[0], max(p[1], d[1]), p[2] or d[2]) for p in prefill for d in decode])
            first = TIERS.index(weight_tiers[0]) if weight_tiers else -1
            out.extend((s, memory["hbm"], memory["ddr"], memory["cxl"], g, int(u), first) for s, g, u in pairs)
    return np.array(out, dtype=np.float64)


def _merge(states: np.ndarray) -> np.ndarray:
    """Partial plans [seconds, hbm, ddr, cxl, staging, gpu]: per memory, those no other beats (seconds, staging,
    GPU use all no worse)."""
    if not len(states):
        return states
    order = np.lexsort((states[:, 3], states[:, 2], states[:, 1]))
    states = states[order]
    memory = np.cumsum(np.r_[True, np.any(states[1:, 1:4] != states[:-1, 1:4], axis=1)])
    return states[_staircase(memory, states[:, 0], states[:, 4], states[:, 5])]


def referee_optimum(costs: CostGraph) -> float | None:
    """The least objective over every plan that fits the budgets (Eqs. 10-13) at every prefill micro-batch the cost
    graph offers (Eq. 20: each priced apart, `CostGraph.with_prefill`), or None."""
    values = [_optimum_at(costs.with_prefill(m)) for m in costs.microbatches]
    values = [v for v in values if v is not None]
    return min(values) if values else None


def _optimum_at(costs: CostGraph) -> float | None:
    """The least objective at the cost graph's own prefill micro-batch, or None."""
    budgets = costs.budgets
    decoder = costs.layer_class("decoder")
    choices = layer_choices(costs, decoder)[:, :6]
    states = choices
    hbm_cap = budgets.hbm_bytes
    for _ in range(decoder.count - 1):
        grown = (states[:, None, :] + choices[None, :, :]).reshape(-1, 6)
        grown[:, 4] = np.maximum(states[:, None, 4], choices[None, :, 4]).ravel()
        grown[:, 5] = np.maximum(states[:, None, 5], choices[None, :, 5]).ravel()
        fits = (grown[:, 1] + (budgets.prefetch_depth + 1) * grown[:, 4] <= hbm_cap) & \
            (grown[:, 2] <= budgets.ddr_bytes) & (grown[:, 3] <= budgets.cxl_bytes)
        states = _merge(grown[fits])
        if not len(states):
            return None
    workspace = {c.layer_class: c.workspace_bytes for c in costs.classes}
    host = max(c.host_workspace_bytes for c in costs.classes)
    embed = layer_choices(costs, costs.layer_class("embed"))
    head = layer_choices(costs, costs.layer_class("head"))
    best = None
    for e in embed:
        for h in head:
            credit = np.zeros(3)
            if costs.tied_weight_bytes and e[6] == h[6] and e[6] >= 0:
                credit[int(e[6])] = costs.tied_weight_bytes
            staging = np.maximum(states[:, 4], max(e[4], h[4]))
            used_ws = np.maximum(np.where(states[:, 5] > 0, workspace["decoder"], 0),
                                 max(workspace["embed"] * e[5], workspace["head"] * h[5]))
            hbm = states[:, 1] + e[1] + h[1] - credit[0] + (budgets.prefetch_depth + 1) * staging + used_ws
            ddr = states[:, 2] + e[2] + h[2] - credit[1] + host
            cxl = states[:, 3] + e[3] + h[3] - credit[2]
            fits = (hbm <= budgets.hbm_bytes) & (ddr <= budgets.ddr_bytes) & (cxl <= budgets.cxl_bytes)
            if fits.any():
                value = float(states[fits, 0].min()) + e[0] + h[0]
                best = value if best is None else min(best, value)
    return best
