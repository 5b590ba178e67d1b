"""The zoo's shapes against published parameter counts, and `resolve_model` / `from_hf_config` inputs."""

import dataclasses
import json

import pytest
import torch

from liac.errors import LiacError
from liac.models import PUBLISHED_PARAMS, ZOO, build_model, from_hf_config, resolve_model


def meta_param_count(cfg) -> int:
    """Parameters of the model built on the meta device (a tied embedding counted once)."""
    with torch.device("meta"):
        model = build_model(cfg)
    return sum(p.numel() for p in model.parameters())


def test_every_zoo_model_has_a_published_count():
    assert set(PUBLISHED_PARAMS) == set(ZOO)


@pytest.mark.parametrize("name", sorted(ZOO))
def test_param_count_within_one_percent_of_published(name):
    published, source = PUBLISHED_PARAMS[name]
    count = meta_param_count(ZOO[name])
    assert abs(count - published) / published < 0.01, f"{name}: {count / 1e9:.3f} B vs {source}"


def test_tied_embedding_counted_once():
    cfg = ZOO["opt-1.3b"]
    untied = dataclasses.replace(cfg, tie_embeddings=False)
    assert meta_param_count(untied) - meta_param_count(cfg) == cfg.vocab_size * cfg.hidden_size


def test_resolve_zoo_name_config_file_and_directory(tmp_path):
    assert resolve_model("opt-30b") is ZOO["opt-30b"]
    hf = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 512, "intermediate_size": 512}
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(hf))
    from_dir = resolve_model(str(tmp_path / "tiny"))
    from_file = resolve_model(str(tmp_path / "tiny" / "config.json"))
    assert from_dir == from_file
    assert (from_dir.name, from_dir.num_kv_heads, from_dir.head_dim) == ("tiny", 2, 32)


def test_unknown_name_suggests_the_closest():
    with pytest.raises(LiacError) as err:
        resolve_model("opt-3b")
    assert "'opt-30b'" in err.value.line() and err.value.source == "--model"


@pytest.mark.parametrize("config, path, words", [
    ({"model_type": "gpt2"}, "model_type", "must be one of"),
    ({"model_type": "llama", "hidden_size": "x"}, "hidden_size", "must be int"),
    ({"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
      "vocab_size": 10, "max_position_embeddings": 8, "ffn_dim": 128, "do_layer_norm_before": False},
     "do_layer_norm_before", "not supported"),
])
def test_unsupported_hf_configs_name_the_field(config, path, words):
    with pytest.raises(LiacError) as err:
        from_hf_config(config)
    assert err.value.path == path and words in err.value.message
