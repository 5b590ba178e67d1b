"""`liac.quick.generate` / `load`: compile or reuse a cached plan, run it, return text; and the tiny
checkpoint of the README quickstart (liac/tiny.py) from `scripts/make-tiny-checkpoint` to text on stdout.

References: HF `generate` + the tokenizer's decode on the same checkpoint, in float32."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import liac.quick
from liac.errors import LiacError
from liac.quick import generate, load, workload_bucket
from liac.tiny import make_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A briefly trained tiny checkpoint (a few steps: enough to be a real checkpoint, not a good model)."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-llama", steps=3)


def _hf(directory, prompts, new_tokens):
    from transformers import AutoTokenizer, GenerationConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(directory, padding_side="left")
    model = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        out = model.generate(**enc, generation_config=config)[:, enc["input_ids"].shape[1]:]
    return [tokenizer.decode(row, skip_special_tokens=True) for row in out]


def test_generate_compiles_once_and_reuses_the_plan(tiny, user_cache_dir, capsys):
    # no hw: this host's profile (measured on first use, said on stderr); a host without CUDA plans for the CPU
    out = generate(tiny, ["The GPU", "Once upon a time"], max_new_tokens=12, dtype="float32")
    assert "measuring it with a quick probe" in capsys.readouterr().err
    assert list(out.text) == _hf(tiny, ["The GPU", "Once upon a time"], 12)
    assert out.prefill_seconds > 0 and out.token_ids.shape[0] == 2
    folder = user_cache_dir / "liac" / "plans"  # the user's cache directory (XDG_CACHE_HOME here)
    plans = sorted(folder.iterdir())
    assert len(plans) == 1 and ".b2-p16-g16.tiny-llama.host." in plans[0].name

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again")

    with pytest.MonkeyPatch.context() as patch:  # (monkeypatch.undo would also drop the test's cache directory)
        patch.setattr(liac.quick, "compile_plans", no_compile)
        again = generate(tiny, "The CPU", max_new_tokens=10, dtype="float32")  # within b2-p16-g16
    assert sorted(folder.iterdir()) == plans
    assert list(again.text) == _hf(tiny, ["The CPU"], 10)
    generate(tiny, "The CPU", max_new_tokens=40)  # a longer generation: a new plan
    assert len(list(folder.iterdir())) == 2
    generate(tiny, "The CPU", max_new_tokens=10, hw="h200-amx16", gpu_mem=0)  # another profile: another plan
    assert len(list(folder.iterdir())) == 3


def test_load_keeps_an_engine(tiny, tmp_path):
    with load(tiny, batch=3, hw="h200-amx16", gpu_mem=0, dtype="float32", cache=tmp_path) as engine:
        assert engine.plan.spec.workload.batch_size == 4
        first = engine.generate("The plan", 8, temperature=0.9, seed=2)
        assert first.text == engine.generate("The plan", 8, temperature=0.9, seed=2).text


def test_quick_errors_are_one_line(tiny, tmp_path, monkeypatch):
    with pytest.raises(LiacError, match="model: must be a checkpoint directory or a Hugging Face repo id"):
        generate(tmp_path / "absent" / "deeper", "hi")
    with pytest.raises(LiacError, match="gpu_mem: must be a size"):
        liac.quick.plan_for(tiny, hw="h200-amx16", gpu_mem="lots", cache=tmp_path)
    with pytest.raises(LiacError, match="dtype: unsupported value 'fp8'"):
        load(tiny, hw="h200-amx16", gpu_mem=0, dtype="fp8", cache=tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("LIAC_EMULATE_GPU", raising=False)
    with pytest.raises(LiacError, match="gpu_mem: must be 0 on this host: no CUDA device is available"):
        generate(tiny, "hi", hw="h200-amx16", gpu_mem="24GiB", cache=tmp_path)


def test_workload_bucket():
    assert workload_bucket(3, 20, 32, 2048) == (4, 32, 32)
    assert workload_bucket(1, 3, 5, 2048) == (1, 16, 16)
    assert workload_bucket(1, 100, 30, 160) == (1, 128, 32)
    assert workload_bucket(1, 100, 30, 150) == (1, 100, 32)   # 128 + 32 would not fit, the prompt is kept
    assert workload_bucket(1, 100, 50, 150) == (1, 100, 50)   # neither: the request itself


def test_the_quickstart_script_to_text(tmp_path):
    """README quickstart: make the checkpoint, compile a CPU plan for it, lia-run a prompt: stdout is HF's text."""
    bin_dir = Path(sys.executable).parent
    ckpt = tmp_path / "tiny-llama"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make-tiny-checkpoint"), str(ckpt), "--steps", "20"],
                   check=True, capture_output=True)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= {p.name for p in ckpt.iterdir()}
    plan = tmp_path / "tiny.yaml"
    subprocess.run([str(bin_dir / "liac"), "compile", "--model", str(ckpt), "--batch", "1", "-o", str(plan)],
                   check=True, capture_output=True)  # for this host: CPU plans without a GPU
    run = subprocess.run([str(bin_dir / "lia-run"), str(plan), "--weights", str(ckpt), "--prompt", "The GPU",
                          "--gen-len", "16", "--dtype", "float32"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout == _hf(ckpt, ["The GPU"], 16)[0] + "\n"
