"""`liac compile` end to end (real tracer, tiny models from config.json), its small parsers, schema freshness."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from liac.api import compile_plans, parse_batches, parse_bytes, plan_costs, unit_prices, write_plans
from liac.artifacts.validate import validate_path
from liac.cli import main
from liac.errors import LiacError
from liac.plan import load_plan, parse_plan, plan_to_yaml, schema_text

ROOT = Path(__file__).parents[1]

TINY_OPT = {"model_type": "opt", "hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 4,
            "ffn_dim": 512, "vocab_size": 1000, "max_position_embeddings": 256, "do_layer_norm_before": True,
            "word_embed_proj_dim": 128, "activation_function": "relu", "enable_bias": True}
TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 3, "intermediate_size": 352, "vocab_size": 1000,
              "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
              "tie_word_embeddings": False}


@pytest.fixture()
def tiny(tmp_path):
    def write(name, config):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        return str(folder)
    return write


# ---------------------------------------------------------------------------------------------------------------
# Parsers


def test_parse_batches():
    assert parse_batches("1..256") == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert parse_batches("4..20") == (4, 8, 16)
    assert parse_batches("64,1,8,8") == (1, 8, 64)
    assert parse_batches(" 32 ") == (32,)
    for bad in ("0", "x", "8..4", "3..16", "1,,2", "-1", "1.5", "0..8"):
        with pytest.raises(LiacError) as info:
            parse_batches(bad)
        assert info.value.source == "--batch"


def test_parse_bytes():
    assert parse_bytes("24GiB", "--gpu-mem") == 24 * 2**30
    assert parse_bytes("24GB", "--gpu-mem") == 24 * 10**9
    assert parse_bytes("512MiB", "--gpu-mem") == 512 * 2**20
    assert parse_bytes("1.5TiB", "--cpu-mem") == int(1.5 * 2**40)
    assert parse_bytes("1000B", "--cpu-mem") == 1000
    assert parse_bytes("0", "--cxl-mem") == 0
    assert parse_bytes("0.0", "--cxl-mem") == 0
    for bad in ("24 parsecs", "GiB", "-1GiB", "1e9", "24", "1000", "1.5"):  # a number without a unit is refused
        with pytest.raises(LiacError) as info:
            parse_bytes(bad, "--gpu-mem")
        assert info.value.line() == (f"--gpu-mem: must be a size with a unit, like '24GiB', '24GB' or '512MiB' "
                                     f"(or 0), got '{bad}'")


def test_committed_schema_is_generated_from_plan_py():
    assert (ROOT / "liac" / "schema" / "offload-plan-v2.schema.json").read_text() == schema_text()


# ---------------------------------------------------------------------------------------------------------------
# CLI


def test_sweep_writes_valid_plans_index_and_table(tiny, tmp_path, capsys):
    model = tiny("tiny-opt", TINY_OPT)
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
    model = tiny("tiny-llama", TINY_LLAMA)
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert main(["compile", "--model", model, "--hw", "h200-amx16", "--batch", "1,16", "--prompt-len", "16",
                     "--gen-len", "4", "--gpu-mem", "3MiB", "--solver", "cbc", "-o", str(out)]) == 0
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) == 3


def test_single_point_to_a_file_and_policy(tiny, tmp_path, capsys):
    model = tiny("tiny-opt", TINY_OPT)
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
    model = tiny("tiny-opt", TINY_OPT)
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
    model = tiny("tiny-opt", TINY_OPT)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "liac", "compile", "--model", model, "--hw", "spr-h100",
                           "--batch", "4", "--gpu-mem", "1MiB", "--cpu-mem", "2MiB", "-o", str(out)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 3  # infeasible, not bad input (docs/cli.md)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("liac compile: compile: batch 4: constraint mem_total: ")
    assert "short by" in proc.stderr and "MiB" in proc.stderr
    assert not out.exists()


def test_sweep_keeps_feasible_points_and_lists_the_rest(tiny, tmp_path):
    model = tiny("tiny-llama", TINY_LLAMA)
    # KV grows with the batch: 1 fits in 4 MiB of DDR, 64 does not (nor in all tiers together)
    result = compile_plans(model, "spr-h100", batches=(1, 64), prompt_len=64, gen_len=8, gpu_mem=0,
                           cpu_mem=4 * 2**20)
    assert [p.plan.spec.workload.batch_size for p in result.points] == [1]
    assert [b for b, _ in result.infeasible] == [64]
    write_plans(result, tmp_path / "sweep")
    index = yaml.safe_load((tmp_path / "sweep" / "index.yaml").read_text())
    assert index["infeasible"][0]["batch_size"] == 64 and "mem_total" in index["infeasible"][0]["reason"]
    with pytest.raises(LiacError, match="names one file"):
        write_plans(result, tmp_path / "one.yaml")


def test_partly_infeasible_sweep_exits_3_writes_the_rest_and_json_parses(tiny, tmp_path, capsys):
    model = tiny("tiny-llama", TINY_LLAMA)
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
    model = tiny("tiny-opt", TINY_OPT)
    argv = ["compile", "--model", model, "--hw", "spr-h100", "--batch", "1,2", "--prompt-len", "16", "--gen-len",
            "4", "--gpu-mem", "1MiB"]
    assert main(argv + ["-o", str(tmp_path / "quiet")]) == 0
    assert capsys.readouterr().err == ""  # not a terminal: quiet
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv + ["-o", str(tmp_path / "bar")]) == 0
    drawn = terminal.getvalue()
    assert "compile tiny-opt" in drawn and "2/2" in drawn and "batch 2" in drawn


def test_explain_can_reprice_a_plan(tiny, tmp_path):
    """plan_costs rebuilds the CostGraph from spec alone; unit_prices gives both devices' times per unit."""
    model = tiny("tiny-opt", TINY_OPT)
    result = compile_plans(model, "spr-h100", batches=(4,), prompt_len=32, gen_len=8, gpu_mem=2**21)
    point = result.points[0]
    again = plan_costs(point.plan)
    assert again.to_json() == point.costs.to_json()
    prices = unit_prices(point.plan)
    groups = point.plan.spec.layer_groups
    assert len(prices) == 2 * sum(len(g.sublayers) for g in groups)
    for price in prices:
        assert price.gpu_seconds > 0
        if price.device == "cpu":
            assert price.cpu_seconds is not None and price.cpu_seconds > 0


