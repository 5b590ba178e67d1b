"""`liac profile` (liac/commands/profile.py): the output must be a profile file (YAML), said before measuring."""

from __future__ import annotations

from liac.cli import main


def test_output_must_be_yaml(tmp_path, capsys):
    assert main(["profile", "--quick", "--no-gpu", "-o", str(tmp_path / "host.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"liac profile: --output: must end in '.yaml' or '.yml', got '{tmp_path / 'host.txt'}'"]
