"""Pricing a placement (passes/price.py): one layer's time against hand sums of the unit prices (Eqs. 2-9, 15-18),
and a plan's price, the same wherever it is asked for: every checked-in plan of every shipped profile (splits
included) re-prices to the `status.predicted` it carries, and `liac calibrate` predicts exactly that too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hand_graphs import TINY, hand_graph

from liac.api import compile_plans
from liac.calibrate import Row, Run, predict_rows
from liac.models import ZOO
from liac.passes.costs import TierBudgets, Workload, annotate_costs
from liac.passes.price import (EXPERT_SPLIT_OPS, SPLIT_OPS, LayerPricer, _unit_options, chain_ops, dma_beside_cpu_seconds,
                               layer_time, plan_profile, price_plan, shared_ddr_seconds, unit_prices, unit_times)
from liac.passes.trace import trace_model
from liac.plan import PHASES, TIERS, load_plan
from liac.profile import profile_names, resolve_profile
from liac.sizes import GB, GIB
from liac.sweep import plan_files

HW = resolve_profile("spr-h100-cxl")
BUDGETS = TierBudgets(10**12, 10**12, 10**12)
PLANS = Path(__file__).resolve().parents[2] / "plans"
MODELS = ("opt-30b", "opt-66b")  # two traces cover a split plan on every profile plans/ holds


def costs_for(batch=2, prompt=8, gen=4, hw=HW):
    return annotate_costs(hand_graph(TINY), hw, Workload(batch, prompt, gen), BUDGETS)


# ---------------------------------------------------------------------------------------------------------------
# One layer, by hand


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
    pc = dec.decode
    for placement in [(0,) * 6, (1,) * 6, (1, 0, 0, 1, 1, 1), (0, 1, 1, 0, 1, 0)]:  # 1 = GPU
        permille = [[1000 * (1 - on_gpu) for on_gpu in placement]]
        priced = layer_time(costs, dec, "decode", tiers, np.array(permille))
        assert priced.valid[0]
        assert priced.seconds[0] == pytest.approx(_whole_layer_by_hand(costs, dec, placement), rel=1e-12)
        most = max(sum(u.stream_bytes[step] for i, u in enumerate(pc.units) if placement[i]) for step in range(pc.steps))
        assert priced.staging_bytes[0] == pytest.approx(most)


def _whole_layer_by_hand(costs, dec, placement) -> float:
    """Eqs. 4-7, 18, 25 and 26 summed by hand for whole units (1 = GPU, 0 = CPU), everything in DDR: a decode
    attention unit on the CPU whose partner is on the GPU takes its apart prices (`cpu_apart_*`)."""
    pc = dec.decode
    score, context = (i for i, u in enumerate(pc.units) if u.cpu_apart_seconds)
    apart = {score: placement[context] == 1, context: placement[score] == 1}
    total = 0.0
    for step in range(pc.steps):
        stream = cpu_read = cpu = beside = 0.0
        own = [0.0] * len(pc.units)  # each unit's terms on the chain: its compute, K, V write, the copies into it
        for i, u in enumerate(pc.units):
            if placement[i]:
                own[i] += u.gpu_seconds[step] + u.kv_to_host_seconds[step]
                stream += u.stream_bytes[step]
                continue
            alone = apart.get(i, False)
            seconds = (u.cpu_apart_seconds if alone else u.cpu_seconds)[1][step]
            own[i] += seconds
            cpu += seconds
            beside += (u.cpu_apart_beside_bytes if alone else u.cpu_beside_bytes)[1][step]
            cpu_read += (u.cpu_apart_read_bytes if alone else u.cpu_read_bytes)[step]
        crossings = []
        for e in pc.edges:
            if placement[e.src] != placement[e.dst]:
                own[e.dst] += e.h2d_seconds[step] if placement[e.dst] else e.d2h_seconds[step]
                if placement[e.dst]:
                    crossings.append(e.dst)
        chain = sum(own)
        h = costs.h2d_gb_per_s * GB
        step_seconds = max(chain, stream / h, (stream + cpu_read) / (costs.ddr_shared_gb_per_s * GB),
                           by_hand_fit(chain, cpu, beside, cpu_read, stream, costs))
        # Eq. 26: the release follows the last streamed unit; the first crossing to the GPU after it (cyclically)
        # waits for the copy queued there, and the engine idles until the release: from that crossing's unit on
        readers = [i for i, u in enumerate(pc.units) if placement[i] and u.stream_bytes[step] > 0]
        if readers and crossings:
            n = len(pc.units)
            after = [(i - readers[-1] - 1) % n for i in range(n)]
            first = min(after[i] for i in crossings)
            step_seconds = max(step_seconds, stream / h + sum(own[i] for i in range(n) if after[i] >= first))
        total += step_seconds
    return total


def test_a_crossing_queued_behind_the_copy_idles_the_engine_until_the_release(monkeypatch):
    """Eq. 26: host → GPU copies run one at a time, in the order queued. The release after a layer's last streamed
    unit queues the copy two layers ahead; the first activation crossing to the GPU after it (the next layer's CPU
    work handing over) waits for that whole copy, and the engine then idles until the next release: a decode
    step is at least the stream plus the chain from that crossing to the release. A layer with no crossing (all on
    the GPU) is Eq. 7 alone, and a split's join crosses inside its own op, before the release."""
    hw = dataclasses.replace(HW, pcie_h2d_gb_per_s=0.5)  # stream-bound: the tiny model's copies take longest
    costs = costs_for(batch=4, hw=hw)
    dec = costs.layer_class("decoder")
    pc = dec.decode
    ddr = ("ddr",) * 6

    def without_queue(tiers, permille):
        with monkeypatch.context() as patch:
            patch.setattr(LayerPricer, "_copy_queue", lambda *args: None)
            return layer_time(costs, dec, "decode", tiers, np.array([permille])).seconds[0]

    # CPU qkv (and attention: LIA's partial policy the other way round), the rest streamed to the GPU
    for placement in [(0, 1, 1, 1, 1, 1), (0, 0, 0, 1, 1, 1), (1, 0, 0, 1, 1, 1)]:  # 1 = GPU
        permille = [1000 * (1 - on_gpu) for on_gpu in placement]
        priced = layer_time(costs, dec, "decode", ddr, np.array([permille])).seconds[0]
        assert priced == pytest.approx(_whole_layer_by_hand(costs, dec, placement), rel=1e-12)
        assert priced > without_queue(ddr, permille) * (1 + 1e-9)  # the term binds here
        # the stream plus the GPU units from the first one after the CPU's (its crossing) to fc2 (the release)
        first = placement.index(1, placement.index(0))
        tail = [sum(pc.units[i].gpu_seconds[t] + pc.units[i].kv_to_host_seconds[t] for i in range(first, 6))
                + sum(e.h2d_seconds[t] if placement[e.src] == 0 else 0.0 for e in pc.edges if e.dst >= first)
                for t in range(pc.steps)]
        streamed = [sum(pc.units[i].stream_bytes[t] for i in range(6) if placement[i]) for t in range(pc.steps)]
        assert priced == pytest.approx(sum(b / (0.5 * GB) + x for b, x in zip(streamed, tail)), rel=1e-12)
    # all on the GPU: nothing crosses to it, Eq. 7 alone (LIA's GPU policy)
    assert layer_time(costs, dec, "decode", ddr, np.array([(0,) * 6])).seconds[0] == without_queue(ddr, (0,) * 6)
    # fc1 split and the last streamed unit, its CPU share joined inside the split op: no crossing after the release
    tiers = ("hbm", "hbm", "hbm", "hbm", "ddr", "hbm")
    split = (0, 0, 0, 0, costs.split_permille[0], 0)
    assert layer_time(costs, dec, "decode", tiers, np.array([split])).seconds[0] == without_queue(tiers, split)
    # prefill stages its weights once for the pass: no term there
    rows = np.array([(1000, 0, 0, 0, 0, 0)])
    with monkeypatch.context() as patch:
        patch.setattr(LayerPricer, "_copy_queue", lambda *args: None)
        plain = layer_time(costs, dec, "prefill", ddr, rows).seconds[0]
    assert layer_time(costs, dec, "prefill", ddr, rows).seconds[0] == plain


