"""trace_model against hand-derived FLOPs and bytes, the zoo's parameter counts, and direct lowering off the fit.

Formulas (bf16 = 2 bytes; D hidden, F FFN, H heads, G KV heads, E head dim, V vocab):
    linear d_in → d_out:   FLOPs 2·B·Q·d_in·d_out, weight bytes 2·d_in·d_out (+ 2·d_out bias)
    q·Kᵀ and p·V:          FLOPs 2·B·H·Q·C·E each; each reads the K resp. V cache, 2·B·C·G·E bytes
    new K and V (qkv):     2 · 2·B·Q·G·E bytes written to the cache
"""

import dataclasses

import pytest
import torch

from liac.ir import OP_KINDS, Poly, require_stage
from liac.models import SUBLAYERS, ZOO, build_model
from liac.passes.trace import CHECK_POINT, CORNERS, TraceError, symbolic_dim, trace_layer, trace_model
from liac.passes.trace_lower import LoweringError, lower_program

BF16 = 2
POINTS = [(1, 128, 128), (1, 1, 129), (8, 1, 2049), (4, 512, 512), (3, 7, 19)]


def node(graph, name):
    return graph.nodes[name]["sublayer"]


def meta_param_count(cfg) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(cfg).parameters())


# ---------------------------------------------------------------------------------------------------------------
# Hand formulas


@pytest.mark.parametrize("name", ["opt-1.3b", "opt-30b"])
def test_opt_linears_flops_and_weights(name):
    cfg = ZOO[name]
    g, d = trace_model(cfg), cfg.hidden_size
    fc1 = node(g, "decoder.fc1")
    weight = next(w for w in fc1.weights if w.name.endswith("fc1.proj.weight"))
    assert weight.shape == (4 * d, d) and weight.nbytes == 8 * d * d  # OPT fc1 holds 8·d² bytes of weights
    assert fc1.weight_bytes == 8 * d * d + BF16 * 4 * d  # plus its bias
    for (B, Q, C) in POINTS:
        assert node(g, "decoder.qkv").flops(B, Q, C) == 2 * B * Q * d * 3 * d
        assert node(g, "decoder.out_proj").flops(B, Q, C) == 2 * B * Q * d * d
        assert fc1.flops(B, Q, C) == 2 * B * Q * d * 4 * d
        assert node(g, "decoder.fc2").flops(B, Q, C) == 2 * B * Q * 4 * d * d
        # fc1 reads its input and all its weights, writes its [B, Q, 4d] output
        assert fc1.bytes_read(B, Q, C) == fc1.weight_bytes + BF16 * B * Q * d
        assert fc1.bytes_written(B, Q, C) == BF16 * B * Q * 4 * d


@pytest.mark.parametrize("name", ["opt-1.3b", "opt-30b"])
def test_opt_attention_reads_the_whole_cache(name):
    cfg = ZOO[name]
    g, d, H, E = trace_model(cfg), cfg.hidden_size, cfg.num_heads, cfg.head_dim
    score, context, qkv = node(g, "decoder.attn_score"), node(g, "decoder.attn_context"), node(g, "decoder.qkv")
    for B, L in [(1, 128), (8, 2048), (3, 17)]:
        C = L + 1  # first decode step after an L-token prompt
        assert score.kv_read(B, 1, C) == BF16 * B * C * d  # q·Kᵀ reads 2·B·C·d_model bytes of K (MHA)
        assert context.kv_read(B, 1, C) == BF16 * B * C * d
        assert score.bytes_read(B, 1, C) == BF16 * B * C * d + BF16 * B * d  # plus q
        assert score.flops(B, 1, C) == context.flops(B, 1, C) == 2 * B * H * C * E
        assert qkv.kv_written(B, 1, C) == 2 * BF16 * B * d  # the new K and V
        assert score.kv_written(B, 1, C) == 0 and qkv.kv_read(B, 1, C) == 0
    assert score.kv_read(4, 512, 512) == BF16 * 4 * 512 * d  # prefill: the prompt's own K
    assert node(g, "decoder.softmax").bytes_read(2, 3, 5) == BF16 * 2 * H * 3 * 5  # probabilities [B, H, Q, C]


