"""The exact level knapsack (passes/ilp_knapsack.py): equals enumeration of every multiset of configurations (one
capacity or several, with or without a required column), and equals the ILP solver on whole compiles; it gives up
by a state count, not by time."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hand_graphs import hand_graph

import liac.passes.ilp_knapsack as ilp_knapsack
import liac.passes.ilp_master as ilp_master
from liac.models import ZOO
from liac.passes.costs import TierBudgets, Workload, annotate_costs
from liac.passes.ilp import SolverOptions, solve_placement
from liac.profile import resolve_profile
from liac.sizes import GIB


def enumerate_best(sizes, seconds, layers, capacity, required=None):
    """min Σ seconds over every multiset of `layers` configurations whose sizes fit (every capacity) and that use
    a required configuration, or None."""
    sizes = np.asarray(sizes).reshape(len(seconds), -1)
    capacity = np.asarray(capacity).reshape(-1)
    best = None
    for combo in itertools.combinations_with_replacement(range(len(seconds)), layers):
        if required is not None and not set(combo) & set(required):
            continue
        if (sum(sizes[c] for c in combo) <= capacity).all():
            value = sum(seconds[c] for c in combo)
            best = value if best is None else min(best, value)
    return best


def random_instance(rng):
    """A few configurations, some of them near twins (a few bytes apart, a little faster for the extra bytes),
    and a capacity somewhere between the smallest and the largest fill."""
    count = int(rng.integers(2, 7))
    sizes = [int(v) for v in rng.integers(0, 1000, count)]
    seconds = [float(v) for v in rng.uniform(0.1, 2.0, count)]
    for _ in range(int(rng.integers(0, 3))):
        k = int(rng.integers(0, len(sizes)))
        sizes.append(sizes[k] + int(rng.integers(1, 5)))
        seconds.append(seconds[k] - float(rng.uniform(0.0, 0.02)))
    layers = int(rng.integers(1, 7))
    capacity = int(rng.uniform(min(sizes), max(sizes) + 1) * layers)
    return np.array(sizes, dtype=np.int64), np.array(seconds), layers, capacity


def check_knapsack(sizes, seconds, layers, capacity, required=None):
    expected = enumerate_best(sizes, seconds, layers, capacity, required)
    value, counts = ilp_knapsack.knapsack(sizes, seconds, layers, capacity, required=required)
    if expected is None:
        assert counts is None and value == np.inf
        return
    matrix = np.asarray(sizes).reshape(len(seconds), -1)
    assert value == pytest.approx(expected, rel=1e-12)
    assert counts.sum() == layers and (counts >= 0).all()
    assert (counts @ matrix <= np.asarray(capacity).reshape(-1)).all()
    assert float(counts @ seconds) == pytest.approx(value, rel=1e-12)
    if required is not None:
        assert counts[list(required)].sum() >= 1
    # a cutoff at the optimum leaves nothing to find; one above it finds the optimum again
    assert ilp_knapsack.knapsack(sizes, seconds, layers, capacity, cutoff=expected, required=required)[1] is None
    again, _ = ilp_knapsack.knapsack(sizes, seconds, layers, capacity, cutoff=expected * 1.01 + 1e-6,
                                     required=required)
    assert again == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("seed", range(60))
def test_knapsack_equals_enumeration(seed):
    check_knapsack(*random_instance(np.random.default_rng(seed)))


@pytest.mark.parametrize("seed", range(60, 90))
def test_knapsack_with_a_required_column_equals_enumeration(seed):
    """A level's plans must use a configuration streaming the level (Eq. 12'): at least one required column."""
    rng = np.random.default_rng(seed)
    sizes, seconds, layers, capacity = random_instance(rng)
    required = sorted({int(c) for c in rng.integers(0, len(sizes), int(rng.integers(1, 3)))})
    check_knapsack(sizes, seconds, layers, capacity, required)


@pytest.mark.parametrize("seed", range(90, 120))
def test_knapsack_with_two_capacities_equals_enumeration(seed):
    """HBM and DDR (or CXL) both bind: the multi-capacity enumeration and its LP (passes/ilp_lp.py)."""
    rng = np.random.default_rng(seed)
    sizes, seconds, layers, capacity = random_instance(rng)
    other = rng.integers(0, 1000, len(sizes))
    matrix = np.column_stack([sizes, other]).astype(np.int64)
    second = int(rng.uniform(other.min(), other.max() + 1) * layers)
    required = [int(rng.integers(0, len(sizes)))] if seed % 3 == 0 else None
    check_knapsack(matrix, seconds, layers, np.array([capacity, second]), required)


@pytest.mark.parametrize("seed", range(120, 160))
def test_knapsack_with_a_floor_equals_enumeration(seed):
    """Without CXL a DDR capacity is a floor on the HBM bytes: settled by the group relaxation or declined (None),
    never wrong."""
    rng = np.random.default_rng(seed)
    sizes, seconds, layers, capacity = random_instance(rng)
    floor = int(capacity * rng.uniform(0.6, 1.0))
    total = max(sizes) + 1
    expected = enumerate_best(np.column_stack([sizes, total - sizes]), seconds, layers,
                              np.array([capacity, layers * total - floor]))
    value, counts = ilp_knapsack.knapsack(sizes, seconds, layers, capacity, floor=floor)
    if value is None:
        return  # declined: the caller enumerates both tiers
    if expected is None:
        assert counts is None
        return
    assert value == pytest.approx(expected, rel=1e-12)
    assert floor <= int(counts @ sizes) <= capacity and counts.sum() == layers



@pytest.mark.parametrize("seed", range(4))
def test_frontier_of_states_holding_equal_bytes_per_layer_count(seed, monkeypatch):
    """When every configuration holds its layer's bytes in some tracked tier, states with as many layers hold the
    same bytes in all: `_frontier` then keeps one state per byte vector (the fastest, the first of equals), the
    states the pairwise Pareto comparison keeps (forced here by one state that breaks the equal sums)."""
    rng = np.random.default_rng(seed)
    sizes = rng.multinomial(12, np.ones(3) / 3, size=8) * 1000  # [K, 3]: each configuration holds 12000 bytes
    seconds = rng.choice(rng.random(4), 8)
    layers = rng.integers(0, 7, 600)
    counts = np.array([rng.multinomial(n, np.ones(8) / 8) for n in layers])
    used_b, used_s = counts @ sizes, counts @ seconds
    fast = ilp_knapsack._frontier(layers, used_b, used_s)
    broken = used_b.copy()
    broken[np.argmax(layers == layers.max())] += 1  # its layer count no longer holds equal sums: Pareto for all
    with_one = ilp_knapsack._frontier(layers, broken, used_s)
    same = layers != layers.max()
    kept_fast = set(fast[same[fast]].tolist())
    kept_pareto = set(with_one[same[with_one]].tolist())
    assert len(kept_fast) < same.sum() and kept_fast == kept_pareto

@pytest.mark.parametrize("seed", range(6))
def test_pareto_of_three_columns_is_the_brute_force_front(seed):
    """`pareto` on three columns (the enumeration's states over two tracked tiers: the staircase path) keeps
    exactly the rows no other row dominates, the first of identical rows: against an O(n²) comparison of every
    pair, on small integer grids full of ties and on anti-correlated columns (large fronts), whatever the chunk."""
    rng = np.random.default_rng(seed)
    for _ in range(40):
        n, high = int(rng.integers(0, 300)), int(rng.integers(1, 12))
        points = rng.integers(0, high, size=(n, 3)).astype(np.float64)
        if seed % 2:
            points[:, 2] = high - points[:, 1] + rng.integers(0, 2, size=n)
        le = np.all(points[None, :, :] <= points[:, None, :], axis=2)  # [i, j]: row j ≤ row i everywhere
        equal = np.all(points[None, :, :] == points[:, None, :], axis=2)
        earlier = np.arange(n)[None, :] < np.arange(n)[:, None]
        beaten = (le & ~equal).any(axis=1) | (equal & earlier).any(axis=1)
        expected = np.flatnonzero(~beaten)
        for chunk in (256, 32, 5):
            assert np.array_equal(ilp_knapsack.pareto(points, chunk), expected)


def test_group_relaxation_settles_a_hard_instance():
    """Near-twin configurations (a few bytes apart) and many layers: the group relaxation (Gomory) settles it
    with few labels where the state enumeration alone exceeds a small cap."""
    rng = np.random.default_rng(3)
    base = rng.integers(100, 1000, 6)
    sizes = np.concatenate([base, base + 3]).astype(np.int64)
    seconds = np.concatenate([rng.uniform(0.5, 1.5, 6), np.zeros(6)])
    seconds[6:] = seconds[:6] - 0.001
    layers, capacity = 60, int(np.sort(base)[3] * 60)
    value, counts = ilp_knapsack.knapsack(sizes, seconds, layers, capacity, max_states=50)
    assert counts is not None and counts.sum() == layers and int(counts @ sizes) <= capacity
    search = ilp_knapsack._Search(sizes[:, None], seconds, layers, np.array([capacity]), np.zeros(1),
                                  float(seconds.min()), [], 50)
    with pytest.raises(ilp_knapsack.TooLarge):  # the plain enumeration, same cap
        search.run([int(c) for c in np.argsort(seconds)], seconds - seconds.min(), np.inf)


def test_knapsack_gives_up_by_state_count():
    """Two capacities (no group relaxation) and many near-twins: a small state cap raises (the level then goes to
    the ILP solver); without the cap the same instance is solved to a plan that fits."""
    rng = np.random.default_rng(0)
    base = rng.integers(100, 1000, 6)
    sizes = np.concatenate([base, base + 3]).astype(np.int64)
    other = np.concatenate([base[::-1], base[::-1] + 2]).astype(np.int64)
    seconds = np.concatenate([rng.uniform(0.5, 1.5, 6), np.zeros(6)])
    seconds[6:] = seconds[:6] - 0.001
    layers = 40
    capacity = np.array([int(np.sort(base)[3] * layers)] * 2)
    matrix = np.column_stack([sizes, other])
    with pytest.raises(ilp_knapsack.TooLarge):
        ilp_knapsack.knapsack(matrix, seconds, layers, capacity, max_states=50)
    value, counts = ilp_knapsack.knapsack(matrix, seconds, layers, capacity)
    assert counts.sum() == layers and (counts @ matrix <= capacity).all()
    assert float(counts @ seconds) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("model, profile, batch, gpu_gib", [
    ("opt-66b", "spr-h100", 1, None), ("opt-66b", "spr-h100", 16, None), ("opt-30b", "h200-amx16", 4, 24),
    ("opt-30b", "gnr-h100", 64, 30), ("llama-3.1-70b", "spr-a100", 8, None),
])
def test_compiles_with_the_knapsack_equal_the_ilp_solver(monkeypatch, model, profile, batch, gpu_gib):
    """The same compile with levels closed by the knapsack and with every level left to HiGHS: the same
    objective, and the knapsack did close levels."""
    hw = resolve_profile(profile)
    budgets = TierBudgets(hw.gpu_budget_bytes if gpu_gib is None else gpu_gib * GIB, hw.cpu_budget_bytes, 0)
    costs = annotate_costs(hand_graph(ZOO[model]), hw, Workload(batch, 128, 32), budgets)
    closed = []
    solve_level = ilp_knapsack.solve_level

    def spy(*args, **kwargs):
        out = solve_level(*args, **kwargs)
        closed.append(out)
        return out

    monkeypatch.setattr(ilp_master, "solve_level", spy)
    with_knapsack, report = solve_placement(costs, SolverOptions(solver="highs"))
    assert closed and report.status == "optimal" and report.gap == 0.0

    def refuse(*args, **kwargs):
        raise ilp_knapsack.TooLarge()

    monkeypatch.setattr(ilp_master, "solve_level", refuse)
    with_solver, solver_report = solve_placement(costs, SolverOptions(solver="highs"))
    assert solver_report.status == "optimal"
    assert report.objective_seconds == pytest.approx(solver_report.objective_seconds, rel=1e-9)
    for tier in ("hbm", "ddr"):
        assert with_knapsack.tier_used_bytes(tier, budgets.prefetch_depth) <= getattr(budgets, f"{tier}_bytes")