def test_attention_apart_on_the_cpu_by_hand():
    """Eq. 25: decode attention on the CPU beside its partner on the GPU is one matmul over the cache's whole
    capacity (the last decode step's context) read at the GEMV rate, not the fused kernel both on the CPU run (the
    profile's KV rate, at each step's context); a layer prices whichever the placement makes, by hand."""
    hw = dataclasses.replace(HW, cpu_kv_read_gb_per_s=3 * HW.cpu_ddr_read_gb_per_s)
    costs = costs_for(batch=64, prompt=512, gen=4, hw=hw)
    dec = costs.layer_class("decoder")
    pc = dec.decode
    assert [u.name for u in pc.units if u.cpu_apart_seconds] == ["attn_score", "attn_context"]
    assert not any(u.cpu_apart_seconds for u in dec.prefill.units)  # a prefill reads the fresh K, V
    context = pc.units[2]
    for tier in range(len(context.cpu_seconds)):
        # over the capacity at every step: the same price each step, at least the fused one (CXL: the same rate)
        assert len(set(context.cpu_apart_seconds[tier])) == 1
        assert all(a >= f for a, f in zip(context.cpu_apart_seconds[tier], context.cpu_seconds[tier]))
    assert all(a > f for a, f in zip(context.cpu_apart_seconds[1], context.cpu_seconds[1]))  # DDR: a third the rate
    assert len(set(context.cpu_apart_read_bytes)) == 1
    assert context.cpu_apart_read_bytes[0] == context.cpu_read_bytes[-1] > context.cpu_read_bytes[0]
    # at equal rates the apart context is the fused one at the capacity, the last step's context
    same = costs_for(batch=64, prompt=512, gen=4,
                     hw=dataclasses.replace(HW, cpu_kv_read_gb_per_s=HW.cpu_ddr_read_gb_per_s)).layer_class("decoder")
    fused_last = same.decode.units[2].cpu_seconds[1][-1]
    assert same.decode.units[2].cpu_apart_seconds[1] == pytest.approx((fused_last,) * pc.steps, rel=1e-12)
    tiers = ("ddr",) * 6
    for placement in [(0, 0, 1, 1, 1, 1), (0, 1, 0, 1, 1, 1), (0, 0, 0, 1, 1, 1), (1, 0, 0, 1, 1, 1)]:
        permille = np.array([[1000 * (1 - on_gpu) for on_gpu in placement]])
        assert layer_time(costs, dec, "decode", tiers, permille).seconds[0] == pytest.approx(
            _whole_layer_by_hand(costs, dec, placement), rel=1e-12)
    apart = layer_time(costs, dec, "decode", tiers, np.array([(1000, 1000, 0, 0, 0, 0)])).seconds[0]
    rows = np.array([(1000, 1000, 0, 0, 0, 0), (1000, 1000, 1000, 0, 0, 0)])  # priced together, each as alone
    together = layer_time(costs, dec, "decode", tiers, rows).seconds
    assert together[0] == apart
    # the per-unit rows (status.predicted, liac explain) carry the same price
    units = {u.name: u for u in unit_times(costs, dec, "decode", tiers, (1000, 1000, 0, 0, 0, 0))}
    assert units["attn_score"].compute_seconds == pytest.approx(float(np.mean(pc.units[1].cpu_apart_seconds[1])),
                                                                rel=1e-12)
    fused = {u.name: u for u in unit_times(costs, dec, "decode", tiers, (1000, 1000, 1000, 0, 0, 0))}
    assert fused["attn_score"].compute_seconds == pytest.approx(float(np.mean(pc.units[1].cpu_seconds[1])),
                                                                rel=1e-12)


def test_prefill_kv_write_is_on_the_chain_when_the_cpu_attention_reads_it():
    """Eq. 20a: a prefill's K, V write into a host cache runs beside the compute (Eq. 20) unless an attention unit of
    the layer computes on the CPU: it reads this step's K, V in that cache, once the GPU's write has landed
    (runtime kv_read 'stored'), so the write is on the chain, charged to qkv's transfers, not its stream."""
    costs = costs_for(batch=4, prompt=16)
    dec = costs.layer_class("decoder")
    pc, tiers = dec.prefill, ("ddr",) * 6
    written = sum(r * s for r, s in zip(pc.step_repeats, pc.units[0].kv_to_host_seconds))
    assert written > 0
    cpu_attention, gpu_attention = (0, 1000, 1000, 0, 0, 0), (0,) * 6
    rows = {u.name: u for u in unit_times(costs, dec, "prefill", tiers, cpu_attention)}
    assert rows["qkv"].transfer_seconds == pytest.approx(written, rel=1e-12)
    priced = layer_time(costs, dec, "prefill", tiers, np.array([cpu_attention]))
    assert priced.chain_seconds[0] == pytest.approx(sum(u.compute_seconds + u.transfer_seconds
                                                         for u in rows.values()), rel=1e-12)
    # attention on the GPU: nothing on the host reads the write, which stays beside (qkv's stream, not its chain)
    rows = {u.name: u for u in unit_times(costs, dec, "prefill", tiers, gpu_attention)}
    assert rows["qkv"].transfer_seconds == 0 and rows["qkv"].stream_seconds >= written
    priced = layer_time(costs, dec, "prefill", tiers, np.array([gpu_attention]))
    assert priced.chain_seconds[0] == pytest.approx(sum(u.compute_seconds + u.transfer_seconds
                                                         for u in rows.values()), rel=1e-12)
    # priced together with other placements, each as alone (the pricer's shared sums)
    both = layer_time(costs, dec, "prefill", tiers, np.array([cpu_attention, gpu_attention, (0, 1000, 0, 0, 0, 0)]))
    alone = [layer_time(costs, dec, "prefill", tiers, np.array([p])).seconds[0]
             for p in (cpu_attention, gpu_attention, (0, 1000, 0, 0, 0, 0))]
    assert list(both.seconds) == alone


