"""ModelConfig + plan placement → bytes per memory tier, recomputed from the architecture alone.

`liac validate` checks a plan's memory claims against these numbers, so they must not come from the compiler's
own bookkeeping (that is what they check). Weight bytes come from the reference model built on the `meta` device
(one decoder layer is enough: layers of a class are identical), KV bytes from the attention shape:

    weights of a unit   = Σ numel(parameters of the unit's module) × bytes(dtype)      (norms attached included)
    KV cache of a layer = 2 (K and V) × batch × tokens × kv_heads × head_dim × bytes(dtype)

An MoE `experts` unit's stacked expert weights ([E, ...] each) are counted per expert: its `experts.hbm` experts in
HBM, the others in its `weights` tier (`liac.plan.expert_tier_counts`).

The LM head of a tied model reads the embedding matrix: that matrix is counted once per tier that holds it (once
when `embed` and `lm_head` share a tier, in both tiers when they do not — the runtime then needs two copies).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from liac.models import SUBLAYERS, build_model
from liac.models.config import ModelConfig
from liac.plan import TIERS, expert_tier_counts

__all__ = ["DTYPE_BYTES", "TierFootprint", "unit_weight_bytes", "kv_bytes_per_layer", "kv_tokens", "tier_footprint",
           "group_tier_bytes"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# Sublayer (plan unit) → attribute path of its module in the reference model (liac/models/*.py). The attention units
# share the weightless `attn` module.
_MODULE_OF = {"embed": "embed", "lm_head": "lm_head", "attn_score": None, "attn_context": None}


@dataclass(frozen=True)
class TierFootprint:
    """Bytes a plan puts in one memory tier, as recomputed from the architecture."""

    tier: str
    weight_bytes: int
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes


def _dtype_bytes(cfg: ModelConfig) -> int:
    try:
        return DTYPE_BYTES[cfg.dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {cfg.dtype!r}") from None


@lru_cache(maxsize=32)
def _unit_parameters(cfg: ModelConfig) -> dict[tuple[str, str], tuple[tuple[str, int], ...]]:
    """(layer class, unit) → ((canonical parameter name, numel), ...) for one layer, from a meta-built model."""
    import torch  # late import: plans can be read without torch

    with torch.device("meta"):
        model = build_model(cfg.with_layers(1))
    canonical = {}  # id(parameter) → first name: a tied LM head maps to the embedding's matrix
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(param), name)

    def params_of(module) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((canonical[id(p)], p.numel()) for _, p in module.named_parameters(remove_duplicate=False)))

    out = {("embed", "embed"): params_of(model.embed), ("head", "lm_head"): params_of(model.lm_head)}
    layer = model.layers[0]
    for unit in SUBLAYERS[cfg.family]:
        attr = _MODULE_OF.get(unit, unit)
        out[("decoder", unit)] = params_of(getattr(layer, attr)) if attr else ()
    return out


def unit_weight_bytes(cfg: ModelConfig) -> dict[tuple[str, str], int]:
    """(layer class, unit) → weight bytes of one layer of that class (tied matrices counted in both units)."""
    size = _dtype_bytes(cfg)
    return {key: sum(n for _, n in params) * size for key, params in _unit_parameters(cfg).items()}


def kv_tokens(prompt_len: int, gen_len: int) -> int:
    """Tokens whose K and V must be cached: the prompt and every generated token but the last (it is never read)."""
    return prompt_len + gen_len - 1


def kv_bytes_per_layer(cfg: ModelConfig, batch_size: int, tokens: int) -> int:
    """K and V of one layer for `batch_size` sequences of `tokens` tokens."""
    return 2 * batch_size * tokens * cfg.num_kv_heads * cfg.head_dim * _dtype_bytes(cfg)


def tier_footprint(plan) -> dict[str, TierFootprint]:
    """Weights and KV cache bytes per tier ('hbm', 'ddr', 'cxl') of a valid `OffloadPlan`.

    Args:
        plan: a `liac.plan.OffloadPlan` that passed `check_semantics` (layer ranges cover the model).

    Returns:
        One `TierFootprint` per tier; staging buffers, activations and workspace are not included.
    """
    cfg = plan.model_config
    params = _unit_parameters(cfg)
    size = _dtype_bytes(cfg)
    work = plan.spec.workload
    kv_layer = kv_bytes_per_layer(cfg, work.batch_size, kv_tokens(work.prompt_len, work.gen_len))
    weights = {tier: 0 for tier in TIERS}
    kv = {tier: 0 for tier in TIERS}
    shared: set[tuple[str, str]] = set()  # (parameter, tier) of the single-layer classes, counted once per tier
    for group in plan.spec.layer_groups:
        if group.kv_cache in kv:
            kv[group.kv_cache] += kv_layer * group.layer_count
        for sub in group.sublayers:
            if sub.weights not in weights:
                continue
            if group.layer_class == "decoder":
                for tier, nbytes in _sublayer_tier_bytes(cfg, group.layer_class, sub).items():
                    weights[tier] += nbytes * group.layer_count
                continue
            for name, numel in params.get((group.layer_class, sub.name), ()):
                if (name, sub.weights) not in shared:
                    shared.add((name, sub.weights))
                    weights[sub.weights] += numel * size
    return {tier: TierFootprint(tier, weights[tier], kv[tier]) for tier in TIERS}


def _sublayer_tier_bytes(cfg: ModelConfig, layer_class: str, sub) -> dict[str, int]:
    """Bytes one layer's unit keeps per tier: all in its `weights` tier, but an MoE experts unit's stacked experts
    split between HBM and that tier by its expert counts."""
    size = _dtype_bytes(cfg)
    out: dict[str, int] = {}
    for _, numel in _unit_parameters(cfg).get((layer_class, sub.name), ()):
        if sub.name == "experts" and cfg.num_experts:
            for tier, count in expert_tier_counts(sub, cfg.num_experts).items():
                out[tier] = out.get(tier, 0) + numel // cfg.num_experts * count * size
        else:
            out[sub.weights] = out.get(sub.weights, 0) + numel * size
    return out


def group_tier_bytes(plan, group) -> dict[str, int]:
    """Bytes one layer of a decoder `group` of `plan` keeps per tier: its units' weights and its KV cache."""
    cfg = plan.model_config
    work = plan.spec.workload
    out = {tier: 0 for tier in TIERS}
    for sub in group.sublayers:
        if sub.weights in out:
            for tier, nbytes in _sublayer_tier_bytes(cfg, group.layer_class, sub).items():
                out[tier] += nbytes
    if group.kv_cache in out:
        out[group.kv_cache] += kv_bytes_per_layer(cfg, work.batch_size, kv_tokens(work.prompt_len, work.gen_len))
    return out
