"""`liac explain` (liac/commands/explain.py): text and JSON, and a plan whose shipped profile has changed is one
line and exit 2 until --hw names the profile to price with. The explanations themselves: tests/artifacts/."""

from __future__ import annotations

import json

from liac.api import compile_plans, write_plans
from liac.cli import main
from liac.sizes import MIB


def test_cli_text_json_and_changed_profile(tiny, capsys, tmp_path):
    result = compile_plans(tiny("tiny-opt"), "spr-h100", batches=(1,), prompt_len=32, gen_len=8, gpu_mem=2 * MIB)
    (path,) = write_plans(result, tmp_path / "plan.yaml")
    plan = result.points[0].plan
    assert main(["explain", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{path}: tiny-opt on spr-h100, batch 1, prompt 32, gen 8 (objective latency)\n")
    assert "Memory per tier (binding constraints first):\n" in text and "group 'decoder-0'" in text
    assert main(["explain", "--format", "json", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["units"]) == 2 * sum(len(g.sublayers) for g in plan.spec.layer_groups)
    stale = tmp_path / "stale.yaml"
    stale.write_text(path.read_text().replace(plan.spec.hardware.sha256, "f" * 64))
    assert main(["explain", str(stale)]) == 2
    err = capsys.readouterr().err
    assert err == ("liac explain: spec.hardware.sha256: profile 'spr-h100' has changed since the plan was compiled "
                   "(sha256 differs): pass the profile file it was compiled with\n")
    assert main(["explain", "--hw", "spr-h100", str(stale)]) == 0
