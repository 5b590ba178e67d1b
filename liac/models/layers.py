"""Building blocks shared by the model families: one module per *sublayer* (a placement unit of a plan).

A decoder layer is a straight line of sublayer modules (see `opt.py`, `llama.py`):

    q, k, v = layer.qkv(x, positions)          # norm + fused QKV projection (+ RoPE)
    o       = layer.attn(q, k_all, v_all)      # attn_score + softmax + attn_context (no weights)
    x       = layer.out_proj(o, x)             # output projection + residual
    h       = layer.fc1(x)                     # norm + fc1 + activation   (gate_up for SwiGLU, router for MoE)
    x       = layer.fc2(h, x)                  # fc2 + residual            (down for SwiGLU, experts for MoE)

The attribute names are the sublayer names of the plan, so the runtime can place each module on its own device and
call it there; the tracer lowers the same code. Shapes: B batch, Q query tokens, C context (keys) tokens,
D hidden size, H heads, G key/value heads, E head dim.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from liac.models.config import ModelConfig

__all__ = [
    "RMSNorm", "make_norm", "rope_inv_freq", "rope_tables", "apply_rope", "QKV", "Attention", "ResidualLinear",
    "NormLinearAct", "NormGateUp", "Embedding", "LMHead", "KVCache", "Transformer", "padded_positions",
    "padded_causal_mask", "ragged_positions", "ragged_decode_mask",
]


class RMSNorm(nn.Module):
    """RMS normalisation, computed in fp32 like the reference (HF) implementation."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
    return RMSNorm(cfg.hidden_size, cfg.norm_eps)


def rope_inv_freq(cfg: ModelConfig, device=None) -> torch.Tensor:
    """Inverse frequencies [E/2] in fp32, with Llama 3.1's long-context rescaling when configured."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
    if cfg.rope_type != "llama3":
        return inv_freq
    old_len = cfg.rope_original_max_position
    low_wavelen = old_len / cfg.rope_low_freq_factor
    high_wavelen = old_len / cfg.rope_high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / cfg.rope_factor, inv_freq)
    smooth = (old_len / wavelen - cfg.rope_low_freq_factor) / (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor)
    smoothed = (1 - smooth) * scaled / cfg.rope_factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, 1, Q, E] of positions [B, Q] (in fp32, then cast to `dtype`, as HF does). Every layer of a pass
    rotates by the same tables: the runtime makes them once per pass and device (`QKV.forward`'s `rope`)."""
    freqs = positions[:, :, None].float() * inv_freq[None, None, :]  # [B, Q, E/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, Q, E] by positions [B, Q] (cos/sin in fp32, then cast, as HF does)."""
    cos, sin = rope_tables(positions, inv_freq, x.dtype)
    return x * cos + _rotate_half(x) * sin


