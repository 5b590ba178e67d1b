"""`ModelConfig`: the shape of a decoder-only transformer, and reading it from a HF `config.json`.

One frozen dataclass for every family; the family name picks the module in `liac.models` that builds it.
`sha256()` hashes the architecture (every field but `name`), so a plan, a checkpoint and a zoo entry can be
matched without trusting names.

A config is checked when it is built (`config_problem`): every field's type, a physical range for every number
(finite floats; sizes a real model could have, which also keeps the cost model's int64 arithmetic exact), and
what the family's module builds (OPT: LayerNorm, ReLU, learned positions; the others: RMSNorm, SiLU, RoPE), so a
hand-edited plan whose config was re-hashed cannot run a different model than it names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from liac.errors import LiacError, brief

__all__ = ["ModelConfig", "FAMILIES", "DTYPES", "ConfigError", "config_problem", "from_hf_config"]

FAMILIES = ("opt", "llama", "qwen2", "mixtral")
# HF model types liac knows it cannot model yet, and why (one line each; docs/moe.md says more)
NOT_YET = {"qwen2_moe": "Qwen2-MoE's shared expert and its sigmoid gate (a dense FFN beside the routed experts) have "
                        "no sublayer in liac's graph (docs/moe.md)"}
DTYPES = ("bfloat16", "float16", "float32")  # what the runtime stores and computes in
# What each family's module builds (liac/models/<family>.py): norm, activation, rotary positions.
_FAMILY_LAYERS = {"opt": ("layernorm", "relu", False), "llama": ("rmsnorm", "silu", True),
                  "qwen2": ("rmsnorm", "silu", True), "mixtral": ("rmsnorm", "silu", True)}
# Physical ranges (inclusive): the largest released models are far inside them.
_INT_RANGES = {"hidden_size": (1, 2**20), "num_layers": (1, 2**17), "num_heads": (1, 2**14),
               "num_kv_heads": (1, 2**14), "head_dim": (1, 2**14), "ffn_dim": (1, 2**22), "vocab_size": (1, 2**24),
               "max_position": (1, 2**24), "rope_original_max_position": (0, 2**24), "num_experts": (0, 2**12),
               "experts_top_k": (0, 2**12)}
_FLOAT_RANGES = {"norm_eps": (0.0, 1.0), "rope_theta": (0.0, 1e12), "rope_factor": (0.0, 1e6),
                 "rope_low_freq_factor": (0.0, 1e6), "rope_high_freq_factor": (0.0, 1e6)}  # (above, at most)


class ConfigError(ValueError):
    """A ModelConfig that no family module can build as stated; `field` names the offending field."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


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
        problem = config_problem(self)
        if problem is not None:
            raise ConfigError(*problem)

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
        unknown = sorted((set(data) - set(fields)), key=str)
        if unknown:
            raise LiacError(source, f"unknown field {brief(unknown[0])}: must be one of {', '.join(sorted(fields))}")
        missing = [name for name, f in fields.items()
                   if name not in data and f.default is dataclasses.MISSING]
        if missing:
            raise LiacError(source, f"field '{missing[0]}' is required", path=missing[0])
        try:
            return cls(**dict(data))
        except ConfigError as e:
            raise LiacError(source, e.message, path=e.field) from e

    def sha256(self) -> str:
        """Hash of the architecture: every field except `name`, canonical JSON."""
        body = {k: v for k, v in self.to_dict().items() if k != "name"}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def with_layers(self, num_layers: int, name: str | None = None) -> "ModelConfig":
        return dataclasses.replace(self, num_layers=num_layers, name=name or f"{self.name}-{num_layers}l")


def _type_problem(cfg: ModelConfig) -> tuple[str, str] | None:
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        want = {"int": int, "float": (int, float), "str": str, "bool": bool}[str(f.type)]
        if isinstance(value, bool) and want is not bool or not isinstance(value, want):
            words = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}
            return f.name, f"must be {words[str(f.type)]}, got {brief(value)}"
    return None


