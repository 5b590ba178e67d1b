"""Mixtral 8x7B: the Llama attention with a sparse MoE FFN (top-2 routing over 8 SwiGLU experts).

The MoE FFN is two sublayers: `router` (norm, gate, softmax, top-k) and `experts`. `Experts.forward` is written
densely so that it traces; the runtime computes only the routed experts, each over its own tokens, with the same
math (`route`, `group_by_expert`, `experts_partial`: a device computes its share of the experts into a partial sum,
and the partial sums are added on the consuming device), as HF's `MixtralSparseMoeBlock` does: routing weights in
float32, each expert's output weighted, cast, and accumulated in the model's dtype in expert order.
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from liac.models.config import ModelConfig
from liac.models.layers import QKV, Attention, ResidualLinear, Transformer, make_norm
from liac.plan import expert_block_rows

__all__ = ["Router", "Experts", "Routing", "expert_ffn", "group_by_expert", "experts_partial", "expert_block_rows",
           "MixtralLayer", "build", "hf_weight_names"]

Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


class Router(nn.Module):
    """Sublayer `router`: FFN norm, gate logits, softmax, top-k, renormalised weights."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.top_k = cfg.experts_top_k
        self.norm = make_norm(cfg)
        self.proj = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)

    def route(self, x: torch.Tensor):
        """x [B, Q, D] → (h [B, Q, D] normalised, index [B, Q, k] of each token's experts, weights [B, Q, k] fp32)."""
        h = self.norm(x)
        probs = torch.softmax(self.proj(h).float(), dim=-1)  # [B, Q, X] for X experts
        top, index = probs.topk(self.top_k, dim=-1)
        return h, index, top / top.sum(dim=-1, keepdim=True)

    def forward(self, x: torch.Tensor):
        h, index, top = self.route(x)
        weights = torch.zeros(*index.shape[:-1], self.proj.out_features, dtype=top.dtype, device=top.device)
        return h, weights.scatter(-1, index, top)  # dense [B, Q, X] fp32: zero where a token is not routed


def expert_ffn(gate_up: torch.Tensor | tuple[torch.Tensor, torch.Tensor], down: torch.Tensor, x: torch.Tensor,
               linear: Linear = F.linear) -> torch.Tensor:
    """One SwiGLU expert: x [m, D] → [m, D] with gate_up [2F, D] (rows [gate; up]) and down [D, F]. gate_up may be
    a pair (gate [f, D], up [f, D]) of rows kept apart in memory, down then [D, f] (a view of its columns): the
    expert over f of its F intermediate features, whose outputs over the other features add up to the expert's."""
    if isinstance(gate_up, tuple):
        gate, up = linear(x, gate_up[0], None), linear(x, gate_up[1], None)
    else:
        gate, up = linear(x, gate_up, None).chunk(2, dim=-1)
    return linear(F.silu(gate) * up, down, None)


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
        h, weights = routed  # h: [B, Q, D], weights: [B, Q, X] fp32
        out = None
        for expert in range(self.gate_up.shape[0]):
            y = (expert_ffn(self.gate_up[expert], self.down[expert], h) * weights[..., expert:expert + 1]).to(h.dtype)
            out = y if out is None else out + y
        # Sum the experts first, then add the residual once (as HF does): one residual add for the tracer.
        return residual + out


class Routing(NamedTuple):
    """A step's tokens grouped by expert: sorted assignment j sends token `tokens[j]` (flat index b·Q + q) to its
    expert with weight `weights[j]`; expert e's assignments are [offsets[e], offsets[e + 1]) (host integers)."""

    tokens: torch.Tensor   # [n·k] int64
    weights: torch.Tensor  # [n·k] fp32
    offsets: tuple[int, ...]

    def count(self, expert: int) -> int:
        return self.offsets[expert + 1] - self.offsets[expert]


def group_by_expert(index: torch.Tensor, weights: torch.Tensor, counts: list[int]) -> Routing:
    """Group the assignments of `index` [B, Q, k] (weights [B, Q, k]) by expert; `counts` [X] are the assignments per
    expert, on the host (`torch.bincount(index.flatten(), minlength=X).tolist()`: one copy from the device)."""
    flat = index.reshape(-1)
    order = flat.argsort(stable=True)  # assignments of expert 0 first, each expert's in token order
    offsets = [0]
    for count in counts:
        offsets.append(offsets[-1] + count)
    return Routing(order // index.shape[-1], weights.reshape(-1)[order], tuple(offsets))


def experts_partial(h: torch.Tensor, routing: Routing, experts: Iterable[tuple[int, torch.Tensor, torch.Tensor]],
                    linear: Linear = F.linear, block_rows: int | None = None) -> torch.Tensor:
    """The sum over `experts` ((index, gate_up, down) each, in ascending order; a generator may wait for a weight
    copy before yielding) of each expert's weighted output on its routed tokens: h [n, D] → [n, D] (zeros where no
    listed expert was routed). Unrouted experts are skipped before their weights are touched. With `block_rows`, an
    expert's tokens are computed at most that many at a time (row blocks of a GEMM: the same values, bounded
    intermediates; `expert_block_rows`)."""
    out = torch.zeros_like(h)
    for expert, gate_up, down in experts:
        first, last = routing.offsets[expert], routing.offsets[expert + 1]
        step = (last - first) if block_rows is None else block_rows
        for begin in range(first, last, max(step, 1)):
            end = min(begin + step, last)
            tokens = routing.tokens[begin:end]
            # one expression: no block's output outlives its index_add_ (the next block's intermediates come alone)
            out.index_add_(0, tokens, (expert_ffn(gate_up, down, h[tokens], linear)
                                       * routing.weights[begin:end, None]).to(out.dtype))
    return out


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
    """liac parameter name → HF checkpoint tensor names, concatenated along their first dimension (the layout of the
    Hub's Mixtral checkpoints, which transformers 5 also saves: one w1 (gate), w3 (up), w2 (down) per expert; our
    stacked [E, 2F, D] gate_up is [w1; w3] of expert 0, then of expert 1, ...)."""
    names = {"embed.tokens.weight": ["model.embed_tokens.weight"], "lm_head.norm.weight": ["model.norm.weight"]}
    if not cfg.tie_embeddings:
        names["lm_head.proj.weight"] = ["lm_head.weight"]
    for layer in range(cfg.num_layers):
        ours, hf = f"layers.{layer}.", f"model.layers.{layer}."
        names[ours + "qkv.norm.weight"] = [hf + "input_layernorm.weight"]
        names[ours + "qkv.proj.weight"] = [hf + f"self_attn.{p}_proj.weight" for p in "qkv"]
        names[ours + "out_proj.proj.weight"] = [hf + "self_attn.o_proj.weight"]
        names[ours + "router.norm.weight"] = [hf + "post_attention_layernorm.weight"]
        moe = hf + "block_sparse_moe."
        names[ours + "router.proj.weight"] = [moe + "gate.weight"]
        names[ours + "experts.gate_up"] = [f"{moe}experts.{e}.{w}.weight" for e in range(cfg.num_experts)
                                           for w in ("w1", "w3")]
        names[ours + "experts.down"] = [f"{moe}experts.{e}.w2.weight" for e in range(cfg.num_experts)]
    return names
