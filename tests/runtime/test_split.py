"""Split sublayers (plan v2): a unit's output features partly on the CPU (from DDR), partly on the GPU (streamed).

Parity with HF transformers for each family under split plans, with CPU shares that divide no unit evenly; where
the parts join (derived by hand from the placements), what streams (closed form), that one thread launches the GPU part
and then computes the CPU part, the profiling rows. The dtype choice is test_parity.py's: tokens in fp32, logits in bf16.
"""

from __future__ import annotations

import threading

import pytest
import torch
from runtime_plans import (BACKENDS, FAMILIES, NEW_TOKENS, PROMPT, assert_bf16_logits_close, make_plan,
                           make_test_backend, placement)

import liac.runtime.kernels as kernels
from liac.errors import LiacError
from liac.models import SUBLAYERS
from liac.models.config import ModelConfig
from liac.plan import LayerGroup
from liac.runtime import Engine, HostWeights, RandomWeights, build_schedule
from liac.runtime.backend import EmulatedBackend
from liac.runtime.metrics import build_metrics
from liac.runtime.schedule import Move

# CPU shares (permille): a third of every unit (r = N // 3 rounded down: 333/1000 divides none of them), with
# attention on the CPU at decode; and one share per unit, attention on the GPU (its KV window streamed), where
# out_proj's 1 ‰ of 64 features rounds to no feature (the GPU computes it alone) and qkv's 999 ‰ leaves the GPU
# a sliver.
SHARES = {
    "third": {"permille": 333},
    "uneven": {"permille": {"qkv": 999, "out_proj": 1, "fc1": 257, "gate_up": 257, "fc2": 901, "down": 901,
                            "lm_head": 123}, "split_attention": "gpu"},
}
LLAMA = ModelConfig(name="tiny-llama", family="llama", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                    head_dim=8, ffn_dim=48, vocab_size=50, max_position=64, norm="rmsnorm", norm_eps=1e-5,
                    activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False, rope_theta=10000.0)
IDS = PROMPT % 50  # in LLAMA's vocabulary


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shares", sorted(SHARES))
@pytest.mark.parametrize("family", FAMILIES)
def test_split_greedy_tokens_match_hf_fp32(checkpoints, reference, family, shares, backend):
    directory, cfg = checkpoints(family)
    plan = make_plan(cfg, "split", **SHARES[shares])
    engine = Engine.from_plan(plan, directory, backend=make_test_backend(backend), dtype=torch.float32)
    assert any(op.split for op in engine.schedule.phases["decode"].ops)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference(family)
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_split_bf16_logits_within_bf16_tolerance(checkpoints, reference, family, backend):
    directory, cfg = checkpoints(family)
    engine = Engine.from_plan(make_plan(cfg, "split", **SHARES["third"]), directory,
                              backend=make_test_backend(backend))
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    fp32, bf16, _, _ = reference(family)
    assert_bf16_logits_close(out, fp32, bf16)


def _layer(schedule, phase, layer, layer_class="decoder"):
    return {op.kind: op for op in schedule.phases[phase].ops if op.layer_class == layer_class and op.layer == layer
            and op.kind not in ("wait", "release")}