def test_split_layer_time_by_hand():
    """Eqs. 15-18 on CCCC[S]G (fc1 split, 600 permille on the CPU), KV and weights in DDR: the split unit takes
    the slower of its parts plus the sync; an activation crossing to a split unit's GPU part moves whole, one
    leaving a split unit moves only the other device's share (its bytes scale, the latency does not)."""
    costs = annotate_costs(hand_graph(TINY), HW, Workload(4, 8, 4), BUDGETS, split_permille=(600,))
    dec = costs.layer_class("decoder")
    tiers = ("ddr",) * 6
    permille = (1000, 1000, 1000, 1000, 600, 0)  # fc1 is 60 % on the CPU, fc2 on the GPU
    priced = layer_time(costs, dec, "decode", tiers, np.array([permille]))
    seconds, staging, valid = priced.seconds, priced.staging_bytes, priced.valid
    total, _, most = _split_fc1_by_hand(costs, dec)
    assert valid[0]
    assert seconds[0] == pytest.approx(total, rel=1e-12)
    assert staging[0] == pytest.approx(most)
    assert costs.split_sync_seconds == HW.split_sync_seconds > 0
    # a split needs its weights off HBM; a share off the grid is a programming error
    tiers_hbm = ("ddr", "ddr", "ddr", "ddr", "hbm", "ddr")
    assert not layer_time(costs, dec, "decode", tiers_hbm, np.array([permille])).valid[0]
    with pytest.raises(ValueError, match="not 500"):
        layer_time(costs, dec, "decode", tiers, np.array([(1000, 1000, 1000, 1000, 500, 0)]))


def _split_fc1_by_hand(costs, dec, op=0.0):
    """Eqs. 15-18 (and Eq. 24's `op` per unit the runtime runs, SPLIT_OPS = 3 for the split) summed by hand for
    TINY's decoder as CCCC[S]G, fc1 60 % on the CPU, everything in DDR: (layer seconds, chain seconds, most
    streamed bytes in a step)."""
    pc, lat = dec.decode, HW.pcie_latency_seconds
    idx = {name: i for i, name in enumerate(dec.units)}

    def edge(a, b):
        return next(e for e in pc.edges if (e.src, e.dst) == (idx[a], idx[b]))

    total = chains = most = 0.0
    for t in range(pc.steps):
        u = pc.units
        fc1 = max(u[4].split_cpu_seconds[0][1][t], u[4].split_gpu_seconds[0][t]) + HW.split_sync_seconds + 3 * op
        chain = sum(u[i].cpu_seconds[1][t] + op for i in range(4)) + fc1 + u[5].gpu_seconds[t] + op
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
        chains += chain
        most = max(most, stream)
    return total, chains, most


def test_runtime_op_seconds_on_the_chain_by_hand():
    """Eq. 24: every unit the runtime runs adds the profile's `runtime_op_seconds` to the chain, a split unit
    SPLIT_OPS of them; none of it reads DDR, so the CPU's compute time (Eq. 18's T_cpu) is unchanged.
    CCCC[S]G with fc1 split 60 % on the CPU, everything in DDR, summed by hand as in the test above."""
    op = 3e-4
    hw = dataclasses.replace(HW, runtime_op_seconds=op)
    costs = annotate_costs(hand_graph(TINY), hw, Workload(4, 8, 4), BUDGETS, split_permille=(600,))
    assert costs.runtime_op_seconds == op and SPLIT_OPS == 3
    dec = costs.layer_class("decoder")
    tiers = ("ddr",) * 6
    permille = (1000, 1000, 1000, 1000, 600, 0)
    priced = layer_time(costs, dec, "decode", tiers, np.array([permille]))
    total, chains, _ = _split_fc1_by_hand(costs, dec, op)
    pc = dec.decode
    assert priced.seconds[0] == pytest.approx(total, rel=1e-12)
    assert priced.chain_seconds[0] == pytest.approx(chains, rel=1e-12)
    # a layer whose weights and cache sit in HBM runs on the GPU alone, bound by its chain: 6 ops more per step
    resident = ("hbm",) * 6
    without = layer_time(costs_for(4, 8, 4), costs_for(4, 8, 4).layer_class("decoder"), "decode", resident,
                         np.array([(0,) * 6]))
    with_ops = layer_time(costs, dec, "decode", resident, np.array([(0,) * 6]))
    assert with_ops.seconds[0] - without.seconds[0] == pytest.approx(pc.steps * 6 * op, rel=1e-9)
    # the explain table's per-unit compute carries it too: one op per whole unit, three for the split
    units = {u.name: u for u in unit_times(costs, dec, "decode", tiers, permille)}
    bare = {u.name: u for u in unit_times(annotate_costs(hand_graph(TINY), HW, Workload(4, 8, 4), BUDGETS,
                                                         split_permille=(600,)), dec, "decode", tiers, permille)}
    assert units["qkv"].compute_seconds - bare["qkv"].compute_seconds == pytest.approx(op, rel=1e-9)
    assert units["fc1"].compute_seconds - bare["fc1"].compute_seconds == pytest.approx(3 * op, rel=1e-9)


def test_a_profile_without_runtime_op_seconds_prices_as_before():
    """Profiles written before Eq. 24 load with 0 (listed as an estimate) and price exactly as they did."""
    assert HW.runtime_op_seconds == 0.0 and "runtime_op_seconds" in HW.estimates
    bare = costs_for(batch=4)
    dec = bare.layer_class("decoder")
    placement = np.array([(1000, 1000, 1000, 0, 0, 0)])
    a = layer_time(bare, dec, "decode", ("ddr",) * 6, placement).seconds[0]
    b = layer_time(costs_for(batch=4, hw=dataclasses.replace(HW, runtime_op_seconds=0.0)), dec, "decode",
                   ("ddr",) * 6, placement).seconds[0]
    assert a == b


