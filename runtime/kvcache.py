"""The KV cache: one preallocated [B, G, C, E] K and V per decoder layer, in the tier its layer group names.

B is the plan's batch, C = prompt + gen - 1 tokens (the last generated token is never attended to), G key/value
heads, E head dim. The device that computes qkv writes this step's K/V (`write`, crossing PCIe when the cache lives
on the other device); attention reads it in place (`view`) or, on the GPU over a host-tier cache, from a window in
the layer's staging buffer that the Streamer filled with the past tokens (`write_window` adds this step's token).

A pass writes batch rows 0..B-1 at one column `start` (a batch generated together), unless the continuous batcher
(runtime/batching.py) sets a *cursor* for it (`Executor.forward(first_row=, columns=)`): `first_row` puts a
newcomer's prefill in its own rows behind the running sequences, and `columns` [B] gives a decode pass one write
column per row — sequences of different lengths decoding together (their attention masks say where each starts
and ends). `move_row` moves a sequence's tokens into a freed row, so the live rows stay 0..B-1.
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
        self.first_row = 0  # the current pass's first row (a newcomer's prefill: behind the running rows)
        self.columns: dict[str, torch.Tensor] | None = None  # per device, each row's write column [B] (ragged)

    def set_cursor(self, first_row: int = 0, columns: dict[str, torch.Tensor] | None = None) -> None:
        """Where the next pass writes: rows from `first_row` on, each at `columns[device][row]` when given (one
        query token per row), else all at the pass's `start`."""
        self.first_row, self.columns = first_row, columns

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int, crosses: bool, row: int = 0,
              beside: bool = False) -> None:
        """Store this step's k, v [B, G, Q, E] at positions start .. start + Q - 1 of sequences row .. row + B - 1
        (counted from the cursor's first row), or at the cursor's columns.

        `beside`: a GPU → host write may run on the backend's store stream, beside the compute that follows (a
        prefill's, Eq. 20 of docs/cost-model.md); `Backend.join_stores` orders the compute stream after it."""
        B, _, Q, _ = k.shape
        if self.columns is not None:
            self._write_ragged(layer, k, v, crosses)
            return
        rows = slice(self.first_row + row, self.first_row + row + B)
        dst_k = self.k[layer][rows, :, start:start + Q]
        dst_v = self.v[layer][rows, :, start:start + Q]
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

    def written(self, layer: int, which: str, row: int, batch: int, context: int) -> torch.Tensor:
        """K or V of the first `context` tokens of the `batch` sequences a pass wrote from `row` on (counted from
        the cursor's first row, as `write` counts), [B, G, C, E]: a strided view, no copy."""
        cache = self.k[layer] if which == "k" else self.v[layer]
        first = self.first_row + row
        return cache[first:first + batch, :, :context]

    def capacity(self, layer: int, which: str, batch: int) -> torch.Tensor:
        """K or V of every position the cache holds, [B, G, C_max, E]: contiguous per sequence and head, which the
        CPU's batched matmuls need to run at memory speed (positions past the context are zeros or stale tokens;
        attention cuts or zero-weights them)."""
        cache = self.k[layer] if which == "k" else self.v[layer]
        return cache[:batch]

    def _write_ragged(self, layer: int, k: torch.Tensor, v: torch.Tensor, crosses: bool) -> None:
        """k, v [B, G, 1, E]: row b at its own column. Across PCIe, one copy per row (a [G, 1, E] view of the
        cache is G runs, one 2-D copy on CUDA)."""
        B = k.shape[0]
        to_gpu = self.home[layer] == "gpu"
        for cache, new in ((self.k[layer], k), (self.v[layer], v)):
            if crosses:
                columns = self.columns["cpu"].tolist()
                for row in range(B):
                    column = columns[row]
                    self.backend.copy_into(cache[row, :, column:column + 1], new[row], to_gpu, "kv")
            else:  # the cache is on this device
                cache[torch.arange(B, device=new.device), :, self.columns[self.home[layer]]] = new[:, :, 0]

    def write_window(self, window: torch.Tensor, new: torch.Tensor, start: int) -> torch.Tensor:
        """Put this step's new [B, G, 1, E] at `start` (or each row's cursor column) of a streamed window; return
        the window's [B, G, C, E]."""
        B = new.shape[0]
        if self.columns is not None:
            window[torch.arange(B, device=new.device), :, self.columns["gpu"]] = new[:, :, 0]
        else:
            window[:B, :, start:start + 1].copy_(new)
        return window[:B, :, :start + 1]

    def move_row(self, source: int, target: int, first: int, last: int) -> None:
        """Copy positions first .. last - 1 of row `source` into row `target`, in every layer (within each tier:
        a memcpy on the host, a device copy on the GPU)."""
        for cache in self.k + self.v:
            cache[target, :, first:last].copy_(cache[source, :, first:last])