def test_parts_join_where_later_ops_read_them():
    # 'split' policy, decode: qkv, out_proj, gate_up, down split; attention on the CPU (KV in DDR); the embedding
    # gathers on the host (decode token ids on the CPU); the LM head split.
    schedule = build_schedule(make_plan(LLAMA, "split", permille=333))
    ops = _layer(schedule, "decode", 1)
    assert ops["qkv"].device == "split" and ops["qkv"].split.merge_on == ("cpu",)  # only CPU attention reads q, k, v
    assert ops["qkv"].kv_writer == "cpu" and not ops["qkv"].kv_write_crosses  # written where the DDR cache is
    # x after out_proj: gate_up (split) reads it on both devices; down (split) adds it where down joins (both)
    assert ops["out_proj"].split.merge_on == ("cpu", "gpu")
    assert ops["out_proj"].moves == (Move("o", "cpu", "gpu"),)  # attention's output to the GPU part
    assert ops["up"].split.merge_on == ("cpu", "gpu") and ops["up"].moves == ()  # down's parts read h on both
    assert ops["down"].split.merge_on == ("cpu", "gpu")  # the next qkv (split) reads x on both devices
    assert ops["down"].moves == ()
    assert _layer(schedule, "decode", 0, "head")["lm_head"].split.merge_on == ("cpu",)  # where the token is embedded
    # r = N · 333 // 1000: qkv N = (4 + 2·2)·8 = 64 → 21; out_proj, down N = 32 → 10; gate_up N = F = 48 → 15
    assert [(ops[k].split.cpu_features, ops[k].split.features) for k in ("qkv", "out_proj", "up", "down")] == \
        [(21, 64), (10, 32), (15, 48), (10, 32)]
    # With attention on the GPU, q, k, v join on the GPU only, and the K/V write crosses to the DDR cache.
    gpu_attention = _layer(build_schedule(make_plan(LLAMA, "split", permille=333, split_attention="gpu")),
                           "decode", 1)
    assert gpu_attention["qkv"].split.merge_on == ("gpu",) and gpu_attention["qkv"].kv_write_crosses
    assert gpu_attention["attn"].kv_read == "window"


def test_a_share_that_rounds_to_no_feature_runs_on_the_gpu():
    schedule = build_schedule(make_plan(LLAMA, "split", permille={"qkv": 500, "out_proj": 1, "gate_up": 500,
                                                                  "down": 500, "lm_head": 500}))
    out_proj = _layer(schedule, "decode", 0)["out_proj"]  # 32 · 1 // 1000 = 0 features on the CPU
    assert out_proj.device == "gpu" and out_proj.split is None and out_proj.streamed


def test_only_the_gpu_part_streams_and_sizes_the_staging_buffer():
    plan = make_plan(LLAMA, "split", permille=333)
    schedule = build_schedule(plan)
    unit = schedule.phases["decode"].stream_units[0]
    rows = {piece.param.canonical.split(".", 2)[2]: piece.rows for piece in unit.weights}
    # GPU rows [r, N): qkv 21..63, out_proj and down 10..31, gate_up gate 15..47 and up 48+15..95; norms whole
    assert rows == {"qkv.norm.weight": ((0, 32),), "qkv.proj.weight": ((21, 43),),
                    "out_proj.proj.weight": ((10, 22),), "gate_up.norm.weight": ((0, 32),),
                    "gate_up.proj.weight": ((15, 33), (63, 33)), "down.proj.weight": ((10, 22),)}
    gpu_part_bytes = 2 * (32 + 43 * 32 + 22 * 32 + 32 + 66 * 32 + 22 * 48)  # bf16; the whole layer is 2·(…) more
    assert unit.nbytes == gpu_part_bytes
    # a staging buffer of exactly the GPU part is enough; a byte less is refused
    import dataclasses

    def with_staging(nbytes):
        return dataclasses.replace(plan, spec=dataclasses.replace(
            plan.spec, execution=dataclasses.replace(plan.spec.execution, staging_bytes=nbytes)))

    head = max(u.nbytes for u in schedule.phases["decode"].stream_units)  # the LM head's GPU rows are the largest unit
    build_schedule(with_staging(max(head, gpu_part_bytes)))
    with pytest.raises(LiacError, match="staging_bytes"):
        build_schedule(with_staging(max(head, gpu_part_bytes) - 1))


def test_merges_cross_pcie_once_per_join_device():
    engine = Engine.from_plan(make_plan(LLAMA, "split", permille=333), RandomWeights(0), backend=EmulatedBackend())
    engine.generate(IDS, 3)
    # per pass, one crossing per (split op, join device): decode per layer qkv 1 + out_proj 2 + gate_up 2 + down 2
    # = 7, prefill the same (qkv joins on the GPU only), plus the LM head's 1; 3 layers, 3 passes
    assert engine.backend.transfers.by_value["merge"] == 3 * (3 * 7 + 1)


