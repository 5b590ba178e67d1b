"""Plan format v2: the split placement rules check_semantics enforces, and the permille range the schema does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from liac.errors import LiacError
from liac.plan import SublayerPlacement, check_semantics, load_plan, parse_plan, plan_to_yaml, schema_text

ROOT = Path(__file__).parents[1]
SPLIT_PLAN = Path(__file__).parent / "fixtures" / "v2-opt-30b-h200-amx16-split.yaml"


def _with_unit(plan, group_index: int, unit: str, **changes):
    groups = list(plan.spec.layer_groups)
    group = groups[group_index]
    subs = tuple(dataclasses.replace(s, **changes) if s.name == unit else s for s in group.sublayers)
    groups[group_index] = dataclasses.replace(group, sublayers=subs)
    return dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, layer_groups=tuple(groups)))


def _decoder(plan, weights="ddr"):
    """Index of a decoder group whose fc1 has its weights in `weights`."""
    return next(i for i, g in enumerate(plan.spec.layer_groups) if g.layer_class == "decoder"
                and next(s for s in g.sublayers if s.name == "fc1").weights == weights)


def test_compiled_split_plan_is_sound():
    plan = load_plan(SPLIT_PLAN)
    assert check_semantics(plan) == []
    assert SublayerPlacement.whole("fc1", "cpu", "gpu", "ddr") == SublayerPlacement("fc1", "cpu", "gpu", "ddr", 1000, 0)


@pytest.mark.parametrize("changes, path, message", [
    ({"decode": "cpu", "decode_cpu_permille": 0}, "fc1].decode_cpu_permille", "must be 1000 for 'cpu' in decode, got 0"),
    ({"prefill": "gpu", "prefill_cpu_permille": 500}, "prefill_cpu_permille", "must be 0 for 'gpu' in prefill, got 500"),
    ({"decode": "split", "decode_cpu_permille": 1000}, "decode_cpu_permille",
     "must be 1..999 for 'split' in decode, got 1000"),
    ({"decode": "split", "decode_cpu_permille": 0}, "decode_cpu_permille", "must be 1..999 for 'split' in decode, got 0"),
])
def test_permille_must_match_the_placement(changes, path, message):
    plan = load_plan(SPLIT_PLAN)
    index = _decoder(plan)
    errors = check_semantics(_with_unit(plan, index, "fc1", **changes))
    assert any(p.endswith(path.split("].")[-1]) and m == message for p, m in errors), errors


def test_only_weight_gemms_split_and_only_from_ddr_or_cxl():
    plan = load_plan(SPLIT_PLAN)
    index = _decoder(plan)
    errors = check_semantics(_with_unit(plan, index, "attn_score", decode="split", decode_cpu_permille=400))
    assert (f"spec.layer_groups[{index}].sublayers[1].decode",
            "must not be 'split': only 'qkv', 'out_proj', 'fc1', 'fc2', 'gate_up', 'down', 'lm_head' may split") in errors
    hbm = _decoder(plan, "hbm")
    errors = check_semantics(_with_unit(plan, hbm, "fc1", decode="split", decode_cpu_permille=400))
    assert (f"spec.layer_groups[{hbm}].sublayers[4].weights",
            "must be 'ddr' or 'cxl' for a split sublayer, got 'hbm'") in errors


def test_permille_range_is_in_the_schema():
    doc = yaml.safe_load(plan_to_yaml(load_plan(SPLIT_PLAN)))
    doc["spec"]["layer_groups"][1]["sublayers"][0]["prefill_cpu_permille"] = 1001
    with pytest.raises(LiacError) as raised:
        parse_plan(doc, "p.yaml")
    assert raised.value.line() == ("p.yaml: spec.layer_groups[1].sublayers[0].prefill_cpu_permille: must be at most "
                                   "1000, got 1001")
    del doc["spec"]["layer_groups"][1]["sublayers"][0]["prefill_cpu_permille"]
    with pytest.raises(LiacError, match="prefill_cpu_permille: required field is missing"):
        parse_plan(doc, "p.yaml")


def test_committed_schema_is_generated_from_plan_py():
    assert (ROOT / "liac" / "schema" / "offload-plan-v4.schema.json").read_text() == schema_text()