def test_gqa_llama_3_1_70b():
    cfg = ZOO["llama-3.1-70b"]
    g = trace_model(cfg)
    D, G, E, H, F = cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim, cfg.num_heads, cfg.ffn_dim
    assert (D, G * E) == (8192, 1024)  # K and V projections are 8192 × 1024 each
    qkv = node(g, "decoder.qkv")
    assert [w.shape for w in qkv.weights] == [(8192 + 2 * 1024, 8192)]
    assert qkv.weight_bytes == 2 * 8192 * (8192 + 2 * 1024)
    score = node(g, "decoder.attn_score")
    for B, Q, C in POINTS:
        assert qkv.flops(B, Q, C) == 2 * B * Q * 8192 * (8192 + 2 * 1024)
        assert score.kv_read(B, Q, C) == BF16 * B * C * 8 * 128  # 8 KV heads, not 64
        assert score.flops(B, Q, C) == 2 * B * H * Q * C * E  # every query head still attends
        assert qkv.kv_written(B, Q, C) == 2 * BF16 * B * Q * 8 * 128
        assert node(g, "decoder.gate_up").flops(B, Q, C) == 2 * B * Q * D * 2 * F
        assert node(g, "decoder.down").flops(B, Q, C) == 2 * B * Q * F * D
    assert node(g, "decoder.gate_up").weight_bytes == BF16 * 2 * F * D
    assert node(g, "decoder.down").weight_bytes == BF16 * F * D


def test_mixtral_experts_priced_for_routed_tokens():
    cfg = ZOO["mixtral-8x7b"]
    g = trace_model(cfg)
    D, F, X, k = cfg.hidden_size, cfg.ffn_dim, cfg.num_experts, cfg.experts_top_k
    experts, router = node(g, "decoder.experts"), node(g, "decoder.router")
    assert experts.experts == (X, k) == (8, 2) and experts.kind == "experts"
    assert experts.weight_bytes == BF16 * X * 3 * F * D
    # Dense per token and expert: gate_up 2·D·2F + down 2·F·D GEMM FLOPs, SiLU and ·up (F each), routing weight
    # (D); plus X − 1 adds of D summing the experts. The node keeps the routed fraction k / X of that.
    dense_per_token = X * (2 * D * 2 * F + 2 * F * D + 2 * F + D) + (X - 1) * D
    for B, Q, C in POINTS:
        assert experts.flops(B, Q, C) == B * Q * dense_per_token * k // X
        assert router.flops(B, Q, C) >= 2 * B * Q * D * X  # the gate GEMM plus softmax/top-k
    assert router.kind == "router" and [w.shape for w in router.weights] == [(X, D)]


def test_residual_stream_and_attention_edges():
    cfg = ZOO["llama-3.1-8b"]
    g, D, H = trace_model(cfg), cfg.hidden_size, cfg.num_heads
    for src, dst in [("embed.embed", "decoder.attn_norm"), ("embed.embed", "decoder.attn_residual"),
                     ("decoder.out_proj", "decoder.attn_residual"), ("decoder.attn_residual", "decoder.ffn_residual"),
                     ("decoder.down", "decoder.ffn_residual"), ("decoder.ffn_residual", "head.final_norm")]:
        tensor = g.edges[src, dst]["tensor"]
        assert tensor.shape == ("B", "Q", D) and tensor.dtype == "bfloat16"
        assert tensor.nbytes == Poly.of({(1, 1, 0): BF16 * D})
    probs = g.edges["decoder.softmax", "decoder.attn_context"]["tensor"]
    assert probs.shape == ("B", H, "Q", "C") and probs.nbytes(2, 3, 5) == BF16 * 2 * H * 3 * 5
    assert not g.has_edge("decoder.qkv", "decoder.attn_context")  # V reaches attention through the cache