class QKV(nn.Module):
    """Sublayer `qkv`: attention norm, fused Q/K/V projection, RoPE. Weight rows are [Q; K; V]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm = make_norm(cfg)
        self.proj = nn.Linear(cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim,
                              bias=cfg.qkv_bias)
        # OPT scales q after the projection; RoPE models scale inside attention.
        self.q_scale = cfg.head_dim ** -0.5 if not cfg.uses_rope else 1.0
        self.register_buffer("inv_freq", rope_inv_freq(cfg) if cfg.uses_rope else None, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None):
        """`rope`: the pass's `rope_tables` of `positions`, made once for every layer (the runtime's decode: the
        host launches a dozen fewer kernels per layer); q and k are then rotated as one tensor, the same values."""
        B, Q, _ = x.shape
        qkv = self.proj(self.norm(x))  # [B, Q, (H + 2G) * E]
        if rope is not None and self.inv_freq is not None:
            H, G, E = self.num_heads, self.num_kv_heads, self.head_dim
            qk = qkv[..., :(H + G) * E].view(B, Q, H + G, E).transpose(1, 2)  # [B, H + G, Q, E]
            cos, sin = rope
            qk = qk * cos + _rotate_half(qk) * sin
            v = qkv[..., (H + G) * E:].view(B, Q, G, E).transpose(1, 2)
            return qk[:, :H], qk[:, H:], v
        q, k, v = qkv.split([self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                             self.num_kv_heads * self.head_dim], dim=-1)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        q = q.view(B, Q, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, Q, E]
        k = k.view(B, Q, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, G, Q, E]
        v = v.view(B, Q, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.inv_freq is not None:
            q = apply_rope(q, positions, self.inv_freq)
            k = apply_rope(k, positions, self.inv_freq)
        return q, k, v


class Attention(nn.Module):
    """Sublayers `attn_score` (q·Kᵀ, mask, softmax) and `attn_context` (p·V). No weights.

    The query block sits at the end of the context: query i sees keys 0 .. C - Q + i. A batch of prompts of
    different lengths passes `mask` [B, 1, Q, C] (True: attend; `padded_causal_mask`), which replaces that causal
    mask. `forward` fuses both (scaled_dot_product_attention); `score` and `context` run them apart, for plans that
    put them on different devices.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.scale = 1.0 if not cfg.uses_rope else cfg.head_dim ** -0.5
        self.groups = cfg.num_heads // cfg.num_kv_heads

    @staticmethod
    def _mask(Q: int, C: int, device) -> torch.Tensor | None:
        if Q == 1:
            return None
        return torch.ones(Q, C, dtype=torch.bool, device=device).tril(C - Q)  # [Q, C]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        # q: [B, H, Q, E]; k, v: [B, G, C, E]; mask: [B, 1, Q, C] or None → [B, Q, H * E] (into `out` when given:
        # the heads are interleaved by one copy, straight into the caller's buffer)
        B, H, Q, E = q.shape
        if mask is None and Q == k.shape[2] > 1:
            # a whole prompt: the kernel's own causal masking, which skips the blocks above the diagonal and reads
            # no mask (CPU: 1.4-1.8x faster than the same kernel over a boolean [Q, C] mask at Q = 128-2048, the
            # same values); a chunk after the first (C > Q) needs the mask's offset diagonal
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=self.groups > 1)
            return _heads_out(o, out)
        if mask is None:
            mask = self._mask(Q, k.shape[2], q.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale, enable_gqa=self.groups > 1)
        return _heads_out(o, out)

    def score(self, q: torch.Tensor, k: torch.Tensor, context: int | None = None,
              mask: torch.Tensor | None = None) -> torch.Tensor:
        # q: [B, H, Q, E], k: [B, G, C, E] → probabilities [B, H, Q, C]. With `context`, k may hold more positions
        # (a cache's whole capacity: a contiguous operand the CPU multiplies several times faster than a strided
        # slice) and only the first `context` count. mask: [B, 1, Q, C] or None (causal).
        B, H, Q, E = q.shape
        C = k.shape[2] if context is None else context
        qg = q.reshape(B, k.shape[1], self.groups * Q, E)  # heads of one group share K (q may be a strided view)
        s = qg @ k.transpose(-1, -2)
        s = (s if s.shape[-1] == C else s[..., :C]).reshape(B, H, Q, C) * self.scale
        if mask is None:
            mask = self._mask(Q, C, q.device)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)

    def context(self, p: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        # p: [B, H, Q, C], v: [B, G, C', E] → [B, Q, H * E] (into `out` when given). C' > C: v is a cache's whole
        # capacity (see `score`); p is padded with zeros, so positions past C must hold finite values (the runtime
        # zeroes its caches).
        B, H, Q, C = p.shape
        if v.shape[2] > C:
            p = F.pad(p, (0, v.shape[2] - C))
            C = v.shape[2]
        o = (p.reshape(B, v.shape[1], self.groups * Q, C) @ v).view(B, H, Q, -1)
        return _heads_out(o, out)


def _heads_out(o: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """Attention's output o [B, H, Q, E] as [B, Q, H * E]: a new tensor, or written into `out` [B, Q, H * E]."""
    B, H, Q, E = o.shape
    if out is None:
        return o.transpose(1, 2).reshape(B, Q, H * E)
    out.view(B, Q, H, E).copy_(o.transpose(1, 2))
    return out


def padded_positions(pad: torch.Tensor, start: int, length: int, arange: torch.Tensor) -> torch.Tensor:
    """Positions [B, Q] of query slots start .. start + Q - 1 for left-padded sequences: slot minus the sequence's
    `pad` [B] leading pad slots (its first real token is position 0; pads get 0, as HF's generate gives them).
    `arange` holds 0 .. N - 1 on the target device (no allocation per call)."""
    return (arange[start:start + length][None, :] - pad[:, None]).clamp_(min=0)


def padded_causal_mask(pad: torch.Tensor, start: int, length: int, arange: torch.Tensor) -> torch.Tensor:
    """The attention mask [B, 1, Q, C] (True: attend, C = start + Q) of left-padded sequences.

    Query slot i sees key slot j when j <= i and j is not one of its sequence's `pad` [B] leading pad slots. A pad
    query also sees itself, so that no row is empty (an empty row is NaN after the softmax, and 0 · NaN in p·V would
    spread it); what pads compute is never attended to by a real token.
    """
    context = start + length
    keys = arange[:context]                                  # [C]
    queries = arange[start:context, None]                    # [Q, 1]
    causal = keys[None, :] <= queries                        # [Q, C]
    real = keys[None, :] >= pad[:, None]                     # [B, C]
    return (causal[None] & (real[:, None, :] | (keys[None, :] == queries)[None]))[:, None]  # [B, 1, Q, C]


def ragged_positions(pad: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Positions [B, 1] of one query token per sequence at its own cache slot `columns` [B] (sequences of
    different lengths decoding together; `pad` [B] leading pad slots each): slot minus padding."""
    return (columns - pad)[:, None]


def ragged_decode_mask(pad: torch.Tensor, columns: torch.Tensor, context: int, arange: torch.Tensor) -> torch.Tensor:
    """The attention mask [B, 1, 1, C] (True: attend; C = `context`, the largest column + 1) of one query token
    per sequence at slot `columns[b]`: it sees its sequence's slots pad[b] .. columns[b], nothing of the longer
    rows' tail."""
    keys = arange[:context]                                                    # [C]
    return ((keys[None, :] >= pad[:, None]) & (keys[None, :] <= columns[:, None]))[:, None, None, :]


class ResidualLinear(nn.Module):
    """Sublayers `out_proj`, `fc2`, `down`: a projection added to the residual stream."""

    def __init__(self, d_in: int, d_out: int, bias: bool):
        super().__init__()
        self.proj = nn.Linear(d_in, d_out, bias=bias)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self.proj(h)


class NormLinearAct(nn.Module):
    """Sublayer `fc1` (OPT): FFN norm, projection up, ReLU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = make_norm(cfg)
        self.proj = nn.Linear(cfg.hidden_size, cfg.ffn_dim, bias=cfg.proj_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.proj(self.norm(x)))


class NormGateUp(nn.Module):
    """Sublayer `gate_up` (SwiGLU): FFN norm, fused gate/up projection (rows [gate; up]), silu(gate) · up."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ffn_dim = cfg.ffn_dim
        self.norm = make_norm(cfg)
        self.proj = nn.Linear(cfg.hidden_size, 2 * cfg.ffn_dim, bias=cfg.proj_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.proj(self.norm(x)).split(self.ffn_dim, dim=-1)
        return F.silu(gate) * up


class Embedding(nn.Module):
    """Sublayer `embed`: token embedding, plus learned positions for OPT (HF's offset of 2)."""

    POSITION_OFFSET = 2

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.positions = (nn.Embedding(cfg.max_position + self.POSITION_OFFSET, cfg.hidden_size)
                          if not cfg.uses_rope else None)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)  # [B, Q, D]
        if self.positions is not None:
            x = x + self.positions(positions + self.POSITION_OFFSET)
        return x


class LMHead(nn.Module):
    """Sublayer `lm_head`: final norm and the vocabulary projection (weight shared with the embedding if tied)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm = make_norm(cfg)
        self.proj = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class KVCache:
    """A growing per-layer K/V cache for the eager reference forward: lists of [B, G, C, E] tensors."""

    def __init__(self, num_layers: int):
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer], k], dim=2)
            v = torch.cat([self.v[layer], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]


class Transformer(nn.Module):
    """Embedding, `num_layers` identical decoder layers, LM head. `forward` is the eager reference."""

    def __init__(self, cfg: ModelConfig, layer_cls: type[nn.Module]):
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg)
        self.layers = nn.ModuleList(layer_cls(cfg) for _ in range(cfg.num_layers))
        self.lm_head = LMHead(cfg)
        if cfg.tie_embeddings:
            self.lm_head.proj.weight = self.embed.tokens.weight

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """ids [B, Q] → logits [B, Q, vocab]; appends to `cache` when given."""
        B, Q = ids.shape
        start = cache.length if cache is not None else 0
        positions = torch.arange(start, start + Q, device=ids.device).expand(B, Q)
        x = self.embed(ids, positions)
        for index, layer in enumerate(self.layers):
            empty = x.new_empty(B, self.config.num_kv_heads, 0, self.config.head_dim)
            k_past = cache.k[index] if cache is not None and cache.k[index] is not None else empty
            v_past = cache.v[index] if cache is not None and cache.v[index] is not None else empty
            x, k, v = layer(x, positions, k_past, v_past)
            if cache is not None:
                cache.update(index, k, v)
        return self.lm_head(x)
