"""`liac validate` (liac/commands/validate.py): every argument checked, one line per problem, exit 1 when it finds
any error (docs/cli.md), the console script included."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from artifact_plans import TINY_LLAMA, make_plan, plan_doc, run_cli, write_doc



def _run(capsys, *args):
    return run_cli(capsys, "validate", *args)


def test_every_argument_checked_and_unreadable_or_non_yaml_files(tmp_path, capsys):
    good = write_doc(tmp_path, plan_doc(make_plan(TINY_LLAMA)), "good.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    old = write_doc(tmp_path, {**plan_doc(), "apiVersion": "liac/v0"}, "old.yaml")
    code, lines, _ = _run(capsys, good, bad, scalar, old, tmp_path / "missing.yaml")
    assert code == 1
    assert lines[0] == f"{good}: OK (valid plan)"
    assert lines[1].startswith(f"{bad}: not valid YAML: ")
    assert lines[2] == f"{scalar}: must be a YAML mapping with apiVersion, kind, metadata, spec, status"
    assert lines[3] == f"{old}: apiVersion: unsupported value 'liac/v0': must be one of 'liac/v1', 'liac/v1alpha1', 'liac/v2', 'liac/v3', 'liac/v4'"
    assert lines[4] == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"


def test_console_script_prints_one_line_per_error_and_exits_1(tmp_path):
    doc = plan_doc()
    doc["spec"]["workload"]["objective"] = "speed"
    path = write_doc(tmp_path, doc)
    script = shutil.which("liac", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "liac.cli"]
    done = subprocess.run([*command, "validate", str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and done.stderr == ""
    assert done.stdout == (f"{path}: spec.workload.objective: unsupported value 'speed': must be one of 'latency', "
                           "'throughput'\n")
