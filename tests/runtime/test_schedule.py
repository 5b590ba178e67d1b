"""The schedule (runtime/schedule.py): its pieces alone (a split's row blocks, a stream unit's layout, which ops a
staging buffer's wait and release bracket), then whole plans: moves where devices change, stream units, staging
sizes, and through Engine the prefetch order the streamer keeps (runtime/staging.py alone: test_staging.py).

Expected moves and transfer counts are derived by hand from the plans' placements (comments give the reasoning),
never read back from the schedule.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from runtime_plans import make_plan

from liac.errors import LiacError
from liac.models.config import ModelConfig
from liac.runtime import Engine, RandomWeights, build_schedule
from liac.runtime.backend import EmulatedBackend
from liac.runtime.executor import Executor
from liac.runtime.schedule import Move, Op, ParamInfo, StreamUnit, _bracketed, _stream_unit, _Streamed, part_rows

TINY = ModelConfig(name="tiny-opt", family="opt", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=4,
                   head_dim=8, ffn_dim=64, vocab_size=50, max_position=64, norm="layernorm", norm_eps=1e-5,
                   activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)
LLAMA = ModelConfig(name="tiny-llama", family="llama", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                    head_dim=8, ffn_dim=48, vocab_size=50, max_position=64, norm="rmsnorm", norm_eps=1e-5,
                    activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False, rope_theta=10000.0)


def test_a_split_reads_its_rows_of_the_projection_and_its_norm_whole():
    gate_up = ParamInfo("proj.weight", "layers.0.gate_up.proj.weight", (2 * 6, 4))  # gate rows 0..5, up rows 6..11
    norm = ParamInfo("norm.weight", "layers.0.gate_up.norm.weight", (4,))
    assert part_rows("gate_up", gate_up, "cpu", 2, 6) == ((0, 2), (6, 2))  # features 0..1 of both halves
    assert part_rows("gate_up", gate_up, "gpu", 2, 6) == ((2, 4), (8, 4))
    qkv = ParamInfo("proj.weight", "layers.0.qkv.proj.weight", (9, 4))
    assert part_rows("qkv", qkv, "cpu", 3, 9) == ((0, 3),) and part_rows("qkv", qkv, "gpu", 3, 9) == ((3, 6),)
    assert part_rows("gate_up", norm, "cpu", 2, 6) == part_rows("gate_up", norm, "gpu", 2, 6) == ((0, 4),)


def test_a_stream_unit_holds_each_parameter_once_aligned_then_its_kv_windows():
    weight = ParamInfo("proj.weight", "layers.7.fc1.proj.weight", (3, 5))
    bias = ParamInfo("proj.bias", "layers.7.fc1.proj.bias", (3,))
    streamed = [_Streamed(weight, "ddr", ((0, 3),)), _Streamed(bias, "cxl", ((0, 3),)),
                _Streamed(weight, "ddr", ((0, 3),))]  # a parameter two ops read is staged once
    unit = _stream_unit(4, 2, ("decoder", 7), streamed, ["k", "v"], kv_shape=(1, 2, 5, 5), itemsize=2)  # 100 B
    assert (unit.index, unit.slot, unit.layer_class, unit.layer) == (4, 0, "decoder", 7)  # slot = index mod 2
    assert [(p.param.canonical, p.tier, p.offset) for p in unit.weights] == [(weight.canonical, "ddr", 0),
                                                                           (bias.canonical, "cxl", 256)]
    assert unit.kv == (("k", 512), ("v", 768))
    assert unit.nbytes == 15 * 2 + 3 * 2 + 2 * 100 and unit.padded_bytes == 1024
    assert unit.kv_shape == (1, 2, 5, 5)  # its windows' [B, G, C, E]: B this plan's batch


def test_wait_and_release_bracket_the_buffers_readers_only():
    ops = [Op("qkv", "g", "decoder", 1, "cpu"), Op("score", "g", "decoder", 1, "gpu", kv_read="window"),
           Op("context", "g", "decoder", 1, "cpu", kv_read="cache"), Op("up", "g", "decoder", 1, "gpu", streamed=True),
           Op("down", "g", "decoder", 1, "cpu")]
    out = _bracketed(ops, StreamUnit(3, 1, "decoder", 1, ()), "g")
    assert [o.kind for o in out] == ["qkv", "wait", "score", "context", "up", "release", "down"]
    assert [o.stream_unit for o in out] == [-1, 3, 3, -1, 3, 3, -1]  # the CPU op between readers reads no buffer


def _ops(schedule, phase, layer):
    return [op for op in schedule.phases[phase].ops if op.layer_class == "decoder" and op.layer == layer
            and op.kind not in ("wait", "release")]


def test_mixed_decode_moves_follow_device_changes():
    # Decode placement of the offloaded layers: qkv gpu, score gpu, context cpu, out_proj cpu, fc1 gpu, fc2 cpu;
    # KV in DDR. Layer 1 follows layer 0, whose fc2 left the residual x on the CPU.
    schedule = build_schedule(make_plan(TINY, "mixed"))
    ops = {op.kind: op for op in _ops(schedule, "decode", 1)}
    assert [op.kind for op in _ops(schedule, "decode", 1)] == ["qkv", "score", "context", "out_proj", "up", "down"]
    assert ops["qkv"].moves == (Move("x", "cpu", "gpu"),)
    assert ops["qkv"].kv_write_crosses  # computed on the GPU, the cache is in DDR
    assert ops["score"].moves == ()  # q and this step's k were produced on the GPU
    assert ops["score"].kv_read == "window"  # GPU attention over a DDR cache: streamed
    assert ops["context"].moves == (Move("p", "gpu", "cpu"),)
    assert ops["context"].kv_read == "cache"  # V read in place from DDR
    assert ops["out_proj"].moves == ()  # o and the residual x are both on the CPU already
    assert ops["up"].moves == (Move("x", "cpu", "gpu"),)
    assert ops["down"].moves == (Move("h", "gpu", "cpu"),)  # x is still on the CPU: not moved again
    unit = schedule.phases["decode"].stream_units[[u.layer for u in schedule.phases["decode"].stream_units].index(1)]
    assert sorted(piece.param.canonical for piece in unit.weights) == sorted(
        f"layers.1.{name}" for name in ("qkv.norm.weight", "qkv.norm.bias", "qkv.proj.weight", "qkv.proj.bias",
                                        "fc1.norm.weight", "fc1.norm.bias", "fc1.proj.weight", "fc1.proj.bias"))
    assert [which for which, _ in unit.kv] == ["k"]  # only the GPU score needs a window


def test_prefill_attention_reads_the_kv_the_gpu_wrote_to_the_host_cache():
    # 'partial': qkv on the GPU, attention on the CPU over a DDR cache. K and V cross PCIe once, as the KV write the
    # cost model prices (Eq. 3); the CPU's attention reads them in the cache, never from a second copy of K and V.
    schedule = build_schedule(make_plan(TINY, "partial"))
    qkv, attn = _ops(schedule, "prefill", 0)[:2]
    assert qkv.device == "gpu" and qkv.kv_write_crosses
    assert attn.kind == "attn" and attn.device == "cpu" and attn.kv_read == "stored"
    assert attn.moves == (Move("q", "gpu", "cpu"),)
    assert "k" in qkv.drops and "v" in qkv.drops  # nothing else reads this step's K, V: freed after the write
    decode_attn = _ops(schedule, "decode", 0)[1]
    assert decode_attn.kv_read == "cache" and decode_attn.moves == (Move("q", "gpu", "cpu"),)


def test_gpu_embedding_over_a_host_table_gathers_rows_on_the_host():
    # 'mixed' puts the embedding on the GPU with its table in DDR: no streaming unit for it; the ids stay on the
    # host (the greedy token comes back from the GPU head), the looked-up rows cross once per pass.
    schedule = build_schedule(make_plan(TINY, "mixed"))
    for phase in ("prefill", "decode"):
        embed = schedule.phases[phase].ops[0]
        assert embed.kind == "embed" and embed.gather and embed.device == "gpu" and embed.moves == ()
        assert all(u.layer_class != "embed" for u in schedule.phases[phase].stream_units)
        head = [op for op in schedule.phases[phase].ops if op.kind == "lm_head"][0]
        assert head.moves[-1] == Move("next", "gpu", "cpu")
    batch, prompt, new_tokens = 1, 4, 3
    engine = Engine.from_plan(make_plan(TINY, "mixed", batch=batch, prompt_len=prompt, gen_len=new_tokens),
                              RandomWeights(0), backend=EmulatedBackend(), dtype=torch.float32)
    out = engine.generate(torch.arange(prompt)[None], new_tokens)
    assert engine.backend.transfers.by_value["embed"] == new_tokens  # one [B, Q, D] block per pass
    assert engine.backend.transfers.by_value["next"] == new_tokens
    reference = Engine.from_plan(make_plan(TINY, "gpu", batch=batch, prompt_len=prompt, gen_len=new_tokens),
                                 RandomWeights(0), backend=EmulatedBackend(), dtype=torch.float32)
    assert torch.equal(out.token_ids, reference.generate(torch.arange(prompt)[None], new_tokens).token_ids)


def test_all_gpu_and_all_cpu_plans_move_nothing_but_the_prompt():
    gpu = build_schedule(make_plan(TINY, "gpu"))
    moves = [m for phase in gpu.phases.values() for op in phase.ops for m in op.moves]
    assert moves == [Move("ids", "cpu", "gpu")]  # the prompt arrives from the host once
    cpu = build_schedule(make_plan(TINY, "cpu"))
    assert [m for phase in cpu.phases.values() for op in phase.ops for m in op.moves] == []
    assert not cpu.uses_gpu and cpu.buffers == 0 and cpu.tier_bytes["hbm"] == 0


def test_partial_plan_transfers_counted_at_run_time():
    # LIA partial: qkv, out_proj, FFN on the GPU; attention on the CPU over a DDR cache. Per layer and pass: q to
    # the CPU and o back; every pass writes K and V to DDR, where the CPU's attention reads them (prefill too: K and
    # V cross once, not a second time as activations).
    layers, new_tokens = TINY.num_layers, 5
    engine = Engine.from_plan(make_plan(TINY, "partial", batch=1, prompt_len=4, gen_len=new_tokens),
                              RandomWeights(0), backend=EmulatedBackend())
    engine.generate(torch.arange(4)[None], new_tokens)
    counts = engine.backend.transfers.by_value
    assert counts == {"ids": 1, "q": layers * new_tokens, "o": layers * new_tokens, "kv": 2 * layers * new_tokens}


class _LateStores(EmulatedBackend):
    """K, V writes issued `beside` (a prefill's, on the GPU's store stream) land only when the host or the compute
    stream waits for them, as on a GPU whose store stream lags: a reader that did not wait reads an empty cache."""

    def __init__(self):
        super().__init__()
        self.pending, self.waits = [], 0

    def copy_into(self, dst, src, to_gpu, value="", beside=False):
        if beside and not to_gpu:
            self.transfers.count(src.numel() * src.element_size(), to_gpu, value)
            self.pending.append((dst, src.clone()))
            return
        super().copy_into(dst, src, to_gpu, value, beside)

    def _land(self):
        for dst, src in self.pending:
            dst.copy_(src)
        self.pending.clear()

    def join_stores(self):
        self._land()

    def wait_stores(self):
        self.waits += 1
        self._land()


@pytest.mark.parametrize("microbatch", [None, (1, 3)])
def test_cpu_prefill_attention_reads_the_cache_once_the_kv_writes_have_landed(microbatch):
    # 'partial' (qkv on the GPU, attention on the CPU over a DDR cache): the prefill's attention reads this step's
    # K, V in the host cache (no second crossing), so it must wait for their writes; in micro-batches of one
    # sequence and 3 prompt tokens the chunks after the first also read the earlier chunks' K, V there.
    prompt, new_tokens = torch.arange(12).reshape(2, 6) % 7, 4
    plan = make_plan(TINY, "partial", batch=2, prompt_len=6, gen_len=new_tokens, microbatch=microbatch)
    late = _LateStores()
    out = Engine.from_plan(plan, RandomWeights(0), backend=late, dtype=torch.float32).generate(
        prompt, new_tokens, return_logits=True)
    assert late.waits and not late.pending  # it waited (else it would have read zeros: the logits below)
    reference = Engine.from_plan(make_plan(TINY, "gpu", batch=2, prompt_len=6, gen_len=new_tokens),
                                 RandomWeights(0), backend=EmulatedBackend(), dtype=torch.float32).generate(
        prompt, new_tokens, return_logits=True)
    assert torch.equal(out.token_ids, reference.token_ids)
    torch.testing.assert_close(out.logits, reference.logits, rtol=1e-4, atol=1e-4)


class _Recording(EmulatedBackend):
    """Records the host buffers `host_empty` hands out and the tensors sent to the 'gpu' as the value 'o'."""

    def __init__(self):
        super().__init__()
        self.buffers, self.sent = [], []

    def host_empty(self, shape, dtype):
        buffer = super().host_empty(shape, dtype)
        self.buffers.append(buffer)
        return buffer

    def transfer(self, tensor, dst, value=""):
        if value == "o" and dst == "gpu":
            self.sent.append(tensor)
        return super().transfer(tensor, dst, value)


def test_cpu_attention_writes_its_crossing_output_into_the_backends_host_buffer():
    # The CPU's attention output crosses to the GPU's out_proj in every pass: it is written, heads interleaved,
    # straight into a buffer from `Backend.host_empty` (page-locked on CUDA), which the crossing sends as it is,
    # not into a pageable tensor that the crossing would first copy into page-locked memory.
    backend, new_tokens = _Recording(), 3
    Engine.from_plan(make_plan(TINY, "partial", batch=2, prompt_len=5, gen_len=new_tokens), RandomWeights(0),
                     backend=backend, dtype=torch.float32).generate(torch.arange(10).reshape(2, 5) % 7, new_tokens)
    assert len(backend.sent) >= TINY.num_layers * new_tokens  # every layer and pass (and the warm-up's)
    assert all(any(sent is buffer for buffer in backend.buffers) for sent in backend.sent)


def test_staging_layout_and_bytes_match_closed_form():
    # 'gpu' policy with weights in DDR: every decoder layer streams all its weights in both phases.
    plan = make_plan(LLAMA, "gpu", weights_tier="ddr", kv_tier="hbm", prefetch_depth=2)
    schedule = build_schedule(plan)
    D, F, H, G, E = 32, 48, 4, 2, 8
    layer_numel = D + D * (H + 2 * G) * E + H * E * D + D + D * 2 * F + F * D  # norms, qkv, o, norm, gate_up, down
    decode_units = schedule.phases["decode"].stream_units
    assert [u.layer for u in decode_units] == [0, 1, 2]
    assert [u.slot for u in decode_units] == [0, 1, 2]  # prefetch_depth 2 → three buffers
    assert all(u.nbytes == layer_numel * 2 for u in decode_units)
    assert schedule.buffers == 3
    assert schedule.buffer_bytes >= plan.spec.execution.staging_bytes
    kv_layer = plan.spec.workload.batch_size * G * (plan.spec.workload.prompt_len + plan.spec.workload.gen_len - 1) * E
    assert schedule.kv_shape == (2, G, 27, E)
    assert schedule.tier_bytes["hbm"] >= 3 * layer_numel * 2 + 3 * 2 * kv_layer * 2


def test_staging_too_small_is_one_error():
    plan = make_plan(LLAMA, "gpu", weights_tier="ddr", kv_tier="hbm", staging_bytes=1000)
    with pytest.raises(LiacError) as error:
        build_schedule(plan, source="plan.yaml")
    assert error.value.path == "spec.execution.staging_bytes"
    assert "must be at least" in error.value.message


@pytest.mark.parametrize("depth", [1, 2])
def test_streamer_prefetches_depth_units_ahead_and_reuses_buffers_safely(depth):
    log = []
    plan = make_plan(LLAMA, "gpu", weights_tier="ddr", kv_tier="ddr", prefetch_depth=depth, batch=1, prompt_len=4,
                     gen_len=4)
    engine = Engine.from_plan(plan, RandomWeights(1), backend=EmulatedBackend(), stream_log=log)
    engine.generate(torch.arange(4)[None], 4)
    buffers = depth + 1
    passes, current = [], []
    for entry in log:  # split the log into passes: a pass ends with the release of its last unit
        current.append(entry)
        if entry == ("release", 2):
            passes.append(current)
            current = []
    assert len(passes) == 4  # prefill + 3 decode steps, 3 streamed layers each
    for index, entries in enumerate(passes):
        position = {entry: at for at, entry in enumerate(entries)}
        assert sorted(i for kind, i in entries if kind == "issue") == [0, 1, 2]  # each unit copied once a pass
        # decode passes find their first `buffers` units already issued by the previous pass (primed)
        start = [i for kind, i in entries if kind == "start"]
        assert start == [0 if index == 0 else min(buffers, 3)]
        for unit in range(3):
            assert position[("wait", unit)] < position[("release", unit)]
            if unit + depth < 3:  # the copy of unit + depth is in flight while unit computes
                assert position[("issue", unit + depth)] < position[("wait", unit)]
            if unit + buffers < 3:  # a buffer is refilled only after the unit that used it released it
                assert position[("release", unit)] < position[("issue", unit + buffers)]


def test_random_weights_are_plan_independent():
    prompt = torch.arange(6)[None]
    outs = []
    for policy in ("gpu", "cpu", "mixed"):
        plan = make_plan(TINY, policy, batch=1, prompt_len=6, gen_len=8)
        engine = Engine.from_plan(plan, RandomWeights(3), backend=EmulatedBackend(), dtype=torch.float32)
        outs.append(engine.generate(prompt, 8).token_ids)
        params = engine.store
        weight = params("layers.0.fc1.proj.weight", plan.spec.layer_groups[1].sublayers[4].weights)
        norm = params("layers.0.qkv.norm.weight", plan.spec.layer_groups[1].sublayers[0].weights)
        assert 0.015 < weight.float().std().item() < 0.025 and abs(weight.float().mean().item()) < 0.005
        assert 0.95 < norm.float().mean().item() < 1.05 and norm.float().std().item() > 0.005
        assert (weight != 0).all()
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    other = Engine.from_plan(make_plan(TINY, "gpu", batch=1, prompt_len=6, gen_len=8), RandomWeights(4),
                             backend=EmulatedBackend(), dtype=torch.float32)
    assert not torch.equal(other.store("layers.0.fc1.proj.weight", "hbm"),
                           Engine.from_plan(make_plan(TINY, "gpu", batch=1, prompt_len=6, gen_len=8),
                                            RandomWeights(3), backend=EmulatedBackend(),
                                            dtype=torch.float32).store("layers.0.fc1.proj.weight", "hbm"))


def test_tied_head_in_another_tier_gets_its_own_copy():
    # 'mixed': the embedding is on the CPU (DDR) and the tied LM head streamed from DDR: one copy. Force the head
    # into HBM: the matrix must then exist in both tiers with identical values.
    plan = make_plan(TINY, "mixed")
    groups = list(plan.spec.layer_groups)
    head = groups[-1]
    groups[-1] = dataclasses.replace(head, sublayers=(dataclasses.replace(head.sublayers[0], weights="hbm"),))
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, layer_groups=tuple(groups)))
    schedule = build_schedule(plan)
    assert schedule.weight_tiers["embed.tokens.weight"] == ("ddr", "hbm")
    engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend())
    assert torch.equal(engine.store("embed.tokens.weight", "ddr"), engine.store("embed.tokens.weight", "hbm"))
    assert engine.store("embed.tokens.weight", "ddr").data_ptr() != engine.store("embed.tokens.weight",
                                                                                  "hbm").data_ptr()


@pytest.mark.gpu
def test_kv_window_rows_are_one_2d_copy_on_cuda():
    import liac.runtime.backend as backend_module
    from liac.runtime.backend import CudaBackend

    backend = CudaBackend()
    src = torch.randn(6, 10, 4).pin_memory()  # 6 (sequence, head) rows of 10 tokens; the first 7 are the past
    dst = torch.zeros(6, 10, 4, device="cuda")
    with backend.on_stream(backend.copy_stream()):
        backend.copy_rows(dst[:, :7], src[:, :7])
    backend.synchronize()
    assert backend_module._cudart_memcpy_2d() is not None  # the 2-D copy, not the per-row fallback
    assert torch.equal(dst[:, :7].cpu(), src[:, :7]) and not dst[:, 7:].any()


def test_wait_and_release_bracket_only_the_ops_that_read_the_staging_buffer():
    # mixed decode: qkv, score (window), fc1 on the GPU read layer 1's buffer; context, out_proj, fc2 on the CPU
    # do not: fc2 runs after the release, so the next copy into that buffer may start meanwhile
    schedule = build_schedule(make_plan(TINY, "mixed"))
    layer = [op.kind for op in schedule.phases["decode"].ops if op.layer_class == "decoder" and op.layer == 1]
    assert layer == ["wait", "qkv", "score", "context", "out_proj", "up", "release", "down"]
    # qkv and attention on the CPU first (as in LIA's plans for OPT-30B on the H200): they start before the
    # layer's streamed GPU weights have arrived
    plan = make_plan(TINY, "partial", weights_tier="ddr")
    offload = plan.spec.layer_groups[1]
    qkv = dataclasses.replace(offload.sublayers[0], decode="cpu", decode_cpu_permille=1000)
    groups = list(plan.spec.layer_groups)
    groups[1] = dataclasses.replace(offload, sublayers=(qkv,) + offload.sublayers[1:])
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, layer_groups=tuple(groups)))
    layer = [op.kind for op in build_schedule(plan).phases["decode"].ops
             if op.layer_class == "decoder" and op.layer == 1]
    assert layer == ["qkv", "attn", "wait", "out_proj", "up", "down", "release"]
    engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend())
    reference = Engine.from_plan(make_plan(TINY, "cpu"), RandomWeights(0), backend=EmulatedBackend())
    assert torch.equal(engine.generate(torch.arange(5)[None], 4).token_ids,
                       reference.generate(torch.arange(5)[None], 4).token_ids)


def test_each_value_is_dropped_after_its_last_reader():
    # All on the GPU (KV in HBM). Prefill: embed reads ids; qkv makes q, k, v, which the fused attention reads
    # (fresh) and drops; out_proj reads o (dropped) and replaces x; up makes h, which down reads and drops; the
    # LM head reads the last x. Decode reads the cache in place: attention reads only q, so qkv drops k and v.
    schedule = build_schedule(make_plan(TINY, "gpu"))
    expect = {"prefill": {"embed": ("ids",), "qkv": (), "attn": ("k", "q", "v"), "out_proj": ("o",), "up": (),
                          "down": ("h",), "lm_head": ("x",)},
              "decode": {"embed": ("ids",), "qkv": ("k", "v"), "attn": ("q",), "out_proj": ("o",), "up": (),
                         "down": ("h",), "lm_head": ("x",)}}
    for phase, drops in expect.items():
        ops = [op for op in schedule.phases[phase].ops if op.kind not in ("wait", "release")]
        assert {(op.kind, op.drops) for op in ops} == set(drops.items())


def test_a_pass_holds_only_live_values(monkeypatch):
    # The frame after each op of a prefill pass (all on the GPU), derived by hand: the residual x throughout, q, k, v
    # from qkv to attention, o to out_proj, h from up to down, and the greedy token at the end.
    seen = []
    compile_op = Executor._compile

    def watched(self, op, stream_unit):
        step = compile_op(self, op, stream_unit)

        def record(frame):
            step(frame)
            seen.append((op.kind, set(frame.vals)))
        return record

    monkeypatch.setattr(Executor, "_compile", watched)
    engine = Engine.from_plan(make_plan(TINY, "gpu"), RandomWeights(0), backend=EmulatedBackend(), warm_up=False)
    engine.generate(torch.randint(0, TINY.vocab_size, (2, 5)), 1)
    layer = [("qkv", {"x", "q", "k", "v"}), ("attn", {"x", "o"}), ("out_proj", {"x"}), ("up", {"x", "h"}),
             ("down", {"x"})]
    assert seen == [("embed", {"x"})] + layer * TINY.num_layers + [("lm_head", {"next"})]


def test_scores_in_blocks_of_query_rows_equal_one_call(monkeypatch):
    """Attention run apart computes its probabilities over blocks of query rows (executor._score_in_blocks):
    the same probabilities as one call, for prefill (Q = C) and for a query block at the end of a longer context."""
    import liac.runtime.executor as executor
    from liac.models.layers import Attention

    attention = Attention(LLAMA)
    for batch, query, context in ((2, 7, 7), (1, 5, 9)):
        q = torch.randn(batch, 4, query, 8, dtype=torch.float64)
        keys = torch.randn(batch, 2, context + 3, 8, dtype=torch.float64)  # a cache longer than the context
        whole = attention.score(q, keys, context)
        monkeypatch.setattr(executor, "SCORE_BLOCK_BYTES", batch * 4 * context * 4 * 2)  # two rows per block
        blocked = executor._score_in_blocks(attention, q, keys, context)
        torch.testing.assert_close(blocked, whole, rtol=1e-12, atol=1e-12)


# The dataflow of a pass as the executor's steps see it, written apart from the schedule: what each op kind reads
# (value → the devices it reads it on) and produces, given its device, its split, its experts and its KV read mode.
_PRODUCES = {"embed": ("x",), "qkv": ("q", "k", "v"), "attn": ("o",), "score": ("p",), "context": ("o",),
             "out_proj": ("x",), "up": ("h",), "down": ("x",), "router": ("h", "ei", "ew"), "experts": ("x",),
             "lm_head": ("next",)}


def _joins(op: Op) -> tuple[str, ...]:
    return op.split.merge_on if op.split else op.experts.merge_on if op.experts else (op.device,)


def _reads(op: Op) -> dict[str, tuple[str, ...]]:
    parts = ("cpu", "gpu") if op.device == "split" else (op.device,)
    fresh = op.kv_read in ("fresh", "window")  # this step's K / V besides the cache
    return {"embed": {"ids": ("cpu",) if op.gather else parts},
            "qkv": {"x": parts}, "up": {"x": parts}, "lm_head": {"x": parts}, "router": {"x": parts},
            "attn": {"q": parts, **({"k": parts, "v": parts} if fresh else {})},
            "score": {"q": parts, **({"k": parts} if fresh else {})},
            "context": {"p": parts, **({"v": parts} if fresh else {})},
            "out_proj": {"o": parts, "x": _joins(op)}, "down": {"h": parts, "x": _joins(op)},
            "experts": {**{v: op.experts.devices() for v in ("h", "ei", "ew")}, "x": _joins(op)} if op.experts
            else {}}[op.kind]


def _dataflow_errors(ops, ids_on: str, bring: bool) -> list[str]:
    """Run the ops' moves over where each value is; each op's reads must find their values. With `bring` (a pass over
    some layers only, Executor._forward_alone), an op first gets its inputs where `Op.inputs_at` says; without, a
    whole pass, `inputs_at` must be where they are."""
    where, errors = {"ids": {ids_on}}, []
    for op in ops:
        if op.kind in ("wait", "release"):
            continue
        name = f"{op.group} layer {op.layer} {op.kind}"
        for value, devices in op.inputs_at:
            if bring:
                where[value] |= set(devices)
            elif where.get(value) != set(devices):
                errors.append(f"{name}: {value} is on {where.get(value)}, inputs_at says {devices}")
        for move in (m for m in op.moves if m.value != "next"):
            if move.src not in where.get(move.value, ()):
                errors.append(f"{name}: moves {move.value} from {move.src}, not there")
            where.setdefault(move.value, set()).add(move.dst)
        for value, devices in _reads(op).items():
            if not set(devices) <= where.get(value, set()):
                errors.append(f"{name}: reads {value} on {devices}, it is on {where.get(value)}")
        for value in _PRODUCES[op.kind]:
            where[value] = set(_joins(op))
        for move in (m for m in op.moves if m.value == "next"):
            if move.src not in where["next"]:
                errors.append(f"{name}: moves the token from {move.src}, not there")
    return errors


def _committed_plans():
    from pathlib import Path

    repo = Path(__file__).parents[2]
    return sorted(p for p in (repo / "plans").glob("*/*.yaml") if p.name != "index.yaml")


def test_every_committed_plan_reads_each_value_where_it_is_in_a_whole_pass_and_in_the_warm_up(monkeypatch):
    """Over the checked-in plans (their real shapes): in a pass over every layer, each op finds its inputs where it
    reads them after its moves; in the warm-up's pass (the first layer of each group), too, once it has brought
    them where `inputs_at` says. Without that, a split op whose input a skipped layer joined on its other device
    failed (KeyError 'cpu': bench/results/h200-2026-12-02/moe-fix, a split LM head after split experts)."""
    import functools

    import liac.runtime.schedule as schedule_module
    from liac.plan import load_plan

    monkeypatch.setattr(schedule_module, "model_params", functools.cache(schedule_module.model_params))
    paths = _committed_plans()
    assert len(paths) > 50
    warmed_splits = 0
    for path in paths:
        plan = load_plan(path)
        schedule = build_schedule(plan)
        for phase, program in schedule.phases.items():
            ops = program.ops
            embed = next(op for op in ops if op.kind == "embed")
            ids_on = "cpu" if phase == "prefill" or embed.gather else embed.device
            firsts = {}
            for op in ops:
                firsts.setdefault(op.group, op.layer)
            alone = [op for op in ops if firsts[op.group] == op.layer]
            assert _dataflow_errors(ops, ids_on, bring=False) == [], (path.name, phase)
            assert _dataflow_errors(alone, ids_on, bring=True) == [], (path.name, phase)
            warmed_splits += any(op.device == "split" for op in alone)
    assert warmed_splits > 0
