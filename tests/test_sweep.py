"""liac/sweep.py: which files of a sweep directory are plans, reading its index, and the policy string."""

from __future__ import annotations

from artifact_plans import TINY_OPT, make_plan

from liac.sweep import INDEX_NAME, plan_files, policy_string, read_index


def test_plan_files_are_the_yaml_files_but_the_index_catalog_and_temp_files(tmp_path):
    for name in ("b.yaml", "a.yml", "index.yaml", "sweeps.yaml", ".b.yaml.1234.tmp", ".x.yaml", "notes.txt"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "dir.yaml").mkdir()
    assert [p.name for p in plan_files(tmp_path)] == ["a.yml", "b.yaml"]


def test_read_index_says_what_is_wrong_instead_of_raising(tmp_path):
    assert read_index(tmp_path) == (None, [("", f"holds no {INDEX_NAME}: a sweep directory written by 'liac "
                                                 "compile' has one")])
    (tmp_path / INDEX_NAME).write_text("points: [unclosed\n")
    doc, problems = read_index(tmp_path)
    assert doc is None and problems[0][1].startswith("not valid YAML: ")
    (tmp_path / INDEX_NAME).write_text("kind: OffloadPlanIndex\n")
    assert read_index(tmp_path) == ({"kind": "OffloadPlanIndex"}, [])


def test_policy_string_counts_layers_and_letters_each_unit():
    plan = make_plan(TINY_OPT, resident=2, offload_prefill="gpu", offload_decode="cpu")
    assert policy_string(plan, "prefill") == "2xGGGGGG+4xGGGGGG"
    assert policy_string(plan, "decode") == "2xGGGGGG+4xCCCCCC"
