"""`liac diff`: layer-by-layer semantic differences, exit codes like diff(1), sweep directories."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from artifact_plans import TINY_LLAMA, make_plan, replace_sub, run_cli, save_plan

from liac.artifacts.diff import diff_plans, fold_layers
from liac.plan import load_plan


def _run(capsys, *args):
    return run_cli(capsys, "diff", *args)


def _recut(plan):
    """The same placement with the offloaded range cut into two differently named groups."""
    offload = plan.spec.layer_groups[2]
    half = offload.layer_count // 2
    groups = list(plan.spec.layer_groups)
    groups[2:3] = [dataclasses.replace(offload, name="off-a", layer_count=half),
                   dataclasses.replace(offload, name="off-b", first_layer=offload.first_layer + half,
                                       layer_count=offload.layer_count - half)]
    return dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, layer_groups=tuple(groups)))


def test_equal_plans_and_regrouped_plans_have_no_semantic_differences(tmp_path, capsys):
    plan = make_plan()
    a, b = save_plan(tmp_path / "a.yaml", plan), save_plan(tmp_path / "b.yaml", _recut(plan))
    assert a.read_text() != b.read_text()
    assert _run(capsys, a, a) == (0, ["no semantic differences"], "")
    assert _run(capsys, a, b) == (0, ["no semantic differences"], "")


def test_placement_tier_and_kv_moves_are_folded_into_layer_ranges(tmp_path, capsys):
    before = make_plan(resident=2)
    after = replace_sub(make_plan(resident=3), 2, "fc1", decode="gpu", weights="ddr")
    after = replace_sub(after, 2, "qkv", prefill="cpu")
    a, b = save_plan(tmp_path / "a.yaml", before), save_plan(tmp_path / "b.yaml", after)
    code, lines, _ = _run(capsys, a, b)
    assert code == 1
    assert lines[:2] == [f"--- {a}", f"+++ {b}"]
    assert [line for line in lines if not line.startswith("  predicted")][2:] == [
        "  placement prefill: decoder layers 3..5: qkv: gpu → cpu",
        "  placement decode: decoder layer 2: qkv, attn_score, attn_context, out_proj, fc1, fc2: cpu → gpu",
        "  placement decode: decoder layers 3..5: fc1: cpu → gpu",
        "  weights: decoder layer 2: qkv, out_proj, fc1, fc2: ddr → hbm",
        "  kv_cache: decoder layer 2: ddr → hbm",
    ]


def test_predicted_changes_in_percent(tmp_path):
    before, after = make_plan(), make_plan(seconds_scale=1.25)
    changes = {c.subject: c for c in diff_plans(before, after).changes if c.section == "predicted"}
    pa, pb = before.status.predicted, after.status.predicted
    assert changes["total"].detail == f"{(pb.total_seconds / pa.total_seconds - 1) * 100:+.1f}%" == "+25.0%"
    assert changes["tokens/s"].detail == "-20.0%"  # 1 / 1.25 − 1
    assert changes["prefill"].old == f"{pa.prefill_seconds:.4g} s"


def test_workload_budgets_memory_and_identity(tmp_path):
    before = make_plan(TINY_LLAMA)
    after = make_plan(TINY_LLAMA, batch=8, gpu_bytes=2 * 2**30)
    after = dataclasses.replace(after, spec=dataclasses.replace(
        after.spec, hardware=dataclasses.replace(after.spec.hardware, profile="other-hw")))
    lines = [c.line() for c in diff_plans(before, after).changes if c.section != "predicted"]
    assert lines == ["hardware: profile: test-hw → other-hw",
                     "workload: batch_size: 1 → 8",
                     "budgets: gpu_bytes: 1.0 GiB → 2.0 GiB (+100.0%, +1.0 GiB)",
                     "memory reserved: hbm_bytes: 512.0 MiB → 1.0 GiB (+100.0%, +512.0 MiB)",
                     "memory used: hbm: 256.0 MiB → 512.0 MiB (+100.0%, +256.0 MiB)"]


def test_sweep_directories_pair_by_file_name(tmp_path, capsys):
    for name, batch in (("b1.yaml", 1), ("b8.yaml", 8)):
        save_plan(tmp_path / "A" / name, make_plan(batch=batch))
        save_plan(tmp_path / "B" / name, make_plan(batch=batch, resident=3 if batch == 8 else 2))
    save_plan(tmp_path / "A" / "b64.yaml", make_plan(batch=64))
    (tmp_path / "A" / "index.yaml").write_text("plans: []\n")  # never paired as a plan
    code, lines, _ = _run(capsys, tmp_path / "A", tmp_path / "B")
    assert code == 1
    assert lines[:2] == [f"--- {tmp_path / 'A' / 'b8.yaml'}", f"+++ {tmp_path / 'B' / 'b8.yaml'}"]
    assert lines[-1] == f"only in A: {tmp_path / 'A' / 'b64.yaml'}"
    assert not any("b1.yaml" in line for line in lines)
    (tmp_path / "A" / "b64.yaml").unlink()
    save_plan(tmp_path / "B" / "b8.yaml", make_plan(batch=8))
    assert _run(capsys, tmp_path / "A", tmp_path / "B") == (0, ["no semantic differences"], "")


def test_fold_layers_keeps_classes_apart_and_breaks_on_gaps_and_changes():
    folded = fold_layers({("embed", 0): "x", ("decoder", 0): "x", ("decoder", 1): "x", ("decoder", 2): "y",
                          ("decoder", 4): "y", ("head", 0): "x"})
    assert folded == [("embed", "x"), ("decoder layers 0..1", "x"), ("decoder layer 2", "y"),
                      ("decoder layer 4", "y"), ("head", "x")]


def test_different_models_report_identity_not_layers():
    other = make_plan(TINY_LLAMA)
    changes = diff_plans(make_plan(), other).changes
    sections = {c.section for c in changes}
    assert "model" in sections and not sections & {"placement prefill", "placement decode", "weights", "kv_cache"}


# ---------------------------------------------------------------------------------------------------------------
# Real compiled plans (the checked-in sweeps)

REPO = Path(__file__).resolve().parents[2]


def _layer_moves(a, b, attribute):
    """Brute force: (unit, old, new) → number of decoder layers whose `attribute` differs, from the groups."""
    def per_layer(plan):
        out = {}
        for group in plan.spec.layer_groups:
            if group.layer_class == "decoder":
                for layer in range(group.first_layer, group.first_layer + group.layer_count):
                    out[layer] = {s.name: label(s) for s in group.sublayers}
        return out

    experts = a.model_config.num_experts

    def label(sub):  # a split is told apart by the CPU's share, MoE experts by their counts
        value = getattr(sub, attribute)
        if sub.name == "experts" and experts:
            # the record's counts; a plan without one (compiled before expert counts) places all experts alike
            if attribute == "weights":
                hbm = sub.experts.hbm if sub.experts is not None else (experts if value == "hbm" else 0)
                return f"{value} ({hbm} of {experts} experts in hbm)" if 0 < hbm < experts else value
            cpu = getattr(sub.experts, attribute + "_cpu") if sub.experts is not None else \
                (experts if value == "cpu" else 0)
            return f"{value} ({cpu} of {experts} experts on the CPU)"
        return f"split ({sub.cpu_permille(attribute)}‰ CPU)" if value == "split" else value
    la, lb = per_layer(a), per_layer(b)
    counts = {}
    for layer in la:
        for unit, old in la[layer].items():
            if lb[layer][unit] != old:
                key = (unit, old, lb[layer][unit])
                counts[key] = counts.get(key, 0) + 1
    return counts


def _counted(changes, section):
    """(unit, old, new) → layers covered by the diff's changes of one section."""
    counts = {}
    for change in changes:
        if change.section != section or not change.subject.startswith("decoder"):
            continue
        span, units = change.subject.split(": ")
        bounds = span.split(" ")[-1].split("..")
        layers = int(bounds[-1]) - int(bounds[0]) + 1
        for unit in units.split(", "):
            key = (unit, change.old, change.new)
            counts[key] = counts.get(key, 0) + layers
    return counts


