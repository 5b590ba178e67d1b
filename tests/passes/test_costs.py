"""Cost model: prices of a tiny Linear and an attention block against hand arithmetic, transfers, KV, MoE, JSON."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hand_graphs import TINY, hand_graph

from liac.models.config import ModelConfig
from liac.passes.costs import (WORKSPACE_SHARE, CostGraph, Microbatch, TierBudgets, Workload, annotate_costs,
                               experts_touched, experts_transient_bytes, gpu_workspace_bytes, microbatch_points)
from liac.profile import resolve_profile

HW = resolve_profile("spr-h100-cxl")
BUDGETS = TierBudgets(10**12, 10**12, 10**12)
D, F, H, V = 64, 256, 4, 100
GB = 1e9


def costs_for(batch=2, prompt=8, gen=4, hw=HW):
    return annotate_costs(hand_graph(TINY), hw, Workload(batch, prompt, gen), BUDGETS)


def unit(costs, layer_class, phase, name):
    cls = costs.layer_class(layer_class)
    return cls.phase(phase).units[cls.units.index(name)]


def roof_gpu(flops, nbytes):
    return max(flops / (HW.gpu_bf16_tflops * 1e12), nbytes / (HW.gpu_hbm_gb_per_s * GB)) + HW.gpu_launch_seconds


def test_fc1_decode_on_both_devices_by_hand():
    """fc1 = ffn_norm + fc1 linear + ReLU, decode step at B=2 (M = 2 rows)."""
    B = 2
    costs = costs_for(batch=B)
    fc1 = unit(costs, "decoder", "decode", "fc1")
    x, h = B * D * 2, B * F * 2  # activation bytes in and out of the linear
    norm_w, lin_w = 2 * D * 2, (F * D + F) * 2
    gpu = (roof_gpu(5 * B * D, norm_w + 2 * x) + roof_gpu(2 * B * D * F, lin_w + x + h)
           + roof_gpu(B * F, 2 * h))
    assert fc1.gpu_seconds[0] == pytest.approx(gpu, rel=1e-12)
    # AMX at M=2: between the (1, 0.4) and (16, 6.4) TFLOP/s points, a quarter of the way in log M
    amx = (0.4 + math.log(2) / math.log(16) * 6.0) * 1e12
    ddr, cxl, lam = HW.cpu_ddr_read_gb_per_s * GB, HW.cxl_gb_per_s * GB, HW.cpu_launch_seconds

    def cpu(weight_rate):
        return (max(5 * B * D / amx, norm_w / weight_rate + 2 * x / ddr) + lam
                + max(2 * B * D * F / amx, lin_w / weight_rate + (x + h) / ddr) + lam
                + max(B * F / amx, 2 * h / ddr) + lam)

    tiers = ("hbm", "ddr", "cxl")
    assert fc1.cpu_seconds[tiers.index("ddr")][0] == pytest.approx(cpu(ddr), rel=1e-12)
    assert fc1.cpu_seconds[tiers.index("cxl")][0] == pytest.approx(cpu(cxl), rel=1e-12)
    assert not fc1.cpu_allows_hbm
    # streamed when the GPU computes it with its weights off HBM: all of the unit's weights, each step
    assert fc1.stream_bytes == (norm_w + lin_w,) * 3


def test_attention_decode_reads_the_growing_cache():
    """attn_score (q·Kᵀ + softmax) at decode step t reads K of C = L + t + 1 tokens from the KV tier."""
    B, L = 2, 8
    costs = costs_for(batch=B, prompt=L, gen=4)
    score = unit(costs, "decoder", "decode", "attn_score")
    assert len(score.gpu_seconds) == 3  # gen_len 4: the prefill gives token 1, three decode steps the rest
    kv_rate, ddr = HW.cpu_kv_read_gb_per_s * GB, HW.cpu_ddr_read_gb_per_s * GB
    amx1 = 0.4e12  # M = Q = 1
    for step, C in enumerate(range(L + 1, L + 4)):
        q, k, p = B * D * 2, B * C * D * 2, B * H * C * 2
        cpu = (max(2 * B * C * D / amx1, k / kv_rate + (q + p) / ddr) + HW.cpu_launch_seconds
               + max(5 * B * H * C / amx1, 2 * p / ddr) + HW.cpu_launch_seconds)
        assert score.cpu_seconds[1][step] == pytest.approx(cpu, rel=1e-12)
        gpu = roof_gpu(2 * B * C * D, k + q + p) + roof_gpu(5 * B * H * C, 2 * p)
        assert score.gpu_seconds[step] == pytest.approx(gpu, rel=1e-12)
        assert score.stream_bytes[step] == k  # a GPU attention over a DDR cache streams K each step
    # KV in CXL: the CPU reads it at the CXL rate (LIA observation 2)
    C = L + 1
    cxl_cpu = (max(2 * B * C * D / amx1, B * C * D * 2 / (HW.cxl_gb_per_s * GB) + (B * D * 2 + B * H * C * 2) / ddr)
               + HW.cpu_launch_seconds + max(5 * B * H * C / amx1, 2 * B * H * C * 2 / ddr) + HW.cpu_launch_seconds)
    assert score.cpu_seconds[2][0] == pytest.approx(cxl_cpu, rel=1e-12)
    assert not score.cpu_allows_hbm  # decode attention on the CPU needs the cache off HBM
    assert unit(costs, "decoder", "prefill", "attn_score").cpu_allows_hbm  # prefill reads fresh K, V


def test_fused_decode_attention_is_priced_by_its_kv_read_alone():
    """Eq. 1b: CPU decode attention (both halves on the CPU: the fused kernel `cpu_kv_read_gb_per_s` times) costs
    its KV bytes at that rate, whatever the GEMM curve says at M = 1 (a weight GEMV's rate: with it as a FLOP bound
    the H200's fused attention was priced 1.3-2x what it measured, docs/cost-model.md). The GEMM curve still bounds
    the softmax, attention run apart (Eq. 25) and the prefill."""
    B, L = 2, 8
    slow = dataclasses.replace(HW, cpu_amx_bf16_tflops=tuple(
        dataclasses.replace(p, tflops=p.tflops * 1e-6) if p.m == 1 else p for p in HW.cpu_amx_bf16_tflops))
    costs = costs_for(batch=B, prompt=L, gen=4, hw=slow)
    amx1 = slow.cpu_tflops_at(1) * 1e12
    kv_rate, ddr, lam = HW.cpu_kv_read_gb_per_s * GB, HW.cpu_ddr_read_gb_per_s * GB, HW.cpu_launch_seconds
    score = unit(costs, "decoder", "decode", "attn_score")
    context = unit(costs, "decoder", "decode", "attn_context")
    for step, C in enumerate(range(L + 1, L + 4)):
        q, k, p, o = B * D * 2, B * C * D * 2, B * H * C * 2, B * D * 2
        assert 2 * B * C * D / amx1 > 100 * k / kv_rate  # the FLOP bound would dominate by far
        want = (k / kv_rate + (q + p) / ddr + lam) + (max(5 * B * H * C / amx1, 2 * p / ddr) + lam)
        assert score.cpu_seconds[1][step] == pytest.approx(want, rel=1e-12)
        assert context.cpu_seconds[1][step] == pytest.approx(k / kv_rate + (p + o) / ddr + lam, rel=1e-12)
        # apart from its partner (Eq. 25) the score is a matmul over the capacity: the GEMM curve bounds it
        assert score.cpu_apart_seconds[1][step] > 2 * B * (L + 3) * D / amx1
    # prefill attention (Q > 1) keeps its FLOP bound (the attention curve)
    assert unit(costs, "decoder", "prefill", "attn_score").cpu_seconds[1][0] == pytest.approx(
        unit(costs_for(batch=B, prompt=L, gen=4), "decoder", "prefill", "attn_score").cpu_seconds[1][0], rel=1e-12)


def test_prefill_lm_head_prices_the_last_position_only():
    B, L = 2, 8
    costs = costs_for(batch=B, prompt=L)
    head = unit(costs, "head", "prefill", "lm_head")
    x = B * D * 2
    gpu = roof_gpu(5 * B * D, 2 * D * 2 + 2 * x) + roof_gpu(2 * B * D * V, V * D * 2 + x + B * V * 2)
    assert head.gpu_seconds[0] == pytest.approx(gpu, rel=1e-12)


def test_kv_cache_edges_and_kv_writes():
    B, L, G = 3, 8, 4
    costs = costs_for(batch=B, prompt=L, gen=G)
    dec = costs.layer_class("decoder")
    # K and V of L + G - 1 tokens (the last generated token is never fed back)
    assert dec.kv_cache_bytes == 2 * B * (L + G - 1) * D * 2
    qkv = unit(costs, "decoder", "prefill", "qkv")
    kv_new = 2 * B * L * D * 2
    assert qkv.kv_to_host_seconds[0] == pytest.approx(kv_new / (HW.pcie_d2h_gb_per_s * GB) + HW.pcie_latency_seconds)
    assert qkv.kv_to_gpu_seconds[0] == pytest.approx(kv_new / (HW.pcie_h2d_gb_per_s * GB) + HW.pcie_latency_seconds)
    # edges: within the layer, plus the next layer's input (fc2 → qkv and fc2 → out_proj, the residual)
    pairs = {(dec.units[e.src], dec.units[e.dst]) for e in dec.prefill.edges}
    assert pairs == {("qkv", "attn_score"), ("attn_score", "attn_context"), ("attn_context", "out_proj"),
                     ("out_proj", "fc1"), ("out_proj", "fc2"), ("fc1", "fc2"), ("fc2", "qkv"), ("fc2", "out_proj")}
    fc1_fc2 = next(e for e in dec.prefill.edges if (dec.units[e.src], dec.units[e.dst]) == ("fc1", "fc2"))
    assert fc1_fc2.h2d_seconds[0] == pytest.approx(B * L * F * 2 / (HW.pcie_h2d_gb_per_s * GB)
                                                   + HW.pcie_latency_seconds)
    assert costs.tied_weight_bytes == V * D * 2  # OPT's LM head is the embedding matrix


def test_fc1_split_parts_by_hand():
    """A split fc1 at decode B=2 (Eq. 15): each device normalises the whole input, computes its share of the
    GEMM's FLOPs, weights and outputs, and applies ReLU to its share; the GPU part streams its share of the GEMM's
    weights plus two rows of slack and the whole norm (Eq. 16)."""
    B = 2
    costs = annotate_costs(hand_graph(TINY), HW, Workload(B, 8, 4), BUDGETS, split_permille=(250, 600))
    assert costs.split_permille == (250, 600)
    fc1 = unit(costs, "decoder", "decode", "fc1")
    x, h = B * D * 2, B * F * 2
    norm_w, lin_w = 2 * D * 2, (F * D + F) * 2
    amx = (0.4 + math.log(2) / math.log(16) * 6.0) * 1e12
    ddr, lam = HW.cpu_ddr_read_gb_per_s * GB, HW.cpu_launch_seconds
    for k, permille in enumerate((250, 600)):
        f, g = permille / 1000, 1 - permille / 1000
        cpu = (max(5 * B * D / amx, norm_w / ddr + 2 * x / ddr) + lam
               + max(2 * B * D * F * f / amx, f * lin_w / ddr + (x + f * h) / ddr) + lam
               + max(B * F * f / amx, 2 * h * f / ddr) + lam)
        gpu = roof_gpu(5 * B * D, norm_w + 2 * x) + roof_gpu(2 * B * D * F * g, g * lin_w + x + g * h) \
            + roof_gpu(B * F * g, 2 * h * g)
        assert fc1.split_cpu_seconds[k][1][0] == pytest.approx(cpu, rel=1e-12)
        assert fc1.split_gpu_seconds[k][0] == pytest.approx(gpu, rel=1e-12)
        assert fc1.split_stream_bytes[k][0] == pytest.approx(g * lin_w + 2 * lin_w / F + norm_w, rel=1e-12)
        assert fc1.split_cpu_read_bytes[k][0] == pytest.approx(f * lin_w + norm_w, rel=1e-12)
    # only weight GEMM units split: not attention, not the embedding; the LM head does
    assert not unit(costs, "decoder", "decode", "attn_score").can_split
    assert not unit(costs, "embed", "decode", "embed").can_split
    assert unit(costs, "head", "decode", "lm_head").can_split
    assert not unit(annotate_costs(hand_graph(TINY), HW, Workload(B, 8, 4), BUDGETS, split_permille=()),
                    "decoder", "decode", "fc1").can_split
    with pytest.raises(ValueError, match="permille in 1..999"):
        annotate_costs(hand_graph(TINY), HW, Workload(B, 8, 4), BUDGETS, split_permille=(0, 500))


def test_beside_bytes_of_fc1_on_the_cpu_by_hand():
    """Eq. 18a for fc1 at decode B=2 with its weights in DDR: per kernel, DMA may read what the shared rate leaves
    beside the kernel's own weight reads (at most the PCIe rate) while it runs, and the PCIe rate during its
    launch overhead; a kernel reading no DDR operand leaves it the whole PCIe rate."""
    B = 2
    costs = costs_for(batch=B)
    fc1 = unit(costs, "decoder", "decode", "fc1")
    x, h = B * D * 2, B * F * 2
    norm_w, lin_w = 2 * D * 2, (F * D + F) * 2
    amx = (0.4 + math.log(2) / math.log(16) * 6.0) * 1e12
    ddr, lam = HW.cpu_ddr_read_gb_per_s * GB, HW.cpu_launch_seconds
    pcie, shared = HW.pcie_h2d_gb_per_s * GB, HW.ddr_shared_gb_per_s * GB
    kernels = [(max(5 * B * D / amx, norm_w / ddr + 2 * x / ddr), norm_w),
               (max(2 * B * D * F / amx, lin_w / ddr + (x + h) / ddr), lin_w),
               (max(B * F / amx, 2 * h / ddr), 0.0)]
    expected = sum(min(pcie * busy, max(shared * busy - weights, 0.0)) + min(pcie, shared) * lam
                   for busy, weights in kernels)
    assert fc1.cpu_beside_bytes[1][0] == pytest.approx(expected, rel=1e-12)
    # weights in CXL: the kernels read no DDR, DMA gets the PCIe rate throughout
    cxl_seconds = fc1.cpu_seconds[2][0]
    assert fc1.cpu_beside_bytes[2][0] == pytest.approx(min(pcie, shared) * cxl_seconds, rel=1e-12)


def test_prefill_cpu_kernels_leave_dma_only_their_launch_overhead():
    """Eq. 18a in prefill: a CPU kernel over B·Q > 1 rows leaves PCIe DMA no DDR beside its roofline part (the H200
    runs: splits and CPU units in prefill did not overlap the weight stream), only its launch overhead; the same
    unit in decode keeps the fluid model, and so does the LM head's prefill (Q = 1), for a whole unit and a split's
    CPU part alike."""
    B, prompt = 2, 8
    costs = costs_for(batch=B, prompt=prompt)
    lam = HW.cpu_launch_seconds
    alone = min(HW.pcie_h2d_gb_per_s, HW.ddr_shared_gb_per_s) * GB * lam  # per kernel: its launch, DMA alone
    fc1 = unit(costs, "decoder", "prefill", "fc1")
    for tier in (1, 2):  # DDR and CXL: no DDR beside the kernels either way
        assert fc1.cpu_beside_bytes[tier][0] == pytest.approx(3 * alone, rel=1e-12)
        for k in range(len(costs.split_permille)):
            assert fc1.split_cpu_beside_bytes[k][tier][0] == pytest.approx(3 * alone, rel=1e-12)
    decode = unit(costs, "decoder", "decode", "fc1")
    assert decode.cpu_beside_bytes[1][0] > 3 * alone  # decode: DMA beside the kernels (Eq. 18a as before)
    head = unit(costs, "head", "prefill", "lm_head")
    head_decode = unit(costs, "head", "decode", "lm_head")
    assert head.cpu_beside_bytes[1][0] == pytest.approx(head_decode.cpu_beside_bytes[1][0], rel=1e-12)
    assert head.cpu_beside_bytes[1][0] > alone


def test_expected_distinct_experts_matches_enumeration():
    """E·(1 − (1 − k/E)^n) against the mean over every top-k routing of n tokens (uniform, distinct experts)."""
    for experts, top_k, tokens in [(4, 2, 1), (4, 2, 2), (4, 2, 3), (5, 1, 3), (8, 2, 2)]:
        subsets = list(itertools.combinations(range(experts), top_k))
        routings = list(itertools.product(subsets, repeat=tokens))
        mean = sum(len(set().union(*r)) for r in routings) / len(routings)
        assert experts_touched(experts, top_k, tokens) == pytest.approx(mean, rel=1e-12)


def test_experts_transient_bytes_by_hand():
    """Eq. 14's MoE term from the stacked weights' shapes alone: Mixtral-8x7B's (D 4096, F 14336, bf16, top-2 of 8)
    at a batch-8 prefill of 128 tokens: n = 1024 tokens, blocks of R = 1024·2/8 = 256 rows."""
    from liac.ir import Poly, Sublayer, WeightTensor

    experts, top_k, d, f = 8, 2, 4096, 14336
    weights = (WeightTensor("down", (experts, d, f), "bfloat16", experts * d * f * 2),  # either order
               WeightTensor("gate_up", (experts, 2 * f, d), "bfloat16", experts * 2 * f * d * 2))
    node = Sublayer("experts", "experts", "decoder", "experts", weights=weights, bytes_written=Poly.const(0),
                    experts=(experts, top_k))
    n, rows = 1024, 256
    routing = 12 * n * top_k                     # int64 token index + fp32 weight per assignment
    partial = n * d * 2                          # the device's partial sum
    block = rows * 2 * (d + 2 * f + 2 * f)       # gathered input, gate_up's output, silu(gate), the product
    assert experts_transient_bytes(node, (8, 128, 128)) == routing + partial + block
    # decode at batch 1: one token, blocks of one row (larger than the merge's copy of a partial sum, n·D·2)
    assert experts_transient_bytes(node, (1, 1, 130)) == 12 * 2 + d * 2 + 2 * (d + 4 * f)
    # 3 tokens, top-2 of 8: ⌈6 / 8⌉ = 1 row per block
    assert experts_transient_bytes(node, (3, 1, 130)) == 12 * 6 + 3 * d * 2 + 2 * (d + 4 * f)
    dense = dataclasses.replace(node, kind="linear", experts=(0, 0))
    assert experts_transient_bytes(dense, (8, 128, 128)) == 0


def test_json_round_trip_replays():
    costs = costs_for()
    again = CostGraph.from_json(costs.to_json())
    assert again.to_json() == costs.to_json() or CostGraph.from_json(again.to_json()).to_json() == again.to_json()
    a = costs.layer_class("decoder").decode.units[4].cpu_seconds[1]
    b = again.layer_class("decoder").decode.units[4].cpu_seconds[1]
    assert b == pytest.approx(a, rel=1e-5)


def test_stage_is_checked():
    graph = hand_graph(TINY)
    del graph.graph["stage"]
    with pytest.raises(ValueError, match="annotate_costs needs a graph at stage 'traced', got 'None'"):
        annotate_costs(graph, HW, Workload(1, 8, 4), BUDGETS)


def test_traced_graph_prices_like_the_hand_built_one():
    """The tracer's OPT graph and the hand-written one give the same memory and (to FLOP-count details) times."""
    from liac.passes.trace import trace_model

    cfg = ModelConfig(name="trace-opt", family="opt", hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4,
                      head_dim=32, ffn_dim=512, vocab_size=1000, max_position=128, norm="layernorm", norm_eps=1e-5,
                      activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)
    work = Workload(4, 32, 4)
    traced = annotate_costs(trace_model(cfg), HW, work, BUDGETS)
    hand = annotate_costs(hand_graph(cfg), HW, work, BUDGETS)
    assert traced.tied_weight_bytes == hand.tied_weight_bytes == 1000 * 128 * 2
    for a, b in zip(traced.classes, hand.classes):
        assert (a.units, a.operands, a.weight_bytes, a.kv_cache_bytes) == (b.units, b.operands, b.weight_bytes,
                                                                           b.kv_cache_bytes)
        for phase in ("prefill", "decode"):
            pa, pb = a.phase(phase), b.phase(phase)
            assert sorted((e.src, e.dst) for e in pa.edges) == sorted((e.src, e.dst) for e in pb.edges)
            for ua, ub in zip(pa.units, pb.units):
                assert ua.stream_bytes == ub.stream_bytes
                assert ua.gpu_seconds == pytest.approx(ub.gpu_seconds, rel=1e-3)
                for tier in range(3):
                    assert ua.cpu_seconds[tier] == pytest.approx(ub.cpu_seconds[tier], rel=1e-3)


def test_workspace_is_the_activation_live_set_plus_the_gpu_footprint_by_hand():
    """Eq. 14 on the hand-built OPT layer (D = 64, F = 256 = 4D, 4 heads): the runtime holds the residual x while fc1
    runs, and fc1's ReLU holds its input and output (F each), so T·(D + 2F) bf16 bytes with T = B·Q tokens; prefill
    attention holds less (q, K, V, the H·Q·C probabilities twice, x: with C = Q = 8 ≤ D / H = 16... small)."""
    hw = dataclasses.replace(HW, gpu_context_mib=300.0, gpu_library_workspace_mib=40.0, gpu_activation_factor=1.5)
    costs = costs_for(batch=2, prompt=8, hw=hw)
    tokens = 2 * 8
    live = tokens * (D + 2 * F) * 2
    attention = tokens * D * 2 * (1 + 2 + 1) + 2 * H * 8 * 8 * 2 * 2  # q, K, V, x; probabilities in and out
    assert attention < live
    decoder = costs.layer_class("decoder")
    assert decoder.host_workspace_bytes == live
    # + two of the caching allocator's 20 MiB segments (costs.ALLOCATOR_SEGMENTS_BYTES)
    assert decoder.workspace_bytes == int(300 * 2**20 + 40 * 2**20 + 1.5 * live + 40 * 2**20)
    assert costs.gpu_context_bytes == 300 * 2**20


# ---------------------------------------------------------------------------------------------------------------
# Prefill micro-batches (Eq. 20)


def test_microbatch_points_count_every_micro_batch():
    """5 sequences × 7 tokens in micro-batches of 2 sequences × 3 tokens: row blocks 2, 2, 1 × chunks ending at
    3, 6, 7 (each attends to the chunks before it: C = its end)."""
    points, counts = microbatch_points(Workload(5, 7, 4), Microbatch(2, 3))
    assert dict(zip(points, counts)) == {(2, 3, 3): 2, (2, 3, 6): 2, (2, 1, 7): 2, (1, 3, 3): 1, (1, 3, 6): 1,
                                         (1, 1, 7): 1}
    assert sum(b * q * n for (b, q, _), n in zip(points, counts)) == 5 * 7  # every prompt token once
    assert microbatch_points(Workload(5, 7, 4), Microbatch(5, 7)) == ([(5, 7, 7)], [1])
    assert Microbatch(2, 3).count(Workload(5, 7, 4)) == 9


def test_prefill_in_microbatches_by_hand():
    """B=2, L=8 in micro-batches of 1 sequence × 4 tokens: the decoder's prefill steps are the micro-batch points,
    each shared by both sequences; weights are staged once (the whole batch's); the workspace is one
    micro-batch's largest node, the rest of the batch's residual stream and the prompt's K, V so far (Eq. 14)."""
    B, L = 2, 8
    whole = costs_for(batch=B, prompt=L)
    costs = annotate_costs(hand_graph(TINY), HW, Workload(B, L, 4), BUDGETS, microbatches=(Microbatch(1, 4),))
    assert costs.microbatch == Microbatch(1, 4) and costs.prefill_options == ()
    pc = costs.layer_class("decoder").prefill
    assert (pc.steps, pc.step_repeats) == (2, (2, 2))
    fc1 = pc.units[costs.layer_class("decoder").units.index("fc1")]
    b, q = 1, 4
    x, h = b * q * D * 2, b * q * F * 2
    norm_w, lin_w = 2 * D * 2, (F * D + F) * 2
    gpu = roof_gpu(5 * b * q * D, norm_w + 2 * x) + roof_gpu(2 * b * q * D * F, lin_w + x + h) + roof_gpu(
        b * q * F, 2 * h)
    assert fc1.gpu_seconds == pytest.approx((gpu, gpu), rel=1e-12)
    assert fc1.stream_bytes == (norm_w + lin_w,) * 2  # staged once for all micro-batches, priced per pass
    # attention of the second chunk reads the K of all 8 tokens
    score = pc.units[costs.layer_class("decoder").units.index("attn_score")]
    assert score.gpu_seconds[1] == pytest.approx(roof_gpu(2 * q * L * D, (q * D + L * D) * 2 + q * H * L * 2)
                                                 + roof_gpu(5 * H * q * L, 2 * q * H * L * 2), rel=1e-12)
    # Eq. 14: while one micro-batch's fc1 runs, its residual x and the ReLU's input and output (F wide), the other
    # 12 tokens' residual stream, the prompt's K and V (8 tokens) of the row block; the GPU workspace is the whole
    # footprint around those activations
    decoder = costs.layer_class("decoder")
    assert decoder.host_workspace_bytes == q * (D + 2 * F) * 2 + (B * L - q) * D * 2 + 2 * L * D * 2
    assert decoder.workspace_bytes == gpu_workspace_bytes(decoder.host_workspace_bytes, HW)
    assert whole.layer_class("decoder").host_workspace_bytes == B * L * (D + 2 * F) * 2  # the whole batch's
    assert costs.with_prefill(Microbatch(1, 4)) == costs


def test_candidates_halve_sequences_then_tokens_while_they_free_memory():
    """The solver is offered the whole batch, then halvings (sequences first, then prompt tokens) for as long as
    each frees at least WORKSPACE_SHARE of the budget."""
    graph, work = hand_graph(TINY), Workload(4, 32, 4)
    tight = annotate_costs(graph, HW, work, TierBudgets(64 * 1024, 10**12, 0))
    candidates = tight.microbatches
    assert candidates[:4] == (Microbatch(4, 32), Microbatch(2, 32), Microbatch(1, 32), Microbatch(1, 16))
    sizes = [tight.with_prefill(m).layer_class("decoder").workspace_bytes for m in candidates]
    assert all(a - b >= WORKSPACE_SHARE * 64 * 1024 for a, b in zip(sizes, sizes[1:]))
    roomy = annotate_costs(graph, HW, work, TierBudgets(10**12, 10**12, 0))
    assert roomy.microbatches == (Microbatch(4, 32),)  # nothing worth freeing: the whole batch only
    # every candidate prices the same decode and only the decoder's prefill differs
    other = tight.with_prefill(candidates[-1])
    assert other.layer_class("decoder").decode == tight.layer_class("decoder").decode
    assert other.layer_class("head") == tight.layer_class("head")
    assert CostGraph.from_json(tight.to_json()).microbatches == candidates  # the options serialise too
