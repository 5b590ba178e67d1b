"""The KV cache: one preallocated [B, G, C, E] K and V per decoder layer, in the tier its layer group names.

B is the plan's batch, C = prompt + gen - 1 tokens (the last generated token is never attended to), G key/value
heads, E head dim. The device that computes qkv writes this step's K/V (`write`, crossing PCIe when the cache lives
on the other device); attention reads it in place (`view`) or, on the GPU over a host-tier cache, from a window in
the layer's staging buffer that the Streamer filled with the past tokens (`write_window` adds this step's token).
"""

from __future__ import annotations

import torch

from liac.runtime.backend import Backend
from liac.runtime.memory import HOME, TierMemory

__all__ = ["KVCache"]


class KVCache:
    """Per-layer K and V tensors [B, G, C, E] in their planned tiers."""

    def __init__(self, backend: Backend, memory: TierMemory, kv_tiers: tuple[str, ...],
                 shape: tuple[int, int, int, int], dtype: torch.dtype):
        self.backend = backend
        self.shape = shape
        self.k = [memory.take(tier, shape, dtype) for tier in kv_tiers]
        self.v = [memory.take(tier, shape, dtype) for tier in kv_tiers]
        for cache in self.k + self.v:  # CPU attention reads whole capacities (`capacity`): no garbage past the end
            cache.zero_()
        self.home = [HOME[tier] for tier in kv_tiers]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int, crosses: bool, row: int = 0,
              beside: bool = False) -> None:
        """Store this step's k, v [B, G, Q, E] at positions start .. start + Q - 1 of sequences row .. row + B - 1.

        `beside`: a GPU → host write may run on the backend's store stream, beside the compute that follows (a
        prefill's, Eq. 20 of docs/cost-model.md); `Backend.join_stores` orders the compute stream after it."""
        B, _, Q, _ = k.shape
        dst_k = self.k[layer][row:row + B, :, start:start + Q]
        dst_v = self.v[layer][row:row + B, :, start:start + Q]
        if crosses:
            to_gpu = self.home[layer] == "gpu"
            self.backend.copy_into(dst_k, k, to_gpu, "kv", beside=beside)
            self.backend.copy_into(dst_v, v, to_gpu, "kv", beside=beside)
        else:
            dst_k.copy_(k)
            dst_v.copy_(v)

    def view(self, layer: int, which: str, batch: int, context: int) -> torch.Tensor:
        """K or V of the first `context` tokens, [B, G, C, E] (a strided view, no copy)."""
        cache = self.k[layer] if which == "k" else self.v[layer]
        return cache[:batch, :, :context]

    def capacity(self, layer: int, which: str, batch: int) -> torch.Tensor:
        """K or V of every position the cache holds, [B, G, C_max, E]: contiguous per sequence and head, which the
        CPU's batched matmuls need to run at memory speed (positions past the context are zeros or stale tokens;
        attention cuts or zero-weights them)."""
        cache = self.k[layer] if which == "k" else self.v[layer]
        return cache[:batch]

    @staticmethod
    def write_window(window: torch.Tensor, new: torch.Tensor, start: int) -> torch.Tensor:
        """Put this step's new [B, G, 1, E] at `start` of a streamed window; return the window's [B, G, C, E]."""
        B = new.shape[0]
        window[:B, :, start:start + 1].copy_(new)
        return window[:B, :, :start + 1]
