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


# ---------------------------------------------------------------------------------------------------------------
# Hostile checkpoints and bad numbers (issue 13, items 1, 2 and 7)


def test_an_index_cannot_point_outside_the_checkpoint(tmp_path):
    directory = tmp_path / "ckpt"
    cfg = save_hf_checkpoint("llama", directory, seed=5, max_shard_size="40KB")
    outside = tmp_path / "other"
    outside.mkdir()
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    tensor, shard = next(iter(index["weight_map"].items()))
    shutil.copy(directory / shard, outside / "x.safetensors")  # a readable file is there: refused all the same
    index["weight_map"][tensor] = "../other/x.safetensors"
    index_path.write_text(json.dumps(index))
    error = _error(make_plan(cfg, "gpu"), directory)
    assert error.source == str(index_path) and error.path == f"weight_map.{tensor}"
    assert "must name a file inside" in error.message and "'../other/x.safetensors'" in error.message


@pytest.mark.parametrize("header, message", [
    (b"[1, 2]", "its header must be a JSON object, got list"),
    (b'{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', "has a malformed header entry"),
    (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}', "has a malformed header entry"),
    (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, NaN]}}', "not a number JSON allows"),
    (b'{"w": "F32"}', "has a malformed header entry"),
])
def test_malformed_headers_are_one_error(llama, header, message):
    directory, cfg = llama
    path = directory / "model.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    error = _error(make_plan(cfg, "gpu"), directory)
    assert error.source == str(path) and message in error.message


def test_a_weight_map_that_is_not_a_mapping(tmp_path):
    directory = tmp_path / "ckpt"
    cfg = save_hf_checkpoint("llama", directory, seed=5, max_shard_size="40KB")
    index_path = directory / "model.safetensors.index.json"
    index_path.write_text(json.dumps({"weight_map": ["model-00001-of-00002.safetensors"]}))
    error = _error(make_plan(cfg, "gpu"), directory)
    assert error.source == str(index_path) and error.path == "weight_map"


def test_a_tensor_whose_data_does_not_match_its_shape(llama):
    directory, cfg = llama
    path = directory / "model.safetensors"
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    name = "model.layers.0.mlp.down_proj.weight"
    header[name]["shape"] = [header[name]["shape"][0] // 2, header[name]["shape"][1]]
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + length:])
    error = _error(make_plan(cfg, "gpu"), directory)
    assert f"tensor '{name}' has" in error.message and "bytes of data" in error.message


def test_a_nan_weight_stops_generation_naming_the_first_sublayer(llama):
    directory, cfg = llama
    _rewrite(directory, lambda t: t["model.layers.1.mlp.up_proj.weight"].__setitem__((0, 0), float("nan")))
    engine = _engine(make_plan(cfg, "mixed", resident_layers=1), directory)
    with pytest.raises(LiacError) as error:
        engine.generate(PROMPT, 4)
    assert error.value.source == "generate" and "in the prefill" in error.value.message
    assert "the first sublayer whose output is not finite is 'layers.1.gate_up'" in error.value.message


def test_a_nan_reached_only_in_decode_names_its_step(llama):
    directory, cfg = llama
    plan = make_plan(cfg, "gpu")
    first = int(_engine(plan, directory).generate(PROMPT, 2).token_ids[0, 0])
    assert first not in PROMPT[0].tolist()  # its embedding is read first by decode step 1
    _rewrite(directory, lambda t: t["model.embed_tokens.weight"].__setitem__((first, 0), float("inf")))
    with pytest.raises(LiacError) as error:
        _engine(plan, directory).generate(PROMPT, 4)
    assert "at decode step 1" in error.value.message and "is 'embed'" in error.value.message
