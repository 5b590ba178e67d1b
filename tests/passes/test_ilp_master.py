"""Master problem by staging levels: equals the single staircase ILP (Eq. 12) it replaces; its bounds are bounds.

Both formulations are solved over the same configurations (passes/ilp.py's columns): the staircase ILP sizes the
staging buffer with binaries in one problem, the level search fixes it per interval of levels (Eq. 12') and prunes
them with Lagrangian bounds, LP relaxations and integer relaxations. Their optima must agree, no bound may exceed
the optimum of the plans it covers, and the search's certificate must bound the optimum.
"""

from __future__ import annotations

import numpy as np
import pulp
import pytest
from hand_graphs import hand_graph
from test_ilp import TINY, synthetic

from liac.errors import InfeasibleError
from liac.models import ZOO
from liac.passes import ilp_master
from liac.passes.costs import TierBudgets, Workload, annotate_costs
from liac.passes.ilp import SolverOptions, layer_configs
from liac.passes.ilp_check import certified_bound
from liac.profile import resolve_profile
from liac.sizes import GIB


def _configs(costs):
    return {cls.layer_class: layer_configs(costs, cls) for cls in costs.classes}


def _staircase(costs, configs, largest=None):
    """The single ILP with the staging staircase (Eq. 12), or None when infeasible. With `largest` (bytes), only
    plans whose largest stream is exactly that: configurations streaming more are not offered and at least one
    layer streams that much."""
    problem, count, _ = ilp_master._build(costs, configs)
    if largest is not None:
        for (name, index), var in count.items():
            if configs[name][index].staging_bytes > largest:
                problem += var == 0
        problem += pulp.lpSum(var for (name, index), var in count.items()
                              if configs[name][index].staging_bytes == largest) >= 1
    _, solver = ilp_master.make_solver(SolverOptions())
    return float(pulp.value(problem.objective)) if ilp_master._solve(problem, solver) else None


def _instances():
    yield "synthetic-21", synthetic(21, layers=2, decoder_ops=("weights", "kv", "weights"), cxl=False, split=(500,))
    yield "synthetic-27", synthetic(27, layers=2, decoder_ops=("weights", "kv"), cxl=True, split=(250, 750))
    hw = resolve_profile("h200-amx16")
    graph = hand_graph(TINY, layers=2)
    weights = sum(s.weight_bytes for s in graph.sublayers())
    yield "tiny-h200", annotate_costs(graph, hw, Workload(4, 16, 3), TierBudgets(int(0.4 * weights), 2**34, 0))
    hw = resolve_profile("spr-h100")
    # OPT-66B's shapes, 8 layers, a third of them fitting HBM; a coarse split grid keeps the staircase ILP small
    yield "opt-66b", annotate_costs(hand_graph(ZOO["opt-66b"], layers=8), hw, Workload(8, 128, 8),
                                    TierBudgets(12 * GIB, hw.cpu_budget_bytes, 0), split_permille=(250, 500, 750))


@pytest.mark.parametrize("name, costs", list(_instances()), ids=[n for n, _ in _instances()])
def test_level_search_equals_the_staircase_ilp(name, costs):
    configs = _configs(costs)
    expected = _staircase(costs, configs)
    if expected is None:
        with pytest.raises(InfeasibleError):
            ilp_master.solve_master(costs, configs, SolverOptions())
        return
    solution = ilp_master.solve_master(costs, configs, SolverOptions())
    got = sum(configs[cls][index].seconds * n for (cls, index), n in solution.counts.items())
    assert got == pytest.approx(expected, rel=1e-9)
    # the certificate proves it: every level's bound is at least the optimum (to the 1e-9 tolerance)
    assert certified_bound(costs, configs, solution.certificate) >= got * (1 - 1e-9)


