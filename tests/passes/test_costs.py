"""Cost model: prices of a tiny Linear and an attention block against hand arithmetic, transfers, KV, MoE, JSON."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hand_graphs import hand_graph

from liac.models.config import ModelConfig
from liac.passes.costs import (CostGraph, TierBudgets, Workload, annotate_costs, dma_beside_cpu_seconds,
                               experts_touched, layer_seconds)
from liac.profile import resolve_profile

TINY = ModelConfig(name="tiny-opt", family="opt", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4,
                   head_dim=16, ffn_dim=256, vocab_size=100, max_position=64, norm="layernorm", norm_eps=1e-5,
                   activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)
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


def by_hand_fit(chain, cpu, beside, cpu_read, stream, costs):
    """Eq. 18 written out: DMA reads `beside` bytes while the CPU computes and the PCIe rate (at most the shared
    one) in the rest of the chain; what does not fit stretches the step at the shared rate while slowing the CPU
    helps (until the DMA beside it gets the PCIe rate), then at the PCIe rate."""
    h, sh = costs.h2d_gb_per_s * GB, costs.ddr_shared_gb_per_s * GB
    short = stream - beside - min(h, sh) * max(chain - cpu, 0.0)
    if short <= 0:
        return chain
    slow = max(cpu_read / (sh - h) - cpu, 0.0)
    return chain + (short / sh if short <= sh * slow else slow + (short - sh * slow) / h)


def test_layer_time_is_the_max_of_chain_stream_and_shared_ddr():
    """Eqs. 7 and 18 on all-CPU, all-GPU-streamed and mixed placements, summed by hand from the unit prices."""
    costs = costs_for(batch=4)
    dec = costs.layer_class("decoder")
    tiers = ("ddr", "ddr", "ddr", "ddr", "ddr", "ddr")
    for placement in [(0,) * 6, (1,) * 6, (1, 0, 0, 1, 1, 1), (0, 1, 1, 0, 1, 0)]:
        seconds, staging, valid, _ = layer_seconds(costs, dec, "decode", tiers, np.array([placement]))
        pc = dec.decode
        total, most = 0.0, 0.0
        for step in range(pc.steps):
            chain = stream = cpu_read = cpu = beside = 0.0
            for i, u in enumerate(pc.units):
                if placement[i]:
                    chain += u.gpu_seconds[step] + u.kv_to_host_seconds[step]
                    stream += u.stream_bytes[step]
                else:
                    chain += u.cpu_seconds[1][step]
                    cpu += u.cpu_seconds[1][step]
                    beside += u.cpu_beside_bytes[1][step]
                    cpu_read += u.cpu_read_bytes[step]
            for e in pc.edges:
                if placement[e.src] != placement[e.dst]:
                    chain += e.h2d_seconds[step] if placement[e.dst] else e.d2h_seconds[step]
            total += max(chain, stream / (costs.h2d_gb_per_s * GB),
                         (stream + cpu_read) / (costs.ddr_shared_gb_per_s * GB),
                         by_hand_fit(chain, cpu, beside, cpu_read, stream, costs))
            most = max(most, stream)
        assert valid[0]
        assert seconds[0] == pytest.approx(total, rel=1e-12)
        assert staging[0] == pytest.approx(most)


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


def test_split_layer_time_by_hand():
    """Eqs. 15-18 on CCCC[S]G (fc1 split, 600 permille on the CPU), KV and weights in DDR: the split unit takes
    the slower of its parts plus the sync; an activation crossing to a split unit's GPU part moves whole, one
    leaving a split unit moves only the other device's share (its bytes scale, the latency does not)."""
    costs = annotate_costs(hand_graph(TINY), HW, Workload(4, 8, 4), BUDGETS, split_permille=(600,))
    dec = costs.layer_class("decoder")
    tiers = ("ddr",) * 6
    shares = (0.0, 0.0, 0.0, 0.0, 0.4, 1.0)  # GPU shares: fc1 is 40 % on the GPU, fc2 on the GPU
    seconds, staging, valid, _ = layer_seconds(costs, dec, "decode", tiers, np.array([shares]))
    pc, lat = dec.decode, HW.pcie_latency_seconds
    idx = {name: i for i, name in enumerate(dec.units)}

    def edge(a, b):
        return next(e for e in pc.edges if (e.src, e.dst) == (idx[a], idx[b]))

    total = most = 0.0
    for t in range(pc.steps):
        u = pc.units
        fc1 = max(u[4].split_cpu_seconds[0][1][t], u[4].split_gpu_seconds[0][t]) + HW.split_sync_seconds
        chain = sum(u[i].cpu_seconds[1][t] for i in range(4)) + fc1 + u[5].gpu_seconds[t]
        cpu = sum(u[i].cpu_seconds[1][t] for i in range(4)) + u[4].split_cpu_seconds[0][1][t]
        beside = sum(u[i].cpu_beside_bytes[1][t] for i in range(4)) + u[4].split_cpu_beside_bytes[0][1][t]
        chain += edge("out_proj", "fc1").h2d_seconds[t]  # CPU → the split fc1's GPU part: all of it
        chain += 0.6 * (edge("fc1", "fc2").h2d_seconds[t] - lat) + lat  # the CPU's 60 % of fc1's output
        chain += edge("out_proj", "fc2").h2d_seconds[t]  # the residual, to the GPU
        chain += edge("fc2", "qkv").d2h_seconds[t] + edge("fc2", "out_proj").d2h_seconds[t]
        stream = u[4].split_stream_bytes[0][t] + u[5].stream_bytes[t]
        cpu_read = sum(u[i].cpu_read_bytes[t] for i in range(4)) + u[4].split_cpu_read_bytes[0][t]
        total += max(chain, stream / (costs.h2d_gb_per_s * GB), (stream + cpu_read) / (costs.ddr_shared_gb_per_s * GB),
                     by_hand_fit(chain, cpu, beside, cpu_read, stream, costs))
        most = max(most, stream)
    assert valid[0]
    assert seconds[0] == pytest.approx(total, rel=1e-12)
    assert staging[0] == pytest.approx(most)
    assert costs.split_sync_seconds == HW.split_sync_seconds > 0
    # a split needs its weights off HBM; a share off the grid is a programming error
    tiers_hbm = ("ddr", "ddr", "ddr", "ddr", "hbm", "ddr")
    assert not layer_seconds(costs, dec, "decode", tiers_hbm, np.array([shares]))[2][0]
    with pytest.raises(ValueError, match="not 500"):
        layer_seconds(costs, dec, "decode", tiers, np.array([(0, 0, 0, 0, 0.5, 1)]))


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


