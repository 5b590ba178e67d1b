"""Master problem by staging levels: equals the single staircase ILP (Eq. 12) it replaces; its bounds are bounds.

Both formulations are solved over the same configurations (passes/ilp.py's columns): the staircase ILP sizes the
staging buffer with binaries in one problem, the level search fixes it per level (Eq. 12') and prunes levels with
Lagrangian and LP bounds. Their optima must agree, and no bound may exceed the optimum of a level it covers.
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
from liac.profile import resolve_profile
from liac.sizes import GIB


def _configs(costs):
    return {cls.layer_class: layer_configs(costs, cls) for cls in costs.classes}


def _staircase(costs, configs):
    """The single ILP with the staging staircase (Eq. 12), or None when infeasible."""
    problem, _, _ = ilp_master._build(costs, configs)
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
    yield "opt-66b", annotate_costs(hand_graph(ZOO["opt-66b"]), hw, Workload(8, 128, 8),
                                    TierBudgets(48 * GIB, hw.cpu_budget_bytes, 0))


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
    assert solution.proven and solution.gap == 0.0
    assert got == pytest.approx(expected, rel=1e-9)


def test_lagrangian_and_interval_bounds_never_exceed_a_level_optimum():
    costs = dict(_instances())["opt-66b"]
    configs = _configs(costs)
    levels = ilp_master._staging_levels(configs)
    bounds = ilp_master._LevelBounds(costs, configs, levels)
    _, solver = ilp_master.make_solver(SolverOptions())
    until = ilp_master._useful_until(configs["decoder"])
    rng = np.random.default_rng(0)
    optimum = {}
    for j in sorted(rng.choice(len(levels), size=min(8, len(levels)), replace=False)):
        useful = ilp_master._useful_at(configs["decoder"], until, levels[j])
        relaxed, _, _ = ilp_master._build(costs, configs, staging_level=(levels[j], levels[j]), relax=True,
                                          useful=useful)
        if ilp_master._solve(relaxed, solver):
            bounds.add(ilp_master._multipliers(relaxed))  # multipliers from this LP bound every level
        exact, _, _ = ilp_master._build(costs, configs, staging_level=(levels[j], levels[j]), useful=useful)
        if ilp_master._solve(exact, solver):
            optimum[j] = float(pulp.value(exact.objective))
    assert len(optimum) >= 3 and bounds.multipliers.shape[0] > 1
    for j, value in optimum.items():
        assert bounds.bound(j, j) <= value * (1 + 1e-9)
        for first in range(0, j + 1, max(1, j // 3)):  # an interval containing level j bounds it too
            assert bounds.bound(first, len(levels) - 1) <= value * (1 + 1e-9)
