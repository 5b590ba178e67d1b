"""`liac diff` (liac/commands/diff.py): JSON output, exit 1 when different, one line and exit 2 on bad input."""

from __future__ import annotations

import json

from artifact_plans import make_plan, run_cli, save_plan

from liac.cli import main


def _run(capsys, *args):
    return run_cli(capsys, "diff", *args)


def test_json_output(tmp_path, capsys):
    a = save_plan(tmp_path / "a.yaml", make_plan())
    b = save_plan(tmp_path / "b.yaml", make_plan(batch=2))
    assert main(["diff", "--format", "json", str(a), str(b)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["different"] is True and doc["only_in_a"] == []
    assert {"section": "workload", "subject": "batch_size", "old": "1", "new": "2", "detail": ""} in \
        doc["plans"][0]["changes"]


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    a = save_plan(tmp_path / "a.yaml", make_plan())
    assert _run(capsys, a, tmp_path) == (2, [], f"liac diff: diff: must compare two plan files or two sweep "
                                                f"directories, got '{a}' and '{tmp_path}'\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: liac/v1\n")
    code, lines, err = _run(capsys, a, broken)
    assert code == 2 and lines == [] and err.count("\n") == 1 and err.startswith(f"liac diff: {broken}: ")
