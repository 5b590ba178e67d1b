"""`liac explain` on real compiled plans: re-pricing reproduces the plan's predictions, flips agree with re-pricing
a moved plan, the binding tier is the one a hand count says is full, bad profiles are one line."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from liac.api import compile_plans, write_plans
from liac.artifacts.explain import explain_plan
from liac.models import ZOO
from liac.passes.price import price_plan, unit_prices
from liac.passes.trace import trace_model
from liac.plan import parse_plan, plan_to_yaml
from liac.profile import resolve_profile
from liac.sizes import GIB, format_gib

MODEL = "opt-1.3b"  # 24 layers of 2048: small enough to compile in seconds, big enough to offload


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A tight GPU budget (some layers resident, the rest offloaded) and a roomy one (everything resident)."""
    graph = trace_model(ZOO[MODEL])
    tight = compile_plans(MODEL, "spr-h100", batches=(1, 64), gpu_mem=int(1.5 * GIB), graph=graph)
    roomy = compile_plans(MODEL, "spr-h100", batches=(1,), graph=graph)
    out = tmp_path_factory.mktemp("plans")
    write_plans(tight, out / "tight")
    write_plans(roomy, out / "roomy")
    return {"tight": [p.plan for p in tight.points], "roomy": roomy.points[0].plan, "dir": out}


def _opt_layer_bytes(d: int, f: int) -> dict[str, int]:
    """Hand-derived bf16 weight bytes of an OPT decoder layer's units."""
    return {"qkv": 2 * (2 * d + 3 * d * d + 3 * d), "out_proj": 2 * (d * d + d), "fc1": 2 * (2 * d + d * f + f),
            "fc2": 2 * (f * d + d), "attn_score": 0, "attn_context": 0}


def test_repricing_from_spec_reproduces_the_predictions(compiled):
    for plan in compiled["tight"] + [compiled["roomy"]]:
        ex = explain_plan(plan)
        work = plan.spec.workload
        prefill = sum(g.layer_seconds["prefill"] * g.layer_count for g in ex.groups)
        decode = sum(g.layer_seconds["decode"] * g.layer_count for g in ex.groups) * (work.gen_len - 1)
        assert prefill == pytest.approx(plan.status.predicted.prefill_seconds, rel=1e-4)
        assert decode == pytest.approx(plan.status.predicted.decode_seconds, rel=1e-4)
        placed = {(g.name, s.name, phase): getattr(s, phase) for g in plan.spec.layer_groups for s in g.sublayers
                  for phase in ("prefill", "decode")}
        assert {(u.group, u.unit, u.phase): u.device for u in ex.units} == placed


def test_flip_delta_equals_repricing_the_moved_plan(compiled):
    plan = compiled["tight"][0]
    ex = explain_plan(plan)
    checked = 0
    for u in ex.units:
        if u.flip_delta_seconds is None or u.group in ("embed", "head") or checked >= 4:
            continue
        index = next(i for i, g in enumerate(plan.spec.layer_groups) if g.name == u.group)
        group = plan.spec.layer_groups[index]
        other = "gpu" if u.device == "cpu" else "cpu"
        moves = {u.phase: other, f"{u.phase}_cpu_permille": 1000 if other == "cpu" else 0}
        subs = tuple(dataclasses.replace(s, **moves) if s.name == u.unit else s for s in group.sublayers)
        groups = list(plan.spec.layer_groups)
        groups[index] = dataclasses.replace(group, sublayers=subs)
        moved = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, layer_groups=tuple(groups)))
        after = next(g for g in explain_plan(moved).groups if g.name == u.group).layer_seconds[u.phase]
        before = next(g for g in ex.groups if g.name == u.group).layer_seconds[u.phase]
        assert after - before == pytest.approx(u.flip_delta_seconds, rel=1e-6, abs=1e-12)
        checked += 1
    assert checked == 4


