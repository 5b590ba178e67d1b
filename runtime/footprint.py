"""The process's GPU footprint beyond a plan's arena, measured on this GPU for `liac profile` (docs/cost-model.md
Eq. 14): the libraries' workspaces inside torch's caching allocator, the CUDA context outside it, and the
activation peak of real runs.

    numbers = measure_footprint([(plan, batch, prompt_len), ...])   # on a CUDA host
    numbers.library_bytes, numbers.context_bytes, numbers.activation_bytes   # one per run
    numbers.decode_step_seconds                                               # one per run (Eq. 24)

Each run builds an engine over seeded random weights without reserving its workspace or capping the allocator
(`enforce_budget=False`), then measures the allocator's reserved peak of one generate beyond what it held before:
activations with the allocator's own rounding and block splitting, which is what a budget must hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from liac.runtime.backend import CudaBackend, make_backend
from liac.runtime.engine import Engine
from liac.runtime.weights import RandomWeights

__all__ = ["Footprint", "measure_footprint", "library_workspace_bytes"]


@dataclass(frozen=True)
class Footprint:
    library_bytes: int  # cuBLAS / cuBLASLt workspaces, held by the caching allocator once the first GEMMs ran
    context_bytes: int  # outside the allocator, after every run (their kernels loaded)
    activation_bytes: tuple[int, ...]  # per run: reserved peak of one generate beyond the engine's arena
    decode_step_seconds: tuple[float, ...] = ()  # per run: one decode step's wall time (the runtime's per-unit
    # host time, docs/cost-model.md Eq. 24: the models are small, so their kernels take little of it)


def library_workspace_bytes(backend: CudaBackend) -> int:
    """What the first GEMMs leave allocated once their operands are gone: the libraries' workspaces."""
    device = backend.devices["gpu"]
    before = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        a = torch.randn(512, 512, device=device, dtype=torch.bfloat16)
        b = torch.randn(512, 512, device=device, dtype=torch.bfloat16)
        c = torch.nn.functional.linear(a, b, a[0])  # cuBLASLt (bias epilogue)
        d = a @ b                                    # cuBLAS
        del a, b, c, d
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.memory_allocated(device) - before)


DECODE_STEPS = 8  # decode steps timed per run for `Footprint.decode_step_seconds`


def measure_footprint(runs, new_tokens: int = 2) -> Footprint:
    """`runs`: (plan, batch, prompt_len) triples of plans whose GPU tiers fit this GPU. After the measured generate,
    one more of `DECODE_STEPS` + 1 tokens on a short prompt times the decode steps (`decode_step_seconds`)."""
    backend = make_backend(False)
    if not isinstance(backend, CudaBackend):
        raise RuntimeError("measuring the GPU footprint needs CUDA")
    device = backend.devices["gpu"]
    library = library_workspace_bytes(backend)
    peaks, steps = [], []
    for plan, batch, prompt_len in runs:
        ids = torch.randint(0, plan.model_config.vocab_size, (batch, prompt_len),
                            generator=torch.Generator().manual_seed(0))
        with Engine.from_plan(plan, RandomWeights(0), backend=backend, enforce_budget=False,
                              warm_up=False) as engine:
            engine.generate(ids[:, :8], new_tokens)  # first-call allocations and kernel loading, not counted
            torch.cuda.synchronize(device)
            backend.release_cached()
            held = torch.cuda.memory_reserved(device)
            backend.reset_peak()
            engine.generate(ids, new_tokens)
            torch.cuda.synchronize(device)
            peaks.append(max(0, torch.cuda.max_memory_reserved(device) - held))
            timed = engine.generate(ids[:, :8], DECODE_STEPS + 1)
            steps.append(timed.decode_seconds / DECODE_STEPS)
    return Footprint(library, backend.gpu_context_bytes(), tuple(peaks), tuple(steps))