def test_a_profile_without_the_attentions_shared_rate_prices_as_before():
    """`ddr_shared_kv_gb_per_s` absent (0) or equal to the GEMV's shared rate: every layer prices bit for bit as
    Eq. 6 did with the one rate, and the profile hashes as it did (plans compiled for it stay valid)."""
    assert HW.ddr_shared_kv_gb_per_s == 0.0 and HW.ddr_shared_kv == HW.ddr_shared_gb_per_s
    same = dataclasses.replace(HW, ddr_shared_kv_gb_per_s=HW.ddr_shared_gb_per_s)
    assert "ddr_shared_kv_gb_per_s" not in HW.canonical()
    assert dataclasses.replace(HW, ddr_shared_kv_gb_per_s=0.0).sha256() == HW.sha256() != same.sha256()
    placements = np.array([(1000, 1000, 1000, 0, 0, 0), (0, 1000, 1000, 0, 0, 0), (0, 0, 0, 1000, 0, 1000)])
    for batch in (1, 64):
        a, b = (costs_for(batch=batch, prompt=512, gen=2, hw=hw) for hw in (HW, same))
        for phase in ("decode", "prefill"):
            assert np.array_equal(layer_time(a, a.layer_class("decoder"), phase, ("ddr",) * 6, placements).seconds,
                                  layer_time(b, b.layer_class("decoder"), phase, ("ddr",) * 6, placements).seconds)


def test_shared_ddr_with_the_attentions_own_rate_by_hand():
    """Eq. 6 with s_kv: each CPU byte brings its share of the stream at its own kernel's rate, (R + S)·(R_w/s +
    R_kv/s_kv)/R; attention alone → (R + S)/s_kv, a GEMV alone → (R + S)/s, no CPU read → S/s."""
    costs = dataclasses.replace(costs_for(), ddr_shared_gb_per_s=100.0, ddr_shared_kv_gb_per_s=120.0)
    gb = 1e9
    assert shared_ddr_seconds(np.array(40 * gb), np.array(40 * gb), np.array(80 * gb), costs) == pytest.approx(1.0)
    assert shared_ddr_seconds(np.array(40 * gb), np.array(0.0), np.array(60 * gb), costs) == pytest.approx(1.0)
    assert shared_ddr_seconds(np.array(0.0), np.array(0.0), np.array(50 * gb), costs) == pytest.approx(0.5)
    # half the CPU's bytes each way: (30 + 60) GB · (15/100 + 15/120) / 30 s
    assert shared_ddr_seconds(np.array(30 * gb), np.array(15 * gb), np.array(60 * gb), costs) == pytest.approx(
        90 * (15 / 100 + 15 / 120) / 30)


def test_the_fused_attention_beside_the_stream_is_priced_at_its_own_shared_rate():
    """A decode layer with the fused attention on the CPU over a KV cache in DDR and every weight streamed, on a
    profile whose GEMV shared rate makes Eq. 6 bind: with the attention's own measured rate above it (the H200:
    113 GB/s drawn against the GEMV probe's 97) the layer is priced at (R_kv + S)/s_kv, and Eq. 18a lets the DMA
    read more beside that kernel; a GEMV on the CPU is still priced at the GEMV's rate."""
    hw = dataclasses.replace(HW, ddr_shared_gb_per_s=2.0, pcie_h2d_gb_per_s=50.0)
    fast = dataclasses.replace(hw, ddr_shared_kv_gb_per_s=4.0)
    tiers = ("ddr",) * 6
    attention = np.array([(0, 1000, 1000, 0, 0, 0)])
    gemv = np.array([(1000, 0, 0, 0, 0, 0)])
    slow_costs, fast_costs = (costs_for(batch=64, prompt=512, gen=2, hw=h) for h in (hw, fast))
    dec = slow_costs.layer_class("decoder")
    pc = dec.phase("decode")
    read = stream = 0.0
    for index, unit in enumerate(pc.units):
        options = _unit_options(slow_costs, unit, tiers[index], attention[0, index:index + 1], pc.steps)
        read += options["read"][0][0]
        stream += options["stream"][0][0]
    assert read > 0 and stream > 0
    slow = layer_time(slow_costs, dec, "decode", tiers, attention).seconds[0]
    quick = layer_time(fast_costs, fast_costs.layer_class("decoder"), "decode", tiers, attention).seconds[0]
    assert slow == pytest.approx((read + stream) / 2e9, rel=1e-6)  # Eq. 6 binds at the GEMV's rate
    assert quick == pytest.approx((read + stream) / 4e9, rel=1e-6)  # at the attention's own
    beside = [cost.cpu_beside_bytes for cost in (slow_costs, fast_costs)
              for cost in [cost.layer_class("decoder").decode.units[1]]]
    assert beside[1][TIERS.index("ddr")][0] > beside[0][TIERS.index("ddr")][0]  # Eq. 18a beside the kernel
    assert layer_time(slow_costs, dec, "decode", tiers, gemv).seconds[0] == \
        layer_time(fast_costs, fast_costs.layer_class("decoder"), "decode", tiers, gemv).seconds[0]


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


def test_dma_beside_a_cpu_that_does_not_yield():
    """Eq. 18c: only the CPU kernels whose reads yield (fused decode attention, MoE experts) are slowed for the
    DMA; beside a weight GEMV (none yields here) what did not fit waits for the DMA alone at the PCIe rate. The
    H200's GEMV plans at batch 1-32 measured 74-97 GB/s of DDR where the fluid stretch priced the probe's 103."""
    def fit(chain, cpu, beside, yield_gb, stream_gb, yielding):
        return float(dma_beside_cpu_seconds(np.array(chain), np.array(cpu), np.array(beside * 1e9),
                                            np.array(yield_gb * 1e9), np.array(stream_gb * 1e9), 55.0, 260.0,
                                            np.array(yielding)))

    # the 10 GB that did not fit beside the CPU's 1 s: at 55 GB/s after it, not at 260 by slowing the CPU
    assert fit(1.0, 1.0, 50.0, 0.0, 60.0, 0.0) == pytest.approx(1.0 + 10.0 / 55.0)
    # the same CPU second, all of it yielding (its 210 GB): the fluid stretch of the closed forms above
    slow = 210.0 / 205.0 - 1.0
    assert fit(1.0, 1.0, 50.0, 210.0, 60.0, 1.0) == pytest.approx(1.0 + slow + (10.0 - 260.0 * slow) / 55.0)
    # half a second of it yielding (105 GB): the stretch it allows is that kernel's, 105/205 − 0.5 s
    part = 105.0 / 205.0 - 0.5
    assert fit(1.0, 1.0, 50.0, 105.0, 60.0, 0.5) == pytest.approx(1.0 + part + (10.0 - 260.0 * part) / 55.0)
    # everything fits: no stretch either way
    assert fit(1.0, 1.0, 50.0, 0.0, 50.0, 0.0) == pytest.approx(1.0)


