"""Shared HostWeights: one host copy of a model serves many engines; each engine copies only its own tiers and
gives its memory back on close."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from runtime_plans import BACKENDS, hf_model_class, make_plan, make_test_backend

from liac.errors import LiacError
from liac.models.config import ModelConfig
from liac.runtime import Engine, HostWeights, RandomWeights
from liac.runtime.backend import EmulatedBackend
from liac.runtime.memory import aligned

TINY = ModelConfig(name="tiny-llama", family="llama", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=8, ffn_dim=48, vocab_size=50, max_position=64, norm="rmsnorm", norm_eps=1e-5,
                   activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False, rope_theta=10000.0)
PROMPT = torch.arange(5, 13).view(1, 8).repeat(2, 1)
MIXED = {"resident_layers": 1, "cxl_layers": 1}


def _inside(tensor: torch.Tensor, host: HostWeights) -> bool:
    base = host._storage.data_ptr()
    return base <= tensor.data_ptr() < base + host.nbytes


@pytest.mark.parametrize("policy", ["gpu", "cpu", "partial", "mixed"])
def test_engines_over_shared_weights_run_the_seeded_model(policy):
    # The same seed through RandomWeights (generated per plan) and HostWeights (generated once) is the same model.
    plan = make_plan(TINY, policy, **(MIXED if policy == "mixed" else {}))
    host = HostWeights.random(TINY, 3, backend=EmulatedBackend())
    want = Engine.from_plan(plan, RandomWeights(3), backend=EmulatedBackend()).generate(PROMPT, 6).token_ids
    with Engine.from_plan(plan, host) as engine:
        assert torch.equal(engine.generate(PROMPT, 6).token_ids, want)


def test_host_tiers_are_views_of_the_shared_arena_and_only_hbm_is_copied():
    host = HostWeights.random(TINY, 0, backend=EmulatedBackend())
    plan = make_plan(TINY, "mixed", **MIXED)  # layer 0 in 'hbm', layer 1 in 'ddr', layer 2 in 'cxl' (→ DDR here)
    engine = Engine.from_plan(plan, host)
    store = engine.store
    assert _inside(store("layers.1.qkv.proj.weight", "ddr"), host)
    assert _inside(store("layers.2.qkv.proj.weight", "cxl"), host)  # no CXL node: served from the shared DDR copy
    assert not _inside(store("layers.0.qkv.proj.weight", "hbm"), host)
    assert torch.equal(store("layers.0.qkv.proj.weight", "hbm"), host.tensor("layers.0.qkv.proj.weight"))
    # the engine's own DDR arena holds the KV caches only: 2 layers (DDR, and CXL falling back into DDR) × K, V
    batch, heads, tokens, dim = engine.schedule.kv_shape
    kv_bytes = aligned(batch * heads * tokens * dim * 2)  # bf16, each tensor on a 256-byte boundary
    assert engine.memory.reserved_bytes()["ddr"] == 2 * 2 * kv_bytes
    report = engine.memory_report()
    weights = {tier: sum(aligned(store(c, tier).numel() * 2) for c, tiers in engine.schedule.weight_tiers.items()
                         if tier in tiers) for tier in ("ddr", "cxl")}
    assert report["ddr"]["shared_bytes"] == weights["ddr"] + weights["cxl"]  # 'cxl' counted where it really is
    assert report["ddr"]["reserved_bytes"] == 2 * 2 * kv_bytes + report["ddr"]["shared_bytes"]
    assert report["ddr"]["pinned"] is False and report["hbm"]["pinned"] is None  # emulation: nothing page-locked


def test_close_frees_the_engine_and_keeps_the_shared_weights():
    host = HostWeights.random(TINY, 0, backend=EmulatedBackend())
    engine = Engine.from_plan(make_plan(TINY, "mixed", **MIXED), host)
    arenas = [weakref.ref(a.storage) for a in engine.memory.arenas.values()]
    engine.generate(PROMPT, 3)
    engine.close()
    gc.collect()
    assert all(ref() is None for ref in arenas)  # every arena of the engine is gone
    with pytest.raises(LiacError, match="is closed"):
        engine.generate(PROMPT, 2)
    again = Engine.from_plan(make_plan(TINY, "gpu"), host)  # the shared weights still serve the next plan
    assert again.generate(PROMPT, 2).token_ids.shape == (2, 2)


def test_plan_for_another_model_or_dtype_is_refused():
    host = HostWeights.random(TINY, 0, backend=EmulatedBackend())
    other = make_plan(TINY.with_layers(2), "gpu")
    with pytest.raises(LiacError) as error:
        Engine.from_plan(other, host)
    assert error.value.path == "spec.model.config_sha256" and "shared weights' model" in error.value.message
    with pytest.raises(LiacError, match="must be the shared weights'"):
        Engine.from_plan(make_plan(TINY, "gpu"), host, dtype=torch.float32)


def test_shared_checkpoint_weights_match_hf(checkpoints):
    directory, cfg = checkpoints("qwen2")  # tied head: one host copy serves the embedding and the head
    host = HostWeights.from_checkpoint(directory, dtype=torch.float32, backend=EmulatedBackend())
    hf = hf_model_class("qwen2").from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf.generate(PROMPT, max_new_tokens=6, do_sample=False, min_new_tokens=6)[:, PROMPT.shape[1]:]
    for policy in ("partial", "mixed"):
        with Engine.from_plan(make_plan(cfg, policy, **(MIXED if policy == "mixed" else {})), host) as engine:
            assert torch.equal(engine.generate(PROMPT, 6).token_ids, want)


@pytest.mark.gpu
def test_cuda_engines_give_gpu_memory_back_and_shared_weights_are_pinned():
    backend = make_test_backend("cuda")
    host = HostWeights.random(TINY, 0, backend=backend)
    assert host.pinned and host.tensor("layers.0.qkv.proj.weight").is_pinned()
    with Engine.from_plan(make_plan(TINY, "gpu"), host) as engine:
        engine.generate(PROMPT, 2)  # the first GEMMs allocate torch's cuBLAS workspaces (32 MiB on an H200)
    before = torch.cuda.memory_allocated()
    for policy in ("gpu", "mixed", "partial"):
        with Engine.from_plan(make_plan(TINY, policy, **(MIXED if policy == "mixed" else {})), host) as engine:
            assert engine.memory_report()["ddr"]["pinned"] in (True, None)
            engine.generate(PROMPT, 4)
            assert torch.cuda.memory_allocated() > before
        assert torch.cuda.memory_allocated() - before < 2**20  # back to where it was (±1 MiB of stray tensors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_host_weights_are_normal_and_norms_near_one(backend):
    host = HostWeights.random(TINY, 1, backend=make_test_backend(backend))
    weight = host.tensor("layers.0.gate_up.proj.weight").float()
    norm = host.tensor("layers.0.qkv.norm.weight").float()
    assert abs(weight.std().item() - 0.02) < 0.003 and abs(weight.mean().item()) < 0.003
    assert abs(norm.mean().item() - 1.0) < 0.01 and norm.std().item() > 0.005  # ones plus noise, never plain ones
