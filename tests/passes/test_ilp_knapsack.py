"""The exact level knapsack (passes/ilp_knapsack.py): equals enumeration of every multiset of configurations, and
equals the ILP solver on whole compiles; it gives up by a state count, not by time."""

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


def enumerate_best(sizes, seconds, layers, capacity):
    """min Σ seconds over every multiset of `layers` configurations whose sizes fit, or None."""
    best = None
    for combo in itertools.combinations_with_replacement(range(len(sizes)), layers):
        if sum(sizes[c] for c in combo) <= capacity:
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


@pytest.mark.parametrize("seed", range(60))
def test_knapsack_equals_enumeration(seed):
    sizes, seconds, layers, capacity = random_instance(np.random.default_rng(seed))
    expected = enumerate_best(sizes, seconds, layers, capacity)
    value, counts = ilp_knapsack.knapsack(sizes, seconds, layers, capacity)
    if expected is None:
        assert counts is None and value == np.inf
        return
    assert value == pytest.approx(expected, rel=1e-12)
    assert counts.sum() == layers and (counts >= 0).all()
    assert int(counts @ sizes) <= capacity
    assert float(counts @ seconds) == pytest.approx(value, rel=1e-12)
    # a cutoff at the optimum leaves nothing to find; one above it finds the optimum again
    assert ilp_knapsack.knapsack(sizes, seconds, layers, capacity, cutoff=expected)[1] is None
    again, _ = ilp_knapsack.knapsack(sizes, seconds, layers, capacity, cutoff=expected * 1.01 + 1e-6)
    assert again == pytest.approx(expected, rel=1e-12)


def test_knapsack_gives_up_by_state_count():
    """Many near-twins and many layers: a small state cap raises (the level then goes to the ILP solver); without
    the cap the same instance is solved to a plan that fits."""
    rng = np.random.default_rng(7)
    base = rng.integers(100, 1000, 5)
    sizes = np.concatenate([base, base + 3]).astype(np.int64)
    seconds = np.concatenate([rng.uniform(0.5, 1.5, 5), np.zeros(5)])
    seconds[5:] = seconds[:5] - 0.001
    layers, capacity = 40, int(np.sort(base)[2] * 40)
    with pytest.raises(ilp_knapsack._TooLarge):
        ilp_knapsack.knapsack(sizes, seconds, layers, capacity, max_states=50)
    value, counts = ilp_knapsack.knapsack(sizes, seconds, layers, capacity)
    assert counts.sum() == layers and int(counts @ sizes) <= capacity
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
        closed.append(out is not None)
        return out

    monkeypatch.setattr(ilp_master, "solve_level", spy)
    with_knapsack, report = solve_placement(costs, SolverOptions(solver="highs"))
    assert any(closed) and report.status == "optimal" and report.gap == 0.0
    monkeypatch.setattr(ilp_master, "applies", lambda *args: False)
    closed.clear()
    with_solver, solver_report = solve_placement(costs, SolverOptions(solver="highs"))
    assert not closed and solver_report.status == "optimal"
    assert report.objective_seconds == pytest.approx(solver_report.objective_seconds, rel=1e-9)
    for tier in ("hbm", "ddr"):
        assert with_knapsack.tier_used_bytes(tier, budgets.prefetch_depth) <= getattr(budgets, f"{tier}_bytes")