def test_decode_layer_stretches_at_the_pcie_rate_beside_a_cpu_gemv():
    """A decode step with qkv on the CPU from DDR and the rest streamed, on a profile where the stream does not fit
    beside the CPU: Eq. 18c prices the deficit at the PCIe rate (the GEMV does not yield); with the fused attention
    on the CPU too, its reads (only they) give the fluid stretch."""
    # a slow link (the tiny model's chain is mostly launches) beside a GEMV that leaves it 30 % of its rate, and
    # a fused attention kernel reading faster than the shared rate leaves it (so slowing it gives the DMA room)
    hw = dataclasses.replace(HW, pcie_h2d_gb_per_s=0.05, cpu_ddr_read_gb_per_s=100.0, cpu_kv_read_gb_per_s=400.0,
                             ddr_shared_gb_per_s=100.015)
    costs = costs_for(batch=64, prompt=512, gen=2, hw=hw)  # one decode step over a cache the CPU reads at length
    dec = costs.layer_class("decoder")
    pc = dec.phase("decode")
    tiers = ("ddr",) * 6
    h, s = hw.pcie_h2d_gb_per_s * 1e9, hw.ddr_shared_gb_per_s * 1e9
    stretched = {}
    for placement in ((1000, 0, 0, 0, 0, 0), (1000, 1000, 1000, 0, 0, 0)):
        priced = layer_time(costs, dec, "decode", tiers, np.array([placement]))
        chain = priced.chain_seconds[0]
        terms = dict.fromkeys(("cpu", "beside", "stream", "read", "yield_read", "yield_cpu"), 0.0)
        for index, unit in enumerate(pc.units):
            options = _unit_options(costs, unit, tiers[index], np.array([placement[index]]), pc.steps)
            for key in terms:
                terms[key] += options[key][0][0]
        deficit = max(terms["stream"] - terms["beside"] - min(h, s) * max(chain - terms["cpu"], 0.0), 0.0)
        assert deficit > 0  # a case that stretches
        slow = max(terms["yield_read"] / (s - h) - terms["yield_cpu"], 0.0)
        fitted = chain + (deficit / s if deficit <= s * slow else slow + (deficit - s * slow) / h)
        # Eq. 26: the GPU units after the CPU's (their crossing queued behind the copy, fc2 the last reader)
        gpu = [i for i, p in enumerate(placement) if p == 0]
        tail = sum(_unit_options(costs, pc.units[i], tiers[i], np.array([0]), pc.steps)["compute"][0][0] for i in gpu)
        tail += sum(e.h2d_seconds[0] for e in pc.edges if e.dst in gpu and e.src not in gpu)
        assert priced.seconds[0] == pytest.approx(
            max(chain, terms["stream"] / h, (terms["read"] + terms["stream"]) / s, fitted, terms["stream"] / h + tail),
            rel=1e-12)
        stretched[placement[1]] = (terms["yield_read"], slow, fitted - chain, deficit)
    read, slow, stretch, deficit = stretched[0]
    assert read == 0 and slow == 0 and stretch == pytest.approx(deficit / min(h, s))  # the GEMV alone: no yield
    read, slow, stretch, deficit = stretched[1000]
    assert read > 0 and slow > 0 and stretch < deficit / min(h, s)  # the attention's reads yield


# ---------------------------------------------------------------------------------------------------------------
# A plan: the same price wherever it is asked for


@pytest.fixture(scope="module")
def plans():
    """(plan, traced graph): every checked-in plan of MODELS (five shipped profiles), and for the profiles with no
    checked-in plan (h200-measured) a compile of OPT-30B with 24 GiB of HBM at batch 1, which splits."""
    graphs = {model: trace_model(ZOO[model]) for model in MODELS}
    out = [(load_plan(path), graphs[model]) for model in MODELS for sweep in sorted(PLANS.glob(f"{model}.*"))
           for path in plan_files(sweep)]
    covered = {plan.spec.hardware.profile for plan, _ in out}
    for profile in sorted(set(profile_names()) - covered):
        result = compile_plans("opt-30b", profile, batches=(1,), gpu_mem=24 * GIB, graph=graphs["opt-30b"])
        out.append((result.points[0].plan, graphs["opt-30b"]))
    return out


def _splits(plan) -> bool:
    return any(0 < s.cpu_permille(phase) < 1000 for g in plan.spec.layer_groups for s in g.sublayers
               for phase in PHASES)


def _calibrate_predicts(plan, graph) -> list[float]:
    """What `liac calibrate` predicts for a run of `plan` at its own workload: its phase rows, then one sublayer
    row per unit (the profiling pass over every decode step)."""
    work = plan.spec.workload
    rows = [Row("run.json", "phase", phase, "", (), "", 1.0) for phase in PHASES]
    rows += [Row("run.json", "sublayer", phase, group.name, (sub.name,), getattr(sub, phase), 1.0)
             for group in plan.spec.layer_groups for phase in PHASES for sub in group.sublayers]
    run = Run("run.json", plan, work.batch_size, work.prompt_len, work.gen_len, work.gen_len - 1, tuple(rows))
    return predict_rows([run], plan_profile(plan), {plan.spec.model.config_sha256: graph})


def test_status_predicted_equals_price_plan_equals_calibrate_on_every_shipped_profile(plans):
    assert {plan.spec.hardware.profile for plan, _ in plans} == set(profile_names())
    assert {plan.spec.hardware.profile for plan, _ in plans if _splits(plan)} == set(profile_names())
    for plan, graph in plans:
        predicted = plan.status.predicted  # from the file: floats at 6 significant digits (rel. error < 5e-6)
        price = price_plan(plan, graph=graph)
        for name in ("prefill_seconds", "decode_seconds", "decode_seconds_per_token", "total_seconds",
                     "tokens_per_second"):
            assert getattr(price, name) == pytest.approx(getattr(predicted, name), rel=1e-5), (plan.metadata.name,
                                                                                                 name)
        rows = [(g.name, u.name, phase, u.device, u.compute_seconds, u.transfer_seconds, u.stream_seconds)
                for g in price.groups for phase in PHASES for u in g.units[phase]]
        assert [r[:4] for r in rows] == [(t.group, t.name, t.phase, t.device) for t in predicted.sublayers]
        for row, time in zip(rows, predicted.sublayers):
            assert row[4:] == pytest.approx((time.compute_seconds, time.transfer_seconds, time.stream_seconds),
                                            rel=1e-5, abs=1e-15)
        calibrated = _calibrate_predicts(plan, graph)
        units = [u.compute_seconds + u.transfer_seconds for g in price.groups for phase in PHASES
                 for u in g.units[phase]]
        assert calibrated == [price.prefill_seconds, price.decode_seconds_per_token] + units  # the same code, exactly


