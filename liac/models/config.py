"""`ModelConfig`: the shape of a decoder-only transformer, and reading it from a HF `config.json`.

One frozen dataclass for every family; the family name picks the module in `liac.models` that builds it.
`sha256()` hashes the architecture (every field but `name`), so a plan, a checkpoint and a zoo entry can be
matched without trusting names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from liac.errors import LiacError

__all__ = ["ModelConfig", "FAMILIES", "from_hf_config"]

FAMILIES = ("opt", "llama", "qwen2", "mixtral")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only transformer (all sizes in elements, not bytes)."""

    name: str
    family: str  # one of FAMILIES
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # < num_heads means grouped-query attention
    head_dim: int
    ffn_dim: int  # per expert for MoE
    vocab_size: int
    max_position: int
    norm: str  # 'layernorm' | 'rmsnorm'
    norm_eps: float
    activation: str  # 'relu' (OPT fc1) | 'silu' (SwiGLU gate)
    qkv_bias: bool
    proj_bias: bool  # bias on the output projection and the MLP linears
    tie_embeddings: bool
    rope_theta: float = 0.0  # 0 means learned absolute positions (OPT)
    rope_type: str = "default"  # 'default' | 'llama3'
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 1.0
    rope_original_max_position: int = 0
    num_experts: int = 0  # 0 for dense models
    experts_top_k: int = 0
    dtype: str = "bfloat16"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_rope(self) -> bool:
        return self.rope_theta > 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "config") -> "ModelConfig":
        """Inverse of `to_dict`, with one clear error for a missing or unknown field."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise LiacError(source, f"unknown field '{unknown[0]}': must be one of {', '.join(sorted(fields))}")
        missing = [name for name, f in fields.items()
                   if name not in data and f.default is dataclasses.MISSING]
        if missing:
            raise LiacError(source, f"field '{missing[0]}' is required", path=missing[0])
        try:
            return cls(**dict(data))
        except (TypeError, ValueError) as e:
            raise LiacError(source, str(e)) from e

    def sha256(self) -> str:
        """Hash of the architecture: every field except `name`, canonical JSON."""
        body = {k: v for k, v in self.to_dict().items() if k != "name"}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def with_layers(self, num_layers: int, name: str | None = None) -> "ModelConfig":
        return dataclasses.replace(self, num_layers=num_layers, name=name or f"{self.name}-{num_layers}l")


# ---------------------------------------------------------------------------------------------------------------
# HF config.json → ModelConfig


def _get(cfg: Mapping[str, Any], key: str, source: str, kind: type | tuple = int, default: Any = ...) -> Any:
    if key not in cfg or cfg[key] is None:
        if default is ...:
            raise LiacError(source, f"field '{key}' is required for model_type '{cfg.get('model_type')}'", path=key)
        return default
    value = cfg[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise LiacError(source, f"must be {want}, got {value!r}", path=key)
    if kind is int and value <= 0:
        raise LiacError(source, f"must be a positive integer, got {value!r}", path=key)
    return value


def _rope(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    # transformers 5 writes `rope_parameters`; 4.x wrote `rope_theta` + `rope_scaling`.
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    if not isinstance(scaling, Mapping) or not isinstance(params, Mapping):
        raise LiacError(source, "must be a mapping", path="rope_scaling")
    params = {**scaling, **params}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise LiacError(source, f"unsupported rope type '{rope_type}': must be 'default' or 'llama3'",
                        path="rope_scaling.rope_type")
    out = {"rope_theta": float(theta), "rope_type": rope_type}
    if rope_type == "llama3":
        out.update(
            rope_factor=float(params["factor"]),
            rope_low_freq_factor=float(params["low_freq_factor"]),
            rope_high_freq_factor=float(params["high_freq_factor"]),
            rope_original_max_position=int(params["original_max_position_embeddings"]),
        )
    return out


def from_hf_config(cfg: Mapping[str, Any], name: str = "custom", source: str = "config.json") -> ModelConfig:
    """Read a HF `config.json` (already parsed) for one of the supported families.

    Raises:
        LiacError: naming the field when the config is malformed or uses a feature liac does not model.
    """
    if not isinstance(cfg, Mapping):
        raise LiacError(source, "must be a JSON object")
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        raise LiacError(source, f"unsupported model_type {model_type!r}: must be one of "
                        + ", ".join(f"'{f}'" for f in FAMILIES), path="model_type")
    hidden = _get(cfg, "hidden_size", source)
    heads = _get(cfg, "num_attention_heads", source)
    layers = _get(cfg, "num_hidden_layers", source)
    vocab = _get(cfg, "vocab_size", source)
    max_pos = _get(cfg, "max_position_embeddings", source)
    if hidden % heads:
        raise LiacError(source, f"hidden_size {hidden} must be divisible by num_attention_heads {heads}",
                        path="hidden_size")
    common = dict(name=name, family=model_type, hidden_size=hidden, num_layers=layers, num_heads=heads,
                  vocab_size=vocab, max_position=max_pos,
                  tie_embeddings=bool(cfg.get("tie_word_embeddings", model_type == "opt")))
    if model_type == "opt":
        if not cfg.get("do_layer_norm_before", True):
            raise LiacError(source, "post-norm OPT (do_layer_norm_before: false, as in opt-350m) is not supported",
                            path="do_layer_norm_before")
        proj = cfg.get("word_embed_proj_dim", hidden)
        if proj != hidden:
            raise LiacError(source, f"must equal hidden_size {hidden} (project_in/out is not supported), got {proj}",
                            path="word_embed_proj_dim")
        act = cfg.get("activation_function", "relu")
        if act != "relu":
            raise LiacError(source, f"unsupported activation '{act}': must be 'relu'", path="activation_function")
        bias = bool(cfg.get("enable_bias", True))
        return ModelConfig(**common, num_kv_heads=heads, head_dim=hidden // heads,
                           ffn_dim=_get(cfg, "ffn_dim", source), norm="layernorm", norm_eps=1e-5,
                           activation="relu", qkv_bias=bias, proj_bias=bias)
    # Llama-style families
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise LiacError(source, f"unsupported activation '{act}': must be 'silu'", path="hidden_act")
    if cfg.get("use_sliding_window"):
        raise LiacError(source, "sliding-window attention is not supported", path="use_sliding_window")
    kv_heads = _get(cfg, "num_key_value_heads", source, default=heads)
    if heads % kv_heads:
        raise LiacError(source, f"num_attention_heads {heads} must be a multiple of num_key_value_heads {kv_heads}",
                        path="num_key_value_heads")
    head_dim = _get(cfg, "head_dim", source, default=hidden // heads)
    qkv_bias = {"llama": bool(cfg.get("attention_bias", False)), "qwen2": True, "mixtral": False}[model_type]
    proj_bias = bool(cfg.get("mlp_bias", False)) if model_type == "llama" else False
    if model_type == "llama" and proj_bias != bool(cfg.get("attention_bias", False)):
        raise LiacError(source, "attention_bias and mlp_bias must be equal", path="mlp_bias")
    moe = {}
    if model_type == "mixtral":
        moe = dict(num_experts=_get(cfg, "num_local_experts", source),
                   experts_top_k=_get(cfg, "num_experts_per_tok", source))
    eps = cfg.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
        raise LiacError(source, f"must be a positive number, got {eps!r}", path="rms_norm_eps")
    return ModelConfig(**common, num_kv_heads=kv_heads, head_dim=head_dim,
                       ffn_dim=_get(cfg, "intermediate_size", source), norm="rmsnorm", norm_eps=float(eps),
                       activation="silu", qkv_bias=qkv_bias, proj_bias=proj_bias, **_rope(cfg, source), **moe)
