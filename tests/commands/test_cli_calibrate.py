"""`liac calibrate` (liac/commands/calibrate.py): bad flags are one line and exit 2 before anything is read, the
console script included. The fit itself: tests/test_calibrate.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from liac.cli import main


def _bad(tmp_path, *argv):
    return ["calibrate", *argv, "-o", str(tmp_path / "out.yaml")]


@pytest.mark.parametrize("flags,expected", [
    (["--hw", "nope"], "--hw: unknown hardware profile 'nope'"),
    (["--hw", "h200-amx16", "--profile-steps", "0"], "--profile-steps: must be a positive integer, got '0'"),
    (["--hw", "h200-amx16", "--max-evals", "x"], "--max-evals: must be a positive integer, got 'x'"),
    (["--hw", "h200-amx16", "--plans", "/nonexistent/dir"], "--plans: '/nonexistent/dir' must be a plan file"),
    (["--hw", "h200-amx16", "--report", "r.txt"], "--report: must end in '.json'"),
])
def test_bad_flags_are_one_line(tmp_path, capsys, flags, expected):
    assert main(_bad(tmp_path, str(tmp_path / "m.json"), *flags)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err


def test_console_script_bad_output_name(tmp_path):
    liac = Path(sys.executable).with_name("liac")
    proc = subprocess.run([str(liac), "calibrate", str(tmp_path / "m.json"), "--hw", "h200-amx16", "-o", str(tmp_path / "x.txt")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"liac calibrate: --output: must end in '.yaml' or '.yml', got '{tmp_path / 'x.txt'}'"
    assert "Traceback" not in proc.stderr
