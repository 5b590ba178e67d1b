"""`liac docs` (liac/commands/docs.py): what it needs, one line when it is missing, and the plan-format page."""

from __future__ import annotations

from liac.artifacts.schemadoc import render_plan_format
from liac.cli import main


def test_docs_command_bad_input_and_plan_format(tmp_path, capsys):
    assert main(["docs"]) == 2
    assert capsys.readouterr().err == "liac docs: docs: PLANS_DIR (with -o OUT) or --plan-format FILE is required\n"
    assert main(["docs", str(tmp_path / "nowhere"), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"liac docs: docs: '{tmp_path / 'nowhere'}' must be a directory of sweeps (as "
                                       "written by 'liac compile -o DIR')\n")
    assert main(["docs", "--plan-format", str(tmp_path / "format.md")]) == 0
    assert (tmp_path / "format.md").read_text() == render_plan_format()
