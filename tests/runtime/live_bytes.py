"""Count the bytes of the tensors a block of code creates and holds at once (a CPU stand-in for the CUDA caching
allocator's allocated-bytes peak, which the emulated backend does not have).

    with LiveBytes() as live:
        engine.generate(ids, 2)
    live.peak_bytes      # the most bytes of storages created inside the block and alive at one time

A TorchDispatchMode sees every op's outputs: an output whose storage no input shares is a new allocation (views and
in-place results share their input's), counted until the last tensor on it is gone. Storages that existed before
the block (weights, KV caches, staging buffers) are never counted, and a kernel's internal scratch is not seen.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveBytes"]


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._refs: dict[int, list] = {}  # storage address → [tensors alive on it, bytes]

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key in inputs and key not in self._refs:
                continue  # a view or an in-place result of something that existed before
            if key not in self._refs:
                self._refs[key] = [0, storage.nbytes()]
                self.live_bytes += storage.nbytes()
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            self._refs[key][0] += 1
            weakref.finalize(tensor, self._release, key)
        return out
