"""OPT (Zhang et al. 2022): pre-LayerNorm, multi-head attention with biases, ReLU FFN, learned positions."""

from __future__ import annotations

import torch
from torch import nn

from liac.models.config import ModelConfig
from liac.models.layers import QKV, Attention, NormLinearAct, ResidualLinear, Transformer

__all__ = ["OPTLayer", "build", "hf_weight_names"]


class OPTLayer(nn.Module):
    """One decoder layer as six sublayers: qkv, attn (score + context), out_proj, fc1, fc2."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.qkv = QKV(cfg)
        self.attn = Attention(cfg)
        self.out_proj = ResidualLinear(cfg.hidden_size, cfg.hidden_size, bias=cfg.proj_bias)
        self.fc1 = NormLinearAct(cfg)
        self.fc2 = ResidualLinear(cfg.ffn_dim, cfg.hidden_size, bias=cfg.proj_bias)

    def forward(self, x, positions, k_past, v_past):
        # x: [B, Q, D]; k_past, v_past: [B, H, C - Q, E] → (x, k, v) with the new k, v: [B, H, Q, E]
        q, k, v = self.qkv(x, positions)
        o = self.attn(q, torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2))
        x = self.out_proj(o, x)
        return self.fc2(self.fc1(x), x), k, v


def build(cfg: ModelConfig) -> Transformer:
    return Transformer(cfg, OPTLayer)


def hf_weight_names(cfg: ModelConfig) -> dict[str, list[str]]:
    """liac parameter name → HF checkpoint tensor names (concatenated along dim 0 when several)."""
    names = {"embed.tokens.weight": ["model.decoder.embed_tokens.weight"],
             "embed.positions.weight": ["model.decoder.embed_positions.weight"],
             "lm_head.norm.weight": ["model.decoder.final_layer_norm.weight"],
             "lm_head.norm.bias": ["model.decoder.final_layer_norm.bias"]}
    if not cfg.tie_embeddings:
        names["lm_head.proj.weight"] = ["lm_head.weight"]
    for layer in range(cfg.num_layers):
        ours, hf = f"layers.{layer}.", f"model.decoder.layers.{layer}."
        pairs = {"qkv.norm": ["self_attn_layer_norm"], "qkv.proj": ["self_attn.q_proj", "self_attn.k_proj",
                                                                    "self_attn.v_proj"],
                 "out_proj.proj": ["self_attn.out_proj"], "fc1.norm": ["final_layer_norm"], "fc1.proj": ["fc1"],
                 "fc2.proj": ["fc2"]}
        for mine, theirs in pairs.items():
            kinds = ("weight", "bias") if cfg.proj_bias or mine.endswith("norm") else ("weight",)
            for kind in kinds:
                names[ours + mine + "." + kind] = [hf + t + "." + kind for t in theirs]
    return names
