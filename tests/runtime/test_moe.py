"""MoE (Mixtral) plans against HF `MixtralForCausalLM`, on the same safetensors weights.

Two routings: top-2 of 8 experts ('mixtral') and top-3 of 6 ('mixtral-k3'). Experts placed wholly on the GPU
(resident in HBM), wholly on the CPU, streamed (only the routed ones copied, through the expert slots), and mixed:
some resident, some on the CPU, the rest streamed, with a different CPU share per phase, beside dense units spread
over both devices and a router on the other device than some of its experts. Token parity in float32; bf16 logits
judged against HF's own bf16 runs (`_assert_moe_bf16_close`). The reference is HF's forward over the whole
sequence at every step (no KV cache, its own routing), so it shares nothing with the runtime's grouped experts.
"""

from __future__ import annotations

import math
import tarfile
from pathlib import Path

import pytest
import torch
from runtime_plans import (BACKENDS, NEW_TOKENS, PROMPT, hf_greedy, hf_model_class, make_plan, make_test_backend,
                           placement, save_hf_checkpoint, with_experts)

from liac.api import compile_plans
from liac.plan import ExpertPlacement, LayerGroup, load_plan
from liac.runtime import Engine
from liac.runtime.schedule import build_schedule

MOE = ("mixtral", "mixtral-k3")


def _placements(num_experts: int) -> dict:
    """name → (dense policy, make_plan arguments, expert counts or None for the policy's whole placement)."""
    return {
        "gpu": ("gpu", {}, ExpertPlacement(num_experts, 0, 0)),
        "cpu": ("cpu", {}, None),
        "streamed": ("gpu", {"weights_tier": "ddr"}, ExpertPlacement(0, 0, 0)),
        # a resident layer, then 2 resident experts + 1 (prefill) or 3 (decode) on the CPU + the rest streamed,
        # dense units on both devices; the last layer's experts in the 'cxl' tier
        "mixed": ("mixed", {"resident_layers": 1, "cxl_layers": 1}, ExpertPlacement(2, 1, 3)),
        # the router on the CPU at prefill, on the GPU at decode; experts split both times
        "crossed": ("crossed", {}, ExpertPlacement(1, 4, 2)),
    }


PLACEMENTS = tuple(_placements(8))


def _plan(cfg, placement: str, **extra):
    policy, kwargs, experts = _placements(cfg.num_experts)[placement]
    return make_plan(cfg, policy, experts=experts, **kwargs, **extra)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("family", MOE)
def test_greedy_tokens_match_hf_fp32(checkpoints, reference, family, placement, backend):
    directory, cfg = checkpoints(family)
    engine = Engine.from_plan(_plan(cfg, placement), directory, backend=make_test_backend(backend),
                              dtype=torch.float32)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference(family)
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cut", ((1, 8), (2, 3), (1, 3)))
@pytest.mark.parametrize("placement", ("streamed", "mixed", "crossed"))
def test_microbatched_prefill_matches_hf_fp32(checkpoints, reference, placement, cut, backend):
    """A Mixtral prefill cut into micro-batches (plan v3, `microbatch=(sequences, prompt tokens)`): each micro-batch
    routes its own tokens through the resident, CPU and streamed experts; the tokens and logits stay HF's."""
    directory, cfg = checkpoints("mixtral")
    engine = Engine.from_plan(_plan(cfg, placement, microbatch=cut), directory, backend=make_test_backend(backend),
                              dtype=torch.float32)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference("mixtral")
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("placement", ("gpu", "cpu", "mixed"))
@pytest.mark.parametrize("family", MOE)
def test_bf16_logits_within_bf16_tolerance(checkpoints, reference, family, placement, backend):
    directory, cfg = checkpoints(family)
    engine = Engine.from_plan(_plan(cfg, placement), directory, backend=make_test_backend(backend))
    assert engine.dtype == torch.bfloat16
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    fp32, bf16, _, _ = reference(family)
    _assert_moe_bf16_close(out, fp32, bf16)


def _assert_moe_bf16_close(out, fp32, bf16) -> None:
    """Teacher-forced on the tokens the runtime generated, its bf16 logits must be as close to HF's fp32 ones as
    HF's own bf16 runs are (plus a margin), and closer to one of HF's bf16 runs (SDPA or eager attention) than those
    are to fp32. In bf16 a router picks other experts for some tokens than in fp32 (a discontinuity), so the error
    against fp32 reaches a fifth of the logit range at some positions for HF itself: the dense models' bound of 5 %
    of the range cannot hold; agreeing with HF's bf16 routing is what shows the same math."""
    sequence = torch.cat([PROMPT, out.token_ids], dim=1)
    positions = slice(PROMPT.shape[1] - 1, -1)
    with torch.no_grad():
        truth = fp32(sequence).logits[:, positions].float()
        theirs = [model(sequence).logits[:, positions].float() for model in bf16]
    hf_error = max((logits - truth).abs().max().item() for logits in theirs)
    ours_error = (out.logits - truth).abs().max().item()
    assert ours_error <= 1.5 * hf_error + 0.02, (ours_error, hf_error)
    closest = min((out.logits - logits).abs().max().item() for logits in theirs)
    assert closest < hf_error, (closest, hf_error)


def _routed(model, sequence: torch.Tensor) -> list[list[set[int]]]:
    """Per layer, per pass of a greedy run (prefill, then each decode step), the experts HF's router sends that
    pass's tokens to (HF's own routing of the whole sequence)."""
    with torch.no_grad():
        out = model(sequence, output_router_logits=True)
    top_k = model.config.num_experts_per_tok
    batch, length = sequence.shape
    prompt = PROMPT.shape[1]
    passes = [range(0, prompt)] + [range(p, p + 1) for p in range(prompt, length - 1)]
    hit = []
    for logits in out.router_logits:  # [B·T, E] per layer
        index = logits.view(batch, length, -1).topk(top_k, dim=-1).indices
        hit.append([set(index[:, positions].flatten().tolist()) for positions in passes])
    return hit


