"""Streaming host-tier weights (and KV windows) into GPU staging buffers, ahead of compute.

There are prefetch_depth + 1 staging buffers of `spec.execution.staging_bytes` each, carved from the 'hbm' arena.
Stream unit i of a phase (a layer whose GPU ops read weights from 'ddr'/'cxl', or at decode a host-tier KV cache)
is copied into buffer i mod n on a dedicated copy stream:

    issue(i)    copy stream: wait for buffer i mod n's `released` event (its previous stream unit is done with it),
                copy the stream unit's weights and the past tokens of its KV windows, record `copied[i mod n]`
    wait(i)     compute stream: wait for `copied[i mod n]`     (a 'wait' op, before the layer's first buffer reader)
    release(i)  compute stream: record `released[i mod n]`; issue(i + n)       (a 'release' op, after its last reader,
                after a split reader's join: the join's crossing must not queue behind the next copy)

so while layer i computes, the copies of the next n - 1 stream units are in flight. `start` issues the first n of a
forward pass unless `prime` already did at the end of the previous decode step (the copies then overlap the LM head
and the sampling too). A stream unit with KV windows also waits for `kv_written`, an event recorded on the compute
stream by `start` / `prime`: every K/V write of earlier passes (asynchronous GPU → pinned host copies) is then complete
before the window copy reads the cache. Every call is appended to `log` when a list is given, which is how the
tests check the order.

Routed experts (an MoE layer's streamed experts) cannot be copied ahead: which ones a step needs is known only
after its router. `routed_experts` copies them, in the experts op, on a copy stream of their own through the
layer's expert slots (after its other streamed tensors in its staging buffer): slot j mod n takes routed expert j
once expert j - n is computed, so the copy of the next expert overlaps the compute of the current one. Only the
experts the step's tokens are routed to cross PCIe.
"""

from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

import torch

from liac.runtime.backend import Backend
from liac.runtime.kvcache import KVCache
from liac.runtime.memory import aligned
from liac.runtime.schedule import StreamUnit
from liac.sizes import numel

__all__ = ["Streamer"]


class _Copy(NamedTuple):
    """One row block of a stream unit: its view in the staging buffer, the host rows it copies, their bytes."""

    staged: torch.Tensor
    host: torch.Tensor
    nbytes: int


class _Primed(NamedTuple):
    """The first stream units of the next pass, issued ahead (`prime`): for which pass and how many."""

    stream_units: tuple[StreamUnit, ...]
    batch: int
    past: int
    issued: int


def _piece_shape(piece) -> tuple[int, ...]:
    """The staged shape of one piece of a routed expert (`Streamer.routed_experts`): a host tensor's own; a tuple of
    row blocks (an expert's gate rows and up rows of its GPU share of the intermediate features), packed."""
    if isinstance(piece, tuple):
        return (sum(block.shape[0] for block in piece), *piece[0].shape[1:])
    return tuple(piece.shape)


def _copy_piece(backend: Backend, dst: torch.Tensor, piece) -> int:
    """Copy one piece into its staged tensor on the current stream; its bytes. Row blocks one after another; a
    column block of a matrix (rows contiguous, strided apart: down's share of the features) as one 2-D copy."""
    if isinstance(piece, tuple):
        row = 0
        for block in piece:
            dst[row:row + block.shape[0]].copy_(block, non_blocking=True)
            row += block.shape[0]
        return sum(block.numel() * block.element_size() for block in piece)
    if piece.is_contiguous():
        dst.copy_(piece, non_blocking=True)
    else:
        backend.copy_rows(dst.unsqueeze(1), piece.unsqueeze(1))
    return piece.numel() * piece.element_size()


