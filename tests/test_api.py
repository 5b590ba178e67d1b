"""liac.api: compiling a sweep keeps the feasible points and lists the rest; the CostGraph a compile priced with is
the one a plan's spec rebuilds."""

from __future__ import annotations

import pytest
import yaml

from liac.api import compile_plans, write_plans
from liac.errors import LiacError
from liac.passes.price import plan_costs


def test_sweep_keeps_feasible_points_and_lists_the_rest(tiny, tmp_path):
    model = tiny("tiny-llama")
    # KV grows with the batch: 1 fits in 4 MiB of DDR, 64 does not (nor in all tiers together)
    result = compile_plans(model, "spr-h100", batches=(1, 64), prompt_len=64, gen_len=8, gpu_mem=0,
                           cpu_mem=4 * 2**20)
    assert [p.plan.spec.workload.batch_size for p in result.points] == [1]
    assert [b for b, _ in result.infeasible] == [64]
    write_plans(result, tmp_path / "sweep")
    index = yaml.safe_load((tmp_path / "sweep" / "index.yaml").read_text())
    assert index["infeasible"][0]["batch_size"] == 64 and "mem_total" in index["infeasible"][0]["reason"]
    with pytest.raises(LiacError, match="names one file"):
        write_plans(result, tmp_path / "one.yaml")


def test_a_plan_rebuilds_the_cost_graph_it_was_compiled_from(tiny):
    """plan_costs rebuilds the CostGraph from spec alone, number for number."""
    result = compile_plans(tiny("tiny-opt"), "spr-h100", batches=(4,), prompt_len=32, gen_len=8, gpu_mem=2**21)
    point = result.points[0]
    assert plan_costs(point.plan).to_json() == point.costs.to_json()
