"""Checkpoints: sharded loading, chunked reads, and one clear error for every broken checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from runtime_plans import make_plan, save_hf_checkpoint
from safetensors.torch import load_file, save_file

import liac.runtime.weights as weights_module
from liac.errors import LiacError
from liac.runtime import Engine
from liac.runtime.backend import EmulatedBackend
from liac.runtime.weights import Checkpoint

PROMPT = torch.arange(3, 11)[None]


def _engine(plan, directory, **kwargs):
    return Engine.from_plan(plan, directory, backend=EmulatedBackend(), dtype=torch.float32, **kwargs)


@pytest.fixture
def llama(checkpoints, tmp_path):
    """A private copy of the tiny Llama checkpoint (tests may break it)."""
    source, cfg = checkpoints("llama")
    directory = tmp_path / "llama"
    shutil.copytree(source, directory)
    return directory, cfg


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    cfg = save_hf_checkpoint("llama", single, seed=5)
    assert save_hf_checkpoint("llama", sharded, seed=5, max_shard_size="40KB").sha256() == cfg.sha256()
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2  # really sharded
    plan = make_plan(cfg, "mixed", resident_layers=1)
    want = _engine(plan, single).generate(PROMPT, 6).token_ids  # same seed → same weights
    assert torch.equal(_engine(plan, sharded).generate(PROMPT, 6).token_ids, want)


def test_chunked_reads_give_the_same_model(checkpoints, monkeypatch):
    directory, cfg = checkpoints("opt")
    plan = make_plan(cfg, "partial")
    want = _engine(plan, directory).generate(PROMPT, 6, return_logits=True).logits
    monkeypatch.setattr(weights_module, "CHUNK_BYTES", 1000)  # a few rows per read
    assert torch.equal(_engine(plan, directory).generate(PROMPT, 6, return_logits=True).logits, want)


def test_progress_goes_to_stderr(checkpoints, capsys):
    directory, cfg = checkpoints("qwen2")
    _engine(make_plan(cfg, "gpu"), directory, progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "lia-run: loading weights: 100%" in captured.err  # a tqdm bar


def _rewrite(directory, change):
    path = directory / "model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _error(plan, directory) -> LiacError:
    with pytest.raises(LiacError) as error:
        _engine(plan, directory)
    assert "\n" not in error.value.line()
    return error.value


def test_missing_tensor(llama):
    directory, cfg = llama
    _rewrite(directory, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    error = _error(make_plan(cfg, "gpu"), directory)
    assert error.message == ("tensor 'model.layers.1.mlp.up_proj.weight' is missing (needed for "
                             "'layers.1.gate_up.proj.weight')")


def test_wrong_shape(llama):
    directory, cfg = llama
    _rewrite(directory, lambda t: t.update({"model.layers.0.self_attn.o_proj.weight": torch.zeros(64, 32)}))
    error = _error(make_plan(cfg, "gpu"), directory)
    assert "tensor 'model.layers.0.self_attn.o_proj.weight' has shape [64, 32]: must be [64, 64]" in error.message


def test_truncated_file(llama):
    directory, cfg = llama
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    error = _error(make_plan(cfg, "gpu"), directory)
    assert error.source == str(path) and error.message.startswith("truncated: tensor '")


def test_not_safetensors(llama):
    directory, cfg = llama
    (directory / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    assert "not a safetensors file" in _error(make_plan(cfg, "gpu"), directory).message


def test_no_weights_or_no_config(llama, tmp_path):
    directory, cfg = llama
    (directory / "config.json").unlink()
    assert _error(make_plan(cfg, "gpu"), directory).message.startswith("cannot read")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no .safetensors files" in _error(make_plan(cfg, "gpu"), empty).message


def test_checkpoint_of_another_model(checkpoints):
    opt_dir, _ = checkpoints("opt")
    _, llama_cfg = checkpoints("llama")
    error = _error(make_plan(llama_cfg, "gpu"), opt_dir)
    assert error.source == str(opt_dir / "config.json")
    assert "must be" in error.message and "the model the plan was compiled for ('llama')" in error.message


def test_header_check_reads_no_tensor_data(checkpoints, monkeypatch):
    directory, _ = checkpoints("opt")
    ckpt = Checkpoint.open(directory)
    monkeypatch.setattr(Checkpoint, "read_rows", lambda *a: pytest.fail("tensor data read during the check"))
    assert "model.decoder.embed_tokens.weight" in ckpt.entries
