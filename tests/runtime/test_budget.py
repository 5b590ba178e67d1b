"""A plan's GPU budget is the process's whole GPU footprint (docs/cost-model.md Eq. 14, runtime/engine.py
`GpuBudget`): the accounting, the refusal at start, the reservation and the allocator cap (CPU, with a backend
that reports a CUDA context), that the cost model's activation model bounds what the runtime really holds
(counted op by op on the CPU: tests/runtime/live_bytes.py), and on a GPU (`pytest -m gpu`) a sweep of small models
under tight budgets whose peak (allocator reserved + context) must stay within the budget."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from live_bytes import LiveBytes
from runtime_plans import make_plan

from liac.errors import LiacError
from liac.models.config import ModelConfig
from liac.passes.costs import Workload, class_activation_peak
from liac.passes.trace import trace_model
from liac.profile import resolve_profile
from liac.runtime import Engine, RandomWeights
from liac.runtime.backend import EmulatedBackend
from liac.runtime.engine import gpu_budget
from liac.sizes import GIB, MIB

OPT = ModelConfig(name="budget-opt", family="opt", hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=4,
                  head_dim=32, ffn_dim=512, vocab_size=500, max_position=512, norm="layernorm", norm_eps=1e-5,
                  activation="relu", qkv_bias=True, proj_bias=True, tie_embeddings=True)
LLAMA = ModelConfig(name="budget-llama", family="llama", hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
                    head_dim=32, ffn_dim=352, vocab_size=500, max_position=512, norm="rmsnorm", norm_eps=1e-5,
                    activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False, rope_theta=10000.0)


class ContextBackend(EmulatedBackend):
    """The emulation, with a CUDA context of `context` bytes and the reservation and cap calls recorded."""

    def __init__(self, context: int):
        super().__init__()
        self.context, self.calls = context, []

    def gpu_context_bytes(self):
        return self.context

    def reserve(self, nbytes):
        self.calls.append(("reserve", nbytes))

    def cap(self, nbytes):
        self.calls.append(("cap", nbytes))


def compiled(cfg, budget, batch=2, prompt=16, context_mib=64.0):
    from liac.api import compile_plans

    hw = dataclasses.replace(resolve_profile("h200-measured"), gpu_context_mib=context_mib,
                             gpu_library_workspace_mib=8.0, gpu_activation_factor=1.25)
    return compile_plans(cfg, hw, batches=(batch,), prompt_len=prompt, gen_len=4, gpu_mem=budget,
                         policy="lia-gpu").points[0].plan


def test_the_plan_splits_its_gpu_bytes_into_arena_workspace_and_context():
    plan = compiled(OPT, 200 * MIB)
    execution, memory = plan.spec.execution, plan.spec.memory
    engine = Engine.from_plan(plan, RandomWeights(0), backend=ContextBackend(10 * MIB), warm_up=False)
    arena = engine.memory.reserved_bytes()["hbm"]
    # what the ILP reserved: arena (weights, KV, staging) + workspace + the profile's 64 MiB context, within budget
    assert memory.hbm_bytes == arena + execution.workspace_bytes + 64 * MIB <= plan.spec.budgets.gpu_bytes
    budget = engine.budget
    assert budget.enforced and budget.context_bytes == 64 * MIB  # the plan's, larger than the 10 MiB seen here
    assert engine.backend.calls == [("reserve", execution.workspace_bytes), ("cap", 200 * MIB - 64 * MIB)]
    engine.close()
    assert engine.backend.calls[-1] == ("cap", None)  # the cap goes with the engine


def test_a_plan_that_cannot_fit_beside_this_gpus_context_is_refused_at_start():
    plan = compiled(OPT, 200 * MIB)
    spare = plan.spec.budgets.gpu_bytes - plan.spec.memory.hbm_bytes
    context = 64 * MIB + spare + 3 * MIB  # 3 MiB more than the budget leaves
    with pytest.raises(LiacError) as error:
        Engine.from_plan(plan, RandomWeights(0), backend=ContextBackend(context))
    line = error.value.line()
    assert "\n" not in line and "spec.budgets.gpu_bytes" in line and "short by 0.00 GiB" in line
    assert "CUDA context 0." in line and "liac profile" in line


def test_budget_accounting_by_hand():
    plan = make_plan(OPT, "gpu")
    spec = plan.spec
    with_ws = dataclasses.replace(plan, spec=dataclasses.replace(
        spec, execution=dataclasses.replace(spec.execution, workspace_bytes=5 * MIB),
        memory=dataclasses.replace(spec.memory, hbm_bytes=100 * MIB),
        budgets=dataclasses.replace(spec.budgets, gpu_bytes=120 * MIB)))
    budget = gpu_budget(with_ws, "p", arena_bytes=80 * MIB, context_bytes=7 * MIB, uses_gpu=True)
    # the plan's context: 100 - 80 - 5 = 15 MiB (more than the 7 seen); cap = 120 - 15
    assert (budget.enforced, budget.workspace_bytes, budget.context_bytes, budget.cap_bytes) == \
        (True, 5 * MIB, 15 * MIB, 105 * MIB)
    assert gpu_budget(with_ws, "p", 80 * MIB, 35 * MIB, True).cap_bytes == 85 * MIB  # 80 + 5 + 35 = 120: fits
    with pytest.raises(LiacError, match="short by"):
        gpu_budget(with_ws, "p", 80 * MIB, 36 * MIB, True)
    arena = spec.memory.hbm_bytes - MIB
    legacy = gpu_budget(plan, "p", arena, 7 * MIB, True)  # no workspace recorded: reported, not enforced
    assert not legacy.enforced and legacy.workspace_bytes == MIB
    assert not gpu_budget(with_ws, "p", 80 * MIB, None, True).enforced  # no real GPU


@pytest.mark.parametrize("cfg", [OPT, LLAMA], ids=["opt", "llama"])
@pytest.mark.parametrize("batch,prompt", [(2, 64), (8, 16)])
def test_the_activation_model_bounds_what_the_runtime_holds(cfg, batch, prompt):
    """Every unit on the (emulated) GPU: the most bytes the run's ops hold at once (the allocator's view, without
    its rounding) never exceeds Eq. 14's live-set model, and comes within 10 % of it (the FFN binds: the model is
    exact there)."""
    engine = Engine.from_plan(make_plan(cfg, "gpu", batch=batch, prompt_len=prompt, gen_len=4), RandomWeights(0),
                              backend=EmulatedBackend(), dtype=torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), LiveBytes() as live:
        engine.generate(ids, 3)
    modelled = class_activation_peak(trace_model(cfg), "decoder", Workload(batch, prompt, 4))
    logits = batch * cfg.vocab_size * (2 + 4)  # the LM head's last-position logits (and the greedy pick's fp32)
    assert 0.9 * modelled <= live.peak_bytes <= modelled + logits


# Mixtral's proportions (F = 3.5·D, top-2 of 8): the experts' intermediates bind the layer's activation peak.
MIXTRAL = ModelConfig(name="budget-mixtral", family="mixtral", hidden_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, ffn_dim=224, vocab_size=112, max_position=128, norm="rmsnorm",
                      norm_eps=1e-5, activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False,
                      rope_theta=10000.0, num_experts=8, experts_top_k=2)


@pytest.mark.parametrize("resident", [8, 0], ids=["resident", "streamed"])
@pytest.mark.parametrize("batch,prompt", [(8, 16), (16, 32)])
def test_the_activation_model_bounds_what_the_moe_runtime_holds(batch, prompt, resident):
    """The same bound for Mixtral's experts on the (emulated) GPU, resident in HBM or streamed through the expert
    slots: the routing grouped by expert, the partial sum, an expert's intermediates in blocks of ⌈n·k/E⌉ rows
    (passes/costs.py `experts_transient_bytes`) are what the runtime holds beyond the traced edges."""
    from liac.plan import ExpertPlacement

    tier = {} if resident else {"weights_tier": "ddr"}
    plan = make_plan(MIXTRAL, "gpu", batch=batch, prompt_len=prompt, gen_len=4,
                     experts=ExpertPlacement(resident, 0, 0), **tier)
    engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend(), dtype=torch.bfloat16)
    ids = torch.randint(0, MIXTRAL.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), LiveBytes() as live:
        engine.generate(ids, 3)
    modelled = class_activation_peak(trace_model(MIXTRAL), "decoder", Workload(batch, prompt, 4))
    logits = batch * MIXTRAL.vocab_size * (2 + 4)
    assert 0.9 * modelled <= live.peak_bytes <= modelled + logits


def test_a_skewed_routing_keeps_an_experts_intermediates_within_the_priced_block():
    """Every token routed to the same two experts (what random weights or a real prompt can do): the GPU computes
    each in blocks of ⌈n·k/E⌉ rows, so what `experts_partial` holds stays what Eq. 14 prices for uniform routing,
    and the sum equals the unblocked one."""
    from liac.models.mixtral import expert_block_rows, experts_partial, group_by_expert
    from liac.passes.costs import experts_transient_bytes

    n, d, f, experts = 256, 64, 224, 8
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=gen).bfloat16()
    gate_up = torch.randn(experts, 2 * f, d, generator=gen).bfloat16() / 8
    down = torch.randn(experts, d, f, generator=gen).bfloat16() / 8
    index = torch.tensor([[3, 5]] * n).view(1, n, 2)
    weights = torch.full((1, n, 2), 0.5)
    counts = torch.bincount(index.reshape(-1), minlength=experts).tolist()
    listed = [(e, gate_up[e], down[e]) for e in range(experts)]
    whole = experts_partial(h, group_by_expert(index, weights, counts), listed)
    routing = group_by_expert(index, weights, counts)
    block = expert_block_rows(n, 2, experts)
    assert block == 64
    with torch.inference_mode(), LiveBytes() as live:
        blocked = experts_partial(h, routing, listed, block_rows=block)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=0.02)
    node = trace_model(MIXTRAL).nodes["decoder.experts"]["sublayer"]
    node = dataclasses.replace(node, weights=tuple(dataclasses.replace(w, shape=(experts, *w.shape[1:]))
                                                   for w in node.weights))
    routing_bytes = 12 * n * 2  # made before the block: not seen here
    assert live.peak_bytes <= experts_transient_bytes(node, (1, n, n)) - routing_bytes
    with torch.inference_mode(), LiveBytes() as unblocked:
        experts_partial(h, routing, listed)
    assert unblocked.peak_bytes >= live.peak_bytes + 3 * 64 * 2 * (d + 4 * f)  # 256 rows at once: 4 blocks


CASES = [(model, share, batch, prompt) for batch, prompt in [(4, 256), (32, 32), (1, 512)] for share in (0.3, 0.7)
         for model in (0, 1)]


@pytest.fixture(scope="module")
def tight_budget_runs():
    """tests/runtime/budget_cases.py run once in a fresh process over every case: the footprint measured there as
    `liac profile` measures it, then each case compiled for it and run with the warm-up (JSON line per case)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    args = [",".join(map(str, case)) for case in CASES]
    done = subprocess.run([sys.executable, str(here / "budget_cases.py"), *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return {row["case"]: row for row in map(json.loads, done.stdout.splitlines())}


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_peak_footprint_stays_within_tight_budgets_on_the_gpu(tight_budget_runs, case):
    """Eight-layer models of 1024 features (~200 MB of weights) under a budget that holds the GPU's footprint and
    `share` of the weights and KV cache, each compiled for this GPU and run with the warm-up in a process of its
    own: the plan fits the budget, the runtime enforces it, and the allocator's reserved peak plus the CUDA context
    stays within it."""
    row = tight_budget_runs[",".join(map(str, case))]
    assert row["enforced"] and row["planned"] <= row["budget"]
    assert row["used"] <= row["budget"], (row["used"] / MIB, row["budget"] / MIB)


def test_a_failed_warm_up_gives_back_its_cap_and_memory(monkeypatch):
    """The warm-up's out-of-memory error is one line, and the failed engine lifts its allocator cap and hands its
    memory back before the error reaches the caller: the next plan of the process (a benchmark's next point) starts
    on a clean GPU, not under the failed plan's cap."""
    from liac.runtime.executor import Executor

    def out_of_memory(self, batch, prompt_len):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    monkeypatch.setattr(Executor, "warm_up", out_of_memory)
    backend = ContextBackend(10 * MIB)
    with pytest.raises(LiacError) as error:
        Engine.from_plan(compiled(OPT, 200 * MIB), RandomWeights(0), backend=backend)
    assert "while warming up" in error.value.line() and "\n" not in error.value.line()
    assert error.value.__cause__.__traceback__ is None  # its frames (and the tensors they hold) are not kept
    assert backend.calls[-2:] == [("cap", 200 * MIB - 64 * MIB), ("cap", None)]


def test_a_failed_placement_lifts_no_cap_it_did_not_set_and_keeps_no_frames(monkeypatch):
    from liac.runtime import engine as engine_module

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(engine_module.KVCache, "__init__", out_of_memory)
    backend = ContextBackend(10 * MIB)
    with pytest.raises(LiacError, match="while placing the model") as error:
        Engine.from_plan(compiled(OPT, 200 * MIB), RandomWeights(0), backend=backend)
    assert error.value.__cause__.__traceback__ is None
    assert backend.calls == [("cap", None)]  # never capped; the give-back lifts any cap all the same


@pytest.mark.gpu
def test_liac_profile_measures_the_activations_beside_a_fragmented_allocator():
    """`liac profile` runs its GPU benchmarks before the footprint probes. Measured in that same process, the partly
    used segments they left hid the probes' activations (0.00x the model on the H200, 2026-12-02, where a fresh
    process read 2.33x) and a plan compiled for it ran out of memory. The child process sees every probe's peak."""
    import torch

    from liac.commands.profile import measure_footprint_in_child
    from liac.host import footprint_probes, op_probes
    from liac.profile import resolve_profile

    base = resolve_profile("h200-measured")
    keep = []
    for _ in range(8):  # a benchmark's leftovers: big blocks freed, each segment kept by a small live tensor
        big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        del big
        keep.append(torch.empty(2 << 20, dtype=torch.uint8, device="cuda"))  # large pool: splits the freed block
    measured = measure_footprint_in_child(base)
    probes = footprint_probes(base) + op_probes(base)
    sized = [m for p, m in zip(probes, measured["activation_bytes"]) if p.sets_factor]
    assert sized and min(sized) > 0, sized
    del keep
