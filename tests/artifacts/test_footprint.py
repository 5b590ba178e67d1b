"""Bytes per tier recomputed from the architecture, against hand-derived formulas and published parameter counts."""

from __future__ import annotations

import pytest
from artifact_plans import TINY_LLAMA, TINY_OPT, make_plan, with_group

from liac.artifacts.footprint import kv_bytes_per_layer, tier_footprint, unit_weight_bytes
from liac.models import PUBLISHED_PARAMS, ZOO
from liac.plan import SublayerPlacement


def test_tiny_opt_units_match_hand_formulas():
    d, f, v, p = TINY_OPT.hidden_size, TINY_OPT.ffn_dim, TINY_OPT.vocab_size, TINY_OPT.max_position
    got = unit_weight_bytes(TINY_OPT)
    assert got[("decoder", "qkv")] == 2 * (2 * d + 3 * d * d + 3 * d)  # LayerNorm (w, b) + fused QKV with bias
    assert got[("decoder", "attn_score")] == got[("decoder", "attn_context")] == 0
    assert got[("decoder", "out_proj")] == 2 * (d * d + d)
    assert got[("decoder", "fc1")] == 2 * (2 * d + d * f + f)
    assert got[("decoder", "fc2")] == 2 * (f * d + d)
    assert got[("embed", "embed")] == 2 * (v * d + (p + 2) * d)  # tokens + learned positions (HF offset 2)
    assert got[("head", "lm_head")] == 2 * (2 * d + v * d)  # final LayerNorm + the tied matrix


def test_tiny_llama_gqa_units_match_hand_formulas():
    d, f, v, h, g, e = (TINY_LLAMA.hidden_size, TINY_LLAMA.ffn_dim, TINY_LLAMA.vocab_size, TINY_LLAMA.num_heads,
                        TINY_LLAMA.num_kv_heads, TINY_LLAMA.head_dim)
    got = unit_weight_bytes(TINY_LLAMA)
    assert got[("decoder", "qkv")] == 2 * (d + d * (h + 2 * g) * e)
    assert got[("decoder", "out_proj")] == 2 * h * e * d
    assert got[("decoder", "gate_up")] == 2 * (d + 2 * f * d)
    assert got[("decoder", "down")] == 2 * f * d
    assert got[("embed", "embed")] == 2 * v * d
    assert got[("head", "lm_head")] == 2 * (d + v * d)


def test_llama_70b_qkv_is_gqa_sized():
    assert unit_weight_bytes(ZOO["llama-3.1-70b"])[("decoder", "qkv")] == 2 * 8192 * (8192 + 2 * 1024) + 2 * 8192


@pytest.mark.parametrize("name", ["opt-30b", "opt-175b", "llama-3.1-70b", "llama-3.1-405b", "mixtral-8x7b"])
def test_whole_model_in_one_tier_is_two_bytes_per_published_parameter(name):
    cfg = ZOO[name]
    plan = make_plan(cfg, resident=0, offload_decode="cpu", cpu_bytes=2**50, gpu_bytes=2**40)
    plan = with_group(plan, 0, sublayers=(SublayerPlacement.whole("embed", "gpu", "gpu", "ddr"),))
    plan = with_group(plan, 2, sublayers=(SublayerPlacement.whole("lm_head", "gpu", "gpu", "ddr"),))
    weights = tier_footprint(plan)["ddr"].weight_bytes
    published, _ = PUBLISHED_PARAMS[name]
    assert weights == pytest.approx(2 * published, rel=0.01)


def test_tied_matrix_counted_once_per_tier():
    d, v = TINY_OPT.hidden_size, TINY_OPT.vocab_size
    same = tier_footprint(make_plan(resident=TINY_OPT.num_layers))  # embed and head both in HBM
    head_ddr = with_group(make_plan(resident=TINY_OPT.num_layers), 2,
                          sublayers=(SublayerPlacement.whole("lm_head", "cpu", "cpu", "ddr"),))
    split = tier_footprint(head_ddr)
    assert split["ddr"].weight_bytes == 2 * (2 * d + v * d)  # the head needs its own copy of the matrix in DDR
    assert split["hbm"].weight_bytes == same["hbm"].weight_bytes - 2 * (2 * d)  # only the final norm left HBM


def test_kv_bytes_follow_the_attention_shape():
    assert kv_bytes_per_layer(ZOO["llama-3.1-70b"], 8, 1000) == 2 * 8 * 1000 * 8 * 128 * 2
    plan = make_plan(TINY_LLAMA, batch=3, prompt=10, gen=5, resident=1, offload_kv="cxl", cxl_bytes=2**30)
    kv = {tier: fp.kv_bytes for tier, fp in tier_footprint(plan).items()}
    per_layer = 2 * 3 * (10 + 5 - 1) * 2 * 16 * 2
    assert kv == {"hbm": per_layer, "ddr": 0, "cxl": 3 * per_layer}