@pytest.mark.parametrize("sweep", ["opt-175b.spr-h100", "llama-3.1-70b.spr-h100-cxl", "mixtral-8x7b.spr-a100"])
def test_checked_in_plans_diff_layer_by_layer_like_brute_force(sweep):
    files = sorted((REPO / "plans" / sweep).glob("*-p128-g32.yaml"),
                   key=lambda p: int(p.name.split(".b")[-1].split("-")[0]))
    plans = [load_plan(f) for f in files]
    assert any(_layer_moves(a, b, "decode") for a, b in zip(plans, plans[1:]))  # the sweep does move units
    for a, b in zip(plans, plans[1:]):
        changes = diff_plans(a, b).changes
        for attribute in ("prefill", "decode", "weights"):
            section = f"placement {attribute}" if attribute != "weights" else "weights"
            assert _counted(changes, section) == _layer_moves(a, b, attribute)
        assert any(c.section == "workload" and c.subject == "batch_size" for c in changes)
        assert diff_plans(a, a).changes == ()


def test_checked_in_sweep_against_a_copy_of_itself(tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(REPO / "plans" / "opt-30b.spr-h100", copy)
    assert _run(capsys, REPO / "plans" / "opt-30b.spr-h100", copy) == (0, ["no semantic differences"], "")
    last = sorted(copy.glob("*.b256-*.yaml"))[0]
    last.unlink()
    code, lines, _ = _run(capsys, REPO / "plans" / "opt-30b.spr-h100", copy)
    assert code == 1 and lines == [f"only in A: {REPO / 'plans' / 'opt-30b.spr-h100' / last.name}"]
