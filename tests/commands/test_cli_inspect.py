"""`liac inspect`: the table and the JSON against hand formulas, and one clear line for every bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from liac.cli import main


def run_cli(capsys, *argv):
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_matches_hand_formulas(capsys):
    code, out, err = run_cli(capsys, "--model", "opt-1.3b", "--batch", "2", "--prompt-len", "64", "--format", "json")
    assert code == 0 and err == ""
    data = json.loads(out)
    d, B, L = 2048, 2, 64
    assert data["points"] == {"prefill": [B, L, L], "decode": [B, 1, L + 1]}
    model = data["model"]
    assert (model["family"], model["num_layers"], model["hidden_size"], model["num_heads"], model["num_kv_heads"]) \
        == ("opt", 24, d, 32, 32)
    assert abs(model["params"] - 1.32e9) / 1.32e9 < 0.01
    assert model["tied_weights"] == {"lm_head.proj.weight": "embed.tokens.weight"}
    rows = {row["node"]: row for row in data["sublayers"]}
    fc1 = rows["decoder.fc1"]
    assert fc1["count"] == 24 and fc1["weight_bytes"] == 8 * d * d + 2 * 4 * d
    assert fc1["prefill"]["flops"] == 2 * B * L * d * 4 * d
    assert fc1["decode"]["flops"] == 2 * B * d * 4 * d
    assert fc1["decode"]["bytes"] == fc1["weight_bytes"] + 2 * B * d + 2 * B * 4 * d  # weights, in, out
    score = rows["decoder.attn_score"]["decode"]
    assert score["kv_read"] == 2 * B * (L + 1) * d
    assert score["ops_per_byte"] == pytest.approx(score["flops"] / score["bytes"])
    assert rows["head.lm_head"]["prefill"]["flops"] == 2 * B * 1 * d * 50272  # the last position only
    for phase in ("prefill", "decode"):
        flops = sum(r["count"] * r[phase]["flops"] for r in data["sublayers"])
        assert data["totals"][phase]["flops"] == flops
    assert data["totals"]["weight_bytes"] == 2 * model["params"]


def test_table_shows_model_gqa_layers_and_totals(capsys):
    code, out, _ = run_cli(capsys, "--model", "llama-3.1-8b")
    assert code == 0
    header = out.splitlines()[0]
    assert "family llama" in header and "32 layers" in header and "d_model 4096" in header
    assert "32 / 8 (GQA" in header and "8.03 B params" in header
    assert "batch 1, prompt 128 tokens" in out and "(1, 128, 128)" in out and "(1, 1, 129)" in out
    lines = out.splitlines()
    assert any(line.startswith("decoder (×32 layers)") for line in lines)
    for name in ("qkv", "rope", "attn_score", "attn_context", "out_proj", "gate_up", "down", "lm_head"):
        assert any(line.split()[:1] == [name] for line in lines), name
    assert lines[-1].startswith("total (all layers)")
    assert not any(line.startswith("tied:") for line in lines)  # Llama 3.1 8B has its own LM head


def test_config_json_and_checkpoint_dir(tmp_path, capsys):
    config = {"model_type": "qwen2", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
              "num_hidden_layers": 3, "vocab_size": 1000, "max_position_embeddings": 512, "intermediate_size": 512}
    (tmp_path / "tiny-qwen").mkdir()
    (tmp_path / "tiny-qwen" / "config.json").write_text(json.dumps(config))
    code, out, _ = run_cli(capsys, "--model", str(tmp_path / "tiny-qwen"), "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["model"]["name"] == "tiny-qwen" and data["model"]["num_kv_heads"] == 2
    qkv = next(r for r in data["sublayers"] if r["node"] == "decoder.qkv")
    assert qkv["weight_bytes"] == 2 * (256 * (256 + 2 * 64) + (256 + 2 * 64))  # Qwen2 has a QKV bias


@pytest.mark.parametrize("argv, words", [
    (["--model", "opt-3b"], "--model: unknown model 'opt-3b': must be a zoo name"),
    (["--model", "opt-1.3b", "--batch", "0"], "--batch: must be a positive integer, got '0'"),
    (["--model", "opt-1.3b", "--batch", "x"], "--batch: must be a positive integer, got 'x'"),
    (["--model", "opt-1.3b", "--prompt-len", "-3"], "--prompt-len: must be a positive integer, got '-3'"),
    (["--model", "opt-1.3b", "--prompt-len", "2048"], "--prompt-len: must be less than 2048"),
    (["--model", "opt-1.3b", "--format", "yaml"], "--format: unsupported value 'yaml'"),
])
def test_bad_arguments_one_line_exit_2(capsys, argv, words):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("liac inspect: ") and words in err, err


def test_unknown_model_suggests_closest(capsys):
    _, _, err = run_cli(capsys, "--model", "llama-3.1-7b")
    suggestions = err.split("did you mean ")[1].split("?")[0]
    assert "'llama-3.1-8b'" in suggestions


@pytest.mark.parametrize("text, words", [
    ("{not json", "not valid JSON"),
    ('{"model_type": "gpt2"}', "model_type: unsupported model_type 'gpt2'"),
    ('{"model_type": "qwen2_moe", "hidden_size": 64}', "model_type: model_type 'qwen2_moe' is not supported yet: "
     "Qwen2-MoE's shared expert and its sigmoid gate"),
    ('{"model_type": "llama", "hidden_size": -1}', "hidden_size: must be a positive integer"),
    ('[1, 2]', "must be a JSON object"),
])
def test_bad_config_json(tmp_path, capsys, text, words):
    path = tmp_path / "config.json"
    path.write_text(text)
    code, out, err = run_cli(capsys, "--model", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"liac inspect: {path}") and words in err, err


def test_console_script_prints_one_line_and_exits_2():
    script = Path(sys.executable).parent / "liac"
    assert script.exists(), f"the 'liac' console script must be installed beside {sys.executable}"
    result = subprocess.run([str(script), "inspect", "--model", "opt-3b"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "did you mean 'opt-30b'" in result.stderr
    assert "Traceback" not in result.stderr