def test_a_fresh_compile_reprices_to_the_bit(plans):
    """In memory (no rounding to the file's 6 digits), emit_plan's prediction and a re-price from the spec alone
    are the same floats: one code path, the same CostGraph."""
    plan, graph = plans[-1]
    assert plan.spec.hardware.profile == "h200-measured" and _splits(plan)
    price = price_plan(plan, graph=graph)
    predicted = plan.status.predicted
    assert (price.prefill_seconds, price.decode_seconds, price.tokens_per_second) == (
        predicted.prefill_seconds, predicted.decode_seconds, predicted.tokens_per_second)
    assert [dataclasses.astuple(u)[1:] for g in price.groups for phase in PHASES for u in g.units[phase]] == [
        (t.device, t.compute_seconds, t.transfer_seconds, t.stream_seconds) for t in predicted.sublayers]


def test_unit_prices_of_a_split_plan(plans):
    """Per unit, both devices' times: a split unit's price is the slower of its parts plus the sync (Eq. 15), a
    unit the CPU may not compute (weights in HBM) has no CPU time, and its planned device is the plan's."""
    plan, graph = next((p, g) for p, g in plans if _splits(p))
    price = price_plan(plan, graph=graph)
    prices = unit_prices(price)
    assert len(prices) == 2 * sum(len(g.sublayers) for g in plan.spec.layer_groups)
    placed = {(g.name, s.name, phase): (getattr(s, phase), s.weights) for g in plan.spec.layer_groups
              for s in g.sublayers for phase in PHASES}
    sync = plan_profile(plan).split_sync_seconds
    for p in prices:
        device, weights = placed[(p.group, p.unit, p.phase)]
        assert p.device == device and p.gpu_seconds > 0
        if weights != "none":  # (attention: its KV cache's tier decides)
            assert (p.cpu_seconds is None) == (weights == "hbm")
        if device == "split":
            assert 0 < p.cpu_permille < 1000 and p.split_seconds > sync


# ---------------------------------------------------------------------------------------------------------------
# An MoE experts unit split between the CPU and streamed experts (Eq. 21 with 21b)


@pytest.mark.parametrize("op, shared", [(0.0, 60.0), (1e-3, 500.0), (2e-4, 95.0)])
def test_split_experts_by_hand(op, shared):
    """Mixtral-8x7B's experts unit, batch-1 decode, 4 of its 8 experts computed by the CPU from DDR and 4 streamed
    when routed (none resident): the slowest of (a) the CPU's part, begun once the one host thread has dispatched
    the GPU's routed experts (one op each, Eq. 24: 4 · E_hit/E of them), (b) the GPU's part (the routed copies at
    the PCIe rate, then the last expert's compute) and (c) the copies and the CPU's expert reads sharing DDR for
    the unit's duration (Eq. 6), plus the split's sync and SPLIT_OPS ops and one for the routing read on the host
    (EXPERT_SPLIT_OPS). A tight shared rate makes (c) bind, a
    large op (a); the last case has the 2026-12-02 H200 call's op and shared rate (0.21 ms, 95 GB/s)."""
    cfg = ZOO["mixtral-8x7b"].with_layers(2)
    hw = dataclasses.replace(resolve_profile("h200-amx16"), runtime_op_seconds=op, ddr_shared_gb_per_s=shared)
    costs = annotate_costs(trace_model(cfg), hw, Workload(1, 128, 4), BUDGETS)
    dec = costs.layer_class("decoder")
    names = [u.name for u in dec.decode.units]
    index = names.index("experts")
    unit = dec.decode.units[index]
    permille = tuple(500 if n == "experts" else 0 for n in names)
    tiers = tuple("ddr" for _ in names)
    ddr = TIERS.index("ddr")
    per_step = []
    for step in range(dec.decode.steps):
        one = unit.expert_bytes[step]               # an expert's routed bytes per step: W/E · E_hit/E
        routed = one / unit.expert_slot_bytes       # E_hit / E
        cpu = unit.expert_cpu_seconds[4][ddr][step] + 4 * routed * op
        gpu = max(4 * one / (hw.pcie_h2d_gb_per_s * GB) + hw.pcie_latency_seconds,
                  unit.expert_gpu_seconds[4][step]) + unit.expert_gpu_seconds[1][step]
        both = 8 * one / (shared * GB)
        per_step.append(max(cpu, gpu, both) + hw.split_sync_seconds + (SPLIT_OPS + 1) * op)
    (priced,) = [u for u in unit_times(costs, dec, "decode", tiers, permille) if u.name == "experts"]
    assert priced.device == "split" and EXPERT_SPLIT_OPS == SPLIT_OPS + 1
    assert priced.compute_seconds == pytest.approx(sum(per_step) / len(per_step), rel=1e-12)
    # at batch 1 two of 8 experts are routed: the step reads a quarter of each expert's weights (in expectation)
    assert unit.expert_bytes[0] / unit.expert_slot_bytes == pytest.approx(0.25, rel=1e-12)


def _half_split_experts(cfg, profile, batch):
    """The decode experts unit of `cfg` at `batch`, half its experts on the CPU from DDR (500 ‰) and every other
    unit on the GPU: (its priced UnitTime, the unit, the decode steps)."""
    costs = annotate_costs(trace_model(cfg), profile, Workload(batch, 128, 4), BUDGETS)
    dec = costs.layer_class("decoder")
    names = [u.name for u in dec.decode.units]
    permille = tuple(500 if n == "experts" else 0 for n in names)
    (priced,) = [u for u in unit_times(costs, dec, "decode", tuple("ddr" for _ in names), permille)
                 if u.name == "experts"]
    return priced, dec.decode.units[names.index("experts")], dec.decode.steps


