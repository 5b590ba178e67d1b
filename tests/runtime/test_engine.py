"""Engine.from_plan refuses, in one line and before allocating, what it cannot run here; generate checks requests."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from runtime_plans import PinningBackend, make_plan

import liac.runtime.backend as backend_module
from liac.errors import LiacError
from liac.models.config import ModelConfig
from liac.plan import API_VERSION, TierBytes, dump_plan
from liac.runtime import Engine, RandomWeights
from liac.runtime.backend import CpuOnlyBackend, EmulatedBackend, make_backend

TINY = ModelConfig(name="tiny-qwen", family="qwen2", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8, ffn_dim=48, vocab_size=40, max_position=64, norm="rmsnorm", norm_eps=1e-6,
                   activation="silu", qkv_bias=True, proj_bias=False, tie_embeddings=True, rope_theta=10000.0)


def _refused(plan, weights=RandomWeights(0), **kwargs) -> LiacError:
    kwargs.setdefault("backend", EmulatedBackend())
    with pytest.raises(LiacError) as error:
        Engine.from_plan(plan, weights, **kwargs)
    assert "\n" not in error.value.line()
    return error.value


def test_gpu_plan_without_gpu_names_the_first_gpu_sublayer():
    plan = make_plan(TINY, "partial")  # embed on the GPU
    error = _refused(plan, backend=CpuOnlyBackend())
    assert error.path == "spec.layer_groups[0].sublayers[0].prefill"
    assert error.message.startswith("must be 'cpu' on this host: no CUDA device is available")


def test_all_cpu_plan_runs_without_gpu():
    engine = Engine.from_plan(make_plan(TINY, "cpu"), RandomWeights(0), backend=CpuOnlyBackend())
    assert engine.generate(torch.arange(4)[None], 3).token_ids.shape == (1, 3)


def test_emulation_is_never_chosen_silently(monkeypatch):
    monkeypatch.delenv(backend_module.EMULATE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert isinstance(make_backend(), CpuOnlyBackend)
    monkeypatch.setenv(backend_module.EMULATE_ENV, "1")
    assert isinstance(make_backend(), EmulatedBackend)
    monkeypatch.setenv(backend_module.EMULATE_ENV, "0")
    assert isinstance(make_backend(), CpuOnlyBackend)


def test_plan_that_does_not_fit_host_memory():
    plan = make_plan(TINY, "cpu", memory=TierBytes(0, 2**50, 0))  # a PiB of DDR
    error = _refused(plan)
    assert error.path == "spec.memory.ddr_bytes"
    assert "GiB of host memory" in error.message and "short by" in error.message


def test_invalid_plan_object_and_file(tmp_path):
    plan = make_plan(TINY, "cpu")
    broken = dataclasses.replace(plan, spec=dataclasses.replace(
        plan.spec, model=dataclasses.replace(plan.spec.model, config_sha256="0" * 64)))
    assert _refused(broken).path == "spec.model.config_sha256"
    assert "cannot read" in _refused(tmp_path / "absent.yaml").message
    path = tmp_path / "plan.yaml"
    dump_plan(plan, path)
    path.write_text(path.read_text().replace(f"apiVersion: {API_VERSION}", "apiVersion: liac/v9"))
    error = _refused(path)
    assert error.path == "apiVersion" and "unsupported value 'liac/v9'" in error.message


def test_requests_beyond_the_workload_are_refused():
    engine = Engine.from_plan(make_plan(TINY, "gpu", batch=2, prompt_len=6, gen_len=4), RandomWeights(0),
                              backend=EmulatedBackend())
    cases = ((torch.zeros(2, 7, dtype=torch.long), 2, "prompt length must be between 1 and 6"),
             (torch.zeros(3, 2, dtype=torch.long), 2, "batch must be between 1 and 2"),
             (torch.zeros(1, 6, dtype=torch.long), 5, "new tokens must be between 1 and 4"),
             (torch.zeros(1, 2, dtype=torch.long), 9, "new tokens must be between 1 and 8"),  # context 6 + 4
             (torch.full((1, 2), 40), 2, "token ids must be in 0..39"))
    for ids, new_tokens, fragment in cases:
        with pytest.raises(LiacError) as error:
            engine.generate(ids, new_tokens)
        assert fragment in error.value.message
    # smaller than the workload is fine, and a shorter prompt may use the rest of the context for new tokens
    assert engine.generate(torch.zeros(1, 3, dtype=torch.long), 2).token_ids.shape == (1, 2)
    prompt = torch.tensor([[3, 1]])
    longer = Engine.from_plan(make_plan(TINY, "gpu", batch=2, prompt_len=6, gen_len=8), RandomWeights(0),
                              backend=EmulatedBackend())
    assert torch.equal(engine.generate(prompt, 8).token_ids, longer.generate(prompt, 8).token_ids)


def test_metrics_memory_report_matches_arenas():
    engine = Engine.from_plan(make_plan(TINY, "mixed"), RandomWeights(0), backend=EmulatedBackend())
    report = engine.memory_report()
    reserved = engine.memory.reserved_bytes()
    assert {tier: row["reserved_bytes"] for tier, row in report.items()} == reserved
    assert report["hbm"]["planned_bytes"] == engine.plan.spec.memory.hbm_bytes
    # every byte the schedule asked for was allocated, nothing more (the cxl tier falls back into DDR here)
    assert sum(reserved.values()) == sum(engine.schedule.tier_bytes.values())


@pytest.mark.gpu
def test_plan_that_does_not_fit_the_gpu_is_refused_before_allocating():
    plan = make_plan(TINY, "gpu", memory=TierBytes(2**45, 2**20, 0))  # 32 TiB of HBM
    before = torch.cuda.memory_allocated()
    error = _refused(plan, backend=make_backend(False))
    assert error.path == "spec.memory.hbm_bytes" and "GiB of GPU memory" in error.message
    assert torch.cuda.memory_allocated() == before


def test_host_arenas_are_page_locked_once_and_released():
    import gc

    backend = PinningBackend(refuse=False)
    engine = Engine.from_plan(make_plan(TINY, "mixed"), RandomWeights(0), backend=backend)
    reserved = engine.memory.reserved_bytes()
    assert backend.pinned == [reserved["ddr"]]  # one registration for the whole DDR arena (weights + KV)
    assert not [n for n in engine.notes if "page-locked" in n]
    del engine
    gc.collect()
    assert backend.unpinned == backend.pinned


def test_host_arena_that_cannot_be_page_locked_is_said_once():
    engine = Engine.from_plan(make_plan(TINY, "mixed"), RandomWeights(0), backend=PinningBackend(refuse=True))
    assert len([n for n in engine.notes if "could not be page-locked" in n]) == 1
    assert engine.generate(torch.arange(4)[None], 2).token_ids.shape == (1, 2)
