"""Named architectures with their published shapes, and `resolve_model` for `--model`.

`--model` takes a zoo name (`opt-30b`), a HF `config.json`, a checkpoint directory holding one, or a Hugging Face
repo id (`facebook/opt-30b`), whose config.json comes through the Hugging Face cache (`liac.hub`: the only way
this module touches the network, and not at all with HF_HUB_OFFLINE set). `PUBLISHED_PARAMS` are the parameter counts the model cards / papers state (source per entry),
used by the tests as an independent check on the shapes and on the model code.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from liac.errors import LiacError, brief
from liac.fileio import load_json
from liac.hub import hub_config, is_repo_id
from liac.models.config import ModelConfig, from_hf_config

__all__ = ["ZOO", "PUBLISHED_PARAMS", "resolve_model", "zoo_names"]


def _opt(name, hidden, layers, heads):
    return ModelConfig(name=name, family="opt", hidden_size=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=heads, head_dim=hidden // heads, ffn_dim=4 * hidden, vocab_size=50272,
                       max_position=2048, norm="layernorm", norm_eps=1e-5, activation="relu", qkv_bias=True,
                       proj_bias=True, tie_embeddings=True)


def _llama(name, hidden, layers, heads, kv_heads, ffn, vocab, max_pos, theta, llama3=False, family="llama",
           eps=1e-5, experts=0, top_k=0, tie=False):
    rope = dict(rope_type="llama3", rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                rope_original_max_position=8192) if llama3 else {}
    return ModelConfig(name=name, family=family, hidden_size=hidden, num_layers=layers, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=hidden // heads, ffn_dim=ffn, vocab_size=vocab,
                       max_position=max_pos, norm="rmsnorm", norm_eps=eps, activation="silu",
                       qkv_bias=family == "qwen2", proj_bias=False, tie_embeddings=tie, rope_theta=theta,
                       num_experts=experts, experts_top_k=top_k, **rope)


ZOO: dict[str, ModelConfig] = {c.name: c for c in [
    # OPT (Zhang et al. 2022, Table 1): d_model, layers, heads; FFN = 4·d_model; vocab 50272; tied LM head.
    _opt("opt-125m", 768, 12, 12),
    _opt("opt-1.3b", 2048, 24, 32),
    _opt("opt-6.7b", 4096, 32, 32),
    _opt("opt-13b", 5120, 40, 40),
    _opt("opt-30b", 7168, 48, 56),
    _opt("opt-66b", 9216, 64, 72),
    _opt("opt-175b", 12288, 96, 96),
    # Llama 2 (Touvron et al. 2023) and Llama 3.1 (config.json of meta-llama/*).
    _llama("llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.0),
    _llama("llama-2-13b", 5120, 40, 40, 40, 13824, 32000, 4096, 10000.0),
    _llama("llama-2-70b", 8192, 80, 64, 8, 28672, 32000, 4096, 10000.0),
    _llama("llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256, 131072, 500000.0, llama3=True),
    _llama("llama-3.1-70b", 8192, 80, 64, 8, 28672, 128256, 131072, 500000.0, llama3=True),
    _llama("llama-3.1-405b", 16384, 126, 128, 8, 53248, 128256, 131072, 500000.0, llama3=True),
    # Qwen2.5 (config.json of Qwen/Qwen2.5-*): QKV bias, untied head for 7B and 72B.
    _llama("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, 32768, 1000000.0, family="qwen2", eps=1e-6),
    _llama("qwen2.5-72b", 8192, 80, 64, 8, 29568, 152064, 32768, 1000000.0, family="qwen2", eps=1e-6),
    # Mixtral 8x7B (config.json of mistralai/Mixtral-8x7B-v0.1): 8 experts, top-2 routing.
    _llama("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, 32768, 1000000.0, family="mixtral", experts=8, top_k=2),
]}

# Published parameter counts (exact where the model card / paper gives them).
PUBLISHED_PARAMS: dict[str, tuple[float, str]] = {
    "opt-125m": (125e6, "OPT paper, Table 1 (125M)"),
    "opt-1.3b": (1.32e9, "HF model card facebook/opt-1.3b (1.32B)"),
    "opt-6.7b": (6.7e9, "OPT paper, Table 1"),
    "opt-13b": (12.9e9, "HF model card facebook/opt-13b (12.9B)"),
    "opt-30b": (30.0e9, "OPT paper, Table 1"),
    "opt-66b": (66.0e9, "OPT paper, Table 1"),
    "opt-175b": (175.0e9, "OPT paper, Table 1"),
    "llama-2-7b": (6.74e9, "HF model card meta-llama/Llama-2-7b-hf (6.74B)"),
    "llama-2-13b": (13.0e9, "Llama 2 paper, Table 1"),
    "llama-2-70b": (69.0e9, "HF model card meta-llama/Llama-2-70b-hf (69B)"),
    "llama-3.1-8b": (8.03e9, "HF model card meta-llama/Llama-3.1-8B (8.03B)"),
    "llama-3.1-70b": (70.6e9, "HF model card meta-llama/Llama-3.1-70B (70.6B)"),
    "llama-3.1-405b": (406.0e9, "HF model card meta-llama/Llama-3.1-405B (406B)"),
    "qwen2.5-7b": (7.61e9, "Qwen2.5 model card (7.61B)"),
    "qwen2.5-72b": (72.7e9, "Qwen2.5 model card (72.7B)"),
    "mixtral-8x7b": (46.7e9, "Mixtral paper (46.7B total)"),
}


def zoo_names() -> list[str]:
    return sorted(ZOO)


def resolve_model(spec: str, source: str = "--model") -> ModelConfig:
    """A zoo name, a `config.json` path, a checkpoint directory holding `config.json`, or a Hugging Face repo id
    (its config.json from the Hugging Face cache; named by the repo's name, 'opt-30b') → `ModelConfig`.

    Raises:
        LiacError: unknown name (with the closest zoo names), unreadable or unsupported config, a repo id that
            cannot be had (offline and not cached, no such repo, ...).
    """
    if spec in ZOO:
        return ZOO[spec]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise LiacError(source, f"directory {brief(spec)} holds no config.json")
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise LiacError(source, f"file {brief(spec)} does not exist")
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        return from_hf_config(load_json(path), name=name, source=str(path))
    if is_repo_id(spec):
        where = f"{spec}/config.json"
        return from_hf_config(load_json(hub_config(spec, source), where), name=spec.split("/")[1], source=where)
    close = difflib.get_close_matches(spec, ZOO, n=3, cutoff=0.4)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise LiacError(source, f"unknown model {brief(spec)}: must be a zoo name, a config.json, a checkpoint "
                    f"directory or a Hugging Face repo id like 'facebook/opt-30b'{hint} (zoo: {', '.join(zoo_names())})")