@pytest.mark.parametrize("batch, beside", [(1, 28.0), (8, 28.0), (8, 0.0), (1, 500.0)])
def test_split_experts_cpu_reads_beside_the_copies_by_hand(batch, beside):
    """Eq. 21c on Mixtral-8x7B's experts unit (4 experts on the CPU from DDR, 4 streamed when routed): the CPU side
    reads its first expert's worth of weights (one expert's bytes, or all its expected bytes when fewer: batch 1)
    at the beside-copy rate and the rest at the alone rate, i.e. Eq. 21b's CPU side plus min(R, W_e)·(1/r_b −
    1/r_a); a profile that does not measure the beside rate (0), or measures it at or above the alone rate, prices
    the unit exactly as Eq. 21b."""
    cfg = ZOO["mixtral-8x7b"].with_layers(2)
    base = dataclasses.replace(resolve_profile("h200-amx16"), runtime_op_seconds=2e-4, ddr_shared_gb_per_s=500.0)
    hw = dataclasses.replace(base, cpu_expert_beside_copy_gb_per_s=beside)

    priced, unit, steps = _half_split_experts(cfg, hw, batch)
    plain, _, _ = _half_split_experts(cfg, base, batch)
    ddr = TIERS.index("ddr")
    extra = []
    for step in range(steps):
        one = unit.expert_bytes[step]
        read = 4 * one  # the CPU's expected expert bytes per step
        gpu = max(4 * one / (hw.pcie_h2d_gb_per_s * GB) + hw.pcie_latency_seconds,
                  unit.expert_gpu_seconds[4][step]) + unit.expert_gpu_seconds[1][step]
        cpu = unit.expert_cpu_seconds[4][ddr][step] + 4 * one / unit.expert_slot_bytes * hw.runtime_op_seconds
        penalty = 0.0
        if 0 < beside < hw.cpu_ddr_read_gb_per_s:
            penalty = min(read, unit.expert_slot_bytes) * (1 / (beside * GB) - 1 / (hw.cpu_ddr_read_gb_per_s * GB))
        assert cpu + penalty > gpu or penalty == 0  # the CPU side binds where it is priced (the case is about it)
        extra.append(max(cpu + penalty, gpu) - max(cpu, gpu))
    assert priced.compute_seconds - plain.compute_seconds == pytest.approx(sum(extra) / steps, rel=1e-9, abs=1e-15)
    if beside == 28.0:
        assert priced.compute_seconds > plain.compute_seconds
        if batch == 8:  # every expert routed: the CPU reads 4 experts, only the first beside a copy's start
            assert unit.expert_bytes[0] / unit.expert_slot_bytes > 0.85
    else:
        assert priced.compute_seconds == plain.compute_seconds
    # 0 is "not measured": the profile hashes as before the field existed (plans compiled for it stay valid)
    assert dataclasses.replace(base, cpu_expert_beside_copy_gb_per_s=0.0).sha256() == base.sha256()
    assert hw.sha256() != base.sha256() or beside == 0.0


@pytest.mark.parametrize("batch, experts_rate", [(8, 70.0), (1, 40.0), (8, 0.0), (8, 500.0)])
def test_split_experts_ddr_term_at_the_experts_shared_rate(batch, experts_rate):
    """Eq. 21b's DDR term at `ddr_shared_experts_gb_per_s` (DDR's total measured in a split experts unit's own
    pattern) where the profile has it: the unit is the slowest of its CPU side, its GPU side and (c + s) routed
    experts' bytes over that rate; 0 ("not measured") prices at `ddr_shared_gb_per_s` as before and hashes as
    before. The shared rate (95 GB/s, the H200's) is above 70: the field, not the old rate, makes the term bind."""
    cfg = ZOO["mixtral-8x7b"].with_layers(2)
    base = dataclasses.replace(resolve_profile("h200-amx16"), runtime_op_seconds=2e-4, ddr_shared_gb_per_s=95.0)
    hw = dataclasses.replace(base, ddr_shared_experts_gb_per_s=experts_rate)

    priced, unit, steps = _half_split_experts(cfg, hw, batch)
    plain, _, _ = _half_split_experts(cfg, base, batch)
    ddr, op = TIERS.index("ddr"), hw.runtime_op_seconds
    rate = experts_rate or base.ddr_shared_gb_per_s
    per_step = []
    for step in range(steps):
        one = unit.expert_bytes[step]
        cpu = unit.expert_cpu_seconds[4][ddr][step] + 4 * one / unit.expert_slot_bytes * op
        gpu = max(4 * one / (hw.pcie_h2d_gb_per_s * GB) + hw.pcie_latency_seconds,
                  unit.expert_gpu_seconds[4][step]) + unit.expert_gpu_seconds[1][step]
        both = 8 * one / (rate * GB)
        per_step.append(max(cpu, gpu, both) + hw.split_sync_seconds + EXPERT_SPLIT_OPS * op)
        if experts_rate == 70.0:
            assert both > max(cpu, gpu)  # the case is about the DDR term: it binds at 70 GB/s, batch 8
    assert priced.compute_seconds == pytest.approx(sum(per_step) / steps, rel=1e-12)
    if experts_rate == 70.0:
        assert priced.compute_seconds > plain.compute_seconds
    elif experts_rate == 0.0:
        assert priced.compute_seconds == plain.compute_seconds
    assert dataclasses.replace(base, ddr_shared_experts_gb_per_s=0.0).sha256() == base.sha256()
    assert hw.sha256() != base.sha256() or experts_rate == 0.0


@pytest.mark.parametrize("batch, beside_cpu, ddr", [(1, 3e-4, 500.0), (8, 3e-4, 500.0), (8, 3e-4, 60.0),
                                                   (1, 0.0, 500.0), (8, 0.0, 60.0)])
def test_host_chain_beside_a_cpu_part_by_hand(batch, beside_cpu, ddr):
    """Eq. 21d on Mixtral-8x7B's experts unit at decode (4 experts on the CPU from DDR, 4 streamed when routed):
    with o_c (`runtime_op_seconds_beside_cpu`) the CPU side carries the layer's host ops at o_c each, i.e. the
    GPU's routed experts dispatched (4 · E_hit/E), the unit's own EXPERT_SPLIT_OPS and one op per other unit of the
    layer (`chain_ops`), in the max against the GPU side; the other units' Eq. 24 ops are taken back from the unit
    (they are inside that CPU side), so the layer's chain is the other units' kernels plus this max. The CPU part
    itself lasts the longer of its kernels and Eq. 21b's DDR term (its reads wait for DDR beside the copies), and
    the chain comes after it on the host thread: at 60 GB/s, where the DDR term binds at batch 8, the chain adds to
    that term instead of hiding under it. An all-CPU unit carries its one op instead of EXPERT_SPLIT_OPS. o_c = 0
    prices Eq. 21b exactly (the DDR term in the max beside the CPU and GPU sides) and hashes as before."""
    cfg = ZOO["mixtral-8x7b"].with_layers(2)
    base = dataclasses.replace(resolve_profile("h200-amx16"), runtime_op_seconds=1.2e-4, ddr_shared_gb_per_s=ddr)
    hw = dataclasses.replace(base, runtime_op_seconds_beside_cpu=beside_cpu)
    costs = annotate_costs(trace_model(cfg), hw, Workload(batch, 128, 4), BUDGETS)
    dec = costs.layer_class("decoder")
    names = [u.name for u in dec.decode.units]
    unit = dec.decode.units[names.index("experts")]
    others = len(names) - 1
    assert chain_ops(dec.decode, "decode") == others and chain_ops(dec.prefill, "prefill") is None
    tiers = tuple("ddr" for _ in names)
    ddr = TIERS.index("ddr")
    o, oc = hw.runtime_op_seconds, beside_cpu
    binds = []  # at 60 GB/s, batch 8: the DDR term binds, and the chain beyond it
    for cpu_experts, permille in ((4, 500), (8, 1000)):
        per_step = []
        for step in range(dec.decode.steps):
            one = unit.expert_bytes[step]
            routed = one / unit.expert_slot_bytes
            streamed = 8 - cpu_experts
            cpu = unit.expert_cpu_seconds[cpu_experts][ddr][step]
            if streamed:
                gpu = max(streamed * one / (hw.pcie_h2d_gb_per_s * GB) + hw.pcie_latency_seconds,
                          unit.expert_gpu_seconds[streamed][step]) + unit.expert_gpu_seconds[1][step]
                both = 8 * one / (hw.ddr_shared_gb_per_s * GB)
                sync, own = hw.split_sync_seconds, EXPERT_SPLIT_OPS
            else:
                gpu, both, sync, own = 0.0, 0.0, 0.0, 1
            if oc:
                side = max(cpu, both) + (streamed * routed + own + others) * oc
                per_step.append(max(max(side, gpu) + sync - others * o, 0.0))
                if ddr == 60.0 and batch == 8 and streamed:
                    binds.append(both > cpu and both + (streamed * routed + own + others) * oc > gpu)
            else:
                side = cpu + streamed * routed * o
                per_step.append(max(side, gpu, both) + sync + own * o)
        permilles = tuple(permille if n == "experts" else 0 for n in names)
        (priced,) = [u for u in unit_times(costs, dec, "decode", tiers, permilles) if u.name == "experts"]
        assert priced.compute_seconds == pytest.approx(sum(per_step) / len(per_step), rel=1e-12)
    assert all(binds) and bool(binds) == (ddr == 60.0 and batch == 8 and oc > 0)
    # the prefill keeps Eq. 21b (its chain is priced per micro-batch; the tally measured decode only)
    plain = annotate_costs(trace_model(cfg), base, Workload(batch, 128, 4), BUDGETS)
    prefill = [u.compute_seconds for u in unit_times(plain, plain.layer_class("decoder"), "prefill", tiers,
                                                     tuple(500 if n == "experts" else 0 for n in names))]
    assert prefill == [u.compute_seconds for u in unit_times(costs, dec, "prefill", tiers,
                                                             tuple(500 if n == "experts" else 0 for n in names))]
    assert dataclasses.replace(base, runtime_op_seconds_beside_cpu=0.0).sha256() == base.sha256()
    assert (hw.sha256() == base.sha256()) == (beside_cpu == 0.0)


