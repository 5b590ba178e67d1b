"""Small crossings to the GPU read in place (runtime/backend.py `CudaBackend.transfer`): a kernel on the compute
stream reads the page-locked block, so a decode step's activation never queues behind a staging copy."""

from __future__ import annotations

import pytest
import torch

import liac.runtime.backend as backend_module


@pytest.mark.parametrize("tensor", [
    torch.randn(3, 1, 7, dtype=torch.bfloat16),
    torch.tensor([-0.0, 1.5, float("nan"), float("-inf")], dtype=torch.float32),
    torch.arange(-5, 5, dtype=torch.int64).reshape(2, 5),
    torch.tensor([True, False, True]),
    torch.tensor(7, dtype=torch.int32),
])
def test_the_byte_copy_is_bit_exact_for_any_dtype(tensor):
    """The alias of a block's bytes and the elementwise byte copy (what the GPU kernel does, here on the host):
    bit for bit, signed zeros and NaNs included, any dtype and shape."""
    out = torch.empty_like(tensor)
    backend_module._byte_copy(out, backend_module._alias(tensor, torch.device("cpu")))
    assert out.shape == tensor.shape and out.dtype == tensor.dtype
    assert torch.equal(out.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_the_alias_does_not_copy():
    tensor = torch.zeros(4, dtype=torch.float32)
    alias = backend_module._alias(tensor, torch.device("cpu"))
    tensor[1] = 1.0
    assert alias.numel() == 16 and alias.view(torch.float32)[1] == 1.0


def test_without_libcudart_nothing_is_read_in_place(monkeypatch):
    """Where libcudart cannot be reached, no block counts as mapped: the copy engine copies every crossing."""
    monkeypatch.setattr(backend_module, "_loaded_cudart_paths", lambda: [])
    monkeypatch.setattr(backend_module, "_CUDART_FUNCTIONS", {})
    assert backend_module._mapped_in_place(torch.zeros(4).data_ptr()) is False


def test_only_the_cuda_backend_reads_in_place():
    assert backend_module.Backend.mapped_crossings is False
    assert backend_module.EmulatedBackend().mapped_crossings is False


@pytest.mark.gpu
def test_a_small_crossing_is_read_in_place_and_exact_beside_a_staging_copy():
    """On the GPU: a decode-sized activation crosses by the mapped read (the block counts as mapped, the result
    equals the copy engine's bit for bit, the bytes are counted), also while a 256 MiB staging copy runs on the copy
    stream; a K, V write into a strided slice of an HBM cache likewise; a crossing over MAPPED_MAX_BYTES, or with
    mapped_crossings off, is copied."""
    from liac.runtime.backend import MAPPED_MAX_BYTES, CudaBackend

    backend = CudaBackend()
    assert backend.mapped_crossings
    big = torch.empty(256 * 2**20, dtype=torch.uint8).pin_memory()
    staging = torch.empty_like(big, device="cuda")
    with backend.on_stream(backend.copy_stream()):
        staging.copy_(big, non_blocking=True)
    activation = torch.randn(8, 1, 7168, dtype=torch.bfloat16)
    host = backend.host_empty(activation.shape, activation.dtype)
    host.copy_(activation)
    assert backend_module._mapped_in_place(host.data_ptr())
    before = backend.transfers.totals()["h2d_bytes"]
    torch.cuda._sleep(100_000_000)  # the compute stream busy (~50 ms): the reader cannot have run when transfer returns
    out = backend.transfer(host, "gpu", "o")
    assert backend._mapped_held and backend._mapped_held[-1][1] is host  # held until its reader has run
    backend.synchronize()
    assert out.is_cuda and torch.equal(out.cpu().view(torch.int16), activation.view(torch.int16))
    assert backend.transfers.totals()["h2d_bytes"] - before == host.numel() * 2 and not backend._mapped_held
    cache = torch.zeros(2, 4, 16, 8, dtype=torch.bfloat16, device="cuda")  # [B, G, C, E]
    k = torch.randn(2, 4, 1, 8, dtype=torch.bfloat16)
    backend.copy_into(cache[:, :, 5:6], k, True, "k")
    backend.synchronize()
    assert torch.equal(cache[:, :, 5:6].cpu(), k) and not cache[:, :, :5].any() and not cache[:, :, 6:].any()
    large = torch.randn(MAPPED_MAX_BYTES // 2 + 1, dtype=torch.bfloat16)
    assert torch.equal(backend.transfer(large, "gpu").cpu(), large)
    backend.mapped_crossings = False
    assert torch.equal(backend.transfer(activation, "gpu").cpu(), activation)