def config_problem(cfg: ModelConfig) -> tuple[str, str] | None:
    """The first way `cfg` is not a model liac can build, as (field, message); None when it is sound."""
    problem = _type_problem(cfg)
    if problem:
        return problem
    for name, (low, high) in _INT_RANGES.items():
        value = getattr(cfg, name)
        if not low <= value <= high:
            return name, f"must be between {low} and {high}, got {value}"
    for name, (above, high) in _FLOAT_RANGES.items():
        value = getattr(cfg, name)
        if not math.isfinite(value) or value > high or (value <= above and not (name == "rope_theta" and value == 0)):
            return name, f"must be a finite number above {above} and at most {high:g}, got {brief(value)}"
    if cfg.family not in FAMILIES:
        return "family", (f"unsupported value {brief(cfg.family)}: must be one of "
                          + ", ".join(f"'{f}'" for f in FAMILIES))
    if cfg.dtype not in DTYPES:
        return "dtype", (f"unsupported value {brief(cfg.dtype)}: must be one of "
                         + ", ".join(f"'{d}'" for d in DTYPES))
    norm, activation, rope = _FAMILY_LAYERS[cfg.family]
    if cfg.norm != norm:
        return "norm", f"must be '{norm}' for family '{cfg.family}', got {brief(cfg.norm)}"
    if cfg.activation != activation:
        return "activation", f"must be '{activation}' for family '{cfg.family}', got {brief(cfg.activation)}"
    if rope != (cfg.rope_theta > 0):
        return "rope_theta", (f"must be greater than 0 for family '{cfg.family}' (rotary positions)" if rope
                              else f"must be 0 for family '{cfg.family}' (learned positions), got {cfg.rope_theta}")
    if cfg.rope_type not in ("default", "llama3"):
        return "rope_type", f"unsupported value {brief(cfg.rope_type)}: must be 'default' or 'llama3'"
    if cfg.rope_type == "llama3" and (cfg.rope_original_max_position < 1
                                      or cfg.rope_high_freq_factor == cfg.rope_low_freq_factor):
        return "rope_type", ("'llama3' needs rope_original_max_position of at least 1 and rope_high_freq_factor "
                             "different from rope_low_freq_factor")
    if cfg.num_heads % cfg.num_kv_heads:
        return "num_kv_heads", f"must divide num_heads {cfg.num_heads}, got {cfg.num_kv_heads}"
    if cfg.family == "opt" and (cfg.num_kv_heads != cfg.num_heads or cfg.num_heads * cfg.head_dim != cfg.hidden_size):
        return "head_dim", (f"must be hidden_size / num_heads with num_kv_heads = num_heads for family 'opt', got "
                            f"{cfg.num_heads} heads of {cfg.head_dim} ({cfg.num_kv_heads} KV heads) for hidden_size "
                            f"{cfg.hidden_size}")
    if (cfg.family == "mixtral") != (cfg.num_experts > 0):
        return "num_experts", ("must be at least 1 for family 'mixtral'" if cfg.family == "mixtral"
                               else f"must be 0 for family '{cfg.family}', got {cfg.num_experts}")
    if cfg.num_experts and not 1 <= cfg.experts_top_k <= cfg.num_experts:
        return "experts_top_k", f"must be between 1 and num_experts {cfg.num_experts}, got {cfg.experts_top_k}"
    if cfg.family == "qwen2" and not cfg.qkv_bias:
        return "qkv_bias", "must be true for family 'qwen2'"
    return None


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
        raise LiacError(source, f"must be {want}, got {brief(value)}", path=key)
    if kind is int and value <= 0:
        raise LiacError(source, f"must be a positive integer, got {brief(value)}", path=key)
    return value


def _number(params: Mapping[str, Any], key: str, source: str, path: str, default: Any = ...) -> float:
    if key not in params:
        if default is ...:
            raise LiacError(source, "required for rope type 'llama3'", path=path)
        return default
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LiacError(source, f"must be a finite number, got {brief(value)}", path=path)
    return value