def test_embedding_and_tied_head():
    cfg = ZOO["opt-1.3b"]
    g, D, V = trace_model(cfg), cfg.hidden_size, cfg.vocab_size
    embed, head = node(g, "embed.embed"), node(g, "head.lm_head")
    assert g.graph["tied_weights"] == {"lm_head.proj.weight": "embed.tokens.weight"}
    assert [w.name for w in head.weights] == ["lm_head.proj.weight"] and head.weight_bytes == BF16 * V * D
    assert [w.name for w in embed.weights] == ["embed.positions.weight"]  # the shared table is listed once
    for B, Q, C in POINTS:
        # token ids (int64), one row of the token table and one of the position table per token
        assert embed.bytes_read(B, Q, C) == 8 * B * Q + 2 * BF16 * B * Q * D
        assert head.flops(B, Q, C) == 2 * B * Q * D * V
        assert head.bytes_written(B, Q, C) == BF16 * B * Q * V


# ---------------------------------------------------------------------------------------------------------------
# The whole zoo

EXPECTED = {
    "common": {"attn_norm": ("norm", "qkv"), "qkv": ("linear", "qkv"), "attn_score": ("attention_score", "attn_score"),
               "softmax": ("softmax", "attn_score"), "attn_context": ("attention_context", "attn_context"),
               "out_proj": ("linear", "out_proj"), "attn_residual": ("add", "out_proj")},
    "opt": {"ffn_norm": ("norm", "fc1"), "fc1": ("linear", "fc1"), "act": ("activation", "fc1"),
            "fc2": ("linear", "fc2"), "ffn_residual": ("add", "fc2")},
    "llama": {"rope": ("rope", "qkv"), "ffn_norm": ("norm", "gate_up"), "gate_up": ("linear", "gate_up"),
              "act": ("activation", "gate_up"), "down": ("linear", "down"), "ffn_residual": ("add", "down")},
    "mixtral": {"rope": ("rope", "qkv"), "ffn_norm": ("norm", "router"), "router": ("router", "router"),
                "experts": ("experts", "experts"), "ffn_residual": ("add", "experts")},
}
EXPECTED["qwen2"] = EXPECTED["llama"]


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_traces(name):
    cfg = ZOO[name]
    g = trace_model(cfg)
    require_stage(g, "traced", "test")
    assert g.graph["model"] == cfg.to_dict()
    assert g.graph["layer_counts"] == {"embed": 1, "decoder": cfg.num_layers, "head": 1}
    assert g.graph["units"] == {"embed": ["embed"], "decoder": list(SUBLAYERS[cfg.family]), "head": ["lm_head"]}
    decoder = {s.name: (s.kind, s.unit) for s in g.sublayers("decoder")}
    assert decoder == {**EXPECTED["common"], **EXPECTED[cfg.family]}
    assert {s.name: (s.kind, s.unit) for s in g.sublayers("head")} == {"final_norm": ("norm", "lm_head"),
                                                                         "lm_head": ("linear", "lm_head")}
    assert all(s.kind in OP_KINDS for s in g.sublayers())
    # Weights: bytes × layer count over the graph = 2 bytes × the meta-built model's parameters (tied: once).
    total = sum(s.weight_bytes * g.graph["layer_counts"][s.layer_class] for s in g.sublayers())
    assert total == BF16 * meta_param_count(cfg)
    # Every activation a node writes goes somewhere: an edge, the KV cache, or the class output.
    for s in g.sublayers("decoder"):
        assert s.bytes_read(2, 3, 5) > 0 and s.bytes_written(2, 3, 5) > 0, s.name


