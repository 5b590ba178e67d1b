"""Independent cross-check: HF transformers' own decoder layers, lowered by the same code, give our sublayer graph.

HF's layers differ from ours in every detail the lowering must see through: separate q/k/v and gate/up
projections (fused by the sibling rule), eager attention as matmul · scale + mask → softmax → matmul with
`repeat_kv` for GQA (or SDPA), RoPE tables passed in as inputs, OPT's FFN on a flattened [B·Q, D] view, and the
KV cache as an object whose `update` concatenates. Built on the meta device from configs written here.
"""

import pytest
import torch
from torch import nn

from liac.models import from_hf_config
from liac.passes.trace import trace_layer, trace_model

transformers = pytest.importorskip("transformers")


class PastKV:
    """The part of HF's Cache a decoder layer calls: `update` appends this step's K, V to the past ones."""

    def __init__(self, k_past, v_past):
        self.k_past, self.v_past = k_past, v_past

    def update(self, k, v, layer_idx, *args, **kwargs):
        return torch.cat([self.k_past, k], dim=-2), torch.cat([self.v_past, v], dim=-2)


class HFLayer(nn.Module):
    """An HF decoder layer with tensor inputs only: hidden states, additive mask, RoPE cos/sin, past K and V."""

    def __init__(self, layer, rope: bool):
        super().__init__()
        self.layer, self.rope = layer, rope

    def forward(self, x, mask, cos, sin, k_past, v_past):
        extra = {"position_embeddings": (cos, sin)} if self.rope else {}
        return self.layer(x, attention_mask=mask, cache=PastKV(k_past, v_past), **extra)


def trace_hf_decoder(hf_config, layer_class, rope: bool, attn_implementation: str):
    hf_config._attn_implementation = attn_implementation
    cfg = from_hf_config(hf_config.to_dict(), name="hf")
    with torch.device("meta"):
        layer = HFLayer(layer_class(hf_config, layer_idx=0), rope).to(torch.bfloat16).eval()
    G, E = cfg.num_kv_heads, cfg.head_dim

    def inputs(B, Q, C):
        def meta(*shape):
            return torch.empty(*shape, dtype=torch.bfloat16, device="meta")
        return (meta(B, Q, cfg.hidden_size), meta(B, 1, Q, C), meta(B, Q, E), meta(B, Q, E),
                meta(B, G, C - Q, E), meta(B, G, C - Q, E))

    template = trace_layer(layer, inputs, "decoder", ("data", "aux", "aux", "aux", "k_past", "v_past"), ("data",),
                           lambda target: target)
    return template, trace_model(cfg)


def assert_same_decoder(template, ours):
    theirs = {s.name: s for s in template.sublayers}
    mine = {s.name: s for s in ours.sublayers("decoder")}
    assert list(theirs) == list(mine)
    assert list(template.units) == ours.graph["units"]["decoder"]
    for name, sub in mine.items():
        other = theirs[name]
        assert (other.kind, other.unit, other.experts) == (sub.kind, sub.unit, sub.experts), name
        assert other.weight_bytes == sub.weight_bytes, name
        assert sum(w.nbytes for w in other.weights) == sum(w.nbytes for w in sub.weights), name
        for what in ("flops", "bytes_read", "bytes_written", "kv_read", "kv_written"):
            assert getattr(other, what) == getattr(sub, what), (name, what, str(getattr(other, what)),
                                                                str(getattr(sub, what)))
    edges = {(e.src, e.dst) for e in template.edges if e.src != "@input"}
    assert edges == {(u.split(".")[1], v.split(".")[1]) for u, v in ours.edges
                     if u.startswith("decoder.") and v.startswith("decoder.")}


def test_hf_opt_decoder_layer_eager():
    from transformers.models.opt.modeling_opt import OPTDecoderLayer

    config = transformers.OPTConfig(hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32,
                                    vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=2048)
    template, ours = trace_hf_decoder(config, OPTDecoderLayer, rope=False, attn_implementation="eager")
    assert_same_decoder(template, ours)
    # HF keeps q, k and v as three projections: the sibling rule fused them into one qkv node.
    qkv = next(s for s in template.sublayers if s.name == "qkv")
    assert sorted(w.name for w in qkv.weights) == sorted(
        f"layer.self_attn.{p}_proj.{kind}" for p in "qkv" for kind in ("weight", "bias"))


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_hf_llama_gqa_decoder_layer(attn_implementation):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      max_position_embeddings=8192)
    template, ours = trace_hf_decoder(config, LlamaDecoderLayer, rope=True, attn_implementation=attn_implementation)
    assert_same_decoder(template, ours)
    qkv = next(s for s in template.sublayers if s.name == "qkv")
    assert sorted(w.shape for w in qkv.weights) == [(1024, 4096), (1024, 4096), (4096, 4096)]