class Streamer:
    """Double (n-fold) buffered host → GPU streaming of the stream units of one phase at a time."""

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
        self._alone = False  # a warm-up pass (`begin_alone`): not logged, no prefetch
        self.copied = [backend.event() for _ in buffers]
        self.released = [None] * self.n
        self.kv_written = backend.event()
        self.stream = backend.copy_stream()
        self.stream_units: tuple[StreamUnit, ...] = ()
        self.batch = 0
        self.past = 0
        self.issued = 0  # stream units of the current pass already issued
        self._primed: _Primed | None = None  # copied ahead for the next pass
        self._copies: dict[int, list[_Copy]] = {}  # id(stream unit) → its copies, built once
        self.expert_stream = backend.new_copy_stream()
        self._expert_events: dict[tuple[int, int], tuple] = {}  # (buffer, expert slot) → (copied, freed) events
        self._expert_views: dict[tuple, list[torch.Tensor]] = {}  # (buffer, slot offset, shapes) → its views

    # -- views into the buffers (the executor binds GPU modules to these once) ----------------------------------
    def view(self, slot: int, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
        nbytes = numel(shape) * self.itemsize
        return self.buffers[slot][offset:offset + nbytes].view(self.dtype).view(shape)

    def window(self, stream_unit: StreamUnit, which: str) -> torch.Tensor:
        offset = dict(stream_unit.kv)[which]
        return self.view(stream_unit.slot, offset, stream_unit.kv_shape or self.kv.shape)

    def _copy_list(self, stream_unit: StreamUnit, slot: int) -> list[_Copy]:
        """One copy per row block: a whole parameter is one block; a split unit's GPU part
        packs its blocks (for gate_up: gate rows, then up rows) one after another, so its staged weight is one
        contiguous tensor."""
        out = []
        for piece in stream_unit.weights:
            staged = self.view(slot, piece.offset, piece.shape)
            host = self.host_tensor(piece.param.canonical, piece.tier)
            row = 0
            for first, count in piece.rows:
                src = host[first:first + count]
                out.append(_Copy(staged[row:row + count], src, src.numel() * src.element_size()))
                row += count
        return out

    def expert_slot(self, stream_unit: StreamUnit, index: int, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """The staged tensors of expert slot `index` of a stream unit: one per expert parameter, of `shapes`."""
        offset, out = stream_unit.expert_slots[index], []
        for shape in shapes:
            out.append(self.view(stream_unit.slot, offset, shape))
            offset += aligned(numel(shape) * self.itemsize)
        return out

    def _expert_slot_views(self, stream_unit: StreamUnit, index: int, shapes: tuple) -> list[torch.Tensor]:
        """`expert_slot`, made once per (buffer, slot, shapes): an experts op of every MoE layer at every step asks
        for them (a dozen tensor views each time, host time on the step's chain otherwise)."""
        key = (stream_unit.slot, stream_unit.expert_slots[index], shapes)
        views = self._expert_views.get(key)
        if views is None:
            views = self._expert_views[key] = self.expert_slot(stream_unit, index, list(shapes))
        return views

    def routed_experts(self, stream_unit: StreamUnit, experts: list[int],
                       sources: Callable[[int], list[torch.Tensor]]) -> Iterator[tuple[int, list[torch.Tensor]]]:
        """Copy the routed `experts` (their host tensors: `sources(expert)`) through the stream unit's expert slots
        (see the module docstring); the returned iterator yields (expert, its staged tensors) once its copy is on the
        compute stream's side. The caller computes with them before asking for the next one. The first copies (one
        per slot) are issued by this call itself, not at the iterator's first step: a caller launches other work
        (the GPU's resident experts) while they run."""
        n = len(stream_unit.expert_slots)
        backend, stream = self.backend, self.expert_stream
        pieces = {expert: sources(expert) for expert in experts}
        # per position, its slot's staged tensors: an expert's whole matrices, or a part of one (`_piece_shape`)
        staged = [self._expert_slot_views(stream_unit, position % n, tuple(_piece_shape(p) for p in pieces[e]))
                  for position, e in enumerate(experts)]
        events = [self._expert_events.setdefault((stream_unit.slot, j), (backend.event(), backend.event()))
                  for j in range(n)]
        begun = backend.event()
        begun.record()  # the slots' previous users are all enqueued before this on the compute stream

        def issue(position: int) -> None:
            slot = position % n
            with backend.on_stream(stream):
                (begun if position < n else events[slot][1]).wait(stream)
                for dst, piece in zip(staged[position], pieces[experts[position]]):
                    nbytes = _copy_piece(backend, dst, piece)
                    backend.transfers.count(nbytes, True, "experts")
                    backend.transfers.streamed_bytes += nbytes
                events[slot][0].record(stream)
            if self.log is not None:
                self.log.append(("expert", stream_unit.index, experts[position]))

        for position in range(min(n, len(experts))):
            issue(position)

        def staged_experts() -> Iterator[tuple[int, list[torch.Tensor]]]:
            for position, expert in enumerate(experts):
                slot = position % n
                events[slot][0].wait()
                yield expert, staged[position]
                events[slot][1].record()  # its compute is enqueued: the slot may be refilled after it
                if position + n < len(experts):
                    issue(position + n)
        return staged_experts()

    # -- the protocol -------------------------------------------------------------------------------------------
    def start(self, stream_units: tuple[StreamUnit, ...], batch: int, past: int) -> None:
        """Begin a pass over `stream_units` whose attention sees `past` cached tokens; issue what is not in flight."""
        primed = self._primed
        if primed is not None and primed.stream_units is stream_units and (primed.batch, primed.past) == (batch, past):
            self.issued = primed.issued
        else:
            self.issued = 0
        self._primed = None
        self.stream_units, self.batch, self.past = stream_units, batch, past
        self.kv_written.record()
        self._alone = False
        if self.log is not None:
            self.log.append(("start", self.issued))
        for index in range(self.issued, min(self.n, len(stream_units))):
            self._issue(index)

    def prime(self, stream_units: tuple[StreamUnit, ...], batch: int, past: int) -> None:
        """Issue the first stream units of the next pass now (called after the current pass's last layer)."""
        self._alone = False
        self.stream_units, self.batch, self.past = stream_units, batch, past
        self.kv_written.record()
        count = min(self.n, len(stream_units))
        for index in range(count):
            self._issue(index)
        self._primed = _Primed(stream_units, batch, past, count)

    def begin_alone(self, stream_units: tuple[StreamUnit, ...], batch: int, past: int) -> None:
        """Begin a pass that copies each stream unit only when it is reached (`issue`), nothing ahead: the warm-up
        pass, which runs a few layers of the phase's program (runtime/executor.py `Executor.warm_up`)."""
        self.stream_units, self.batch, self.past, self.issued = stream_units, batch, past, 0
        self._primed = None
        self._alone = True
        self.kv_written.record()

    def issue(self, index: int) -> None:
        """Copy stream unit `index` of the current pass into its buffer now."""
        self._issue(index)

    def wait(self, index: int) -> None:
        if self.log is not None and not self._alone:
            self.log.append(("wait", index))
        self.copied[index % self.n].wait()

    def release(self, index: int) -> None:
        if self.log is not None and not self._alone:
            self.log.append(("release", index))
        slot = index % self.n
        event = self.released[slot] or self.backend.event()
        event.record()
        self.released[slot] = event
        following = index + self.n
        if following < len(self.stream_units) and not self._alone:  # a warm-up pass copies nothing ahead
            self._issue(following)

    def _issue(self, index: int) -> None:
        stream_unit = self.stream_units[index]
        slot = index % self.n
        if self.log is not None and not self._alone:
            self.log.append(("issue", index))
        backend = self.backend
        with backend.on_stream(self.stream):
            if self.released[slot] is not None:
                self.released[slot].wait(self.stream)
            copies = self._copies.get(id(stream_unit))
            if copies is None:
                copies = self._copies[id(stream_unit)] = self._copy_list(stream_unit, slot)
            for dst, src, nbytes in copies:
                dst.copy_(src, non_blocking=True)
                backend.transfers.count(nbytes, True, "stream")
                backend.transfers.streamed_bytes += nbytes
            if stream_unit.kv and self.past:
                self.kv_written.wait(self.stream)
                layer = stream_unit.layer
                B, G, C, E = stream_unit.kv_shape or self.kv.shape  # the window's rows: this plan's batch
                for which, offset in stream_unit.kv:
                    cache = self.kv.k[layer] if which == "k" else self.kv.v[layer]
                    window = self.view(slot, offset, (B, G, C, E))
                    # One contiguous [past, E] run per (sequence, kv head), strided apart: one 2-D copy.
                    rows = self.batch * G
                    backend.copy_rows(window.view(B * G, C, E)[:rows, :self.past],
                                      cache.view(-1, C, E)[:rows, :self.past])
                    nbytes = self.batch * G * self.past * E * cache.element_size()
                    backend.transfers.count(nbytes, True, "stream")
                    backend.transfers.streamed_bytes += nbytes
            self.copied[slot].record(self.stream)
