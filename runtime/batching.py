"""Continuous batching: requests join and leave the running decode batch between steps (iteration-level scheduling).

    batcher = ContinuousBatcher(engine)                               # an Engine over any plan (a serving plan's best)
    handle = batcher.submit(Request([5, 6, 7], max_tokens=16))        # any thread; QueueFull past `max_waiting`
    while batcher.busy:
        for event in batcher.step():                                  # TokenEvent(request, token, finish_reason)
            ...

One iteration (`step`):

1. *retire*: sequences that finished (EOS or a stop token, `max_tokens`, or cancelled: a client that left) give
   their cache rows back; the last live rows move into the holes (`KVCache.move_row`, their tokens only), so the
   live batch is always rows 0..b-1 and every pass reads a prefix of the cache;
2. *admit*: waiting requests, oldest first, while rows are free and their prompt tokens (left-padded to the
   group's longest) fit `max_prefill_tokens`, are prefilled together in one pass into the rows behind the running
   ones (`Executor.forward(first_row=b)`), with the compute placement the plan has for a batch of that many
   (`Engine.executor_for`); each gets its first token (time to first token);
3. *decode*: one step of every live sequence, the newcomers included, with the placement planned for the live
   batch size b. Sequences sit at different lengths: each writes its K/V at its own column and attends to its
   own slots (`Executor.forward(columns=)`; its padding from step 2 masked as `runtime/sequences.py` does).

**How a newcomer's prefill shares time with running streams: interleaving, bounded.** A prefill runs between two
decode steps of the running sequences (no chunking: the schedule prefills a prompt in one pass), and at most
`max_prefill_tokens` prompt tokens are prefilled per iteration, so a running stream waits at most one bounded
prefill per token; a burst of arrivals is admitted over several iterations instead of stalling every stream for
all of them. bench/serve_load.py measures what it costs the inter-token latency (docs/serving.md).

**Static batching** (`static=True`, `lia-serve --static-batching`: the baseline continuous batching is measured
against): newcomers are admitted only when no sequence is live, as many as the rows hold (the prefill budget does
not cut the batch); the batch then decodes until its last sequence is done, its finished rows idle meanwhile.

Sampling is per sequence: its own SamplingParams and its own generator (seeded from (seed, 0), as
`Engine.generate` seeds a batch of one), so its tokens do not depend on what else shares its steps; greedy tokens
are the argmax of its own logits — the same alone or in a busy batch up to the batched kernels' rounding
(tests/runtime/test_batching.py checks them equal in float32).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from liac.errors import LiacError
from liac.runtime.engine import Engine
from liac.runtime.sampling import Sampler, SamplingParams, generator_for
from liac.runtime.sequences import PromptBatch

__all__ = ["Request", "Handle", "TokenEvent", "StepReport", "QueueFull", "ContinuousBatcher", "check_servable"]


@dataclass(frozen=True)
class Request:
    """What one client asks for: token ids in, at most `max_tokens` new tokens out.

    Attributes:
        prompt_ids: the prompt's token ids (at least one; at most the plan's prompt_len).
        max_tokens: new tokens at most; prompt + max_tokens must fit the plan's context (prompt_len + gen_len).
        sampling: temperature, top-p, top-k, seed (greedy by default).
        stop_ids: token ids that end the sequence (its EOS ids); the stop token is the last one emitted.
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop_ids: tuple[int, ...] = ()


class QueueFull(Exception):
    """More requests wait than the batcher takes (`max_waiting`): retry later."""


class TokenEvent(NamedTuple):
    """One new token of one request; `finish_reason` ('stop', 'length', 'cancelled') on its last event ('cancelled'
    events carry no token: `token` is None)."""

    request: int
    token: int | None
    finish_reason: str | None


@dataclass
class StepReport:
    """What the last iteration did (for metrics): batch sizes, tokens, seconds."""

    prefill_sequences: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_batch: int = 0
    decode_seconds: float = 0.0


@dataclass
class Handle:
    """A submitted request: its id, and `cancel()` (any thread) to free its row at the next iteration."""

    id: int
    request: Request
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    reason: str = "cancelled"

    def cancel(self, reason: str = "cancelled") -> None:
        """Finish the request at the next iteration with `reason` (a client that left: 'cancelled'; a stop string
        the text layer found: 'stop')."""
        self.reason = reason
        self.cancelled = True


