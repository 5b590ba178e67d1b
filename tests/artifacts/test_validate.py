"""`liac validate`: hand-broken plans get precise, path-named errors; all of them; exit codes."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from artifact_plans import GIB, TINY_LLAMA, TINY_OPT, make_plan, plan_doc, replace_sub, run_cli, with_group, write_doc

from liac.artifacts.schema_check import schema_problems
from liac.artifacts.validate import validate_document
from liac.errors import LiacError
from liac.plan import OffloadPlan, parse_plan
from liac.schema_tools import to_data


def _run(capsys, *args):
    return run_cli(capsys, "validate", *args)


def test_valid_plan_prints_one_ok_line(tmp_path, capsys):
    path = write_doc(tmp_path, plan_doc())
    code, lines, err = _run(capsys, path)
    assert code == 0 and lines == [f"{path}: OK (valid plan)"] and err == ""


def test_bad_enum_names_path_value_and_allowed_values(tmp_path, capsys):
    doc = plan_doc()
    doc["spec"]["layer_groups"][2]["sublayers"][4]["decode"] = "tpu"
    path = write_doc(tmp_path, doc)
    code, lines, _ = _run(capsys, path)
    assert code == 1
    assert lines == [f"{path}: spec.layer_groups[2].sublayers[4].decode: unsupported value 'tpu': must be one of "
                     "'cpu', 'gpu', 'split'"]


def test_missing_and_unknown_fields_and_bad_types_are_all_reported(tmp_path, capsys):
    doc = plan_doc()
    del doc["spec"]["workload"]["gen_len"]
    doc["spec"]["workload"]["gen_length"] = 32
    doc["spec"]["budgets"]["gpu_bytes"] = "24GiB"
    doc["spec"]["layer_groups"][1]["sublayers"][0]["weights"] = "nvme"
    path = write_doc(tmp_path, doc)
    code, lines, _ = _run(capsys, path)
    assert code == 1
    assert sorted(lines) == sorted([
        f"{path}: spec.workload.gen_length: unknown field: must be one of batch_size, gen_len, objective, prompt_len",
        f"{path}: spec.workload.gen_len: required field is missing",
        f"{path}: spec.budgets.gpu_bytes: must be an integer, got '24GiB'",
        f"{path}: spec.layer_groups[1].sublayers[0].weights: unsupported value 'nvme': must be one of 'hbm', 'ddr', "
        "'cxl', 'none'",
    ])


@pytest.mark.parametrize("breakage", ["enum", "missing", "unknown", "type", "minimum", "pattern", "list"])
def test_first_schema_problem_is_the_one_the_loader_raises(breakage):
    """The collecting checker and liac.schema_tools.from_data word problems identically (no drift)."""
    doc = plan_doc()
    work = doc["spec"]["workload"]
    if breakage == "enum":
        work["objective"] = "speed"
    elif breakage == "missing":
        del doc["status"]["solver"]["gap"]
    elif breakage == "unknown":
        doc["spec"]["extra"] = 1
    elif breakage == "type":
        work["batch_size"] = 1.5
    elif breakage == "minimum":
        work["prompt_len"] = 0
    elif breakage == "pattern":
        doc["spec"]["hardware"]["sha256"] = "xyz"
    else:
        doc["spec"]["layer_groups"] = {"embed": 1}
    problems = schema_problems(OffloadPlan, copy.deepcopy(doc))
    assert len(problems) == 1
    with pytest.raises(LiacError) as raised:
        parse_plan(doc, "p.yaml")
    assert (raised.value.path, raised.value.message) == problems[0]


def test_overlapping_layer_ranges(tmp_path, capsys):
    plan = with_group(make_plan(resident=2), 2, first_layer=1, layer_count=TINY_OPT.num_layers - 1)
    path = write_doc(tmp_path, to_data(plan))
    code, lines, _ = _run(capsys, path)
    assert code == 1
    assert lines == [f"{path}: spec.layer_groups[2].first_layer: must be 2 (layer ranges of class 'decoder' must be "
                     "contiguous, in order: layer 1 is also in spec.layer_groups[1])"]


def test_gap_and_short_coverage(tmp_path, capsys):
    plan = with_group(make_plan(resident=2), 2, first_layer=3, layer_count=2)
    path = write_doc(tmp_path, to_data(plan))
    code, lines, _ = _run(capsys, path)
    assert code == 1
    assert lines == [
        f"{path}: spec.layer_groups[2].first_layer: must be 2 (layer ranges of class 'decoder' must be contiguous, "
        "in order: layer 2 is not covered)",
        f"{path}: spec.layer_groups: layers of class 'decoder' must cover 0..5, covered 0..4",
    ]


def test_unknown_sublayer_in_group(tmp_path, capsys):
    doc = plan_doc()
    doc["spec"]["layer_groups"][2]["sublayers"][5]["name"] = "fc3"
    path = write_doc(tmp_path, doc)
    code, lines, _ = _run(capsys, path)
    assert code == 1
    assert lines == [f"{path}: spec.layer_groups[2].sublayers: must name qkv, attn_score, attn_context, out_proj, fc1, "
                     "fc2 in this order, got qkv, attn_score, attn_context, out_proj, fc1, fc3"]


def test_weights_in_hbm_for_a_cpu_sublayer(tmp_path, capsys):
    plan = replace_sub(make_plan(), 2, "fc1", weights="hbm")
    path = write_doc(tmp_path, to_data(plan))
    code, lines, _ = _run(capsys, path)
    assert code == 1
    assert lines == [f"{path}: spec.layer_groups[2].sublayers[4].weights: must not be 'hbm' for a sublayer computed "
                     "on the CPU"]


def test_config_hash_mismatch(tmp_path, capsys):
    doc = plan_doc()
    doc["spec"]["model"]["config"]["num_layers"] = 7  # edited architecture, stale hash
    doc["spec"]["layer_groups"][2]["layer_count"] = 5
    path = write_doc(tmp_path, doc)
    code, lines, _ = _run(capsys, path)
    assert code == 1
    want = TINY_OPT.with_layers(7, name=TINY_OPT.name).sha256()[:12]
    assert lines == [f"{path}: spec.model.config_sha256: must be the sha256 of spec.model.config ('{want}…'), got "
                     f"'{TINY_OPT.sha256()[:12]}…'"]


def _tiny_opt_bytes():
    """Hand-derived bf16 weight bytes of TINY_OPT's units (independent of the model code)."""
    d, f, v, p = TINY_OPT.hidden_size, TINY_OPT.ffn_dim, TINY_OPT.vocab_size, TINY_OPT.max_position
    layer = (2 * d + 3 * d * d + 3 * d) + (d * d + d) + (2 * d + d * f + f) + (f * d + d)
    embed = v * d + (p + 2) * d
    head = 2 * d  # final LayerNorm; the projection is the (tied) embedding matrix
    return 2 * layer, 2 * embed, 2 * head


