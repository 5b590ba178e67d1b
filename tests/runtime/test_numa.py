"""The CXL tier: node discovery on fake sysfs trees, the placement decision, the real libnuma path, the fallback."""

from __future__ import annotations

import gc

import pytest
import torch
from runtime_plans import make_plan

import liac.runtime.engine as engine_module
from liac.models.config import ModelConfig
from liac.runtime import Engine, RandomWeights
from liac.runtime.backend import EmulatedBackend
from liac.runtime.numa import (NUMA_STATS, NumaNode, find_cxl_node, libnuma, numa_empty, plan_cxl_placement,
                               read_nodes)

TINY = ModelConfig(name="tiny-llama", family="llama", hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2,
                   head_dim=8, ffn_dim=48, vocab_size=50, max_position=64, norm="rmsnorm", norm_eps=1e-5,
                   activation="silu", qkv_bias=False, proj_bias=False, tie_embeddings=False, rope_theta=10000.0)


def _node(root, index, cpus, mem_kib):
    path = root / f"node{index}"
    path.mkdir(parents=True)
    (path / "cpulist").write_text(cpus + "\n")
    (path / "meminfo").write_text(f"Node {index} MemTotal:       {mem_kib} kB\nNode {index} MemFree: 1 kB\n")


def test_read_nodes_and_first_cpu_less_node(tmp_path):
    _node(tmp_path, 0, "0-3,8", 1024)
    _node(tmp_path, 10, "", 4096)  # sorted numerically, not as text
    _node(tmp_path, 2, "", 2048)
    _node(tmp_path, 3, "", 0)  # CPU-less but without memory: not a memory expander
    (tmp_path / "possible").write_text("0-3\n")
    nodes = read_nodes(tmp_path)
    assert nodes == [NumaNode(0, (0, 1, 2, 3, 8), 1024 * 1024), NumaNode(2, (), 2048 * 1024),
                     NumaNode(3, (), 0), NumaNode(10, (), 4096 * 1024)]
    assert find_cxl_node(nodes).index == 2
    assert find_cxl_node(nodes[:1]) is None
    assert read_nodes(tmp_path / "absent") == []


def test_placement_decision():
    cpu, cxl = NumaNode(0, (0, 1), 2**30), NumaNode(1, (), 2**30)
    assert plan_cxl_placement([cpu, cxl], 0, True).note == ""  # nothing in the tier: nothing to say
    assert plan_cxl_placement([cpu, cxl], 2**20, True).node == 1
    fallback = plan_cxl_placement([cpu], 2**20, True)
    assert fallback.node is None and "placed in DDR" in fallback.note
    assert plan_cxl_placement([cpu, cxl], 2**20, False).node is None  # no libnuma
    assert plan_cxl_placement([cpu, cxl], 2**31, True).node is None  # too small


@pytest.mark.skipif(libnuma() is None, reason="libnuma (libnuma1) is not installed")
def test_numa_empty_allocates_usable_memory_and_frees_it():
    freed = NUMA_STATS["freed_bytes"]
    tensor = numa_empty(1 << 16, 0)  # node 0 exists everywhere libnuma works
    values = tensor[256:256 + 64].view(torch.bfloat16)
    values.copy_(torch.arange(32, dtype=torch.bfloat16))
    assert torch.equal(tensor[256:256 + 64].view(torch.bfloat16), torch.arange(32, dtype=torch.bfloat16))
    del tensor
    gc.collect()
    assert NUMA_STATS["freed_bytes"] == freed  # a view still uses the memory
    del values
    gc.collect()
    assert NUMA_STATS["freed_bytes"] == freed + (1 << 16)


def test_no_cxl_node_falls_back_to_ddr_and_says_so_once(capsys):
    plan = make_plan(TINY, "cpu", weights_tier="cxl", kv_tier="cxl")
    if find_cxl_node(read_nodes()) is not None:
        pytest.skip("this host has a CPU-less NUMA node: the fallback cannot happen here")
    engine = Engine.from_plan(plan, RandomWeights(0), backend=EmulatedBackend())
    notes = [n for n in engine.notes if "CPU-less" in n]
    assert len(notes) == 1 and "placed in DDR" in notes[0]
    reserved = engine.memory.reserved_bytes()
    assert reserved["cxl"] == 0 and reserved["ddr"] >= engine.schedule.tier_bytes["cxl"]
    assert engine.memory.placed_in("cxl") == "ddr"


@pytest.mark.skipif(libnuma() is None, reason="libnuma (libnuma1) is not installed")
def test_cxl_tier_on_a_numa_node_runs_the_same_model(monkeypatch):
    # Pretend node 0 has no CPUs, so the real numa_alloc_onnode path serves the 'cxl' arena.
    prompt = torch.arange(5)[None]
    plan = make_plan(TINY, "mixed", cxl_layers=2, batch=1, prompt_len=5, gen_len=6)
    fallback = Engine.from_plan(plan, RandomWeights(2), backend=EmulatedBackend(), dtype=torch.float32)
    monkeypatch.setattr(engine_module, "read_nodes", lambda: [NumaNode(0, (), 2**40)])
    on_node = Engine.from_plan(plan, RandomWeights(2), backend=EmulatedBackend(), dtype=torch.float32)
    assert on_node.memory.placed_in("cxl") == "cxl"
    assert on_node.memory.reserved_bytes()["cxl"] == on_node.schedule.tier_bytes["cxl"] > 0
    assert not [n for n in on_node.notes if "CPU-less" in n]
    assert torch.equal(on_node.generate(prompt, 6).token_ids, fallback.generate(prompt, 6).token_ids)
