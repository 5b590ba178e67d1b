"""The (op kind, device) kernel table and the optional IPEX backend (exercised with a stand-in module)."""

from __future__ import annotations

import logging
import sys

import pytest
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


_STAND_IN = """
import sys
__version__ = {version!r}
if {explode!r}:
    raise RuntimeError("IPEX built for another torch was imported")
calls = []

def optimize(module, dtype, inplace, weights_prepack):
    calls.append((dtype, inplace, weights_prepack))
    return module
"""


@pytest.fixture
def installed_ipex(tmp_path, monkeypatch):
    """Install a stand-in intel-extension-for-pytorch (a dist-info with its version, and the package) on sys.path;
    `explode` makes importing it fail loudly, as a real IPEX built for another torch complains on import."""
    def install(version: str, explode: bool = False):
        root = tmp_path / f"site-{version}"
        (root / "intel_extension_for_pytorch").mkdir(parents=True)
        (root / "intel_extension_for_pytorch" / "__init__.py").write_text(_STAND_IN.format(version=version,
                                                                                          explode=explode))
        info = root / f"intel_extension_for_pytorch-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: intel-extension-for-pytorch\n"
                                       f"Version: {version}\n")
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.delitem(sys.modules, "intel_extension_for_pytorch", raising=False)
        ipex_module.cache_clear()

    yield install
    sys.modules.pop("intel_extension_for_pytorch", None)
    ipex_module.cache_clear()


def test_ipex_version_rule():
    assert kernels.ipex_matches("2.8.0+cpu", "2.8.1")
    assert kernels.ipex_matches("2.13.10", "2.13.0+cu128")
    assert not kernels.ipex_matches("2.8.0+cpu", "2.13.0+cpu")
    assert not kernels.ipex_matches("2.1.0", "2.13.0")  # not a prefix match


def test_ipex_for_another_torch_is_never_imported_and_said_once(installed_ipex, caplog):
    other = "1.99.0" if not torch.__version__.startswith("1.99.") else "2.98.0"
    installed_ipex(other, explode=True)  # importing it would raise
    with caplog.at_level(logging.WARNING, logger="liac.runtime"):
        blocks = [prepare_module(_Block(), "cpu", torch.bfloat16) for _ in range(63)]
        assert cpu_backend() == "torch"
    assert "intel_extension_for_pytorch" not in sys.modules  # checked from metadata, before any import
    assert all(isinstance(block.proj, KernelLinear) for block in blocks)  # the stock kernels run
    said = [r.getMessage() for r in caplog.records if "intel-extension-for-pytorch" in r.getMessage()]
    assert len(said) == 1, said
    assert f"intel-extension-for-pytorch {other} is built for torch {other[:4]}" in said[0]
    assert "using the stock PyTorch CPU kernels" in said[0]


def test_ipex_for_this_torch_is_used(installed_ipex, caplog):
    installed_ipex(torch.__version__.split("+")[0] + "+cpu")
    with caplog.at_level(logging.WARNING, logger="liac.runtime"):
        assert cpu_backend() == "ipex"
        block = prepare_module(_Block(), "cpu", torch.bfloat16)
    fake = sys.modules["intel_extension_for_pytorch"]
    assert ipex_module() is fake
    assert fake.calls == [(torch.bfloat16, True, False)]  # no weight prepacking: no second copy of planned weights
    assert isinstance(block.proj, nn.Linear)
    prepare_module(_Block(), "gpu", torch.bfloat16)  # GPU modules never go through IPEX
    assert len(fake.calls) == 1
    assert not caplog.records


def test_ipex_that_fails_to_import_is_said_once(installed_ipex, caplog):
    installed_ipex(torch.__version__.split("+")[0], explode=True)
    with caplog.at_level(logging.WARNING, logger="liac.runtime"):
        for _ in range(5):
            assert isinstance(prepare_module(_Block(), "cpu", torch.bfloat16).proj, KernelLinear)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "does not import (RuntimeError: IPEX built for another torch" in said[0]


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