def test_interval_bounds_never_exceed_the_plans_they_cover():
    """Lagrangian bounds of single levels and of intervals, under multipliers from LP relaxations, against the
    exact optimum of the plans whose largest stream is each level (the staircase ILP restricted to it)."""
    costs = dict(_instances())["opt-66b"]
    configs = _configs(costs)
    columns = ilp_master._columns(costs, configs)
    levels = np.array(ilp_master._staging_levels(configs), dtype=np.int64)
    tiers = ilp_master._tiers_that_can_bind(costs, configs)
    bounds = ilp_master._Bounds(costs, columns, levels)
    rng = np.random.default_rng(0)
    for first, last in ((0, levels.size - 1), (levels.size // 3, levels.size - 1), (2, 2)):
        multipliers = ilp_master._level_lp(ilp_master._level_problem(costs, first, last, levels, tiers), columns)
        if multipliers is not None:
            bounds.add(multipliers)
    assert bounds.multipliers.shape[0] > 2
    optimum = {}
    for j in sorted(rng.choice(levels.size, size=min(8, levels.size), replace=False)):
        value = _staircase(costs, configs, int(levels[j]))
        optimum[j] = np.inf if value is None else value
    assert sum(np.isfinite(v) for v in optimum.values()) >= 3
    for j, value in optimum.items():
        assert bounds.bound(j, j) <= value * (1 + 1e-9)
        for first in range(0, j + 1, max(1, j // 3)):  # an interval containing level j bounds it too
            assert bounds.bound(first, levels.size - 1) <= value * (1 + 1e-9)


@pytest.mark.parametrize("name, costs", list(_instances()), ids=[n for n, _ in _instances()])
def test_a_cutoff_prunes_without_changing_the_optimum(name, costs):
    """A cutoff (another micro-batch's best plan) just above the optimum leaves the optimum to find; one at the
    optimum leaves nothing that beats it, and the certificate then still proves the bound."""
    configs = _configs(costs)
    expected = _staircase(costs, configs)
    if expected is None:
        return
    above = ilp_master.solve_master(costs, configs, SolverOptions(), cutoff=expected * (1 + 1e-6))
    got = sum(configs[cls][index].seconds * n for (cls, index), n in above.counts.items())
    assert got == pytest.approx(expected, rel=1e-9)
    at = ilp_master.solve_master(costs, configs, SolverOptions(), cutoff=expected)
    assert at.counts is None
    assert certified_bound(costs, configs, at.certificate) >= expected * (1 - 2e-9)
    assert certified_bound(costs, configs, at.certificate) <= expected * (1 + 1e-9)


def test_a_node_limited_stop_above_the_cutoff_does_not_close_the_level(monkeypatch):
    """HiGHS stopped by its node limit reports the incumbent it has, even one worse than the cutoff: that proves
    nothing about the plans below the cutoff, so the level stays open with the solver's bound (it once closed
    levels that held a better plan: llama-3.1-405b spr-h100-cxl batch 1, 'optimal' at 150.7757 s where
    150.7642 s fits). Here the solve finds the level's optimum, then reports it as a node-limited incumbent one
    second worse; the answer must be 'not settled', with the solver's bound (at most the optimum)."""
    costs = dict(_instances())["opt-66b"]
    configs = _configs(costs)
    columns = ilp_master._columns(costs, configs)
    levels = np.array(ilp_master._staging_levels(configs), dtype=np.int64)
    tiers = ilp_master._tiers_that_can_bind(costs, configs)
    level = ilp_master._level_problem(costs, levels.size - 1, levels.size - 1, levels, tiers)
    real = ilp_master._solve
    solved = []

    def node_limited(problem, solver):
        assert real(problem, solver)
        solved.append(pulp.value(problem.objective))
        problem.objective += 1.0  # the incumbent it reports: a second worse than the optimum it bounds
        problem.sol_status = pulp.LpSolutionIntegerFeasible
        return True

    monkeypatch.setattr(ilp_master, "_solve", node_limited)
    options = SolverOptions(solver="highs")
    found, bound, settled = ilp_master._solve_level_ilp(costs, configs, columns, level, options, np.inf, 10)
    optimum = solved[0]
    found, bound, settled = ilp_master._solve_level_ilp(costs, configs, columns, level, options, optimum + 0.5, 10)
    assert not settled and not found.counts
    assert bound <= optimum * (1 + 1e-9)  # what the solver proved: a lower bound, not the cutoff
    # a bound no lower than the cutoff does close it
    found, bound, settled = ilp_master._solve_level_ilp(costs, configs, columns, level, options, optimum, 10)
    assert settled and not found.counts


@pytest.mark.parametrize("name, costs", list(_instances()), ids=[n for n, _ in _instances()])
def test_unit_counts_leave_the_optimum_as_it_is(name, costs, monkeypatch):
    """The level ILPs with the unit counts of `_aggregate` (offered when every tier is nearly full) find the
    staircase ILP's optimum, and add one integer per (unit or KV cache, tier) the offered configurations use."""
    configs = _configs(costs)
    expected = _staircase(costs, configs)
    monkeypatch.setattr(ilp_master, "_tight", lambda costs: True)
    problem, _, _ = ilp_master._build(costs, configs)
    units = [v for v in problem.variables() if v.name.startswith("y[") or v.name.startswith("y_")]
    decoder = configs["decoder"]
    pairs = {(u, t) for c in decoder for u, t in enumerate(c.weights) if t != "none"}
    pairs |= {("kv", c.kv_cache) for c in decoder if c.kv_cache != "none"}
    assert len(units) == len(pairs) and all(v.cat == pulp.LpInteger for v in units)
    if expected is None:
        with pytest.raises(InfeasibleError):
            ilp_master.solve_master(costs, configs, SolverOptions())
        return
    solution = ilp_master.solve_master(costs, configs, SolverOptions(), diagnose=False)
    got = sum(configs[cls][index].seconds * n for (cls, index), n in solution.counts.items())
    assert got == pytest.approx(expected, rel=1e-9)
