"""(op kind, device) → kernel: the one place that decides how a sublayer's GEMMs run on each device.

The math of every sublayer stays in liac.models (norms, RoPE, activations, SDPA); the runtime only swaps the
`nn.Linear` inside a sublayer module for a `KernelLinear` whose kernel comes from `KERNELS`, so a faster CPU GEMV or
an IPEX kernel is a one-line change here, never a change to the model code or the executor.

CPU backends:
    'torch'  stock PyTorch: bf16 F.linear goes to oneDNN's brgemm kernels, which use AMX on Sapphire Rapids and
             later (ONEDNN_VERBOSE prints brg_matmul:avx10_1_512_amx). Attention uses the model's fused SDPA, which
             reads a bf16 KV cache 1.3-2.3x faster than bmm-softmax-bmm at decode (docs/runtime.md).
    'ipex'   intel-extension-for-pytorch, only when its release (read from package metadata, BEFORE importing it:
             an IPEX built for another torch prints its own error on every import attempt) matches torch's
             major.minor and it then imports: CPU sublayer modules keep their nn.Linear and go through
             `ipex.optimize(..., weights_prepack=False)`, so IPEX makes no second copy of weights the plan placed.
             Decided once per process; a mismatch is said once (a warning of the 'liac.runtime' logger) and the
             stock kernels run. Optional, never a dependency; IPEX 2.8 needs torch 2.8, so no host of this project
             has exercised this path yet (docs/runtime.md).

Small-M CPU projections (decode: batch × 1 rows) read their weights once, so memory bandwidth decides, and which
of F.linear and torch.mv reads faster differs between hosts and even between starts of one host. An engine measures
both on its own CPU weights at build time (`choose_cpu_linear`, ~0.3 s) and binds the winner to its CPU modules.
"""

from __future__ import annotations

import functools
import logging
import time
from importlib import metadata
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from liac.sizes import GIB

__all__ = ["KERNELS", "CPU_LINEAR", "SMALL_M_ROWS", "KernelLinear", "BlocksLinear", "bind_kernels", "prepare_module",
           "cpu_backend", "ipex_module", "ipex_matches", "measure_cpu_linear", "choose_cpu_linear", "linear_kernel",
           "IPEX_DISTRIBUTION"]

IPEX_DISTRIBUTION = "intel-extension-for-pytorch"
_log = logging.getLogger("liac.runtime")


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


SMALL_M_ROWS = 16  # up to this many rows (batch × query tokens) a projection reads its weights once: a GEMV


def _linear_mv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear, but small-M products as torch.mv / W @ xᵀ (faster than oneDNN's brgemm on some hosts)."""
    rows = x.numel() // x.shape[-1]
    if rows > SMALL_M_ROWS or rows == 0:
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    y = torch.mv(weight, flat[0])[None] if rows == 1 else (weight @ flat.T).T
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


# Keyed by (op kind, plan device). F.linear everywhere by default: on the H200 host it read weights at 70-75 GB/s
# at M = 1-16 against 40-48 for torch.mv in one run (/work/shared/hw), but another start of that machine saw the
# opposite (mv 26 vs 20 GB/s), so an engine measures both on its own CPU weights (`choose_cpu_linear`).
KERNELS: dict[tuple[str, str], Callable[..., torch.Tensor]] = {
    ("linear", "cpu"): _linear,
    ("linear", "gpu"): _linear,
}
CPU_LINEAR = {"linear": _linear, "mv": _linear_mv}  # the small-M choices for ('linear', 'cpu')
MEASURE_MIN_BYTES = 256 * 2**20  # below this the sample sits in the CPU caches: measuring would mislead
_MEASURE_MAX_BYTES = 2 * GIB


def measure_cpu_linear(weights: list[torch.Tensor], rounds: int = 3) -> dict[str, float]:
    """GB/s each CPU_LINEAR kernel reads `weights` at, at M = 1 (interleaved rounds, after one warm-up each)."""
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    xs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights]
    seconds = {name: 0.0 for name in CPU_LINEAR}
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            for name, kernel in CPU_LINEAR.items():
                began = time.perf_counter()
                for w, x in zip(weights, xs):  # rotating over the sample: no weight is still cached
                    kernel(x, w, None)
                if round_:
                    seconds[name] += time.perf_counter() - began
    return {name: nbytes * rounds / max(s, 1e-9) / 1e9 for name, s in seconds.items()}


