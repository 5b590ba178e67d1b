"""The (op kind, device) kernel table and the optional IPEX backend (exercised with a stand-in module)."""

from __future__ import annotations

import sys
import types

import torch
from torch import nn

import liac.runtime.kernels as kernels
from liac.runtime.kernels import KernelLinear, bind_kernels, cpu_backend, ipex_module, prepare_module


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 16)
        self.inner = nn.Sequential(nn.Linear(16, 4, bias=False))

    def forward(self, x):
        return self.inner(self.proj(self.norm(x)))


def test_bind_kernels_swaps_every_linear_and_keeps_the_math():
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(3, 8)
    want = block(x)
    bind_kernels(block, "cpu")
    assert isinstance(block.proj, KernelLinear) and isinstance(block.inner[0], KernelLinear)
    assert not any(isinstance(m, nn.Linear) for m in block.modules())
    torch.testing.assert_close(block(x), want)


def test_kernel_table_is_consulted(monkeypatch):
    calls = []

    def recording(x, weight, bias):
        calls.append(tuple(weight.shape))
        return torch.nn.functional.linear(x, weight, bias)

    monkeypatch.setitem(kernels.KERNELS, ("linear", "gpu"), recording)
    block = bind_kernels(_Block(), "gpu")
    block(torch.randn(2, 8))
    assert calls == [(16, 8), (4, 16)]


def test_ipex_used_only_when_it_matches_torch(monkeypatch):
    fake = types.ModuleType("intel_extension_for_pytorch")
    seen = []

    def optimize(module, dtype, inplace, weights_prepack):
        seen.append((dtype, inplace, weights_prepack))
        return module

    fake.optimize = optimize
    fake.__version__ = "2.8.0+cpu"  # another torch: must not be used
    monkeypatch.setitem(sys.modules, "intel_extension_for_pytorch", fake)
    if not torch.__version__.startswith("2.8."):
        assert ipex_module() is None and cpu_backend() == "torch"
        assert isinstance(prepare_module(_Block(), "cpu", torch.bfloat16).proj, KernelLinear)
    fake.__version__ = torch.__version__.split("+")[0] + "+cpu"  # built for this torch
    assert ipex_module() is fake and cpu_backend() == "ipex"
    block = prepare_module(_Block(), "cpu", torch.bfloat16)
    assert seen == [(torch.bfloat16, True, False)]  # no weight prepacking: no second copy of planned weights
    assert isinstance(block.proj, nn.Linear)
    prepare_module(_Block(), "gpu", torch.bfloat16)  # GPU modules never go through IPEX
    assert len(seen) == 1


def test_small_m_kernel_matches_f_linear_at_every_m():
    torch.manual_seed(1)
    weight, bias = torch.randn(24, 16), torch.randn(24)
    for shape in ((1, 1, 16), (2, 1, 16), (4, 4, 16), (1, 17, 16)):  # mv, W @ xᵀ, W @ xᵀ (16 rows), F.linear
        x = torch.randn(shape)
        for b in (bias, None):
            got = kernels.CPU_LINEAR["mv"](x, weight, b)
            torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, b))
            assert got.shape == shape[:-1] + (24,)


def test_small_m_kernel_choice(monkeypatch):
    small = [torch.zeros(64, 64, dtype=torch.bfloat16)]
    assert kernels.choose_cpu_linear(small, "mv") == ("mv", None)  # asked for: no measurement
    assert kernels.choose_cpu_linear(small) == ("linear", None)  # cache-resident sample: not measured, the default
    monkeypatch.setattr(kernels, "MEASURE_MIN_BYTES", 0)
    rates = kernels.measure_cpu_linear(small, rounds=1)
    assert set(rates) == {"linear", "mv"} and all(r > 0 for r in rates.values())
    for measured, want in (({"linear": 10.0, "mv": 10.5}, "linear"), ({"linear": 10.0, "mv": 11.5}, "mv")):
        monkeypatch.setattr(kernels, "measure_cpu_linear", lambda weights, measured=measured: measured)
        assert kernels.choose_cpu_linear(small) == (want, measured)  # mv only when ≥ 10 % faster
    block = prepare_module(_Block(), "cpu", torch.float32, cpu_linear="mv")
    if cpu_backend() == "torch":
        assert block.proj.kernel is kernels.CPU_LINEAR["mv"]
