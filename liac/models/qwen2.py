"""Qwen2 / Qwen2.5: the Llama layer with biases on the Q/K/V projection (`qkv_bias` in the config)."""

from __future__ import annotations

from liac.models.config import ModelConfig
from liac.models.layers import Transformer
from liac.models.llama import LlamaLayer, hf_weight_names

__all__ = ["build", "hf_weight_names"]


def build(cfg: ModelConfig) -> Transformer:
    assert cfg.qkv_bias, "Qwen2 configs carry a QKV bias"
    return Transformer(cfg, LlamaLayer)
