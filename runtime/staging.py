"""Streaming host-tier weights (and KV windows) into GPU staging buffers, ahead of compute.

There are prefetch_depth + 1 staging buffers of `spec.execution.staging_bytes` each, carved from the 'hbm' arena.
Streaming unit i of a phase (a layer whose GPU ops read weights from 'ddr'/'cxl', or at decode a host-tier KV cache)
is copied into buffer i mod n on a dedicated copy stream:

    issue(i)    copy stream: wait for buffer i mod n's `released` event (its previous unit is done with it),
                copy the unit's weights and the past tokens of its KV windows, record `copied[i mod n]`
    wait(i)     compute stream: wait for `copied[i mod n]`     (a 'wait' op, before the layer's first buffer reader)
    release(i)  compute stream: record `released[i mod n]`; issue(i + n)       (a 'release' op, after its last reader)

so while layer i computes, the copies of the next n - 1 units are in flight. `start` issues the first n units of a
forward pass unless `prime` already did at the end of the previous decode step (the copies then overlap the LM head
and the sampling too). A unit with KV windows also waits for `kv_written`, an event recorded on the compute stream
by `start` / `prime`: every K/V write of earlier passes (asynchronous GPU → pinned host copies) is then complete
before the window copy reads the cache. Every call is appended to `log` when a list is given, which is how the
tests check the order.
"""

from __future__ import annotations

import torch

from liac.runtime.backend import Backend
from liac.runtime.kvcache import KVCache
from liac.runtime.schedule import StreamUnit
from liac.sizes import numel

__all__ = ["Streamer"]


class Streamer:
    """Double (n-fold) buffered host → GPU streaming of the units of one phase at a time."""

    def __init__(self, backend: Backend, buffers: list[torch.Tensor], host_tensor, kv: KVCache,
                 dtype: torch.dtype, log: list | None = None):
        self.backend = backend
        self.buffers = buffers
        self.n = len(buffers)
        self.host_tensor = host_tensor  # (canonical parameter, tier) → host tensor
        self.kv = kv
        self.dtype = dtype
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.log = log
        self.copied = [backend.event() for _ in buffers]
        self.released = [None] * self.n
        self.kv_written = backend.event()
        self.stream = backend.copy_stream()
        self.units: tuple[StreamUnit, ...] = ()
        self.batch = 0
        self.past = 0
        self.issued = 0  # units of the current pass already issued
        self._primed: tuple | None = None  # (units, batch, past, issued) copied ahead for the next pass
        self._copies: dict[int, list] = {}  # id(unit) → [(staging view, host tensor, bytes)], built once

    # -- views into the buffers (the executor binds GPU modules to these once) ----------------------------------
    def view(self, slot: int, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
        nbytes = numel(shape) * self.itemsize
        return self.buffers[slot][offset:offset + nbytes].view(self.dtype).view(shape)

    def window(self, unit: StreamUnit, which: str) -> torch.Tensor:
        offset = dict(unit.kv)[which]
        return self.view(unit.slot, offset, self.kv.shape)

    def _copy_list(self, unit: StreamUnit, slot: int) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """(staging view, host rows, bytes) per row block: a whole parameter is one block; a split unit's GPU part
        packs its blocks (for gate_up: gate rows, then up rows) one after another, so its staged weight is one
        contiguous tensor."""
        out = []
        for piece in unit.weights:
            staged = self.view(slot, piece.offset, piece.shape)
            host = self.host_tensor(piece.param.canonical, piece.tier)
            row = 0
            for first, count in piece.rows:
                src = host[first:first + count]
                out.append((staged[row:row + count], src, src.numel() * src.element_size()))
                row += count
        return out

    # -- the protocol -------------------------------------------------------------------------------------------
    def start(self, units: tuple[StreamUnit, ...], batch: int, past: int) -> None:
        """Begin a pass over `units` whose attention sees `past` cached tokens; issue what is not yet in flight."""
        primed = self._primed
        if primed is not None and primed[0] is units and primed[1:3] == (batch, past):
            self.issued = self._primed[3]
        else:
            self.issued = 0
        self._primed = None
        self.units, self.batch, self.past = units, batch, past
        self.kv_written.record()
        if self.log is not None:
            self.log.append(("start", self.issued))
        for index in range(self.issued, min(self.n, len(units))):
            self._issue(index)

    def prime(self, units: tuple[StreamUnit, ...], batch: int, past: int) -> None:
        """Issue the first units of the next pass now (called after the current pass's last layer)."""
        self.units, self.batch, self.past = units, batch, past
        self.kv_written.record()
        count = min(self.n, len(units))
        for index in range(count):
            self._issue(index)
        self._primed = (units, batch, past, count)

    def wait(self, index: int) -> None:
        if self.log is not None:
            self.log.append(("wait", index))
        self.copied[index % self.n].wait()

    def release(self, index: int) -> None:
        if self.log is not None:
            self.log.append(("release", index))
        slot = index % self.n
        event = self.released[slot] or self.backend.event()
        event.record()
        self.released[slot] = event
        following = index + self.n
        if following < len(self.units):
            self._issue(following)

    def _issue(self, index: int) -> None:
        unit = self.units[index]
        slot = index % self.n
        if self.log is not None:
            self.log.append(("issue", index))
        backend = self.backend
        with backend.on_stream(self.stream):
            if self.released[slot] is not None:
                self.released[slot].wait(self.stream)
            copies = self._copies.get(id(unit))
            if copies is None:
                copies = self._copies[id(unit)] = self._copy_list(unit, slot)
            for dst, src, nbytes in copies:
                dst.copy_(src, non_blocking=True)
                backend.transfers.count(nbytes, True, "stream")
                backend.transfers.streamed_bytes += nbytes
            if unit.kv and self.past:
                self.kv_written.wait(self.stream)
                layer = unit.layer
                B, G, C, E = self.kv.shape
                for which, offset in unit.kv:
                    cache = self.kv.k[layer] if which == "k" else self.kv.v[layer]
                    window = self.view(slot, offset, self.kv.shape)
                    # One contiguous [past, E] run per (sequence, kv head), strided apart: one 2-D copy.
                    rows = self.batch * G
                    backend.copy_rows(window.view(B * G, C, E)[:rows, :self.past],
                                      cache.view(B * G, C, E)[:rows, :self.past])
                    nbytes = self.batch * G * self.past * E * cache.element_size()
                    backend.transfers.count(nbytes, True, "stream")
                    backend.transfers.streamed_bytes += nbytes
            self.copied[slot].record(self.stream)