def test_tight_budget_binds_hbm_as_a_hand_count_says(compiled):
    cfg = ZOO[MODEL]
    per_unit = _opt_layer_bytes(cfg.hidden_size, cfg.ffn_dim)
    for plan in compiled["tight"]:
        ex = explain_plan(plan)
        hbm = next(t for t in ex.tiers if t.tier == "hbm")
        work = plan.spec.workload
        kv = 2 * work.batch_size * (work.prompt_len + work.gen_len - 1) * cfg.hidden_size * 2
        heavy = {g.name: sum(per_unit[s.name] for s in g.sublayers if s.weights == "hbm")
                 + (kv if g.kv_cache == "hbm" else 0) for g in plan.spec.layer_groups if g.layer_class == "decoder"}
        top = max(heavy.values())
        lighter = [top - v for v in heavy.values() if v < top]
        assert hbm.need_bytes == (min(lighter) if lighter else 0)
        assert hbm.free_bytes == plan.spec.budgets.gpu_bytes - next(u.used_bytes for u in plan.status.memory
                                                                    if u.tier == "hbm")
        assert hbm.binding == (hbm.need_bytes > hbm.free_bytes)
        if hbm.binding:
            holders = sum(g.layer_count for g in plan.spec.layer_groups if heavy.get(g.name) == top)
            assert hbm.message.startswith("GPU memory full at ")
            assert f": {holders} of {cfg.num_layers} decoder layers " in hbm.message
            assert f"; one more needs {format_gib(hbm.need_bytes)}, {format_gib(hbm.free_bytes)} free" in hbm.message
    assert any(next(t for t in explain_plan(p).tiers if t.tier == "hbm").binding for p in compiled["tight"])


def test_roomy_budget_keeps_everything_resident_and_nothing_binds(compiled):
    ex = explain_plan(compiled["roomy"])
    assert not any(t.binding for t in ex.tiers)
    for u in ex.units:
        assert u.device == "gpu"
        if u.operand_tier == "hbm" and u.unit not in ("attn_score", "attn_context"):
            assert u.cpu_seconds is None and u.reason == "weights resident in HBM: the CPU does not compute from HBM"


def test_cpu_units_say_what_the_gpu_would_cost(compiled):
    ex = explain_plan(compiled["tight"][0])  # batch 1: LIA's regime, offloaded layers decode on the CPU
    cpu = [u for u in ex.units if u.device == "cpu" and u.phase == "decode" and u.operand_tier == "ddr"]
    assert cpu
    for u in cpu:
        assert u.cpu_seconds is not None and u.stream_seconds_on_gpu > 0
        if u.flip_delta_seconds >= 0:
            assert u.reason.startswith("on the GPU the layer would take ")
            assert "streaming its" in u.reason


@pytest.mark.parametrize("model, profile, gpu_gib, headroom", [
    ("opt-30b", "h200-amx16", 24, "35 GB/s of headroom"), ("opt-175b", "spr-h100", None, "50 GB/s of headroom"),
    ("opt-175b", "spr-h100 saturated", None, "the CPU alone saturates DDR (210 of 210 GB/s)"),
])
def test_a_split_plan_explains_why_it_splits(model, profile, gpu_gib, headroom):
    """A compiled split plan (batch 1), read back through YAML as liac explain reads it: its split units' price is
    the slower part of the split plus the sync, and explain weighs both whole alternatives and says why the split
    pays: the DDR headroom PCIe has beside the CPU's reads (Eq. 18), or, where the CPU alone saturates DDR
    (spr-h100 with ddr_shared = the CPU's rate), that PCIe reads DDR only while the CPU does not."""
    hw = resolve_profile(profile.split()[0])
    if profile.endswith("saturated"):
        hw = dataclasses.replace(hw, ddr_shared_gb_per_s=hw.cpu_ddr_read_gb_per_s)
    result = compile_plans(model, hw, batches=(1,), gpu_mem=None if gpu_gib is None else gpu_gib * GIB)
    (point,) = result.points
    plan = parse_plan(yaml.safe_load(plan_to_yaml(point.plan)), "plan")
    price = price_plan(plan, hw=hw)
    assert price.total_seconds == pytest.approx(plan.status.predicted.total_seconds, rel=1e-5)
    prices = [p for p in unit_prices(price) if p.device == "split"]
    assert prices and all(0 < p.cpu_permille < 1000 and p.split_seconds > hw.split_sync_seconds for p in prices)
    explained = [u for u in explain_plan(plan, hw=hw).units if u.device == "split"]
    assert len(explained) == len(prices)
    for u in explained:
        assert u.reason.startswith("split, ") and "wholly on the CPU" in u.reason and "wholly on the GPU" in u.reason
        assert headroom in u.reason and f"sync {hw.split_sync_seconds * 1e6:.0f} µs" in u.reason