def _streamed_share(hit: set[int], hbm: int, cpu: int, num_experts: int) -> set[int]:
    """The routed host experts a pass streams when the plan has `cpu` on the CPU and the rest beyond the `hbm`
    resident ones streamed, shared at a ratio of 1 (an expert costs the CPU what its copy costs PCIe): of r routed
    host experts x go to the CPU, x minimising max(x, r − x), ties to the fewest moved from their planned device;
    its own planned ones first, then the lowest of the others; all routed: as planned."""
    host = sorted(e for e in hit if e >= hbm)
    planned_cpu = [e for e in host if e < hbm + cpu]
    others = [e for e in host if e >= hbm + cpu]
    if len(host) == num_experts - hbm:
        return set(others)
    x = min(range(len(host) + 1), key=lambda x: (max(x, len(host) - x), abs(x - len(planned_cpu))))
    on_cpu = planned_cpu[:x] if x <= len(planned_cpu) else planned_cpu + others[:x - len(planned_cpu)]
    return set(host) - set(on_cpu)


@pytest.mark.parametrize("family", MOE)
def test_only_routed_experts_are_copied(checkpoints, reference, family):
    """Every expert copy the runtime makes is of an expert a token of that pass is routed to, in that layer, and
    each routed expert it streams is copied once per pass: the count equals HF's routing replayed, with the routed
    host experts shared between the CPU and PCIe (`ExpertRun.assign`, at a given ratio of 1)."""
    directory, cfg = checkpoints(family)
    placed = ExpertPlacement(1, 2, 3)  # planned streamed: experts [3, E) at prefill, [4, E) at decode
    log: list = []
    engine = Engine.from_plan(make_plan(cfg, "gpu", weights_tier="ddr", experts=placed), directory,
                              backend=make_test_backend("emulated"), dtype=torch.float32, stream_log=log,
                              expert_share=1.0)
    assert engine.executor.expert_ratio == 1.0
    log.clear()  # the load's warm-up pass copies what it routes too: count the generate call's copies only
    before = engine.backend.transfers.by_value.get("experts", 0)
    out = engine.generate(PROMPT, NEW_TOKENS)
    fp32, _, tokens, _ = reference(family)
    assert torch.equal(out.token_ids, tokens)
    hit = _routed(fp32, torch.cat([PROMPT, tokens], dim=1))
    E = cfg.num_experts
    streamed = [[_streamed_share(h, 1, 2 if index == 0 else 3, E) for index, h in enumerate(passes)]
                for passes in hit]
    expected = sum(len(s) for passes in streamed for s in passes)
    copies = [entry for entry in log if entry[0] == "expert"]
    assert len(copies) == expected
    one_expert = 3 * cfg.ffn_dim * cfg.hidden_size * 4  # gate, up, down rows of one expert, fp32
    assert engine.backend.transfers.by_value["experts"] - before == 2 * expected  # its gate_up and its down
    assert out.transfers["streamed_bytes"] >= expected * one_expert
    # every copied expert is a routed host expert (never a resident one), and some decode pass streamed one of
    # the experts the plan puts on the CPU (the share at work)
    assert {expert for _, _, expert in copies} <= set(range(1, E))
    assert any(s & set(range(1, 4)) for passes in streamed for s in passes[1:])


def test_routed_copies_are_issued_before_the_resident_experts_launch(checkpoints, reference, monkeypatch):
    """The GPU part of an experts op issues its routed experts' first copies (one per expert slot) before it
    launches its resident experts (`Streamer.routed_experts` issues them when called): the copies then run while
    the host launches, not after. Checked on the stream log beside each GPU-part expert computed, with HF's
    tokens."""
    import liac.models.mixtral as mixtral
    import liac.runtime.executor as executor

    directory, cfg = checkpoints("mixtral")
    log: list = []
    engine = Engine.from_plan(make_plan(cfg, "gpu", weights_tier="ddr", experts=ExpertPlacement(2, 1, 3)),
                              directory, backend=make_test_backend("emulated"), dtype=torch.float32, stream_log=log,
                              expert_share=1.0)
    partial, ffn = executor.experts_partial, mixtral.expert_ffn

    def gpu_partial(h, routing, experts, linear=None, block_rows=None):
        if block_rows is None:  # the CPU part
            return partial(h, routing, experts, linear)
        log.append(("gpu part",))
        try:
            return partial(h, routing, experts, linear, block_rows)
        finally:
            log.append(("gpu part end",))

    def logged_ffn(gate_up, down, x, linear=None):
        log.append(("ffn",))
        return ffn(gate_up, down, x, linear)

    monkeypatch.setattr(executor, "experts_partial", gpu_partial)
    monkeypatch.setattr(mixtral, "expert_ffn", logged_ffn)
    log.clear()
    out = engine.generate(PROMPT, NEW_TOKENS)
    assert torch.equal(out.token_ids, reference("mixtral")[2])
    parts, part = [], None
    for entry in log:
        if entry[0] == "gpu part":
            part = []
        elif entry[0] == "gpu part end":
            parts.append(part)
            part = None
        elif part is not None and entry[0] in ("ffn", "expert"):
            part.append(entry[0])
    # parts with a resident expert computed and a routed expert copied: the copy is issued first
    both = [p for p in parts if "ffn" in p and "expert" in p]
    assert len(both) > NEW_TOKENS
    assert all(p[0] == "expert" for p in both)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("placement, split", [("mixed", False), ("crossed", False), ("mixed", True)])
@pytest.mark.parametrize("family", MOE)
def test_gpu_part_launched_beside_the_cpu_part_matches_hf_fp32(checkpoints, reference, family, placement, split,
                                                                backend, monkeypatch):
    """`Engine.from_plan(expert_launcher=True)` (runtime/executor.py `_Launcher`): an experts op with both a CPU
    and a GPU part launches the GPU part from the launcher thread while the main thread computes the CPU part (the
    CPU part never waits for the GPU's launches); HF's tokens and logits, with the routed experts shared and with a
    cut expert. Every split GPU part of a timed pass ran on the launcher thread, every CPU part on the caller's."""
    import threading

    import liac.runtime.executor as executor

    directory, cfg = checkpoints(family)
    threads: dict[str, set[str]] = {"cpu": set(), "gpu": set()}
    partial = executor.experts_partial

    def which_thread(h, routing, experts, linear=None, block_rows=None):
        threads["cpu" if block_rows is None else "gpu"].add(threading.current_thread().name)
        return partial(h, routing, experts, linear, block_rows)

    monkeypatch.setattr(executor, "experts_partial", which_thread)
    engine = Engine.from_plan(_plan(cfg, placement), directory, backend=make_test_backend(backend),
                              dtype=torch.float32, expert_share=1.0, expert_launcher=True, expert_split=split)
    if split:  # the emulation measures no copy: a cut of 40 features, as the cut's own test makes it
        splitter = executor.ExpertSplit(executor.ExpertShare(1.0, pcie_seconds=1e-3), engine.executor.expert_tally,
                                        cfg.ffn_dim, rows=8)
        monkeypatch.setattr(splitter, "features", lambda cpu, streamed, nbytes: 40)
        engine.executor.expert_split = splitter
    threads["cpu"].clear(), threads["gpu"].clear()
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference(family)
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)
    main = threading.current_thread().name
    assert threads["cpu"] == {main}
    assert any(name.startswith("liac-gpu-launch") for name in threads["gpu"])
    if split:
        assert out.experts["decode_cut_experts"] > 0
    engine.close()


