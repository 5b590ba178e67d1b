"""`liac demo` (the README's main job) runs end to end: a compiled sweep table, then a small plan run on random
weights whose metrics file records the generated tokens."""

from __future__ import annotations

import json

from liac.cli import main


def test_demo_compiles_a_sweep_and_runs_a_small_plan(tmp_path, capsys):
    status = main(["demo", "-o", str(tmp_path), "--model", "opt-1.3b", "--batch", "1,8", "--gpu-mem", "1GiB"])
    out = capsys.readouterr().out
    assert status == 0
    assert "opt-1.3b on h200-amx16" in out and "decode policy" in out
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir()) == [
        "index.yaml", "opt-1.3b.h200-amx16.b1-p128-g32.yaml", "opt-1.3b.h200-amx16.b8-p128-g32.yaml"]
    metrics = json.loads((tmp_path / "opt-125m.metrics.json").read_text())
    assert metrics["model"] == "opt-125m"
    assert metrics["run"]["gen_len"] == 16 and metrics["run"]["decode_steps"] == 15
    assert metrics["prefill_ms"] > 0 and metrics["decode_ms_per_token"] > 0
