"""`--model ORG/NAME` and checkpoints by repo id, through a Hugging Face cache the tests fabricate (no network)."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import save_file

from liac.cli import main
from liac.errors import LiacError
from liac.hub import hub_checkpoint, is_repo_id, resolve_checkpoint
from liac.models import resolve_model
from liac.plan import load_plan

TINY_OPT = {"model_type": "opt", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "ffn_dim": 128, "vocab_size": 100, "max_position_embeddings": 128, "do_layer_norm_before": True,
            "word_embed_proj_dim": 64, "activation_function": "relu", "enable_bias": True}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache (HF_HUB_CACHE) with HF_HUB_OFFLINE=1, and `add(repo_id, files)` to put a repo
    in it as huggingface_hub lays one out: refs/main → commit, snapshots/<commit>/<files>."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # huggingface_hub reads the variable at import
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def add(repo_id: str, files: dict[str, object]):
        repo = cache / ("models--" + repo_id.replace("/", "--"))
        snapshot = repo / "snapshots" / COMMIT
        snapshot.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
        for name, content in files.items():
            if name.endswith(".safetensors"):
                save_file(content, str(snapshot / name))
            else:
                (snapshot / name).write_text(json.dumps(content))
        return snapshot

    add.root = cache
    return add


def test_repo_id_shape():
    assert is_repo_id("facebook/opt-30b") and is_repo_id("meta-llama/Llama-3.1-70B-Instruct")
    for not_one in ("opt-30b", "a/b/c", "/abs/path", "../x", "x/config.json", "./x", "org/", "/name"):
        assert not is_repo_id(not_one), not_one


def test_compile_and_inspect_take_a_repo_id_from_the_cache(hub_cache, tmp_path, capsys):
    hub_cache("acme/tiny-opt", {"config.json": TINY_OPT})
    cfg = resolve_model("acme/tiny-opt")
    assert cfg.name == "tiny-opt" and cfg.hidden_size == 64 and cfg.num_layers == 2
    out = tmp_path / "plan.yaml"
    assert main(["compile", "--model", "acme/tiny-opt", "--hw", "spr-h100", "--gpu-mem", "0", "--batch", "1",
                 "--prompt-len", "16", "--gen-len", "4", "-o", str(out)]) == 0
    plan = load_plan(out)
    assert plan.spec.model.name == "tiny-opt" and plan.spec.model.config_sha256 == cfg.sha256()
    capsys.readouterr()
    assert main(["inspect", "--model", "acme/tiny-opt", "--prompt-len", "16", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["name"] == "tiny-opt"


def test_offline_and_absent_is_one_line(hub_cache, tmp_path, capsys):
    out = tmp_path / "plan.yaml"
    assert main(["compile", "--model", "acme/missing", "--hw", "spr-h100", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("liac compile: --model: 'acme/missing' (config.json) is not in the Hugging Face cache")
    assert str(hub_cache.root) in err[0] and "HF_HUB_OFFLINE is set" in err[0]
    assert not out.exists()


def test_checkpoint_by_repo_id(hub_cache, tmp_path):
    weights = {"w": torch.zeros(2, 2)}
    snapshot = hub_cache("acme/tiny-opt", {"config.json": TINY_OPT, "model.safetensors": weights,
                                           "tokenizer_config.json": {}})
    assert resolve_checkpoint("acme/tiny-opt") == snapshot
    local = tmp_path / "ckpt"
    local.mkdir()
    assert resolve_checkpoint(local) == local  # a directory is used as it is
    hub_cache("acme/config-only", {"config.json": TINY_OPT})
    with pytest.raises(LiacError, match="holds no .safetensors weights and HF_HUB_OFFLINE is set"):
        hub_checkpoint("acme/config-only")
    with pytest.raises(LiacError, match=r"'acme/absent' \(checkpoint\) is not in the Hugging Face cache"):
        resolve_checkpoint("acme/absent")
    with pytest.raises(LiacError, match="must be a checkpoint directory or a Hugging Face repo id"):
        resolve_checkpoint(tmp_path / "nowhere" / "deeper")


def test_online_but_unreachable_says_so(hub_cache, monkeypatch):
    """Online (HF_HUB_OFFLINE unset) with the Hub out of reach and the repo not cached: huggingface_hub raises
    LocalEntryNotFoundError (after its own retries, which this test skips), and that is one line about the
    connection, not about offline mode."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    asked = []

    def unreachable(repo_id, filename, local_files_only):
        asked.append((repo_id, filename, local_files_only))
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    with pytest.raises(LiacError) as info:
        resolve_model("acme/missing")
    assert asked == [("acme/missing", "config.json", False)]  # online: the Hub may be asked
    assert info.value.line() == (f"--model: cannot reach the Hugging Face Hub and 'acme/missing' (config.json) is "
                                 f"not in the cache ({hub_cache.root}): check the connection")