def test_gpu_part_is_launched_first_then_the_cpu_part_runs_on_the_main_thread(monkeypatch):
    """One CPU thread (the split trace of 2026-12-01: a worker thread's OpenMP team competed with the main
    thread's): each split launches its GPU part, then computes its CPU part itself, with every intra-op thread."""
    calls = []

    def recorder(device):
        def kernel(x, weight, bias):
            calls.append((device, threading.current_thread().name, torch.get_num_threads()))
            return torch.nn.functional.linear(x, weight, bias)
        return kernel

    monkeypatch.setitem(kernels.KERNELS, ("linear", "cpu"), recorder("cpu"))
    monkeypatch.setitem(kernels.KERNELS, ("linear", "gpu"), recorder("gpu"))
    plan = make_plan(LLAMA.with_layers(1), "split", permille=333)
    engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend(), cpu_kernel="auto", warm_up=False)
    engine.generate(IDS, 1)  # prefill only: qkv, out_proj, gate_up, down, lm_head, each in two parts
    assert [c[0] for c in calls] == ["gpu", "cpu"] * 2 + ["gpu", "cpu", "cpu"] + ["gpu", "cpu"] * 2  # gate_up's
    # CPU part reads two row blocks (two calls); every GPU part is launched before its CPU part computes
    assert {c[1] for c in calls} == {threading.main_thread().name}
    assert {c[2] for c in calls} == {torch.get_num_threads()}
    assert not [t for t in threading.enumerate() if t.name.startswith("liac-cpu-part")]  # no worker thread


def test_profile_rows_carry_both_parts():
    engine = Engine.from_plan(make_plan(LLAMA, "split", permille=333), RandomWeights(0), backend=EmulatedBackend())
    generation = engine.generate(IDS, 3)
    metrics = build_metrics(engine, generation, engine.profile(IDS, 2))
    rows = [r for r in metrics["sublayers"] if r["device"] == "split"]
    assert {(r["sublayers"][0], r["phase"]) for r in rows} >= {("qkv", "decode"), ("down", "prefill"),
                                                              ("lm_head", "decode")}
    for row in rows:
        assert 0 < row["measured_cpu_part_ms"] <= row["measured_ms"]
        assert 0 < row["measured_gpu_part_ms"] <= row["measured_ms"]
    assert not [r for r in metrics["sublayers"] if r["device"].startswith("split:")]


def test_cpu_parts_read_the_shared_weights_in_place():
    host = HostWeights.random(LLAMA, 0, backend=EmulatedBackend())
    engine = Engine.from_plan(make_plan(LLAMA, "split", permille=333), host)
    op = _layer(engine.schedule, "decode", 1)["up"]
    units = {u.index: u for u in engine.schedule.phases["decode"].stream_units}
    part = engine.executor._part(op, units[op.stream_unit], "cpu")
    weight = host.tensor("layers.1.gate_up.proj.weight")
    (gate, _), (up, _) = part.proj.blocks
    row = weight.stride(0) * weight.element_size()
    assert gate.data_ptr() == weight.data_ptr() and up.data_ptr() == weight.data_ptr() + 48 * row  # views, no copy
    assert gate.shape == up.shape == (15, 32) and part.ffn_dim == 15


