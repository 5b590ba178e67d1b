"""`liac compile` end to end (real tracer, tiny models from config.json): the sweep, its index and table, byte-identical
output, one file per point, and one line and exit 2 for every bad flag or an infeasible budget."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import yaml

from liac.artifacts.validate import validate_path
from liac.cli import main
from liac.plan import load_plan


def test_sweep_writes_valid_plans_index_and_table(tiny, tmp_path, capsys):
    model = tiny("tiny-opt")
    out = tmp_path / "sweep"
    code = main(["compile", "--model", model, "--hw", "spr-h100", "--batch", "1..8", "--prompt-len", "32",
                 "--gen-len", "8", "--gpu-mem", "2MiB", "-o", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "batch" in text and "decode policy" in text and "wrote" in text
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["index.yaml"] + [f"tiny-opt.spr-h100.b{b}-p32-g8.yaml" for b in (1, 2, 4, 8)])
    index = yaml.safe_load((out / "index.yaml").read_text())
    assert [p["batch_size"] for p in index["points"]] == [1, 2, 4, 8]
    for row in index["points"]:
        plan = load_plan(out / row["file"])
        assert row["total_seconds"] == plan.status.predicted.total_seconds
        assert row["memory"]["hbm_bytes"] <= 2 * 2**20
        assert row["solver"]["status"] == "optimal" and row["solver"]["gap"] == 0.0
        assert set(row["decode"].replace("+", "").replace("x", "")) <= set("0123456789CG")
    # liac validate's checks (schema, semantics, footprint recomputed from the architecture, index vs plans)
    checked, findings = validate_path(out)
    assert [f.line() for f in findings if f.severity == "error"] == []
    assert len(checked) == 5
    # a narrower sweep into the same directory replaces the plans the old index listed
    assert main(["compile", "--model", model, "--hw", "spr-h100", "--batch", "2", "--prompt-len", "32",
                 "--gen-len", "8", "--gpu-mem", "2MiB", "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.yaml", "tiny-opt.spr-h100.b2-p32-g8.yaml"]


def test_compiling_twice_is_byte_identical(tiny, tmp_path):
    model = tiny("tiny-llama")
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert main(["compile", "--model", model, "--hw", "h200-amx16", "--batch", "1,16", "--prompt-len", "16",
                     "--gen-len", "4", "--gpu-mem", "3MiB", "--solver", "cbc", "-o", str(out)]) == 0
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) == 3


def test_single_point_to_a_file_and_policy(tiny, tmp_path, capsys):
    model = tiny("tiny-opt")
    target = tmp_path / "plan.yaml"
    assert main(["compile", "--model", model, "--hw", "spr-h100-cxl", "--batch", "2", "--policy", "lia-cpu",
                 "--gpu-mem", "1MiB", "--cxl-mem", "1GiB", "-o", str(target)]) == 0
    plan = load_plan(target)
    assert plan.metadata.name == "tiny-opt.spr-h100-cxl.b2-p128-g32.lia-cpu"
    assert plan.spec.budgets.cxl_bytes == 2**30 and plan.spec.budgets.gpu_bytes == 2**20
    for group in plan.spec.layer_groups:
        if group.layer_class == "decoder" and group.kv_cache != "hbm":
            assert {s.decode for s in group.sublayers} == {"cpu"}


@pytest.mark.parametrize("argv, where", [
    (["--batch", "x"], "--batch"),
    (["--gpu-mem", "24 parsecs"], "--gpu-mem"),
    (["--policy", "fastest"], "--policy"),
    (["--hw", "nope"], "--hw"),
    (["--cxl-mem", "1GiB"], "--cxl-mem"),  # spr-h100 has no CXL
    (["--prompt-len", "250", "--gen-len", "32"], "--gen-len"),  # beyond the model's 256 positions
])
def test_bad_flags_are_one_line(tiny, tmp_path, capsys, argv, where):
    model = tiny("tiny-opt")
    base = ["compile", "--model", model, "--hw", "spr-h100", "-o", str(tmp_path / "out")]
    for i in range(0, len(argv), 2):  # later flags win over the base ones
        if argv[i] in base:
            base[base.index(argv[i]) + 1] = argv[i + 1]
        else:
            base += argv[i:i + 2]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"liac compile: {where}: ")
    assert not (tmp_path / "out").exists()


def test_infeasible_is_one_line_and_writes_nothing(tiny, tmp_path):
    model = tiny("tiny-opt")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "liac", "compile", "--model", model, "--hw", "spr-h100",
                           "--batch", "4", "--gpu-mem", "1MiB", "--cpu-mem", "2MiB", "-o", str(out)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 3  # infeasible, not bad input (docs/cli.md)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("liac compile: compile: batch 4: constraint mem_total: ")
    assert "short by" in proc.stderr and "MiB" in proc.stderr
    assert not out.exists()


def test_partly_infeasible_sweep_exits_3_writes_the_rest_and_json_parses(tiny, tmp_path, capsys):
    model = tiny("tiny-llama")
    out = tmp_path / "sweep"
    argv = ["compile", "--model", model, "--hw", "spr-h100", "--batch", "1,64", "--prompt-len", "64", "--gen-len",
            "8", "--gpu-mem", "0", "--cpu-mem", "4MiB", "-o", str(out), "--json"]
    assert main(argv) == 3
    stdout, stderr = capsys.readouterr()
    doc = json.loads(stdout)  # stdout is one JSON document, nothing else
    assert [p["batch_size"] for p in doc["points"]] == [1]
    assert doc["infeasible"][0]["batch_size"] == 64 and "mem_total" in doc["infeasible"][0]["reason"]
    assert sorted(doc["written"]) == sorted(str(p) for p in out.iterdir())
    assert load_plan(out / doc["points"][0]["file"]).spec.workload.batch_size == 1
    index = yaml.safe_load((out / "index.yaml").read_text())
    assert doc["points"] == index["points"] and doc["infeasible"] == index["infeasible"]  # the same numbers
    assert "decode policy" in stderr and "64     infeasible: " in stderr  # the human table went to stderr
    assert stderr.strip().splitlines()[-1] == ("liac compile: 1 of 2 points infeasible (batch 64); the feasible "
                                               "ones are written")
    # no point feasible: exit 3 too, one line, an error document, nothing written
    argv[argv.index("1,64")] = "64"
    argv[argv.index(str(out))] = str(tmp_path / "none")
    assert main(argv) == 3
    stdout, stderr = capsys.readouterr()
    assert json.loads(stdout)["written"] == [] and "batch 64: constraint mem_total" in json.loads(stdout)["error"]
    assert stderr.count("\n") == 1 and stderr.startswith("liac compile: compile: batch 64: constraint mem_total")
    assert not (tmp_path / "none").exists()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal(tiny, tmp_path, capsys, monkeypatch):
    model = tiny("tiny-opt")
    argv = ["compile", "--model", model, "--hw", "spr-h100", "--batch", "1,2", "--prompt-len", "16", "--gen-len",
            "4", "--gpu-mem", "1MiB"]
    assert main(argv + ["-o", str(tmp_path / "quiet")]) == 0
    assert capsys.readouterr().err == ""  # not a terminal: quiet
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv + ["-o", str(tmp_path / "bar")]) == 0
    drawn = terminal.getvalue()
    assert "compile tiny-opt" in drawn and "2/2" in drawn and "batch 2" in drawn
