"""Plan emission: valid against the committed JSON Schema and `liac validate`'s independent checks, contiguous groups,
predictions equal to the solver's objective, byte-identical output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hand_graphs import hand_graph

from liac.artifacts.validate import plan_problems
from liac.models.config import ModelConfig

jsonschema = pytest.importorskip("jsonschema")  # in the test extra; absent on the GPU machine
from liac.passes.costs import TierBudgets, Workload, annotate_costs
from liac.passes.emit import emit_plan, plan_name
from liac.passes.ilp import SolverOptions, solve_placement
from liac.plan import parse_plan, plan_to_yaml
from liac.profile import resolve_profile
from liac.schema_tools import to_data

TINY = ModelConfig(name="tiny-opt", family="opt", hidden_size=256, num_layers=6, num_heads=4, num_kv_heads=4,
                   head_dim=64, ffn_dim=1024, vocab_size=512, max_position=256, norm="layernorm", norm_eps=1e-5,
                   activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)
SCHEMA = json.loads((Path(__file__).parents[2] / "liac" / "schema" / "offload-plan-v4.schema.json").read_text())


def compile_tiny(batch=4, hbm_fraction=0.4, policy=None, profile="spr-h100"):
    hw = resolve_profile(profile)
    graph = hand_graph(TINY)
    weights = sum(s.weight_bytes * graph.graph["layer_counts"][s.layer_class] for s in graph.sublayers())
    budgets = TierBudgets(int(hbm_fraction * weights), 64 * weights, 0)
    costs = annotate_costs(graph, hw, Workload(batch, 32, 8), budgets)
    assignment, report = solve_placement(costs, SolverOptions(policy=policy))
    return emit_plan(costs, assignment, report, TINY, "latency"), assignment, report


@pytest.mark.parametrize("batch, hbm_fraction, policy", [(1, 0.4, None), (16, 0.25, None), (4, 0.5, "lia-cpu"),
                                                         (64, 0.0, None), (2, 3.0, None)])
def test_plan_is_valid_and_passes_independent_checks(batch, hbm_fraction, policy):
    plan, assignment, report = compile_tiny(batch, hbm_fraction, policy)
    doc = yaml.safe_load(plan_to_yaml(plan))
    jsonschema.validate(doc, SCHEMA)  # the committed schema, not the dataclasses
    assert parse_plan(doc, "emitted") == parse_plan(yaml.safe_load(plan_to_yaml(plan)), "again")
    # liac validate's layer 3: tier bytes recomputed from the architecture (not from the compiler), status sums
    assert [p for p in plan_problems(plan) if p[2] == "error"] == []


def test_groups_are_contiguous_and_resident_first():
    plan, assignment, _ = compile_tiny(batch=1, hbm_fraction=0.4)
    groups = [g for g in plan.spec.layer_groups if g.layer_class == "decoder"]
    assert len(groups) == len([c for name, c, _ in assignment.choices if name == "decoder"])
    assert sum(g.layer_count for g in groups) == TINY.num_layers
    first = 0
    for group in groups:
        assert group.first_layer == first
        first += group.layer_count
    hbm = [sum(1 for s in g.sublayers if s.weights == "hbm") + (g.kv_cache == "hbm") for g in groups]
    assert hbm[0] >= hbm[-1]
    assert [g.layer_class for g in plan.spec.layer_groups][0] == "embed"
    assert [g.layer_class for g in plan.spec.layer_groups][-1] == "head"


def test_predictions_equal_the_objective():
    plan, assignment, report = compile_tiny(batch=8, hbm_fraction=0.3)
    predicted = plan.status.predicted
    assert predicted.total_seconds == pytest.approx(report.objective_seconds, rel=1e-9)
    assert predicted.tokens_per_second == pytest.approx(8 * 8 / report.objective_seconds, rel=1e-9)
    assert predicted.decode_seconds_per_token == pytest.approx(predicted.decode_seconds / 7, rel=1e-12)
    data = to_data(plan)
    assert data["status"]["solver"] == {"name": report.name, "status": "optimal", "gap": 0.0,
                                        "objective_seconds": pytest.approx(report.objective_seconds, rel=1e-5)}
    # per-sublayer breakdown: one row per group, unit and phase, on the planned device
    rows = {(t.group, t.name, t.phase): t.device for t in predicted.sublayers}
    for group in plan.spec.layer_groups:
        for sub in group.sublayers:
            assert rows[(group.name, sub.name, "prefill")] == sub.prefill
            assert rows[(group.name, sub.name, "decode")] == sub.decode


def test_memory_reserved_matches_assignment_and_budgets():
    plan, assignment, _ = compile_tiny(batch=16, hbm_fraction=0.25)
    spec = plan.spec
    assert spec.memory.hbm_bytes == assignment.tier_used_bytes("hbm", 1)
    assert spec.memory.hbm_bytes <= spec.budgets.gpu_bytes
    assert spec.execution.staging_bytes == assignment.staging_bytes
    assert spec.execution.prefetch_depth == (1 if assignment.staging_bytes else 0)
    usage = {u.tier: (u.used_bytes, u.capacity_bytes) for u in plan.status.memory}
    assert usage["hbm"] == (spec.memory.hbm_bytes, spec.budgets.gpu_bytes)


def test_same_inputs_give_byte_identical_plans():
    a = plan_to_yaml(compile_tiny(batch=4, hbm_fraction=0.4)[0])
    b = plan_to_yaml(compile_tiny(batch=4, hbm_fraction=0.4)[0])
    assert a == b
    assert "seconds: " in a and "solve" not in a.split("status:")[0]


def test_names():
    assert plan_name("opt-30b", "spr-h100", 8, 128, 32, "optimal") == "opt-30b.spr-h100.b8-p128-g32"
    assert plan_name("opt-30b", "spr-h100", 8, 128, 32, "lia-gpu/lia-cpu") == "opt-30b.spr-h100.b8-p128-g32.lia-gpu+lia-cpu"
    plan, _, _ = compile_tiny(batch=4, hbm_fraction=0.5, policy="lia-cpu")
    assert plan.metadata.name.endswith(".lia-cpu")


def test_split_plan_is_valid_and_priced():
    """OPT-30B on h200-amx16 with 24 GiB of HBM splits sublayers: the plan says 'split' with the CPU's permille,
    passes the committed schema and liac validate's checks, and predicts what the solver optimised."""
    from liac.models import ZOO
    from liac.sweep import policy_string

    cfg = ZOO["opt-30b"]
    hw = resolve_profile("h200-amx16")
    costs = annotate_costs(hand_graph(cfg), hw, Workload(1, 128, 32), TierBudgets(24 * 2**30, hw.cpu_budget_bytes, 0))
    assignment, report = solve_placement(costs)
    plan = emit_plan(costs, assignment, report, cfg, "latency")
    splits = [(g, s) for g in plan.spec.layer_groups for s in g.sublayers if "split" in (s.prefill, s.decode)]
    assert splits
    for group, sub in splits:
        assert sub.weights in ("ddr", "cxl")
        for phase in ("prefill", "decode"):
            permille = sub.cpu_permille(phase)
            assert permille == {"cpu": 1000, "gpu": 0}.get(getattr(sub, phase), permille) and 0 <= permille <= 1000
            if getattr(sub, phase) == "split":
                assert 0 < permille < 1000
    doc = yaml.safe_load(plan_to_yaml(plan))
    jsonschema.validate(doc, SCHEMA)
    assert parse_plan(doc, "split").spec == plan.spec  # (status floats are rounded in the file)
    assert [p for p in plan_problems(plan) if p[2] == "error"] == []
    assert plan.status.predicted.total_seconds == pytest.approx(report.objective_seconds, rel=1e-9)
    rows = {(t.group, t.name, t.phase): t.device for t in plan.status.predicted.sublayers}
    assert rows[(splits[0][0].name, splits[0][1].name, "prefill")] == splits[0][1].prefill
    assert "S" in policy_string(plan, "prefill") + policy_string(plan, "decode")
