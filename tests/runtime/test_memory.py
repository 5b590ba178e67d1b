"""runtime/memory.py on its own: aligned pieces carved from one arena per tier, the CXL fallback into DDR, bytes per
tier, page-locking tied to the arena's life, and one line when a tier cannot be allocated."""

from __future__ import annotations

import gc

import pytest
import torch
from runtime_plans import PinningBackend

from liac.errors import LiacError
from liac.runtime.backend import CpuOnlyBackend, EmulatedBackend
from liac.runtime.memory import ALIGN_BYTES, Arena, TierMemory, aligned, pin_host
from liac.runtime.numa import CxlPlacement

NO_CXL_NODE = CxlPlacement(None, "no CPU-less NUMA node")


def test_aligned_rounds_up_to_the_boundary():
    assert ALIGN_BYTES == 256
    assert [aligned(n) for n in (0, 1, 255, 256, 257, 1000)] == [0, 256, 256, 256, 512, 1024]


def test_arena_hands_out_aligned_views_and_refuses_to_overflow():
    arena = Arena("ddr", torch.zeros(1024, dtype=torch.uint8))
    a = arena.take((3, 5), torch.float32)  # 60 bytes at 0
    b = arena.take((10,), torch.bfloat16)  # 20 bytes at the next 256-byte boundary
    assert a.shape == (3, 5) and a.dtype == torch.float32 and b.shape == (10,) and b.dtype == torch.bfloat16
    base = arena.storage.data_ptr()
    assert (a.data_ptr() - base, b.data_ptr() - base) == (0, 256)
    b.fill_(1.0)  # a view of the arena, not a copy
    assert arena.storage[256:276].any() and not arena.storage[276:512].any()
    assert arena.used_bytes == 512
    arena.take((128,), torch.float32)  # 512 bytes: exactly what is left
    with pytest.raises(RuntimeError, match="arena 'ddr' overflow"):
        arena.take((1,), torch.uint8)


def test_one_arena_per_tier_and_cxl_falls_back_into_ddr():
    memory = TierMemory.allocate(EmulatedBackend(), {"hbm": 1024, "ddr": 512, "cxl": 256}, NO_CXL_NODE)
    assert memory.arenas["cxl"] is memory.arenas["ddr"]  # one DDR arena holds the 'cxl' tensors too
    assert memory.placed_in("cxl") == "ddr" and memory.placed_in("hbm") == "hbm"
    assert memory.reserved_bytes() == {"hbm": 1024, "ddr": 768, "cxl": 0}
    cxl = memory.take("cxl", (64,), torch.float32)
    ddr = memory.take("ddr", (64,), torch.float32)
    assert ddr.data_ptr() - cxl.data_ptr() == 256  # the same arena, one after the other


def test_empty_tiers_get_no_arena_but_ddr_always_has_one():
    memory = TierMemory.allocate(EmulatedBackend(), {"hbm": 0, "ddr": 0, "cxl": 0}, NO_CXL_NODE)
    assert set(memory.arenas) == {"ddr", "cxl"} and memory.reserved_bytes() == {"hbm": 0, "ddr": 0, "cxl": 0}


def test_hbm_without_a_gpu_is_one_line():
    with pytest.raises(LiacError) as error:
        TierMemory.allocate(CpuOnlyBackend(), {"hbm": 2**30, "ddr": 0}, NO_CXL_NODE)
    assert error.value.source == "host" and "1.00 GiB in 'hbm' but there is no GPU" in error.value.message


def test_pinning_lasts_as_long_as_its_owner():
    backend, storage = PinningBackend(), torch.zeros(512, dtype=torch.uint8)
    owner = Arena("ddr", storage)
    assert pin_host(backend, storage, owner) is True
    assert backend.pinned == [512] and backend.unpinned == []
    del owner
    gc.collect()
    assert backend.unpinned == backend.pinned  # unregistered before the memory can go
    refused = PinningBackend(refuse=True)
    assert pin_host(refused, storage, Arena("ddr", storage)) is False
    gc.collect()
    assert refused.unpinned == []  # nothing to undo
    assert pin_host(EmulatedBackend(), storage, object()) is False  # no page-locking without CUDA


def test_an_arena_that_stays_pageable_is_noted():
    memory = TierMemory.allocate(PinningBackend(refuse=True), {"hbm": 256, "ddr": 256}, NO_CXL_NODE)
    assert memory.pinned == {"ddr": False}
    assert memory.notes == ["the 'ddr' tier could not be page-locked (cudaHostRegister failed): its streaming "
                            "copies are synchronous"]