def test_cached_trace_is_a_fresh_copy_named_after_the_config():
    cfg = ZOO["opt-1.3b"]
    renamed = dataclasses.replace(cfg, name="my-opt")
    first, second = trace_model(cfg), trace_model(renamed)
    assert second.graph["model"]["name"] == "my-opt" and first.graph["model"]["name"] == "opt-1.3b"
    second.remove_node("decoder.fc1")
    second.graph["units"]["decoder"].clear()
    third = trace_model(cfg)
    assert "decoder.fc1" in third and third.graph["units"]["decoder"]
    assert sorted(third.nodes) == sorted(first.nodes)
    assert [node(first, n) for n in sorted(first)] == [node(third, n) for n in sorted(third)]


# ---------------------------------------------------------------------------------------------------------------
# Direct lowering at points off the fit: decode (Q = 1, no mask), prefill (C = Q, empty past), large C


def lower_decoder_at(cfg, point):
    B, Q, C = point
    with torch.device("meta"):
        layer = build_model(cfg.with_layers(1)).to(torch.bfloat16).layers[0]

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    past = (B, cfg.num_kv_heads, C - Q, cfg.head_dim)
    ep = torch.export.export(layer, (meta(B, Q, cfg.hidden_size), meta(B, Q, dtype=torch.long), meta(*past),
                                     meta(*past)))
    return lower_program(ep, layer, "decoder", ("data", "aux", "k_past", "v_past"), ("data", "k", "v"),
                         lambda target: target)


@pytest.mark.parametrize("name", ["opt-1.3b", "llama-3.1-8b", "mixtral-8x7b"])
def test_polynomials_equal_direct_lowering_off_the_fit(name):
    cfg = ZOO[name]
    g = trace_model(cfg)
    for point in [(2, 1, 9), (1, 1, 1), (4, 16, 16), (7, 1, 300)]:
        lowered = lower_decoder_at(cfg, point)
        assert [n.name for n in lowered.nodes] == [s.name for s in g.sublayers("decoder")]
        for direct in lowered.nodes:
            sub = node(g, f"decoder.{direct.name}")
            for what in ("flops", "bytes_read", "bytes_written", "kv_read", "kv_written"):
                assert getattr(sub, what)(*point) == getattr(direct, what), (direct.name, what, point)


# ---------------------------------------------------------------------------------------------------------------
# Fitting and its errors


def test_symbolic_dim():
    points = CORNERS + (CHECK_POINT,)
    assert symbolic_dim([64] * 9, points) == 64
    assert symbolic_dim([p[0] for p in points], points) == "B"
    assert symbolic_dim([p[0] * p[1] for p in points], points) == "B*Q"
    assert symbolic_dim([32 * p[2] for p in points], points) == "32*C"
    with pytest.raises(TraceError):
        symbolic_dim([p[2] - p[1] for p in points], points)  # C − Q is not a monomial


class _Gram(torch.nn.Module):
    """x·xᵀ over the token axis: [B, Q, D] → [B, Q, Q], quadratic in Q."""

    def forward(self, x):
        return torch.matmul(x, x.transpose(1, 2))


def test_non_multilinear_count_names_the_node():
    def inputs(B, Q, C):
        return (torch.empty(B, Q, 8, device="meta"),)

    with pytest.raises(TraceError, match="sublayer 'embed' .* not multilinear"):
        trace_layer(_Gram(), inputs, "embed", ("data",), ("data",), lambda t: t)


class _Einsum(torch.nn.Module):
    def forward(self, x):
        return torch.einsum("bqd,bkd->bqk", x, x)


def test_unsupported_op_is_named():
    ep = torch.export.export(_Einsum(), (torch.empty(2, 3, 8, device="meta"),))
    with pytest.raises(LoweringError, match="einsum"):
        lower_program(ep, _Einsum(), "embed", ("data",), ("data",), lambda t: t)
    with pytest.raises(TraceError, match=r"embed at \(B, Q, C\) = \(2, 3, 7\): .*einsum"):
        trace_layer(_Einsum(), lambda B, Q, C: (torch.empty(B, Q, 8, device="meta"),), "embed", ("data",),
                    ("data",), lambda t: t)