@pytest.mark.parametrize("model, profile, gpu_gib, headroom", [
    ("opt-30b", "h200-amx16", 24, "35 GB/s of headroom"), ("opt-175b", "spr-h100", None, "50 GB/s of headroom"),
    ("opt-175b", "spr-h100 saturated", None, "the CPU alone saturates DDR (210 of 210 GB/s)"),
])
def test_a_split_plan_reprices_and_explains(model, profile, gpu_gib, headroom):
    """A compiled split plan (batch 1): re-pricing it from its spec gives the predicted times it carries, its
    split units' price is the slower part of the split plus the sync, and explain weighs both whole alternatives
    and says why the split pays: the DDR headroom PCIe has beside the CPU's reads (Eq. 18), or, where the CPU
    alone saturates DDR (spr-h100 with ddr_shared = the CPU's rate), that PCIe reads DDR only while the CPU does
    not."""
    import dataclasses

    from liac.artifacts.explain import explain_plan
    from liac.passes.costs import layer_seconds
    from liac.passes.ilp import unit_tiers
    from liac.profile import GIB, resolve_profile

    hw = resolve_profile(profile.split()[0])
    if profile.endswith("saturated"):
        hw = dataclasses.replace(hw, ddr_shared_gb_per_s=hw.cpu_ddr_read_gb_per_s)
    result = compile_plans(model, hw, batches=(1,), gpu_mem=None if gpu_gib is None else gpu_gib * GIB)
    (point,) = result.points
    plan = parse_plan(yaml.safe_load(plan_to_yaml(point.plan)), "plan")  # through YAML, as liac explain reads it
    costs = plan_costs(plan, hw=hw)
    total = 0.0
    for group in plan.spec.layer_groups:
        cls = costs.layer_class(group.layer_class)
        tiers = unit_tiers(cls, tuple(s.weights for s in group.sublayers), group.kv_cache)
        for phase in ("prefill", "decode"):
            shares = [[1 - s.cpu_permille(phase) / 1000 for s in group.sublayers]]
            total += float(layer_seconds(costs, cls, phase, tiers, shares)[0][0]) * group.layer_count
    assert total == pytest.approx(plan.status.predicted.total_seconds, rel=1e-5)
    prices = [p for p in unit_prices(plan, costs=costs) if p.device == "split"]
    assert prices and all(0 < p.cpu_permille < 1000 and p.split_seconds > hw.split_sync_seconds for p in prices)
    explained = [u for u in explain_plan(plan, hw=hw).units if u.device == "split"]
    assert len(explained) == len(prices)
    for u in explained:
        assert u.reason.startswith("split, ") and "wholly on the CPU" in u.reason and "wholly on the GPU" in u.reason
        assert headroom in u.reason and "sync 50 µs" in u.reason