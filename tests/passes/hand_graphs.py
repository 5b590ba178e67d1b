"""Hand-built SublayerGraphs of OPT-style decoders for the compiler's tests (no torch, no tracer).

Each node's FLOPs and fused bytes are written from the architecture by hand, following the tracer's conventions
(docs/sublayer-graph.md): bytes_read counts a linear's whole weights but an embedding's looked-up rows only; K and V
reach attention through the cache (kv_written on qkv, kv_read on attn_score/attn_context), so the only edge from
qkv into attention carries q. The graphs let the cost model be checked against hand arithmetic independently of
the tracer.
"""
from liac.ir import Poly, Sublayer, SublayerGraph, TensorSpec, WeightTensor
from liac.models.config import ModelConfig

# A two-layer OPT small enough to price by hand (D = 64, F = 256, 4 heads, vocabulary 100).
TINY = ModelConfig(name="tiny-opt", family="opt", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                   head_dim=16, ffn_dim=256, vocab_size=100, max_position=64, norm="layernorm", norm_eps=1e-5,
                   activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)


def P(**terms):
    """P(BQ=3, BQC=2, c=5) → Poly: keys name the variables in the term (c = constant)."""
    out = {}
    for key, coeff in terms.items():
        out[("B" in key and 1 or 0, "Q" in key and 1 or 0, "C" in key and 1 or 0)] = coeff
    return Poly.of(out)


__all__ = ["P", "TINY", "hand_graph"]


def hand_graph(cfg, layers=None):
    """An OPT-style SublayerGraph for cfg written by hand (bf16): per node FLOPs and fused bytes."""
    D, H, F, V = cfg.hidden_size, cfg.num_heads, cfg.ffn_dim, cfg.vocab_size
    E = 2  # bytes per element
    g = SublayerGraph()
    g.graph.update(stage="traced", model=cfg.to_dict(),
                   layer_counts={"embed": 1, "decoder": layers or cfg.num_layers, "head": 1},
                   units={"embed": ["embed"], "decoder": ["qkv", "attn_score", "attn_context", "out_proj", "fc1", "fc2"],
                          "head": ["lm_head"]})
    act = P(BQ=D * E)

    def W(name, *shape):
        n = 1
        for s in shape:
            n *= s
        return WeightTensor(name, tuple(shape), "bfloat16", n * E)

    def add(cls, name, kind, unit, weights=(), flops=Poly(), read=Poly(), written=Poly(), kv_read=Poly(), kv_written=Poly()):
        wb = 0 if kind == "embedding" else sum(w.nbytes for w in weights)
        g.add_node(f"{cls}.{name}", sublayer=Sublayer(name, kind, cls, unit, tuple(weights), flops,
                                                     read + Poly.const(wb), written, kv_read, kv_written))

    def edge(a, b, nbytes):
        g.add_edge(a, b, tensor=TensorSpec(("B", "Q", D), "bfloat16", nbytes))

    add("embed", "embed", "embedding", "embed", [W("embed.tokens.weight", V, D), W("embed.positions.weight", cfg.max_position + 2, D)],
        flops=P(BQ=D), read=P(BQ=8 + 2 * D * E), written=act)
    add("decoder", "attn_norm", "norm", "qkv", [W("qkv.norm.weight", D), W("qkv.norm.bias", D)], flops=P(BQ=5 * D), read=act, written=act)
    add("decoder", "qkv", "linear", "qkv", [W("qkv.proj.weight", 3 * D, D), W("qkv.proj.bias", 3 * D)],
        flops=P(BQ=2 * D * 3 * D), read=act, written=P(BQ=3 * D * E), kv_written=P(BQ=2 * D * E))
    add("decoder", "attn_score", "attention_score", "attn_score", flops=P(BQC=2 * D), read=act + P(BC=D * E),
        written=P(BQC=H * E), kv_read=P(BC=D * E))
    add("decoder", "softmax", "softmax", "attn_score", flops=P(BQC=5 * H), read=P(BQC=H * E), written=P(BQC=H * E))
    add("decoder", "attn_context", "attention_context", "attn_context", flops=P(BQC=2 * D), read=P(BQC=H * E) + P(BC=D * E),
        written=act, kv_read=P(BC=D * E))
    add("decoder", "out_proj", "linear", "out_proj", [W("out_proj.proj.weight", D, D), W("out_proj.proj.bias", D)],
        flops=P(BQ=2 * D * D), read=act, written=act)
    add("decoder", "attn_residual", "add", "out_proj", flops=P(BQ=D), read=P(BQ=2 * D * E), written=act)
    add("decoder", "ffn_norm", "norm", "fc1", [W("fc1.norm.weight", D), W("fc1.norm.bias", D)], flops=P(BQ=5 * D), read=act, written=act)
    add("decoder", "fc1", "linear", "fc1", [W("fc1.proj.weight", F, D), W("fc1.proj.bias", F)], flops=P(BQ=2 * D * F), read=act,
        written=P(BQ=F * E))
    add("decoder", "act", "activation", "fc1", flops=P(BQ=F), read=P(BQ=F * E), written=P(BQ=F * E))
    add("decoder", "fc2", "linear", "fc2", [W("fc2.proj.weight", D, F), W("fc2.proj.bias", D)], flops=P(BQ=2 * D * F),
        read=P(BQ=F * E), written=act)
    add("decoder", "ffn_residual", "add", "fc2", flops=P(BQ=D), read=P(BQ=2 * D * E), written=act)
    add("head", "final_norm", "norm", "lm_head", [W("lm_head.norm.weight", D), W("lm_head.norm.bias", D)], flops=P(BQ=5 * D), read=act, written=act)
    add("head", "lm_head", "linear", "lm_head", [W("embed.tokens.weight", V, D)], flops=P(BQ=2 * D * V), read=act,
        written=P(BQ=V * E))
    for a, b, n in [("embed.embed", "decoder.attn_norm", act), ("embed.embed", "decoder.attn_residual", act),
                    ("decoder.attn_norm", "decoder.qkv", act), ("decoder.qkv", "decoder.attn_score", act), ("decoder.attn_score", "decoder.softmax", P(BQC=H * E)),
                    ("decoder.softmax", "decoder.attn_context", P(BQC=H * E)), ("decoder.attn_context", "decoder.out_proj", act),
                    ("decoder.out_proj", "decoder.attn_residual", act), ("decoder.attn_residual", "decoder.ffn_norm", act),
                    ("decoder.attn_residual", "decoder.ffn_residual", act), ("decoder.ffn_norm", "decoder.fc1", act),
                    ("decoder.fc1", "decoder.act", P(BQ=F * E)), ("decoder.act", "decoder.fc2", P(BQ=F * E)),
                    ("decoder.fc2", "decoder.ffn_residual", act), ("decoder.ffn_residual", "head.final_norm", act),
                    ("head.final_norm", "head.lm_head", act)]:
        edge(a, b, n)
    return g