def test_over_budget_names_tier_and_shortfall(tmp_path, capsys):
    layer, embed, head = _tiny_opt_bytes()
    kv_layer = 2 * 1 * (16 + 8 - 1) * 64 * 2  # K and V, batch 1, 23 cached tokens, 4 heads × 16, bf16
    need = 2 * layer + embed + head + 2 * kv_layer  # two resident layers, embed and head in HBM
    budget = need - 1000
    plan = make_plan(resident=2, gpu_bytes=budget)
    path = write_doc(tmp_path, to_data(plan))
    code, lines, _ = _run(capsys, path)
    assert code == 1
    mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
    assert lines[0] == (f"{path}: spec.budgets.gpu_bytes: over budget: the plan places {mib(need)} in 'hbm' (weights "
                        f"{mib(need - 2 * kv_layer)}, KV cache {mib(2 * kv_layer)}), more than the {mib(budget)} "
                        f"budget (short by {mib(1000)})")


def test_reservation_below_what_the_plan_places(tmp_path, capsys):
    doc = plan_doc(make_plan(resident=0, cpu_bytes=GIB))
    layer, embed, head = _tiny_opt_bytes()
    kv_layer = 2 * (16 + 8 - 1) * 64 * 2
    need = TINY_OPT.num_layers * (layer + kv_layer)  # every layer offloaded: weights and KV in DDR
    doc["spec"]["memory"]["ddr_bytes"] = need - 1
    path = write_doc(tmp_path, doc)
    code, lines, _ = _run(capsys, path)
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith(f"{path}: spec.memory.ddr_bytes: must be at least "
                                                   f"{need / 2**20:.1f} MiB: the plan places")


def test_staging_buffers_count_against_hbm(tmp_path, capsys):
    doc = plan_doc(make_plan(prefetch_depth=1))
    doc["spec"]["execution"]["staging_bytes"] = GIB // 2  # two buffers of 0.5 GiB: the whole 1 GiB GPU budget
    path = write_doc(tmp_path, doc)
    code, lines, _ = _run(capsys, path)
    assert code == 1 and lines[0].startswith(f"{path}: spec.budgets.gpu_bytes: over budget")
    assert "staging 1.0 GiB" in lines[0]


def test_status_inconsistent_with_spec(tmp_path, capsys):
    doc = plan_doc()
    entry = next(i for i, t in enumerate(doc["status"]["predicted"]["sublayers"])
                 if t["group"] == "offload" and t["name"] == "fc1" and t["phase"] == "decode")
    doc["status"]["predicted"]["sublayers"][entry]["device"] = "gpu"
    doc["status"]["predicted"]["total_seconds"] *= 2
    doc["status"]["memory"][0]["used_bytes"] = doc["status"]["memory"][0]["capacity_bytes"] + 1
    path = write_doc(tmp_path, doc)
    code, lines, _ = _run(capsys, path)
    assert code == 1
    assert lines[0] == (f"{path}: status.memory[0].used_bytes: must not exceed capacity_bytes (1.0 GiB), got 1.0 GiB")
    assert lines[1] == (f"{path}: status.predicted.sublayers[{entry}].device: must be 'cpu': spec places group "
                        "'offload' unit 'fc1' on 'cpu' in decode, got 'gpu'")
    assert lines[2].startswith(f"{path}: status.predicted.total_seconds: must equal prefill_seconds + decode_seconds")
    assert lines[3].startswith(f"{path}: status.predicted.tokens_per_second: must equal batch_size × gen_len")


def test_validate_document_returns_the_plan_when_valid():
    plan = make_plan(TINY_LLAMA, batch=4)
    loaded, findings = validate_document(plan_doc(plan), "x")
    assert findings == [] and loaded == plan


def test_changed_shipped_profile_is_a_warning_not_an_error(tmp_path, capsys):
    from liac.profile import resolve_profile

    plan = make_plan()
    hardware = dataclasses.replace(plan.spec.hardware, profile="spr-h100", sha256="f" * 64)
    doc = to_data(dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, hardware=hardware)))
    path = write_doc(tmp_path, doc)
    code, lines, _ = _run(capsys, path)
    current = resolve_profile("spr-h100").sha256()[:12]
    assert code == 0
    assert lines == [f"warning: {path}: spec.hardware.sha256: the shipped profile 'spr-h100' has changed since this "
                     f"plan was compiled (now '{current}…', plan 'ffffffffffff…'): recompile for current "
                     "predictions",
                     f"{path}: OK (valid plan)"]