def test_a_split_that_reads_the_buffer_last_releases_it_after_its_join(monkeypatch):
    """down is each layer's last reader of its staging buffer: a 'release' op follows it, after its GPU part, its
    CPU part and the join, so the next layer's copy (issued by the release) is queued after the join's crossing:
    host → GPU copies share the copy engine one at a time, and a copy queued before the join held it back for a
    whole layer's weights (H200, bench/results/h200-2026-12-02)."""
    log: list = []

    def recorder(device):
        def kernel(x, weight, bias):
            log.append((device, weight.shape[0]))
            return torch.nn.functional.linear(x, weight, bias)
        return kernel

    monkeypatch.setitem(kernels.KERNELS, ("linear", "cpu"), recorder("cpu"))
    monkeypatch.setitem(kernels.KERNELS, ("linear", "gpu"), recorder("gpu"))
    plan = make_plan(LLAMA, "split", permille=333)
    engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend(), stream_log=log, warm_up=False,
                              cpu_kernel="auto")
    ops = engine.schedule.phases["decode"].ops
    for at, op in enumerate(ops):
        if op.kind == "down" and op.layer_class == "decoder":
            assert ops[at + 1].kind == "release" and ops[at + 1].stream_unit == op.stream_unit >= 0
    log.clear()
    engine.generate(IDS, 2)
    d = LLAMA.hidden_size
    n, units = plan.spec.execution.prefetch_depth + 1, len(engine.schedule.phases["prefill"].stream_units)
    for index in range(LLAMA.num_layers):  # prefill: each layer's down: GPU part, CPU part, then its release
        at = log.index(("release", index))
        assert log[at - 2:at] == [("gpu", d - d * 333 // 1000), ("cpu", d * 333 // 1000)]
        if index + n < units:  # the copy into the released buffer is queued only now, after the join
            assert log[at + 1] == ("issue", index + n)


def _joins_differ_within_a_group(cfg, reader: str) -> tuple:
    """Layer groups whose first decoder layer's down projection (split, weights in DDR) joins on other devices than
    their last one's, because the next layer reads the residual stream on the GPU alone but what follows the group
    reads it on both devices: the split LM head (`reader='head'`: groups of layers {0}, {1, 2}) or the next group's
    split qkv (`reader='qkv'`: groups {0, 1}, {2}). The warm-up runs only the first layer of each group."""
    names = SUBLAYERS[cfg.family]

    def layer(split: tuple[str, ...]) -> tuple:
        return tuple(placement(n, "split", "split", "ddr", 500, 500) if n in split
                     else placement(n, "gpu", "gpu", "none" if n.startswith("attn_") else "hbm") for n in names)

    first, then = ((0, 1), (1, 2)) if reader == "head" else ((0, 2), (2, 1))
    return (LayerGroup("embed", "embed", 0, 1, "none", (placement("embed", "gpu", "gpu", "ddr"),)),
            LayerGroup("a", "decoder", first[0], first[1], "hbm", layer((names[-1],))),
            LayerGroup("b", "decoder", then[0], then[1], "hbm",
                       layer((names[-1],) if reader == "head" else (names[0], names[-1]))),
            LayerGroup("head", "head", 0, 1, "none",
                       (placement("lm_head", "split", "split", "ddr", 500, 500) if reader == "head"
                        else placement("lm_head", "gpu", "gpu", "hbm"),)))


@pytest.mark.parametrize("reader", ("head", "qkv"))
def test_warm_up_finds_a_split_ops_input_that_a_skipped_layer_joins(checkpoints, reference, reader):
    """Where a split op joins depends on the next layer, so a group's layers may leave the residual stream on
    different devices; the warm-up, which skips all but the first layer of each group, must still run, and the
    request after it match HF's tokens and logits."""
    directory, cfg = checkpoints("llama")
    plan = make_plan(cfg, layer_groups=_joins_differ_within_a_group(cfg, reader))
    schedule = build_schedule(plan)
    joins = [op.split.merge_on for op in schedule.phases["decode"].ops if op.kind == "down"]
    # the layer before the split reader joins on both devices, the others where the next qkv (or the head) reads
    assert joins == ([("gpu",), ("cpu", "gpu"), ("gpu",)] if reader == "qkv" else [("gpu",), ("gpu",), ("cpu", "gpu")])
    engine = Engine.from_plan(plan, directory, backend=make_test_backend("emulated"), dtype=torch.float32)
    assert engine.warmup_request == (2, 8)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference("llama")
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)
