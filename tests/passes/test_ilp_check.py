"""The solution check (passes/ilp_check.py): it re-prices what the master problem chose, checks the budgets in
exact bytes, and turns the search's certificate into the gap the plan reports; a wrong answer does not pass."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from referee import referee_optimum
from test_ilp import brute_force, synthetic, tiny_costs

from liac.passes import ilp_knapsack, ilp_master
from liac.passes.ilp import SolverOptions, layer_configs, solve_placement
from liac.passes.ilp_check import SolutionCheckError, certified_bound, check_solution


def _solve(costs, options=SolverOptions()):
    configs = {cls.layer_class: layer_configs(costs, cls) for cls in costs.classes}
    solution = ilp_master.solve_master(costs, configs, options)
    assignment, report = solve_placement(costs, options)
    return configs, solution, assignment, report


def test_a_proven_plan_checks_out_with_gap_zero():
    costs = tiny_costs(2, "spr-h100", 8, 0.3, split=(250, 500, 750))
    configs, solution, assignment, report = _solve(costs)
    assert report.status == "optimal" and report.gap == 0.0
    assert check_solution(costs, assignment, solution.certificate, configs) == 0.0
    # the certificate's bound is a bound: never above the referee's optimum
    assert certified_bound(costs, configs, solution.certificate) <= referee_optimum(costs) * (1 + 1e-9)


def test_a_misreported_price_or_budget_is_caught():
    costs = tiny_costs(2, "h200-amx16", 64, 0.3, split=(500,))
    configs, solution, assignment, _ = _solve(costs)
    name, config, count = assignment.choices[1]
    cheaper = dataclasses.replace(config, decode_seconds=config.decode_seconds * 0.9)
    tampered = dataclasses.replace(assignment, choices=(assignment.choices[0], (name, cheaper, count),
                                                        *assignment.choices[2:]))
    with pytest.raises(SolutionCheckError, match="re-priced"):
        check_solution(costs, tampered, solution.certificate, configs)
    squeezed = dataclasses.replace(costs, budgets=dataclasses.replace(
        costs.budgets, hbm_bytes=assignment.tier_used_bytes("hbm", costs.budgets.prefetch_depth) - 1))
    with pytest.raises(SolutionCheckError, match="bytes of hbm"):
        check_solution(squeezed, assignment, solution.certificate, configs)


def test_an_open_level_is_reported_as_a_gap():
    """A level the certificate leaves with a bound below the plan: the gap is what that bound allows."""
    costs = synthetic(21, layers=2, decoder_ops=("weights", "kv", "weights"), cxl=False, split=(500,))
    configs, solution, assignment, report = _solve(costs)
    solved = solution.certificate.solved.copy()
    solved[0] = report.objective_seconds * 0.97
    weak = dataclasses.replace(solution.certificate, solved=solved)
    gap = check_solution(costs, assignment, weak, configs)
    assert gap == pytest.approx(0.03, rel=1e-6)


def test_work_limits_report_an_honest_gap(monkeypatch):
    """No enumeration and a one-node ILP solver: the plan is still a plan, its status 'feasible' unless every level
    was closed anyway, and the gap it reports bounds its distance from the brute-force optimum."""
    costs = synthetic(25, layers=2, decoder_ops=("weights", "kv", "weights"), cxl=False, split=(500,))
    expected = brute_force(costs)

    def refuse(*args, **kwargs):
        raise ilp_knapsack.TooLarge()

    monkeypatch.setattr(ilp_master, "solve_level", refuse)
    assignment, report = solve_placement(costs, SolverOptions(node_limit=1))
    assert report.status in ("optimal", "feasible")
    assert (report.status == "optimal") == (report.gap == 0.0)
    assert report.objective_seconds >= expected * (1 - 1e-9)
    assert report.objective_seconds * (1 - report.gap) <= expected * (1 + 1e-9)
    for tier in ("hbm", "ddr", "cxl"):
        assert assignment.tier_used_bytes(tier, costs.budgets.prefetch_depth) <= getattr(costs.budgets,
                                                                                           f"{tier}_bytes")


def test_results_do_not_depend_on_the_clock(monkeypatch):
    """Work limits are counts: the same compile with a clock that runs a thousand times faster gives the same
    plan (a time limit would cut it short)."""
    import time as time_module

    costs = tiny_costs(2, "gnr-h100", 64, 0.3, split=(250, 500, 750))
    first, report = solve_placement(costs)
    real = time_module.perf_counter
    monkeypatch.setattr(time_module, "perf_counter", lambda: real() * 1000.0)
    monkeypatch.setattr(time_module, "time", lambda: real() * 1000.0)
    second, again = solve_placement(costs)
    assert first == second and report.objective_seconds == again.objective_seconds


def test_a_level_no_class_can_reach_bounds_nothing_and_poisons_nothing():
    """A staging level below every decoder configuration's stream (the ends reach it, the decoder does not) holds
    no plan: its bound is +inf. It must not become nan (inf − inf in the extra of a class with no configuration
    there), which would make the least bound over the levels nan and the check fall back to the solved levels
    alone, ignoring every open one: a plan reported optimal with a bound it never proved."""
    costs = tiny_costs(2, "spr-h100", 8, 0.3, split=(250, 500, 750))
    configs = {cls.layer_class: layer_configs(costs, cls) for cls in costs.classes}
    floor = min(c.staging_bytes for c in configs["decoder"] if c.staging_bytes > 0)
    configs["decoder"] = [c for c in configs["decoder"] if c.staging_bytes >= floor]
    levels = np.array(sorted({c.staging_bytes for options in configs.values() for c in options}), dtype=np.int64)
    assert levels[0] < floor  # an end reaches a level the decoder cannot
    multipliers = np.array([[0.0, 0.0, 0.0], [0.01, 0.002, 0.0]])
    open_everywhere = ilp_master.Certificate(levels, np.full(levels.size, np.nan), multipliers)
    with np.errstate(invalid="raise"):  # no nan on the way
        got = certified_bound(costs, configs, open_everywhere)
    # the same bound with plain loops: per level and λ, Σ count·min(t + λ·m) over configurations streaming at
    # most the level, plus the least extra of one layer streaming exactly the level, less λ·capacity
    budgets = costs.budgets
    host = max(cls.host_workspace_bytes for cls in costs.classes)
    gib = float(2**30)
    expected = np.inf
    for level in levels.tolist():
        capacity = np.array([budgets.hbm_bytes - (budgets.prefetch_depth + 1) * level, budgets.ddr_bytes - host,
                             budgets.cxl_bytes], dtype=np.float64)
        capacity = (capacity + costs.tied_weight_bytes) / gib
        best = -np.inf
        for lam in multipliers:
            total, extra = -float(capacity @ lam), np.inf
            for cls in costs.classes:
                def price(c):
                    return c.seconds + sum(c.tier_bytes(t) / gib * w for t, w in zip(("hbm", "ddr", "cxl"), lam))
                upto = [price(c) for c in configs[cls.layer_class] if c.staging_bytes <= level]
                exact = [price(c) for c in configs[cls.layer_class] if c.staging_bytes == level]
                if not upto:
                    total = np.inf
                    continue
                total += cls.count * min(upto)
                if exact:
                    extra = min(extra, min(exact) - min(upto))
            best = max(best, total + extra)
        expected = min(expected, best)
    assert np.isfinite(expected) and got == pytest.approx(expected, rel=1e-12)
    # and a solved level above that bound does not hide it
    solved = np.full(levels.size, np.nan)
    solved[-1] = expected * 2
    assert certified_bound(costs, configs, ilp_master.Certificate(levels, solved, multipliers)) == \
        pytest.approx(expected, rel=1e-12)