def test_routed_host_experts_are_shared_by_the_ratio():
    from liac.runtime.schedule import ExpertRun

    def routed(*experts):
        return [1 if e in experts else 0 for e in range(8)]

    run = ExpertRun(8, 1, 5, ("gpu",))  # 1 resident, 5 on the CPU (1-5), 2 streamed (6-7): the H200 optimum's layer
    assert run.assign(routed(2, 3)) == ([2, 3], [])  # no ratio: as planned
    assert run.assign(routed(2, 3), 0.9) == ([2], [3])  # batch 1, both on the CPU: one goes over PCIe
    assert run.assign(routed(6, 7), 0.9) == ([6], [7])  # both streamed: the CPU takes one
    assert run.assign(routed(2, 7), 0.9) == ([2], [7])  # one each already: as planned
    assert run.assign(routed(0, 4), 0.9) == ([4], [])   # one host expert: the CPU is the faster for it
    assert run.assign(routed(0, 7), 0.9) == ([7], [])
    assert run.assign(routed(0, 7), 1.0) == ([], [7])   # a tie: as planned
    assert run.assign(routed(2, 3), 3.0) == ([], [2, 3])  # a slow CPU: both over PCIe (2 < 3 of the CPU's one)
    assert run.assign(routed(2, 3), 0.4) == ([2, 3], [])  # a fast CPU: both where planned
    assert run.assign(routed(*range(8)), 0.9) == ([1, 2, 3, 4, 5], [6, 7])  # all routed: as planned
    assert ExpertRun(8, 0, 8, ("gpu",)).assign(routed(2, 3), 1.0) == ([2, 3], [])  # nothing streams: no share
    assert ExpertRun(8, 2, 0, ("gpu",)).assign(routed(0, 3), 1.0) == ([], [3])  # nothing on the CPU: no share
    assert ExpertRun(6, 0, 3, ("gpu",)).assign([1, 1, 1, 0, 1, 0], 1.0) == ([0, 1], [2, 4])


@pytest.mark.parametrize("placement", ("mixed", "crossed"))
def test_shared_routing_matches_hf_fp32(checkpoints, reference, placement):
    """With the routed experts shared (a ratio given: the emulation measures none), tokens and logits stay HF's."""
    directory, cfg = checkpoints("mixtral")
    engine = Engine.from_plan(_plan(cfg, placement), directory, backend=make_test_backend("emulated"),
                              dtype=torch.float32, expert_share=1.0)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference("mixtral")
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)


def test_expert_share_option_is_checked_and_auto_needs_a_measurement(checkpoints):
    directory, cfg = checkpoints("mixtral")
    with pytest.raises(ValueError, match="expert_share must be 'auto', 'load', 'off' or a positive number, got 'always'"):
        Engine.from_plan(_plan(cfg, "mixed"), directory, backend=make_test_backend("emulated"), expert_share="always")
    # emulated: no GPU copy to time, so 'auto' keeps the plan's placement; a plan without CPU + streamed experts
    # has nothing to share whatever is asked
    assert Engine.from_plan(_plan(cfg, "mixed"), directory, backend=make_test_backend("emulated"),
                            warm_up=False).executor.expert_ratio is None
    assert Engine.from_plan(_plan(cfg, "gpu"), directory, backend=make_test_backend("emulated"), warm_up=False,
                            expert_share=1.0).executor.expert_ratio is None


def test_schedule_expert_slots_and_rows(checkpoints):
    """A layer streaming experts carries EXPERT_SLOTS slots of one expert after its other streamed tensors; the
    stacked expert weights are held by rows (resident ones in HBM, the rest in the host tier); a split experts op
    joins where the next layer reads it."""
    _, cfg = checkpoints("mixtral")
    plan = make_plan(cfg, "gpu", weights_tier="ddr", experts=ExpertPlacement(3, 0, 4))
    schedule = build_schedule(plan, itemsize=2)
    one = 3 * cfg.ffn_dim * cfg.hidden_size * 2
    prefill = schedule.phases["prefill"]
    experts = [op for op in prefill.ops if op.kind == "experts"]
    assert [(op.experts.hbm, op.experts.cpu, op.experts.streamed) for op in experts] == [(3, 0, 5)] * 3
    assert all(op.device == "gpu" and op.streamed for op in experts)
    unit = prefill.stream_units[0]
    assert len(unit.expert_slots) == 2 and unit.expert_slots[0] > 0  # after the layer's streamed dense weights
    dense = sum(piece.numel * 2 for piece in unit.weights)
    assert unit.nbytes == dense + 2 * one
    decode = [op for op in schedule.phases["decode"].ops if op.kind == "experts"]
    assert all(op.device == "split" and op.experts.merge_on == ("gpu",) for op in decode)  # the next qkv: GPU
    assert [len(s.expert_slots) for s in schedule.phases["decode"].stream_units] == [1] * 3  # one streamed: one slot
    name = "layers.0.experts.gate_up"
    assert schedule.weight_rows[(name, "hbm")] == (0, 3) and schedule.weight_rows[(name, "ddr")] == (3, 5)
    assert set(schedule.weight_tiers[name]) == {"hbm", "ddr"}


