"""Reference models in plain PyTorch, one short file per family, and the model zoo.

    from liac.models import resolve_model, build_model
    cfg = resolve_model("opt-30b")
    with torch.device("meta"):
        model = build_model(cfg)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from liac.models.config import FAMILIES, ModelConfig, from_hf_config
from liac.models.zoo import PUBLISHED_PARAMS, ZOO, resolve_model, zoo_names

if TYPE_CHECKING:  # torch loads only when a model is built: `liac inspect --model typo` answers at once
    from torch import nn

__all__ = ["ModelConfig", "FAMILIES", "ZOO", "PUBLISHED_PARAMS", "from_hf_config", "resolve_model", "zoo_names",
           "build_model", "family_module", "SUBLAYERS"]

# Placement units of one decoder layer, per family, in execution order. These are the sublayer names of a plan.
SUBLAYERS: dict[str, tuple[str, ...]] = {
    "opt": ("qkv", "attn_score", "attn_context", "out_proj", "fc1", "fc2"),
    "llama": ("qkv", "attn_score", "attn_context", "out_proj", "gate_up", "down"),
    "qwen2": ("qkv", "attn_score", "attn_context", "out_proj", "gate_up", "down"),
    "mixtral": ("qkv", "attn_score", "attn_context", "out_proj", "router", "experts"),
}


def family_module(family: str):
    """The module (`liac.models.opt`, ...) that builds a family."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return importlib.import_module(f"liac.models.{family}")


def build_model(cfg: ModelConfig) -> nn.Module:
    """Build the model for `cfg` on the current default device (use `torch.device('meta')` for shapes only)."""
    return family_module(cfg.family).build(cfg)