@dataclass
class _Live:
    """A sequence in cache row `row` (its index in `ContinuousBatcher.live`): its slots are pad .. column - 1."""

    handle: Handle
    pad: int
    column: int          # where its next token's K/V goes
    last: int            # its latest token (the next decode step's input)
    generated: int = 1
    generator: torch.Generator | None = None
    finish: str | None = None


def check_servable(plan, source: str = "plan") -> None:
    """Continuous batching serves dense models: a mixture of experts' plan (experts placed by count, grouped by
    expert per pass) is refused in one LiacError line naming the plan's file; lia-run runs it."""
    cfg = plan.model_config
    if cfg.is_moe:
        raise LiacError(source, f"model '{cfg.name}' is a mixture of experts ({cfg.num_experts} experts): lia-serve "
                                "and continuous batching serve dense models only; run this plan with lia-run")


class ContinuousBatcher:
    """Iteration-level scheduling over one Engine (see the module docstring).

    Args:
        engine: an Engine over a plan; a serving plan (`liac compile --serve`) gives each live batch size its own
            compute placement. Its plan's batch size is the most sequences live at once (the KV cache's rows).
        max_waiting: requests that may wait for a row; `submit` raises QueueFull beyond it.
        max_prefill_tokens: prompt tokens (left-padded) prefilled per iteration at most (default: the plan's
            prompt_len: one full prompt, or several short ones); a request longer than it is prefilled alone.
        static: static batching (see the module docstring): admit only into an empty batch, up to its rows.
    """

    def __init__(self, engine: Engine, max_waiting: int = 64, max_prefill_tokens: int | None = None,
                 static: bool = False):
        check_servable(engine.plan)
        work = engine.plan.spec.workload
        self.engine = engine
        self.rows = work.batch_size
        self.prompt_limit = work.prompt_len
        self.context = work.prompt_len + work.gen_len  # prompt + new tokens a row holds
        self.max_waiting = max_waiting
        self.max_prefill_tokens = max_prefill_tokens or work.prompt_len
        self.static = static
        self.pad_id = engine.text.pad_id() if engine.text.available() else 0
        self.live: list[_Live] = []
        self.waiting: deque[Handle] = deque()
        self.last = StepReport()
        self._ids = itertools.count()
        self._lock = threading.Lock()

    # -- any thread ------------------------------------------------------------------------------------------------
    def check(self, request: Request) -> None:
        """Refuse what the plan cannot hold, in one LiacError line naming the request's field."""
        length = len(request.prompt_ids)
        if not 1 <= length <= self.prompt_limit:
            raise LiacError("prompt", f"must have 1 to {self.prompt_limit} tokens (spec.workload.prompt_len of plan "
                            f"'{self.engine.plan.metadata.name}'), got {length}")
        most = self.context - length
        if not isinstance(request.max_tokens, int) or not 1 <= request.max_tokens <= most:
            raise LiacError("max_tokens", f"must be between 1 and {most} (the plan's context is prompt_len + gen_len "
                            f"= {self.context} tokens, the prompt takes {length}), got {request.max_tokens}")
        vocab = self.engine.cfg.vocab_size
        if any(not 0 <= t < vocab for t in request.prompt_ids):
            raise LiacError("prompt", f"token ids must be in 0..{vocab - 1}")

    def submit(self, request: Request) -> Handle:
        """Queue a request (checked first); it joins the running batch at a coming iteration.

        Raises:
            LiacError: the plan cannot hold it. QueueFull: `max_waiting` requests already wait.
        """
        self.check(request)
        with self._lock:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests wait already (max_waiting {self.max_waiting})")
            handle = Handle(next(self._ids), request)
            self.waiting.append(handle)
        return handle

    @property
    def busy(self) -> bool:
        return bool(self.live) or bool(self.waiting)

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    # -- the batcher's thread --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[TokenEvent]:
        """One iteration: retire, admit and prefill, decode one token of every live sequence."""
        events = self._retire()
        report = StepReport()
        group = self._admit()
        if group:
            events += self._prefill(group, report)
            events += self._retire()  # a newcomer may be done at once (max_tokens 1, an EOS first)
        if self.live:
            events += self._decode(report)
        self.last = report
        return events

    def _retire(self) -> list[TokenEvent]:
        """Drop finished and cancelled sequences (and cancelled waiting requests); keep live rows 0..b-1."""
        events = []
        with self._lock:
            for handle in [h for h in self.waiting if h.cancelled]:
                self.waiting.remove(handle)
                events.append(TokenEvent(handle.id, None, handle.reason))
        for seq in self.live:
            if seq.finish is None and seq.handle.cancelled:
                seq.finish = seq.handle.reason
                events.append(TokenEvent(seq.handle.id, None, seq.finish))
        keep = sum(seq.finish is None for seq in self.live)
        holes = [row for row in range(keep) if self.live[row].finish is not None]
        movers = [row for row in range(keep, len(self.live)) if self.live[row].finish is None]
        for hole, mover in zip(holes, movers):
            seq = self.live[mover]
            self.engine.executor.kv.move_row(mover, hole, seq.pad, seq.column)
            self.live[hole] = seq
        del self.live[keep:]
        return events

    def _admit(self) -> list[Handle]:
        """The oldest waiting requests that fit the free rows and the prefill budget together (at least one)."""
        group: list[Handle] = []
        if self.static and self.live:
            return group  # a static batch runs to its end before the next one starts
        with self._lock:
            while self.waiting and len(self.live) + len(group) < self.rows:
                candidate = self.waiting[0]
                if candidate.cancelled:
                    break  # retired at the next iteration
                width = max(len(h.request.prompt_ids) for h in group + [candidate])
                fits = all(width + h.request.max_tokens <= self.context for h in group + [candidate])
                if group and (not fits or (not self.static and width * (len(group) + 1) > self.max_prefill_tokens)):
                    break
                group.append(self.waiting.popleft())
        return group

    def _prefill(self, group: list[Handle], report: StepReport) -> list[TokenEvent]:
        """One prefill pass of the newcomers, into rows b .. b + k - 1; each gets its first token."""
        began = time.perf_counter()
        batch = PromptBatch.from_lists([list(h.request.prompt_ids) for h in group], self.pad_id)
        executor = self.engine.executor_for(batch.size)
        generators = [None if h.request.sampling.greedy else generator_for(h.request.sampling) for h in group]
        pick = Sampler([h.request.sampling for h in group], generators)
        frame = executor.forward("prefill", batch.ids, 0, pad=executor.padding(batch.pad), pick=pick,
                                 first_row=len(self.live))
        tokens = frame.vals["next"][executor.head_device["prefill"]][:, 0].tolist()
        events = []
        for handle, pad, token, generator in zip(group, batch.pad.tolist(), tokens, generators):
            seq = _Live(handle, pad, batch.width, token, generator=generator)
            seq.finish = self._finished(seq, token)
            self.live.append(seq)
            events.append(TokenEvent(handle.id, token, seq.finish))
        report.prefill_sequences, report.prefill_tokens = batch.size, batch.ids.numel()
        report.prefill_seconds = time.perf_counter() - began
        return events

    def _decode(self, report: StepReport) -> list[TokenEvent]:
        """One decode step of rows 0..b-1, each at its own column."""
        began = time.perf_counter()
        live = self.live
        executor = self.engine.executor_for(len(live))
        devices = self.engine.backend.devices
        columns = torch.tensor([seq.column for seq in live])
        pads = torch.tensor([seq.pad for seq in live])
        place = {d: devices[d] for d in executor.devices}
        ids = torch.tensor([[seq.last] for seq in live]).to(devices[executor.decode_embed_device])
        pick = Sampler([seq.handle.request.sampling for seq in live], [seq.generator for seq in live])
        frame = executor.forward("decode", ids, int(columns.max()), pad={d: pads.to(v) for d, v in place.items()},
                                 pick=pick, columns={d: columns.to(v) for d, v in place.items()})
        tokens = frame.vals["next"][executor.head_device["decode"]][:, 0].tolist()
        events = []
        for seq, token in zip(live, tokens):
            seq.column += 1
            seq.last = token
            seq.generated += 1
            seq.finish = self._finished(seq, token)
            events.append(TokenEvent(seq.handle.id, token, seq.finish))
        report.decode_batch = len(live)
        report.decode_seconds = time.perf_counter() - began
        return events

    @staticmethod
    def _finished(seq: _Live, token: int) -> str | None:
        request = seq.handle.request
        if token in request.stop_ids:
            return "stop"
        if seq.generated >= request.max_tokens:
            return "length"
        return None
