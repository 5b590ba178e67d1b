"""(op kind, device) → kernel: the one place that decides how a sublayer's GEMMs run on each device.

The math of every sublayer stays in liac.models (norms, RoPE, activations, SDPA); the runtime only swaps the
`nn.Linear` inside a sublayer module for a `KernelLinear` whose kernel comes from `KERNELS`, so a faster CPU GEMV or
an IPEX kernel is a one-line change here, never a change to the model code or the executor.

CPU backends:
    'torch'  stock PyTorch: bf16 F.linear goes to oneDNN's brgemm kernels, which use AMX on Sapphire Rapids and
             later (ONEDNN_VERBOSE prints brg_matmul:avx10_1_512_amx). Attention uses the model's fused SDPA, which
             reads a bf16 KV cache 1.3-2.3x faster than bmm-softmax-bmm at decode (docs/runtime.md).
    'ipex'   intel-extension-for-pytorch, only when it imports and its version matches torch's major.minor: CPU
             sublayer modules keep their nn.Linear and go through `ipex.optimize(..., weights_prepack=False)`,
             so IPEX makes no second copy of weights the plan placed. Optional, never a dependency; IPEX 2.8 needs
             torch 2.8, so no host of this project has exercised this path yet (docs/runtime.md).
"""

from __future__ import annotations

import sys
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["KERNELS", "KernelLinear", "bind_kernels", "prepare_module", "cpu_backend", "ipex_module"]


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


# Keyed by (op kind, plan device). At batch 1 on the dev machine F.linear (oneDNN) beat torch.mv by ~1.8x for an
# 8192x8192 bf16 weight, the opposite of what measurements.md saw with an older build, so both devices use
# F.linear until a benchmark on the target host says otherwise.
KERNELS: dict[tuple[str, str], Callable[..., torch.Tensor]] = {
    ("linear", "cpu"): _linear,
    ("linear", "gpu"): _linear,
}


class KernelLinear(nn.Module):
    """A projection whose weight and bias are plain tensors placed by the runtime and whose kernel comes from
    `KERNELS` (the same math as nn.Linear)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: Callable[..., torch.Tensor]):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x, self.weight, self.bias)


def bind_kernels(module: nn.Module, device: str) -> nn.Module:
    """Replace every nn.Linear inside `module` (in place) by a KernelLinear with the kernel for `device`."""
    kernel = KERNELS[("linear", device)]
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, KernelLinear(child.weight, child.bias, kernel))
        else:
            bind_kernels(child, device)
    return module


def ipex_module():
    """The intel_extension_for_pytorch module when it is importable and built for this torch, else None."""
    if "intel_extension_for_pytorch" not in sys.modules:
        try:
            import intel_extension_for_pytorch  # noqa: F401
        except Exception:  # any import failure (missing, or built for another torch) means: not usable
            return None
    ipex = sys.modules.get("intel_extension_for_pytorch")
    version = getattr(ipex, "__version__", "")
    if version.split(".")[:2] != torch.__version__.split("+")[0].split(".")[:2]:
        return None
    return ipex


def cpu_backend() -> str:
    """'ipex' when a matching IPEX is importable, else 'torch'."""
    return "ipex" if ipex_module() is not None else "torch"


def prepare_module(module: nn.Module, device: str, dtype: torch.dtype) -> nn.Module:
    """Make a bound sublayer module run on `device`'s kernels: IPEX for CPU modules when usable, else KERNELS."""
    if device == "cpu":
        ipex = ipex_module()
        if ipex is not None:
            return ipex.optimize(module.eval(), dtype=dtype, inplace=True, weights_prepack=False)
    return bind_kernels(module, device)