def test_a_split_cpu_part_starts_late_in_decode_by_hand():
    """Eq. 15b: in decode a split unit's CPU part costs the profile's `split_cpu_start_seconds` on top of its
    roofline, inside the max against the GPU part (the unit: max(CPU part + w, GPU part) + sync + SPLIT_OPS·o); a
    prefill's split and every whole unit are priced as before, and so is every layer on a profile without the
    field (0: the hash too)."""
    start, op = 5e-4, 3e-4
    base = dataclasses.replace(HW, runtime_op_seconds=op)
    late = dataclasses.replace(base, split_cpu_start_seconds=start)
    assert base.split_cpu_start_seconds == 0.0 and "split_cpu_start_seconds" not in base.canonical()
    assert late.sha256() != base.sha256()
    costs = {key: annotate_costs(hand_graph(TINY), hw, Workload(4, 8, 4), BUDGETS, split_permille=(600,))
             for key, hw in (("base", base), ("late", late))}
    base, late = "base", "late"
    dec = costs[late].layer_class("decoder")
    tiers = ("ddr",) * 6
    split = (1000, 1000, 1000, 1000, 600, 0)  # fc1 60 % on the CPU
    fc1 = dec.decode.units[4]
    for t in range(dec.decode.steps):
        options = _unit_options(costs[late], fc1, "ddr", np.array([600]), dec.decode.steps, phase="decode")
        by_hand = (max(fc1.split_cpu_seconds[0][1][t] + start, fc1.split_gpu_seconds[0][t])
                   + HW.split_sync_seconds + SPLIT_OPS * op)
        assert options["compute"][0][t] == pytest.approx(by_hand, rel=1e-12)
        assert options["cpu"][0][t] == fc1.split_cpu_seconds[0][1][t]  # Eq. 18's CPU seconds: its kernels only
    units = {hw: {u.name: u for u in unit_times(costs[hw], dec, "decode", tiers, split)} for hw in (base, late)}
    assert units[late]["fc1"].compute_seconds - units[base]["fc1"].compute_seconds == pytest.approx(start, rel=1e-9)
    assert all(units[late][n] == units[base][n] for n in ("qkv", "attn_score", "out_proj", "fc2"))
    # a whole placement and a prefill's split price to the bit as without the field
    whole = np.array([(1000, 1000, 1000, 1000, 1000, 0), (1000, 1000, 1000, 0, 0, 0)])
    for phase, placement in (("decode", whole), ("prefill", np.array([split]))):
        assert np.array_equal(layer_time(costs[late], dec, phase, tiers, placement).seconds,
                              layer_time(costs[base], dec, phase, tiers, placement).seconds)
    assert (layer_time(costs[late], dec, "decode", tiers, np.array([split])).chain_seconds[0]
            - layer_time(costs[base], dec, "decode", tiers, np.array([split])).chain_seconds[0]
            == pytest.approx(dec.decode.steps * start, rel=1e-9))


def test_the_ilp_drops_a_split_whose_gain_is_below_its_cpu_parts_start():
    """OPT-30B at batch 32 on the H200 call i12u's profile (24 GiB): without Eq. 15b the optimum splits fc1 5 %
    onto the CPU in 23 layers for a priced gain of 0.5 % over whole units (the split plan ran 712 ms/token against
    the whole plan's 515 there); with the profiled parts' start (0.52 ms a CPU part) it splits no decoder layer, and
    its price is within 0.5 % of the whole-unit optimum's."""
    call = Path(__file__).resolve().parents[2] / "bench" / "results" / "h200-2026-12-02" / "i12u"
    profile = resolve_profile(str(call / "run-profile.yaml"))
    kw = dict(batches=(32,), prompt_len=128, gen_len=32, gpu_mem=24 * GIB)
    plans = {start: compile_plans("opt-30b", dataclasses.replace(profile, split_cpu_start_seconds=start),
                                  **kw).points[0].plan for start in (0.0, 0.000518)}

    def decoder_splits(plan):
        return sum(g.layer_count for g in plan.spec.layer_groups if g.layer_class == "decoder"
                   for s in g.sublayers if s.decode == "split")

    assert decoder_splits(plans[0.0]) == 23
    assert decoder_splits(plans[0.000518]) == 0
    whole = compile_plans("opt-30b", dataclasses.replace(profile, split_cpu_start_seconds=0.000518), policy="whole",
                          **kw).points[0].plan
    kept, bare = (p.status.predicted.decode_seconds_per_token for p in (plans[0.000518], whole))
    assert 0.995 * bare <= kept <= bare  # what is left of the splits' gain: the LM head's
