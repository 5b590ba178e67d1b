"""The master problem's small LP (passes/ilp_lp.py): equals PuLP's solver on random instances, and its duals are
optimal (the Lagrangian bound they give equals the LP optimum: strong duality)."""

from __future__ import annotations

import warnings

import numpy as np
import pulp
import pytest

from liac.passes.ilp_lp import solve_lp


def _reference(cost, groups, counts, rows, capacity):
    problem = pulp.LpProblem("lp", pulp.LpMinimize)
    x = [problem.add_variable(f"x{i}", lowBound=0) for i in range(cost.size)]
    problem += pulp.lpSum(cost[i] * x[i] for i in range(cost.size))
    for k, count in enumerate(counts):
        problem += pulp.lpSum(x[i] for i in range(cost.size) if groups[i] == k) == count
    for k in range(rows.shape[0]):
        problem += pulp.lpSum(rows[k, i] * x[i] for i in range(cost.size)) <= capacity[k]
    with warnings.catch_warnings():  # pulp 3.3 warns that 4.0 unbundles CBC
        warnings.simplefilter("ignore", DeprecationWarning)
        problem.solve(pulp.PULP_CBC_CMD(msg=False))
    return pulp.value(problem.objective) if problem.status == pulp.LpStatusOptimal else None


@pytest.mark.parametrize("seed", range(40))
def test_lp_equals_cbc_and_its_duals_are_optimal(seed):
    rng = np.random.default_rng(seed)
    n, m, e = int(rng.integers(1, 40)), int(rng.integers(0, 4)), int(rng.integers(1, 3))
    cost = rng.uniform(0.1, 5, n).round(int(rng.integers(1, 4)))
    groups = rng.integers(0, e, n)
    equal = np.zeros((e, n))
    equal[groups, np.arange(n)] = 1
    counts = rng.integers(1, 10, e).astype(float)
    rows = rng.integers(0, 5, (m, n)).astype(float)
    capacity = (rng.uniform(0.2, 1.0, m) * rows.max(axis=1, initial=0) * counts.sum()).round(0)
    expected = _reference(cost, groups, counts, rows, capacity)
    result = solve_lp(cost, equal, counts, rows, capacity)
    if expected is None:
        assert result is None
        return
    assert result.value == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert (result.x >= 0).all() and np.allclose(equal @ result.x, counts) and (rows @ result.x <= capacity + 1e-9).all()
    priced = cost + result.capacity_duals @ rows
    lagrangian = sum(counts[k] * priced[groups == k].min() for k in range(e)) - result.capacity_duals @ capacity
    assert lagrangian == pytest.approx(expected, rel=1e-9, abs=1e-9)