def test_compiled_plan_runs(checkpoints, reference):
    """A plan the compiler writes for a GPU budget that holds only part of the experts runs and matches HF: the
    compiler's staging (expert slots) and memory agree with what the runtime allocates."""
    directory, cfg = checkpoints("mixtral")
    # the budget: what the all-resident plan uses (CUDA context and workspace included) less half the experts' bytes
    roomy = compile_plans(str(directory), "h200-amx16", batches=(2,), prompt_len=8, gen_len=20, gpu_mem=2**31)
    experts_bytes = cfg.num_layers * cfg.num_experts * 3 * cfg.ffn_dim * cfg.hidden_size * 2
    result = compile_plans(str(directory), "h200-amx16", batches=(2,), prompt_len=8, gen_len=20,
                           gpu_mem=roomy.points[0].plan.spec.memory.hbm_bytes - experts_bytes // 2)
    plan = result.points[0].plan
    counts = [g.sublayers[-1].experts for g in plan.spec.layer_groups if g.layer_class == "decoder"]
    assert any(0 < c.hbm < cfg.num_experts for c in counts)  # some experts resident, some not
    engine = Engine.from_plan(plan, directory, backend=make_test_backend("emulated"), dtype=torch.float32)
    assert engine.schedule.tier_bytes["hbm"] <= plan.spec.memory.hbm_bytes * 2  # fp32: twice the plan's bf16
    out = engine.generate(PROMPT, NEW_TOKENS)
    assert torch.equal(out.token_ids, reference("mixtral")[2])
    assert out.transfers["streamed_bytes"] > 0


@pytest.mark.parametrize("placement", ("mixed", "crossed"))
def test_left_padded_prompts_match_hf_generate(checkpoints, placement):
    """Prompts of different lengths in one batch (left padding, a per-sequence mask) through a Mixtral plan with
    experts resident, on the CPU and streamed: HF `generate` with its attention mask gives the same tokens (pad
    tokens are routed too, but no real token attends to them)."""
    import transformers

    rows = [[5, 9, 17, 33, 4, 60, 71, 8], [44, 12, 3], [7, 7, 19, 100, 2]]
    width, new, pad = 8, 12, 0
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    directory, cfg = checkpoints("mixtral")
    hf = transformers.MixtralForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    config = transformers.GenerationConfig(max_new_tokens=new, do_sample=False, pad_token_id=pad, eos_token_id=None,
                                           bos_token_id=None)
    with torch.no_grad():
        expected = hf.generate(ids, attention_mask=mask, generation_config=config)[:, width:]
    policy, kwargs, experts = _placements(cfg.num_experts)[placement]
    plan = make_plan(cfg, policy, experts=experts, batch=3, prompt_len=width, gen_len=new, **kwargs)
    engine = Engine.from_plan(plan, directory, backend=make_test_backend("emulated"), dtype=torch.float32)
    out = engine.generate(ids, new, attention_mask=mask)
    assert torch.equal(out.token_ids, expected)


def test_profile_times_the_experts_parts_and_the_routing(checkpoints):
    """The per-op profile of a plan whose experts run on both devices: each experts row of the metrics carries its
    CPU part, its GPU part (resident and streamed experts) and the routing read on the host before them, each inside
    the row's own time (the next device run reads where an MoE step's time goes from these)."""
    from liac.runtime.backend import EmulatedBackend
    from liac.runtime.metrics import build_metrics

    directory, cfg = checkpoints("mixtral")
    engine = Engine.from_plan(_plan(cfg, "mixed"), directory, backend=EmulatedBackend(), dtype=torch.float32)
    generation = engine.generate(PROMPT, 3)
    metrics = build_metrics(engine, generation, engine.profile(PROMPT, 2))
    rows = [r for r in metrics["sublayers"] if r["sublayers"] == ["experts"] and r["device"] == "split"]
    assert {r["phase"] for r in rows} == {"prefill", "decode"}
    for row in rows:
        parts = row["measured_cpu_part_ms"] + row["measured_gpu_part_ms"] + row["measured_route_ms"]
        assert 0 < row["measured_cpu_part_ms"] and 0 < row["measured_gpu_part_ms"] and 0 < row["measured_route_ms"]
        assert parts <= row["measured_ms"]  # the emulated GPU part runs in its launch: the three add up inside


def test_a_device_with_no_routed_expert_computes_nothing(checkpoints, reference, monkeypatch):
    """At batch 1 a layer's routed experts may all fall on one device: the other computes no part (no zeros, no
    merge copy), and the tokens stay HF's."""
    import liac.runtime.executor as executor

    directory, cfg = checkpoints("mixtral")
    parts = []
    real = executor.experts_partial

    def recording(h, routing, experts, linear, block_rows=None):
        parts.append(1)
        return real(h, routing, experts, linear, block_rows)

    monkeypatch.setattr(executor, "experts_partial", recording)
    # 0 resident, 1 on the CPU, 7 streamed: a token of batch 1 hits the CPU's expert in 1/4 of its routings only
    plan = make_plan(cfg, "gpu", weights_tier="ddr", experts=ExpertPlacement(0, 1, 1), batch=1)
    engine = Engine.from_plan(plan, directory, backend=make_test_backend("emulated"), dtype=torch.float32,
                              expert_share="off")
    parts.clear()
    before = engine.backend.transfers.by_value.get("merge", 0)
    out = engine.generate(PROMPT[:1], NEW_TOKENS)
    fp32 = reference("mixtral")[0]
    with torch.no_grad():
        sequence = PROMPT[:1]
        for _ in range(NEW_TOKENS):
            sequence = torch.cat([sequence, fp32(sequence).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out.token_ids, sequence[:, PROMPT.shape[1]:])
    steps = cfg.num_layers * NEW_TOKENS  # experts ops of the generate call (prefill + decode steps)
    merges = engine.backend.transfers.by_value.get("merge", 0) - before  # CPU partial sums sent to the GPU
    # the GPU has a routed expert in every op (a token's 2 experts cannot both be the CPU's one), the CPU in some:
    # one part per op plus one per CPU part, and each CPU part's sum crosses to the GPU
    assert 0 < merges < steps
    assert len(parts) == steps + merges


def _head_after_split_experts(cfg) -> tuple:
    """The layer groups of the H200 optimum at batch 8 (bench/results/h200-2026-12-02/moe-fix) on the 3-layer model:
    layer 0 all on the GPU, layers 1-2 with decode attention and router on the CPU (KV in DDR) and out_proj streamed;
    experts split in both phases (2 resident, 1 or 3 on the CPU, the rest streamed); the LM head split, from DDR.
    Layer 1's experts join on the GPU only (layer 2 reads the stream there), layer 2's on both devices too (the
    head reads it there): the warm-up, which runs layer 1 but not 2, must still find the head's input on the CPU."""
    gpu = lambda name, tier: placement(name, "gpu", "gpu", tier)  # noqa: E731
    attn = ("attn_score", "attn_context")
    layer0 = (gpu("qkv", "hbm"), *(gpu(n, "none") for n in attn), gpu("out_proj", "hbm"), gpu("router", "ddr"),
              gpu("experts", "ddr"))
    layer1 = (gpu("qkv", "hbm"), *(placement(n, "gpu", "cpu", "none") for n in attn), gpu("out_proj", "ddr"),
              placement("router", "gpu", "cpu", "ddr"), gpu("experts", "ddr"))
    experts = ExpertPlacement(2, 1, 3)
    return (LayerGroup("embed", "embed", 0, 1, "none", (gpu("embed", "ddr"),)),
            with_experts(cfg, LayerGroup("decoder-0", "decoder", 0, 1, "hbm", layer0), experts),
            with_experts(cfg, LayerGroup("decoder-1", "decoder", 1, 2, "ddr", layer1), experts),
            LayerGroup("head", "head", 0, 1, "none", (placement("lm_head", "split", "split", "ddr", 500, 500),)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_head_after_split_experts_matches_hf_fp32(checkpoints, reference, backend):
    """Warmed up (the default: the first layer of each group, both phases), then HF's tokens and logits."""
    directory, cfg = checkpoints("mixtral")
    plan = make_plan(cfg, layer_groups=_head_after_split_experts(cfg))
    schedule = build_schedule(plan)
    joins = [op.experts.merge_on for op in schedule.phases["decode"].ops if op.kind == "experts"]
    assert joins == [("gpu",), ("gpu",), ("cpu", "gpu")]  # the structure above, as the schedule resolves it
    engine = Engine.from_plan(plan, directory, backend=make_test_backend(backend), dtype=torch.float32)
    assert engine.warmup_request == (2, 8)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference("mixtral")
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)


# The compiled optima of the H200 Mixtral call that failed in the warm-up (KeyError 'cpu': the split LM head's input
# not on the CPU), as the benchmark ran them (its plans archive): 16 layers, top-2 of 8 experts.
H200_PLANS = Path(__file__).parents[2] / "bench" / "results" / "h200-2026-12-02" / "moe-fix" / "plans.tgz"


@pytest.fixture(scope="module")
def mixtral16(tmp_path_factory):
    """A 16-layer tiny Mixtral (the tiny routing: top-2 of 8) → (directory, config, HF fp32 greedy tokens, logits)."""
    directory = tmp_path_factory.mktemp("mixtral16") / "ckpt"
    cfg = save_hf_checkpoint("mixtral", directory, seed=5, layers=16)
    hf = hf_model_class("mixtral").from_pretrained(directory, dtype=torch.float32).eval()
    return (directory, cfg) + hf_greedy(hf, PROMPT, NEW_TOKENS // 2)


def _archived_plan(name: str, tmp_path):
    with tarfile.open(H200_PLANS) as archive:
        data = archive.extractfile(f"plans/optimal/{name}.yaml").read()
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    return load_plan(path)


@pytest.mark.parametrize("batch", (8, 32))
def test_the_h200_optima_that_failed_in_warm_up_match_hf_fp32(tmp_path, mixtral16, batch):
    """Their layer groups (split experts by count, decode attention and router on the CPU in some groups, a split LM
    head from DDR) over the tiny 16-layer Mixtral: warmed up (the default), then HF's tokens and logits."""
    directory, cfg, tokens, logits = mixtral16
    compiled = _archived_plan(f"mixtral-8x7b-16l.h200-moe-run.b{batch}-p128-g32", tmp_path)
    shape = compiled.model_config
    assert (shape.num_layers, shape.num_experts, shape.experts_top_k) == (cfg.num_layers, cfg.num_experts,
                                                                          cfg.experts_top_k)
    assert [(s.prefill, s.decode) for g in compiled.spec.layer_groups if g.layer_class == "head"
            for s in g.sublayers] == [("split", "split")]
    plan = make_plan(cfg, layer_groups=compiled.spec.layer_groups)
    engine = Engine.from_plan(plan, directory, backend=make_test_backend("emulated"), dtype=torch.float32)
    assert engine.warmup_request == (2, 8)
    out = engine.generate(PROMPT, NEW_TOKENS // 2, return_logits=True)
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)


def _streamed_at(hit: set[int], hbm: int, cpu: int, num_experts: int, cpu_takes_all: bool) -> set[int]:
    """The routed host experts a pass streams under a share whose ratio has run to one end: a CPU far slower than
    PCIe gets none of them (all streamed), a far faster one all of them (none streamed); every host expert routed:
    as planned."""
    host = {e for e in hit if e >= hbm}
    if len(host) == num_experts - hbm:
        return {e for e in host if e >= hbm + cpu}
    return set() if cpu_takes_all else host


@pytest.mark.parametrize("cpu_takes_all", (False, True), ids=("slow-cpu", "fast-cpu"))
def test_adaptive_share_follows_the_cpu_parts(checkpoints, reference, cpu_takes_all):
    """With an adapting share (`ExpertShare`, as 'auto' makes it on a GPU), the ratio follows the CPU parts' own
    host seconds: against a PCIe copy priced at a femtosecond every routed host expert is streamed after the first
    CPU part, against one of a thousand seconds the CPU takes them all; the copies match HF's routing replayed
    under that share, and the tokens stay HF's."""
    from liac.runtime.moe import ExpertShare

    directory, cfg = checkpoints("mixtral")
    log: list = []
    engine = Engine.from_plan(make_plan(cfg, "gpu", weights_tier="ddr", experts=ExpertPlacement(1, 2, 3)), directory,
                              backend=make_test_backend("emulated"), dtype=torch.float32, stream_log=log,
                              expert_share=1.0)
    share = ExpertShare(1.0, pcie_seconds=1e3 if cpu_takes_all else 1e-15, adapt=True, probe_every=10**9)
    engine.executor.expert_share = share
    fp32, _, tokens, _ = reference("mixtral")
    assert torch.equal(engine.generate(PROMPT, NEW_TOKENS).token_ids, tokens)  # the share moves off 1.0 here
    assert share.observed > 0
    assert (share.current < 1e-3) if cpu_takes_all else (share.current > 1e6)
    log.clear()
    out = engine.generate(PROMPT, NEW_TOKENS)
    assert torch.equal(out.token_ids, tokens)
    hit = _routed(fp32, torch.cat([PROMPT, tokens], dim=1))
    expected = sum(len(_streamed_at(h, 1, 2 if index == 0 else 3, cfg.num_experts, cpu_takes_all))
                   for passes in hit for index, h in enumerate(passes))
    assert len([entry for entry in log if entry[0] == "expert"]) == expected
    fixed = sum(len(_streamed_share(h, 1, 2 if index == 0 else 3, cfg.num_experts))
                for passes in hit for index, h in enumerate(passes))
    assert expected != fixed  # the adapted share streams other experts than the fixed ratio of 1 would
    if not cpu_takes_all:  # a CPU left idle is measured again every `probe_every` experts ops that skip it
        share.probe_every, observed = 2, share.observed
        assert torch.equal(engine.generate(PROMPT, NEW_TOKENS).token_ids, tokens)
        assert share.probes > 0 and share.observed > observed


def test_expert_share_moves_with_the_cpu_and_probes_an_idle_one():
    from liac.runtime.moe import PROBE_RATIO, ExpertShare

    fixed = ExpertShare(0.9)
    fixed.observe(5.0, 1)
    fixed.idle()
    assert fixed.ratio() == 0.9 and fixed.current == 0.9 and fixed.observed == 0  # a given number stays
    share = ExpertShare(1.0, pcie_seconds=0.01, adapt=True, weight=0.5, probe_every=3)
    share.observe(0.1, 2)  # 50 ms an expert: 5 copies' time
    assert share.current == pytest.approx(3.0) and share.observed == 1
    share.observe(0.0, 1)  # no time, no expert: nothing learnt
    share.observe(0.02, 0)
    assert share.current == pytest.approx(3.0) and share.observed == 1
    share.idle()
    share.idle()
    assert share.ratio() == pytest.approx(3.0)
    share.idle()
    assert share.ratio() == PROBE_RATIO == 1.0 and share.probes == 1  # idle 3 times in a row: an even share, once
    assert share.ratio() == pytest.approx(3.0)
    share.idle()
    share.idle()
    share.observe(0.01, 1)  # the CPU measured again: the count starts over
    share.idle()
    assert share.ratio() == pytest.approx(2.0)
    from liac.runtime.schedule import ExpertRun

    run = ExpertRun(8, 0, 4, ("gpu",))  # batch 1, both routed experts planned on the CPU
    assert run.assign([0, 1, 1, 0, 0, 0, 0, 0], 3.0) == ([], [1, 2])  # the slow CPU's share: both over PCIe
    assert run.assign([0, 1, 1, 0, 0, 0, 0, 0], PROBE_RATIO) == ([1], [2])  # the probe: one on the CPU, not both
    with pytest.raises(ValueError, match="positive pcie_seconds"):
        ExpertShare(1.0, adapt=True)
    with pytest.raises(ValueError, match="positive ratio"):
        ExpertShare(0.0)


def test_routing_reaches_the_host_in_one_wait(checkpoints, reference):
    """A split experts op reads its routing (the normalised input, the expert indices, their weights) on the host
    through one `transfer_many` (on CUDA one synchronisation, not one per tensor); no single transfer of them."""
    from liac.runtime.backend import EmulatedBackend

    class Recording(EmulatedBackend):
        def __init__(self):
            super().__init__()
            self.many, self.single, self._inside = [], [], False

        def transfer(self, tensor, dst, value=""):
            if not self._inside:
                self.single.append((value, dst))
            return super().transfer(tensor, dst, value)

        def transfer_many(self, tensors, dst, values):
            self.many.append((tuple(values), dst))
            self._inside = True
            try:
                return super().transfer_many(tensors, dst, values)
            finally:
                self._inside = False

    directory, cfg = checkpoints("mixtral")
    backend = Recording()
    engine = Engine.from_plan(_plan(cfg, "mixed"), directory, backend=backend, dtype=torch.float32)
    backend.many.clear()
    backend.single.clear()
    out = engine.generate(PROMPT, NEW_TOKENS)
    assert torch.equal(out.token_ids, reference("mixtral")[2])
    splits = sum(1 for op in engine.schedule.phases["decode"].ops if op.kind == "experts" and op.device == "split")
    assert splits and len(backend.many) >= splits * (NEW_TOKENS - 1)
    assert set(backend.many) == {(("h", "ei", "ew"), "cpu")}
    assert not [s for s in backend.single if s[0] in ("h", "ei", "ew") and s[1] == "cpu"]


@pytest.mark.gpu
def test_cuda_transfer_many_copies_to_pinned_host_memory():
    from liac.runtime.backend import CudaBackend

    backend = CudaBackend()
    tensors = [torch.randn(2, 3, device="cuda", dtype=torch.bfloat16), torch.arange(6, device="cuda").view(2, 3),
               torch.rand(2, 3, device="cuda")]
    before = backend.transfers.totals()["d2h_bytes"]
    out = backend.transfer_many(tensors, "cpu", ["h", "ei", "ew"])
    assert all(o.device.type == "cpu" and o.is_pinned() and torch.equal(o, t.cpu()) for o, t in zip(out, tensors))
    assert backend.transfers.totals()["d2h_bytes"] - before == sum(t.numel() * t.element_size() for t in tensors)


def test_expert_slot_views_are_made_once(checkpoints, reference, monkeypatch):
    """The staged views of the expert slots are made once per (buffer, slot, shapes), not at every experts op of
    every step: a second generate makes none, and its tokens stay HF's."""
    from liac.runtime.staging import Streamer

    made = []
    real = Streamer.expert_slot

    def counting(self, stream_unit, index, shapes):
        made.append((stream_unit.slot, index))
        return real(self, stream_unit, index, shapes)

    monkeypatch.setattr(Streamer, "expert_slot", counting)
    directory, cfg = checkpoints("mixtral")
    engine = Engine.from_plan(_plan(cfg, "streamed"), directory, backend=make_test_backend("emulated"),
                              dtype=torch.float32)
    engine.generate(PROMPT, NEW_TOKENS)
    first = len(made)
    assert first > 0 and len(set(made)) == first  # each made once
    out = engine.generate(PROMPT, NEW_TOKENS)
    assert len(made) == first
    assert torch.equal(out.token_ids, reference("mixtral")[2])


@pytest.mark.parametrize("family", MOE)
def test_expert_tally_counts_the_cpu_experts_of_the_call(checkpoints, reference, family):
    """`Generation.experts` (runtime/moe.py `ExpertTally`, per phase): the experts the CPU computed are the routed
    host experts the share left it (HF's routing replayed), their bytes one expert's weights each, the routed
    experts streamed those copied; `metrics['experts']` gives the CPU kernel's rate over those bytes and seconds."""
    from liac.runtime.metrics import build_metrics

    directory, cfg = checkpoints(family)
    engine = Engine.from_plan(make_plan(cfg, "gpu", weights_tier="ddr", experts=ExpertPlacement(1, 2, 3)), directory,
                              backend=make_test_backend("emulated"), dtype=torch.float32, expert_share=1.0)
    out = engine.generate(PROMPT, NEW_TOKENS)
    fp32, _, tokens, _ = reference(family)
    assert torch.equal(out.token_ids, tokens)
    hit = _routed(fp32, torch.cat([PROMPT, tokens], dim=1))
    E = cfg.num_experts
    one_expert = 3 * cfg.ffn_dim * cfg.hidden_size * 4  # gate, up, down rows of one expert, fp32
    for phase, passes, cpu in (("prefill", slice(0, 1), 2), ("decode", slice(1, None), 3)):
        routed = [h for layer in hit for h in layer[passes]]  # per experts op of the phase
        streamed = [_streamed_share(h, 1, cpu, E) for h in routed]
        on_cpu = [{e for e in h if e >= 1} - s for h, s in zip(routed, streamed)]
        assert out.experts[f"{phase}_cpu_experts"] == sum(len(c) for c in on_cpu) > 0
        assert out.experts[f"{phase}_cpu_bytes"] == sum(len(c) for c in on_cpu) * one_expert
        assert out.experts[f"{phase}_cpu_parts"] == sum(1 for c in on_cpu if c)
        assert out.experts[f"{phase}_streamed_experts"] == sum(len(s) for s in streamed)
        assert out.experts[f"{phase}_cpu_seconds"] > 0
    rates = build_metrics(engine, out, {})["experts"]
    decode = rates["decode"]
    assert decode["cpu_experts"] == out.experts["decode_cpu_experts"]
    assert decode["cpu_gb_per_s"] == pytest.approx(out.experts["decode_cpu_bytes"]
                                                   / out.experts["decode_cpu_seconds"] / 1e9, rel=1e-5)
    # a second call counts only its own experts (the tally is a difference around the call)
    assert engine.generate(PROMPT, NEW_TOKENS).experts["decode_cpu_experts"] == out.experts["decode_cpu_experts"]


def test_cpu_team_is_woken_once_per_experts_op_with_cpu_experts(checkpoints, reference, monkeypatch):
    """`cpu_wake` on: every experts op that computes experts on the CPU first wakes the CPU's thread team, once,
    before its routing read; ops without CPU experts do not; off (the default), nothing is woken; tokens are HF's
    either way."""
    import liac.runtime.executor as executor

    calls = []
    monkeypatch.setattr(executor._CpuTeamWake, "__call__", lambda self: calls.append(1))
    directory, cfg = checkpoints("mixtral")
    _, _, tokens, _ = reference("mixtral")
    for wake in (True, False, None):  # None: the default
        options = {} if wake is None else {"cpu_wake": wake}
        engine = Engine.from_plan(_plan(cfg, "mixed"), directory, backend=make_test_backend("emulated"),
                                  dtype=torch.float32, **options)
        calls.clear()
        out = engine.generate(PROMPT, NEW_TOKENS)
        assert torch.equal(out.token_ids, tokens)
        passes = {"prefill": 1, "decode": NEW_TOKENS - 1}
        expected = sum(passes[phase] for phase in passes for op in engine.schedule.phases[phase].ops
                       if op.kind == "experts" and op.experts.cpu)
        assert expected and len(calls) == (expected if wake else 0)
        assert any(op.kind == "experts" and not op.experts.cpu for op in engine.schedule.phases["decode"].ops)


def test_cpu_team_wake_engages_every_thread():
    """The wake is one parallel op with a chunk per intra-op thread (torch's grain), on a buffer made once."""
    import liac.runtime.executor as executor

    wake = executor._CpuTeamWake()
    threads = torch.get_num_threads()
    wake()
    if threads < 2:
        assert wake.buffer is None
        return
    assert wake.buffer.numel() == threads * executor._CpuTeamWake.GRAIN and bool((wake.buffer == 0).all())
    buffer = wake.buffer
    wake()
    assert wake.buffer is buffer


def test_rope_tables_are_made_once_per_pass_and_device(checkpoints, reference, monkeypatch):
    """Every layer of a decode pass rotates by the same positions: the executor makes the cos/sin tables at the
    pass's first qkv on each device and every later qkv (split ones' joins too) reuses them (a dozen host launches
    fewer per layer); a prefill makes its own in each layer (Eq. 14's activation peak); the tokens stay HF's."""
    import liac.runtime.executor as executor

    made = []
    real = executor.rope_tables
    monkeypatch.setattr(executor, "rope_tables", lambda *args: made.append(args[0].device.type) or real(*args))
    directory, cfg = checkpoints("mixtral")
    engine = Engine.from_plan(_plan(cfg, "crossed"), directory, backend=make_test_backend("emulated"),
                              dtype=torch.float32)
    made.clear()  # the engine's warm-up
    out = engine.generate(PROMPT, NEW_TOKENS)
    assert torch.equal(out.token_ids, reference("mixtral")[2])
    passes = NEW_TOKENS - 1  # a decode step per token after the prefill's
    # at most once per device a pass (the plan rotates on both), where a table per layer would make 3 a pass
    assert passes <= len(made) <= 2 * passes < cfg.num_layers * passes


def test_tally_times_the_host_work_beside_each_cpu_part(checkpoints, reference):
    """`ExpertTally`'s host seconds (runtime/moe.py): per experts op with a CPU part, the routing read, the GPU
    part's launches and the merge, and the host's seconds since the pass's previous experts op; `metrics['experts']`
    gives them in ms per CPU part."""
    from liac.runtime.metrics import build_metrics

    directory, cfg = checkpoints("mixtral")
    engine = Engine.from_plan(make_plan(cfg, "gpu", weights_tier="ddr", experts=ExpertPlacement(1, 2, 3)), directory,
                              backend=make_test_backend("emulated"), dtype=torch.float32, expert_share=1.0)
    out = engine.generate(PROMPT, NEW_TOKENS)
    assert torch.equal(out.token_ids, reference("mixtral")[2])
    parts, betweens = out.experts["decode_cpu_parts"], out.experts["decode_betweens"]
    # the first layer's experts op has no earlier one in its pass; the others do
    assert 0 < betweens <= parts and betweens >= parts - (NEW_TOKENS - 1)
    for part in ("route", "dispatch", "merge", "between"):
        assert out.experts[f"decode_{part}_seconds"] > 0
    host = build_metrics(engine, out, {})["experts"]["decode"]["host_ms_per_cpu_part"]
    assert host["route"] == pytest.approx(out.experts["decode_route_seconds"] / parts * 1e3, rel=1e-4)
    assert host["between"] == pytest.approx(out.experts["decode_between_seconds"] / betweens * 1e3, rel=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", MOE)
def test_expert_cut_by_features_matches_hf_fp32(checkpoints, reference, family, backend, monkeypatch):
    """`Engine.from_plan(expert_split=True)` (runtime/moe.py `ExpertSplit`): a decode step's last CPU expert computed
    by both devices, the CPU its first c intermediate features from the host tier, the GPU the rest through the
    expert slots (gate and up rows as blocks, down's columns as one 2-D copy); the two partial outputs add up to
    HF's expert: HF's tokens and logits, and the streamed bytes are the GPU's share of the cut experts."""
    from liac.runtime.moe import ExpertShare, ExpertSplit

    directory, cfg = checkpoints(family)
    engine = Engine.from_plan(make_plan(cfg, "gpu", weights_tier="ddr", experts=ExpertPlacement(1, 3, 2)), directory,
                              backend=make_test_backend(backend), dtype=torch.float32, expert_share=1.0,
                              expert_split=True)
    executor = engine.executor
    assert executor.expert_split is None  # a given ratio has no measured copy time: nothing to balance against
    cut = 40  # of 96 features: not a multiple of anything the kernels favour
    splitter = ExpertSplit(ExpertShare(1.0, pcie_seconds=1e-3), executor.expert_tally, cfg.ffn_dim, rows=8)
    monkeypatch.setattr(splitter, "features", lambda cpu, streamed, nbytes: cut)
    executor.expert_split = splitter
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    _, _, tokens, logits = reference(family)
    assert torch.equal(out.token_ids, tokens)
    torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=1e-4)
    cuts = out.experts["decode_cut_experts"]
    assert cuts == out.experts["decode_cpu_parts"] > 0  # every decode CPU part cut its last expert
    one_expert = 3 * cfg.ffn_dim * cfg.hidden_size * 4
    whole = out.experts["decode_cpu_experts"] - cuts
    assert out.experts["decode_cpu_bytes"] == whole * one_expert + cuts * round(cut / cfg.ffn_dim * one_expert)
    # bf16: the CPU's strided down columns and the GPU's 2-D copy in the model's dtype, within bf16's tolerance
    engine = Engine.from_plan(make_plan(cfg, "gpu", weights_tier="ddr", experts=ExpertPlacement(1, 3, 2)), directory,
                              backend=make_test_backend(backend), expert_share=1.0)
    engine.executor.expert_split = ExpertSplit(ExpertShare(1.0, pcie_seconds=1e-3), engine.executor.expert_tally,
                                               cfg.ffn_dim, rows=8)
    monkeypatch.setattr(engine.executor.expert_split, "features", lambda cpu, streamed, nbytes: cut)
    out = engine.generate(PROMPT, NEW_TOKENS, return_logits=True)
    assert out.experts["decode_cut_experts"] > 0
    fp32, bf16, _, _ = reference(family)
    _assert_moe_bf16_close(out, fp32, bf16)


def test_expert_split_balances_the_cpu_and_the_host_chain_against_the_copies():
    """`ExpertSplit.features`: c/F = ((g + 1)·P − (m − 1)·C − H) / (C + P), H the host's chain per decode CPU part
    from the tally, rounded to `rows`; no cut before H is measured, nor when the CPU is the faster side."""
    from liac.runtime.moe import ExpertShare, ExpertSplit, ExpertTally

    tally = ExpertTally()
    splitter = ExpertSplit(ExpertShare(1.1, pcie_seconds=7e-3), tally, 14336)
    assert splitter.features(1, 1) is None  # nothing measured yet
    # the H200's batch-1 split layer: CPU 7.7 ms an expert, copy 7 ms; dispatch 0.3, merge 0.2, between 2.0 ms
    tally.add("decode", 1, 1000, 7.7e-3, 1, {"route": 2e-4, "dispatch": 3e-4, "merge": 2e-4, "between": None})
    assert splitter.features(1, 1, 1000) is None  # no CPU part has followed another yet
    tally.add("decode", 1, 1000, 7.7e-3, 1, {"route": 2e-4, "dispatch": 3e-4, "merge": 2e-4, "between": 2e-3})
    assert splitter.host_seconds() == pytest.approx(2.5e-3)
    assert splitter.cpu_seconds(1000) == pytest.approx(7.7e-3)  # measured in place (the load-time ratio said 7.7)
    c = splitter.features(1, 1, 1000)
    assert c == round((2 * 7e-3 - 2.5e-3) / (7.7e-3 + 7e-3) * 14336 / 256) * 256 == 11264
    host, gpu = c / 14336 * 7.7e-3 + 2.5e-3, (2 - c / 14336) * 7e-3
    assert abs(host - gpu) < 0.2e-3  # both sides within a cut's granularity of each other
    # the CPU parts' own rate, not the load-time ratio: experts twice the bytes take the CPU twice as long (15.4 ms),
    # so the CPU keeps fewer features
    assert splitter.features(1, 1, 2000) == round((2 * 7e-3 - 2.5e-3) / (15.4e-3 + 7e-3) * 14336 / 256) * 256 < c
    # two CPU experts and none streamed: the GPU takes all but the least cut of the second one
    assert splitter.features(2, 0, 1000) == 256
    fast = ExpertSplit(ExpertShare(0.3, pcie_seconds=7e-3), ExpertTally(), 14336)
    fast.tally.add("decode", 1, 1000, 2.1e-3, 1, {"route": 2e-4, "dispatch": 3e-4, "merge": 2e-4, "between": 2e-3})
    fast.tally.add("decode", 1, 1000, 2.1e-3, 1, {"route": 2e-4, "dispatch": 3e-4, "merge": 2e-4, "between": 2e-3})
    assert fast.features(1, 1, 1000) is None  # a CPU three times as fast as PCIe keeps its expert whole
