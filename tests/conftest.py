"""Shared by every test folder: a fresh user cache directory per test, tiny model configs written as HF
config.json (`tiny`), and the hand-made plans of tests/artifacts/artifact_plans.py importable by name, whichever
subset of the suite pytest runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "artifacts"))

# Under pytest-xdist (`make test` runs two workers) each worker gets its share of the cores for torch's threads, in
# this process and in the commands tests start, instead of every worker spinning one thread per core.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0))
                                            // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TINY_OPT = {"model_type": "opt", "hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 4,
            "ffn_dim": 512, "vocab_size": 1000, "max_position_embeddings": 256, "do_layer_norm_before": True,
            "word_embed_proj_dim": 128, "activation_function": "relu", "enable_bias": True}
TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 3, "intermediate_size": 352, "vocab_size": 1000,
              "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
              "tie_word_embeddings": False}


@pytest.fixture(autouse=True)
def user_cache_dir(tmp_path_factory, monkeypatch):
    """A fresh user cache directory per test (XDG_CACHE_HOME), so no test reads or writes this user's own host
    profile (`liac.profile.host_profile_path()`)."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture()
def tiny(tmp_path):
    """tiny("tiny-opt") → a directory holding the config.json of TINY_OPT ("tiny-llama": TINY_LLAMA)."""
    configs = {"tiny-opt": TINY_OPT, "tiny-llama": TINY_LLAMA}

    def write(name):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(configs[name]))
        return str(folder)
    return write
