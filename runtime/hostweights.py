"""`HostWeights`: every parameter of a model once, in one page-locked host arena, shared by many engines.

A benchmark runs several plans of one model; generating or loading the weights once per plan (60 GB for OPT-30B)
would cost more than the runs. Instead:

    host = HostWeights.random(cfg, seed=0)                 # or HostWeights.from_checkpoint("ckpts/opt-30b")
    for path in plans:
        with Engine.from_plan(path, weights=host) as engine:   # copies only its 'hbm' tensors to the GPU
            engine.generate(ids, 8)
    host.close()

An engine built over HostWeights takes its 'ddr' tensors (and 'cxl' ones where the host has no CXL node) as views
of this arena, copies its 'hbm' tensors (and 'cxl' ones onto a CXL node) from it, and gives the GPU memory back on
`close()`. Random values are the ones `RandomWeights(seed)` gives (runtime/weights.py `fill_random`): generated on
the GPU when there is one, then copied into the pinned arena, so the same seed is the same model either way.
"""

from __future__ import annotations

import os
import time
import weakref

import torch

from liac.errors import LiacError
from liac.models.config import ModelConfig
from liac.runtime.backend import Backend, host_available_bytes, make_backend
from liac.runtime.memory import aligned
from liac.runtime.schedule import model_params
from liac.runtime.weights import Checkpoint, Progress, WeightStore, fill_random, load_checkpoint
from liac.sizes import GIB, numel

__all__ = ["HostWeights", "HOST_TIER"]

HOST_TIER = "ddr"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class HostWeights:
    """A model's parameters in one host arena (see the module docstring). Build with `random` or
    `from_checkpoint`; `tensor(name)` is the host copy of one parameter (model-wide name)."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, backend: Backend, storage: torch.Tensor,
                 store: WeightStore, pinned: bool, timings: dict[str, float]):
        self.cfg, self.dtype, self.backend = cfg, dtype, backend
        self.store = store
        self.pinned = pinned
        self.timings = timings  # seconds: allocate, pin, fill (random or checkpoint), total
        self.nbytes = storage.numel()
        self._storage: torch.Tensor | None = storage
        self._unpin: weakref.finalize | None = None

    # -- building -------------------------------------------------------------------------------------------------
    @classmethod
    def _allocate(cls, cfg: ModelConfig, dtype: torch.dtype, backend: Backend, source: str):
        began = time.perf_counter()
        itemsize = torch.empty((), dtype=dtype).element_size()
        shapes = {p.canonical: p.shape for params in model_params(cfg).values() for p in params}
        total = sum(aligned(numel(shape) * itemsize) for shape in shapes.values())
        available = host_available_bytes()
        if total > available:
            raise LiacError(source, f"the weights need {total / GIB:.2f} GiB of host memory, {available / GIB:.2f} "
                                    f"GiB are available (short by {(total - available) / GIB:.2f} GiB)")
        try:
            storage = torch.empty(total, dtype=torch.uint8)
        except (RuntimeError, MemoryError) as e:
            raise LiacError(source, f"cannot allocate {total / GIB:.2f} GiB of host memory for the weights") from e
        allocated = time.perf_counter()
        store = WeightStore()
        offset = 0
        for canonical in sorted(shapes):
            nbytes = numel(shapes[canonical]) * itemsize
            store.add(canonical, HOST_TIER, storage[offset:offset + nbytes].view(dtype).view(shapes[canonical]))
            offset += aligned(nbytes)
        weights = cls(cfg, dtype, backend, storage, store, False, {})
        # Page-locked before filling: the GPU → host copies of the random values (and every later stream) are DMA.
        # Touching every page first faults them in on all cores (zero_ is parallel); cudaHostRegister would
        # otherwise fault tens of GB in one driver thread.
        if backend.pin_memory:
            storage.zero_()
            touched = time.perf_counter()
            if backend.pin(storage):
                weights.pinned = True
                weights._unpin = weakref.finalize(weights, backend.unpin, storage)
            weights.timings["touch_seconds"] = touched - allocated
        weights.timings["allocate_seconds"] = allocated - began
        weights.timings["pin_seconds"] = time.perf_counter() - allocated
        return weights

    @classmethod
    def random(cls, cfg: ModelConfig, seed: int, *, dtype: torch.dtype | None = None, backend: Backend | None = None,
               emulate_gpu: bool | None = None, progress: bool = False) -> "HostWeights":
        """Seeded random weights (N(0, 0.02²); norm scales 1 + N(0, 0.02²)), generated on the GPU when there is one.

        Args:
            cfg: the architecture (the plans' spec.model.config).
            seed: the seed; values depend on (seed, parameter name, generator device type) only.
            dtype: storage dtype; default the config's (bf16).
            backend: the backend the engines will use (default: make_backend(emulate_gpu)).
            progress: print a progress line on stderr.
        """
        began = time.perf_counter()
        dtype = dtype or _DTYPES.get(cfg.dtype, torch.bfloat16)
        backend = backend or make_backend(emulate_gpu)
        weights = cls._allocate(cfg, dtype, backend, "--random-weights")
        device = backend.devices["gpu"] if backend.name == "cuda" else torch.device("cpu")
        filled = time.perf_counter()
        fill_random(weights.store, seed, device, Progress("random weights", weights.nbytes, progress))
        weights.timings["fill_seconds"] = time.perf_counter() - filled
        weights.timings["total_seconds"] = time.perf_counter() - began
        return weights

    @classmethod
    def from_checkpoint(cls, directory: str | os.PathLike, *, dtype: torch.dtype | None = None,
                        backend: Backend | None = None, emulate_gpu: bool | None = None,
                        progress: bool = False) -> "HostWeights":
        """A HF safetensors checkpoint, checked (headers, shapes) and read tensor by tensor into the arena."""
        began = time.perf_counter()
        ckpt = Checkpoint.open(directory)
        cfg = ckpt.config()
        shapes = {p.canonical: p.shape for params in model_params(cfg).values() for p in params}
        sources = ckpt.check(shapes, cfg)
        dtype = dtype or _DTYPES.get(cfg.dtype, torch.bfloat16)
        backend = backend or make_backend(emulate_gpu)
        weights = cls._allocate(cfg, dtype, backend, str(directory))
        filled = time.perf_counter()
        load_checkpoint(ckpt, sources, weights.store, Progress("loading weights", weights.nbytes, progress))
        weights.timings["fill_seconds"] = time.perf_counter() - filled
        weights.timings["total_seconds"] = time.perf_counter() - began
        return weights

    # -- use ------------------------------------------------------------------------------------------------------
    def tensor(self, canonical: str) -> torch.Tensor:
        if self._storage is None:
            raise LiacError("weights", "the shared host weights were closed")
        return self.store(canonical, HOST_TIER)

    def describe(self) -> dict:
        """For results files: size, page-locking, and how long building took."""
        return {"bytes": self.nbytes, "dtype": str(self.dtype).replace("torch.", ""), "pinned": self.pinned,
                **{k: round(v, 3) for k, v in self.timings.items()}}

    def close(self) -> None:
        """Free the arena (engines built over it must be closed first; their views would keep it alive)."""
        if self._unpin is not None:
            self._unpin()  # unregister now, not whenever the collector gets to it
        self.store = WeightStore()
        self._storage = None

