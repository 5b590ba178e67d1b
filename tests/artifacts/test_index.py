"""`liac validate DIR`: a sweep's plans and its index.yaml (written by the compiler's own writer) must agree."""

from __future__ import annotations

import copy

import yaml
from artifact_plans import make_plan

from liac.api import CompiledPoint, CompileResult, write_plans
from liac.cli import main
from liac.plan import plan_to_yaml

BATCHES = (1, 4, 16)


def _sweep(tmp_path):
    points = tuple(CompiledPoint(make_plan(batch=b, seconds_scale=b**0.5), None, None) for b in BATCHES)
    out = tmp_path / "sweep"
    write_plans(CompileResult(points, ((64, "hbm: short by 3.0 GiB"),), "tiny-opt", "test-hw", "latency",
                              "optimal"), out)
    return out


def _edit_index(sweep, edit):
    doc = yaml.safe_load((sweep / "index.yaml").read_text())
    edit(doc)
    (sweep / "index.yaml").write_text(yaml.safe_dump(doc))


def _run(capsys, *args):
    code = main(["validate", *map(str, args)])
    return code, capsys.readouterr().out.splitlines()


def test_compiled_sweep_is_ok(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    assert _run(capsys, sweep) == (0, [f"{sweep}: OK (3 plans and index.yaml)"])


def test_index_values_must_repeat_the_plans(tmp_path, capsys):
    sweep = _sweep(tmp_path)

    def edit(doc):
        doc["points"][1]["tokens_per_second"] *= 1.5
        doc["points"][2]["decode"] = "6xGGGGGG"
        doc["points"][0]["memory"]["hbm_bytes"] += 1
        doc["model"] = "other"
        doc["best_throughput"] = doc["points"][0]["file"]
    _edit_index(sweep, edit)
    code, lines = _run(capsys, sweep)
    index = sweep / "index.yaml"
    plan = make_plan(batch=4, seconds_scale=2.0)
    assert code == 1
    assert lines == [
        f"{index}: points[0].memory: must repeat the plan's value {{'hbm_bytes': 268435456, 'ddr_bytes': "
        f"1073741824, 'cxl_bytes': 0}}, got {{'cxl_bytes': 0, 'ddr_bytes': 1073741824, 'hbm_bytes': 268435457}}",
        f"{index}: points[1].tokens_per_second: must repeat the plan's value "
        f"{plan.status.predicted.tokens_per_second!r}, got {plan.status.predicted.tokens_per_second * 1.5!r}",
        f"{index}: points[2].decode: must repeat the plan's value '2xGGGGGG+4xCCCCCC', got '6xGGGGGG'",
        f"{index}: model: must be 'tiny-opt' (what the plans say), got 'other'",
        f"{index}: best_throughput: must name the plan with the most tokens/s ('tiny-opt.test-hw.b16-p16-g8.yaml'), "
        f"got 'tiny-opt.test-hw.b1-p16-g8.yaml'",
    ]


def test_listing_must_match_the_directory(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    (sweep / "extra.yaml").write_text(plan_to_yaml(make_plan(batch=2)))

    def edit(doc):
        doc["points"].append(copy.deepcopy(doc["points"][0]))  # a copy: the loader refuses YAML aliases
        doc["points"][1]["file"] = "gone.yaml"
        doc["infeasible"].append({"batch_size": 16, "reason": "too big"})
    _edit_index(sweep, edit)
    code, lines = _run(capsys, sweep)
    index = sweep / "index.yaml"
    assert code == 1
    assert lines == [
        f"{index}: points[1].file: 'gone.yaml' does not exist in the sweep directory",
        f"{index}: points[3].file: 'tiny-opt.test-hw.b1-p16-g8.yaml' is already listed at points[0]",
        f"{index}: points: must list every plan of the directory: 'extra.yaml' is missing",
        f"{index}: points: must list every plan of the directory: 'tiny-opt.test-hw.b4-p16-g8.yaml' is missing",
        f"{index}: infeasible[1].batch_size: batch 16 has a plan in this sweep: it must not also be listed as "
        "infeasible",
    ]


def test_invalid_plan_in_a_sweep_and_missing_index(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    bad = sweep / "tiny-opt.test-hw.b4-p16-g8.yaml"
    bad.write_text(bad.read_text().replace("objective: latency", "objective: speed"))
    (sweep / "index.yaml").unlink()
    code, lines = _run(capsys, sweep)
    assert code == 1
    assert lines == [f"{bad}: spec.workload.objective: unsupported value 'speed': must be one of 'latency', "
                     "'throughput'",
                     f"{sweep}: holds no index.yaml: a sweep directory written by 'liac compile' has one"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(capsys, empty) == (1, [f"{empty}: holds no plan files (*.yaml)"])


def test_directory_of_sweeps_and_its_catalog(tmp_path, capsys):
    root = tmp_path / "plans"
    sweep = _sweep(root)  # root/sweep
    (root / "sweeps.yaml").write_text(yaml.safe_dump({"sweeps": [
        {"model": "tiny-opt", "hardware": "test-hw", "directory": "sweep"},
        {"model": "huge", "hardware": "test-hw", "reason": "does not fit"}]}))
    assert _run(capsys, root) == (0, [f"{root}: OK (3 plans, index.yaml and sweeps.yaml)"])
    assert _run(capsys, root / "sweeps.yaml") == (0, [f"{root / 'sweeps.yaml'}: OK (3 plans, index.yaml and "
                                                      "sweeps.yaml)"])
    assert _run(capsys, sweep / "index.yaml") == (0, [f"{sweep / 'index.yaml'}: OK (3 plans and index.yaml)"])
    (root / "sweeps.yaml").write_text(yaml.safe_dump({"sweeps": [
        {"model": "tiny-opt", "hardware": "test-hw", "directory": "gone"},
        {"model": "huge", "hardware": "test-hw"}]}))
    code, lines = _run(capsys, root)
    catalog = root / "sweeps.yaml"
    assert code == 1 and lines == [
        f"{catalog}: sweeps[0].directory: 'gone' must be a sweep directory beside sweeps.yaml",
        f"{catalog}: sweeps[1]: must name 'model' and 'hardware', and either 'directory' or 'reason'",
        f"{catalog}: sweeps: must list every sweep directory: 'sweep' is missing"]