def _rope(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    # transformers 5 writes `rope_parameters`; 4.x wrote `rope_theta` + `rope_scaling`.
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(value, Mapping):
            raise LiacError(source, f"must be a mapping, got {brief(value)}", path=key)
    params = {**scaling, **params}
    where = "rope_parameters" if cfg.get("rope_parameters") else "rope_scaling"
    theta = _number(params, "rope_theta", source, f"{where}.rope_theta",
                    default=_number(cfg, "rope_theta", source, "rope_theta", default=10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise LiacError(source, f"unsupported rope type {brief(rope_type)}: must be 'default' or 'llama3'",
                        path=f"{where}.rope_type")
    out = {"rope_theta": float(theta), "rope_type": rope_type}
    if rope_type == "llama3":
        original = params.get("original_max_position_embeddings")
        if isinstance(original, bool) or not isinstance(original, int):
            raise LiacError(source, f"must be an integer, got {brief(original)}",
                            path=f"{where}.original_max_position_embeddings")
        out.update(
            rope_factor=float(_number(params, "factor", source, f"{where}.factor")),
            rope_low_freq_factor=float(_number(params, "low_freq_factor", source, f"{where}.low_freq_factor")),
            rope_high_freq_factor=float(_number(params, "high_freq_factor", source, f"{where}.high_freq_factor")),
            rope_original_max_position=original,
        )
    return out


# A ModelConfig field → the config.json key it comes from (for error paths).
_HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads", "max_position": "max_position_embeddings",
            "norm_eps": "rms_norm_eps", "num_experts": "num_local_experts", "experts_top_k": "num_experts_per_tok",
            "rope_factor": "rope_scaling.factor", "rope_low_freq_factor": "rope_scaling.low_freq_factor",
            "rope_high_freq_factor": "rope_scaling.high_freq_factor",
            "rope_original_max_position": "rope_scaling.original_max_position_embeddings"}


def _build(source: str, **fields) -> ModelConfig:
    try:
        return ModelConfig(**fields)
    except ConfigError as e:
        key = _HF_KEYS.get(e.field, e.field)
        if e.field == "ffn_dim" and fields.get("family") != "opt":
            key = "intermediate_size"
        raise LiacError(source, e.message, path=key) from e


def from_hf_config(cfg: Mapping[str, Any], name: str = "custom", source: str = "config.json") -> ModelConfig:
    """Read a HF `config.json` (already parsed) for one of the supported families.

    Raises:
        LiacError: naming the field when the config is malformed or uses a feature liac does not model.
    """
    if not isinstance(cfg, Mapping):
        raise LiacError(source, "must be a JSON object")
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type in NOT_YET:
        raise LiacError(source, f"model_type '{model_type}' is not supported yet: {NOT_YET[model_type]}",
                        path="model_type")
    if model_type not in FAMILIES:
        raise LiacError(source, f"unsupported model_type {brief(model_type)}: must be one of "
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
            raise LiacError(source, f"must equal hidden_size {hidden} (project_in/out is not supported), got "
                            f"{brief(proj)}",
                            path="word_embed_proj_dim")
        act = cfg.get("activation_function", "relu")
        if act != "relu":
            raise LiacError(source, f"unsupported activation {brief(act)}: must be 'relu'", path="activation_function")
        bias = bool(cfg.get("enable_bias", True))
        return _build(source, **common, num_kv_heads=heads, head_dim=hidden // heads,
                      ffn_dim=_get(cfg, "ffn_dim", source), norm="layernorm", norm_eps=1e-5,
                      activation="relu", qkv_bias=bias, proj_bias=bias)
    # Llama-style families
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise LiacError(source, f"unsupported activation {brief(act)}: must be 'silu'", path="hidden_act")
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
        raise LiacError(source, f"must be a positive number, got {brief(eps)}", path="rms_norm_eps")
    return _build(source, **common, num_kv_heads=kv_heads, head_dim=head_dim,
                  ffn_dim=_get(cfg, "intermediate_size", source), norm="rmsnorm", norm_eps=float(eps),
                  activation="silu", qkv_bias=qkv_bias, proj_bias=proj_bias, **_rope(cfg, source), **moe)
