"""Mixtral 8x7B: the Llama attention with a sparse MoE FFN (top-2 routing over 8 SwiGLU experts)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from liac.models.config import ModelConfig
from liac.models.layers import QKV, Attention, ResidualLinear, Transformer, make_norm

__all__ = ["Router", "Experts", "MixtralLayer", "build", "hf_weight_names"]


class Router(nn.Module):
    """Sublayer `router`: FFN norm, gate logits, softmax, top-k, renormalised weights (dense, zeros elsewhere)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.experts_top_k
        self.norm = make_norm(cfg)
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)

    def forward(self, x: torch.Tensor):
        h = self.norm(x)  # [B, Q, D]
        probs = torch.softmax(self.proj(h).float(), dim=-1)  # [B, Q, X] for X experts
        top, index = probs.topk(self.top_k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(-1, index, top).to(h.dtype)
        return h, weights


class Experts(nn.Module):
    """Sublayer `experts`: each token's top-k SwiGLU experts, weighted, added to the residual.

    Written densely (every expert on every token, zero weight where not routed) so it traces on the meta device;
    the tracer prices only the routed fraction (top_k / num_experts) of the FLOPs.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ffn_dim = cfg.ffn_dim
        self.gate_up = nn.Parameter(torch.empty(cfg.num_experts, 2 * cfg.ffn_dim, cfg.hidden_size))
        self.down = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, cfg.ffn_dim))

    def forward(self, routed, residual: torch.Tensor) -> torch.Tensor:
        h, weights = routed  # h: [B, Q, D], weights: [B, Q, X]
        out = None
        for expert in range(self.gate_up.shape[0]):
            gate, up = F.linear(h, self.gate_up[expert]).split(self.ffn_dim, dim=-1)
            y = weights[..., expert:expert + 1] * F.linear(F.silu(gate) * up, self.down[expert])
            out = y if out is None else out + y
        # Sum the experts first, then add the residual once (as HF does): one residual add for the tracer.
        return residual + out


class MixtralLayer(nn.Module):
    """One decoder layer as six sublayers: qkv (+RoPE), attn (score + context), out_proj, router, experts."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.qkv = QKV(cfg)
        self.attn = Attention(cfg)
        self.out_proj = ResidualLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.router = Router(cfg)
        self.experts = Experts(cfg)

    def forward(self, x, positions, k_past, v_past):
        q, k, v = self.qkv(x, positions)
        o = self.attn(q, torch.cat([k_past, k], dim=2), torch.cat([v_past, v], dim=2))
        x = self.out_proj(o, x)
        return self.experts(self.router(x), x), k, v


def build(cfg: ModelConfig) -> Transformer:
    return Transformer(cfg, MixtralLayer)


def hf_weight_names(cfg: ModelConfig) -> dict[str, list[str]]:
    """liac parameter name → HF checkpoint tensor names (transformers 5 layout: experts stacked as [E, ...])."""
    names = {"embed.tokens.weight": ["model.embed_tokens.weight"], "lm_head.norm.weight": ["model.norm.weight"]}
    if not cfg.tie_embeddings:
        names["lm_head.proj.weight"] = ["lm_head.weight"]
    for layer in range(cfg.num_layers):
        ours, hf = f"layers.{layer}.", f"model.layers.{layer}."
        names[ours + "qkv.norm.weight"] = [hf + "input_layernorm.weight"]
        names[ours + "qkv.proj.weight"] = [hf + f"self_attn.{p}_proj.weight" for p in "qkv"]
        names[ours + "out_proj.proj.weight"] = [hf + "self_attn.o_proj.weight"]
        names[ours + "router.norm.weight"] = [hf + "post_attention_layernorm.weight"]
        names[ours + "router.proj.weight"] = [hf + "mlp.gate.weight"]
        names[ours + "experts.gate_up"] = [hf + "mlp.experts.gate_up_proj"]
        names[ours + "experts.down"] = [hf + "mlp.experts.down_proj"]
    return names
