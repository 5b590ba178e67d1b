"""Llama 2 / 3.1: RMSNorm, RoPE, grouped-query attention, SwiGLU FFN, no biases."""

from __future__ import annotations

import torch
from torch import nn

from liac.models.config import ModelConfig
from liac.models.layers import QKV, Attention, NormGateUp, ResidualLinear, Transformer

__all__ = ["LlamaLayer", "build", "hf_weight_names"]


class LlamaLayer(nn.Module):
    """One decoder layer as six sublayers: qkv (+RoPE), attn (score + context), out_proj, gate_up, down."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.qkv = QKV(cfg)
        self.attn = Attention(cfg)
        self.out_proj = ResidualLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.proj_bias)
        self.gate_up = NormGateUp(cfg)
        self.down = ResidualLinear(cfg.ffn_dim, cfg.hidden_size, bias=cfg.proj_bias)

    def forward(self, x, positions, k_past, v_past):
        # x: [B, Q, D]; k_past, v_past: [B, G, C - Q, E] → (x, k, v) with the new k, v: [B, G, Q, E]
        q, k, v = self.qkv(x, positions)
        o = self.attn(q, torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2))
        x = self.out_proj(o, x)
        return self.down(self.gate_up(x), x), k, v


def build(cfg: ModelConfig) -> Transformer:
    return Transformer(cfg, LlamaLayer)


def hf_weight_names(cfg: ModelConfig) -> dict[str, list[str]]:
    """liac parameter name → HF checkpoint tensor names (concatenated along dim 0 when several)."""
    names = {"embed.tokens.weight": ["model.embed_tokens.weight"], "lm_head.norm.weight": ["model.norm.weight"]}
    if not cfg.tie_embeddings:
        names["lm_head.proj.weight"] = ["lm_head.weight"]
    for layer in range(cfg.num_layers):
        ours, hf = f"layers.{layer}.", f"model.layers.{layer}."
        names[ours + "qkv.norm.weight"] = [hf + "input_layernorm.weight"]
        names[ours + "gate_up.norm.weight"] = [hf + "post_attention_layernorm.weight"]
        qkv = [hf + f"self_attn.{p}_proj" for p in "qkv"]
        names[ours + "qkv.proj.weight"] = [n + ".weight" for n in qkv]
        if cfg.qkv_bias:
            names[ours + "qkv.proj.bias"] = [n + ".bias" for n in qkv]
        pairs = {"out_proj.proj": [hf + "self_attn.o_proj"],
                 "gate_up.proj": [hf + "mlp.gate_proj", hf + "mlp.up_proj"], "down.proj": [hf + "mlp.down_proj"]}
        for mine, theirs in pairs.items():
            for kind in ("weight", "bias") if cfg.proj_bias else ("weight",):
                names[ours + mine + "." + kind] = [t + "." + kind for t in theirs]
    return names
