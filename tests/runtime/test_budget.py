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


@pytest.fixture(scope="module")
def this_gpu():
    """This GPU's profile: h200-measured's rates with the footprint measured here (runtime/footprint.py) after one
    run of each probe model, so the libraries' kernels are loaded, as `liac profile` measures it."""
    from liac.host import FOOTPRINT_MODELS, footprint_probes, with_footprint
    from liac.runtime.footprint import measure_footprint

    base = resolve_profile("h200-measured")
    probes = footprint_probes(base)
    measured = measure_footprint([(p.plan, p.batch, p.prompt_len) for p in probes])
    return with_footprint(base, probes, measured.library_bytes, measured.context_bytes, measured.activation_bytes), \
        FOOTPRINT_MODELS


@pytest.mark.gpu
@pytest.mark.parametrize("model", [0, 1], ids=["opt", "llama"])
@pytest.mark.parametrize("share", [0.3, 0.7])
@pytest.mark.parametrize("batch,prompt", [(4, 256), (32, 32), (1, 512)])
def test_peak_footprint_stays_within_tight_budgets_on_the_gpu(this_gpu, model, share, batch, prompt):
    """Eight-layer models of 1024 features (~200 MB of weights) under a budget that holds the GPU's footprint and
    `share` of the weights and KV cache: compiled for this GPU, run with the warm-up, the allocator's reserved peak
    plus the CUDA context must stay within the budget."""
    from liac.api import compile_plans
    from liac.runtime.backend import CudaBackend

    hw, models = this_gpu
    cfg = models[model].with_layers(8)
    roomy = compile_plans(cfg, hw, batches=(batch,), prompt_len=prompt, gen_len=8, gpu_mem=64 * GIB).points[0].plan
    resident = roomy.spec.memory.hbm_bytes - roomy.spec.execution.workspace_bytes - hw.gpu_context_bytes
    budget = int(hw.gpu_context_bytes + roomy.spec.execution.workspace_bytes + share * resident)
    plan = compile_plans(cfg, hw, batches=(batch,), prompt_len=prompt, gen_len=8, gpu_mem=budget).points[0].plan
    assert plan.spec.memory.hbm_bytes <= budget
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
    backend = CudaBackend()
    with Engine.from_plan(plan, RandomWeights(0), backend=backend) as engine:
        assert engine.budget.enforced
        engine.generate(ids, 8)
        used = backend.gpu_context_bytes() + torch.cuda.max_memory_reserved()
    assert used <= budget, (used / MIB, budget / MIB)