def choose_cpu_linear(weights: list[torch.Tensor], request: str = "auto") -> tuple[str, dict[str, float] | None]:
    """The small-M CPU kernel for an engine: `request` ('linear' | 'mv'), or for 'auto' the faster of the two on
    `weights` (largest first; 'mv' only when ≥ 10 % faster). Returns (name, measured GB/s or None)."""
    if request != "auto":
        if request not in CPU_LINEAR:
            raise ValueError(f"CPU kernel must be 'auto' or one of {sorted(CPU_LINEAR)}, got {request!r}")
        return request, None
    sample, nbytes = [], 0
    for w in sorted(weights, key=lambda w: -w.numel()):
        if nbytes >= _MEASURE_MAX_BYTES:
            break
        sample.append(w)
        nbytes += w.numel() * w.element_size()
    if nbytes < MEASURE_MIN_BYTES:
        return "linear", None
    rates = measure_cpu_linear(sample)
    return ("mv" if rates["mv"] > 1.1 * rates["linear"] else "linear"), rates


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


class BlocksLinear(nn.Module):
    """A projection over several row blocks of one weight, read in place (a split gate_up's CPU part: its gate
    rows and its up rows): one kernel call per block, outputs concatenated (activations only, never weights)."""

    def __init__(self, blocks: list[tuple[torch.Tensor, torch.Tensor | None]], kernel: Callable[..., torch.Tensor]):
        super().__init__()
        self.blocks = blocks
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.kernel(x, weight, bias) for weight, bias in self.blocks], dim=-1)


def bind_kernels(module: nn.Module, device: str, kernel: Callable[..., torch.Tensor] | None = None) -> nn.Module:
    """Replace every nn.Linear inside `module` (in place) by a KernelLinear with `kernel`, by default the table's
    kernel for `device`."""
    kernel = kernel or KERNELS[("linear", device)]
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, KernelLinear(child.weight, child.bias, kernel))
        else:
            bind_kernels(child, device, kernel)
    return module


def ipex_matches(ipex_version: str, torch_version: str) -> bool:
    """Whether an IPEX release serves a torch release: IPEX X.Y is built for torch X.Y exactly ('2.8.0+cpu' serves
    '2.8.1', not '2.13.0')."""
    def major_minor(version: str) -> list[str]:
        return version.split("+")[0].split(".")[:2]

    return major_minor(ipex_version) == major_minor(torch_version)


@functools.cache
def ipex_module():
    """The intel_extension_for_pytorch module when it is installed for this torch and imports, else None.

    Decided once per process (cached): versions come from package metadata before any import, and the reason IPEX
    is not used, when it is installed, is logged once."""
    try:
        ipex_version = metadata.version(IPEX_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None  # not installed: nothing to say
    torch_version = metadata.version("torch")
    if not ipex_matches(ipex_version, torch_version):
        _log.warning("liac.runtime: %s %s is built for torch %s, but torch is %s: using the stock PyTorch CPU "
                     "kernels (install the IPEX release for torch %s, or uninstall IPEX)", IPEX_DISTRIBUTION,
                     ipex_version, ".".join(ipex_version.split("+")[0].split(".")[:2]), torch_version,
                     ".".join(torch_version.split("+")[0].split(".")[:2]))
        return None
    try:
        import intel_extension_for_pytorch as ipex  # late import: optional, and only once it matches torch
    except Exception as e:  # any import failure means: not usable; said once
        _log.warning("liac.runtime: %s %s does not import (%s): using the stock PyTorch CPU kernels",
                     IPEX_DISTRIBUTION, ipex_version, " ".join(f"{type(e).__name__}: {e}".split()))
        return None
    return ipex


def cpu_backend() -> str:
    """'ipex' when a matching IPEX is importable, else 'torch'."""
    return "ipex" if ipex_module() is not None else "torch"


def linear_kernel(device: str, cpu_linear: str | None = None) -> Callable[..., torch.Tensor]:
    """The projection kernel of a plan device: the table's, or on the CPU torch.mv when the engine chose it."""
    if device == "cpu" and cpu_linear == "mv":
        return CPU_LINEAR["mv"]
    return KERNELS[("linear", device)]


def prepare_module(module: nn.Module, device: str, dtype: torch.dtype, cpu_linear: str | None = None) -> nn.Module:
    """Make a bound sublayer module run on `device`'s kernels: IPEX for CPU modules when usable, else KERNELS (or,
    on the CPU, the engine's `cpu_linear` choice from CPU_LINEAR)."""
    if device == "cpu":
        ipex = ipex_module()
        if ipex is not None:
            return ipex.optimize(module.eval(), dtype=dtype, inplace=True, weights_prepack=False)
    return bind_kernels(module, device, linear_kernel(device, cpu_linear))