def test_dma_beside_the_cpu_closed_forms():
    """Eq. 18 on hand-computed cases (rates in GB/s, bytes in GB): DMA alone; a CPU that saturates DDR; a CPU
    that leaves headroom, first enough, then not enough (the CPU is slowed, then the DMA waited for)."""
    def fit(chain, cpu, beside, cpu_gb, stream_gb, h2d, shared):
        return float(dma_beside_cpu_seconds(np.array(chain), np.array(cpu), np.array(beside * 1e9),
                                            np.array(cpu_gb * 1e9), np.array(stream_gb * 1e9), h2d, shared))

    assert fit(0.0, 0.0, 0.0, 0.0, 55.0, 55.0, 75.0) == pytest.approx(1.0)  # 55 GB at 55 GB/s
    assert fit(0.0, 0.0, 0.0, 0.0, 55.0, 55.0, 40.0) == pytest.approx(55.0 / 40.0)  # DDR slower than the link
    # the CPU alone saturates DDR (210 of 210) for 1 s, 0.1 s of launches: DMA gets 5.5 GB in the gaps, the
    # rest at the shared rate by slowing the CPU: (210 + 20 − 5.5) GB / 210 GB/s + 0.1 s
    assert fit(1.1, 1.1, 55.0 * 0.1, 210.0, 20.0, 55.0, 210.0) == pytest.approx(1.1 + 14.5 / 210.0)
    # headroom (CPU 210, shared 260, PCIe 55): 50 GB/s beside the CPU for 1 s
    assert fit(1.0, 1.0, 50.0, 210.0, 50.0, 55.0, 260.0) == pytest.approx(1.0)
    # 10 GB more: slowing the CPU to the point where DMA gets 55 beside it (210/205 s) gives 260 GB/s · 0.0244 s,
    # the rest waits for the DMA at 55 GB/s
    slow = 210.0 / 205.0 - 1.0
    assert fit(1.0, 1.0, 50.0, 210.0, 60.0, 55.0, 260.0) == pytest.approx(1.0 + slow + (10.0 - 260.0 * slow) / 55.0)


def test_expected_distinct_experts_matches_enumeration():
    """E·(1 − (1 − k/E)^n) against the mean over every top-k routing of n tokens (uniform, distinct experts)."""
    for experts, top_k, tokens in [(4, 2, 1), (4, 2, 2), (4, 2, 3), (5, 1, 3), (8, 2, 2)]:
        subsets = list(itertools.combinations(range(experts), top_k))
        routings = list(itertools.product(subsets, repeat=tokens))
        mean = sum(len(set().union(*r)) for r in routings) / len(routings)
        assert experts_touched(experts, top_k, tokens) == pytest.approx(mean, rel=1e-12)


def test_json_round_trip_replays():
    costs = costs_for()
    again = CostGraph.from_json(costs.to_json())
    assert again.to_json() == costs.to_json() or CostGraph.from_json(again.to_json()).to_json() == again.to_json()
    a = costs.layer_class("decoder").decode.units[4].cpu_seconds[1]
    b = again.layer_class("decoder").decode.units[4].cpu_seconds[1]
    assert b == pytest.approx(a, rel=1e-5)


def test_stage_is_checked():
    graph = hand_graph(TINY)
    graph.graph["stage"] = "costed"
    with pytest.raises(ValueError, match="annotate_costs needs a graph at stage 'traced'"):
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
