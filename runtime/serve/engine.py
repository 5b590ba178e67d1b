"""`AsyncEngine`: the continuous batcher on its own thread, for asyncio code — the seam for scale-out.

    engine = Engine.from_plan("serve.yaml", weights="ckpts/opt-30b")
    server = AsyncEngine(engine, max_waiting=64)                     # starts the batcher's thread
    async for chunk in server.generate(GenerateRequest(prompt_ids, max_tokens=64, stop=("\\n\\n",))):
        print(chunk.text, end="")                                    # text as it comes; chunk.finish_reason last
    await server.shutdown(grace_seconds=30)                          # finish in-flight requests, cancel the rest

The HTTP server (runtime/serve/app.py) is one user of this class; an actor framework is another: a Ray Serve
deployment holds one AsyncEngine per replica and awaits `generate` from its own handler, with no HTTP layer here
(docs/serving.md, "Scale-out"). Nothing here imports FastAPI, uvicorn or prometheus_client.

The batcher (runtime/batching.py) steps on a daemon thread (torch releases the GIL in its kernels); its token
events are handed to the event loop with `call_soon_threadsafe`, one asyncio queue per request. Text is decoded
incrementally per request (`IncrementalText`): stop strings end a request where they begin (they are not part
of the text, as in the OpenAI API), text that could still become a stop string, or an incomplete UTF-8
character, is held back until it cannot.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

from liac.runtime.batching import ContinuousBatcher, Handle, QueueFull, Request, StepReport, TokenEvent
from liac.runtime.engine import Engine
from liac.runtime.sampling import SamplingParams

__all__ = ["GenerateRequest", "Chunk", "ShuttingDown", "EngineFailed", "IncrementalText", "Observer", "AsyncEngine",
           "RequestStream", "QueueFull"]


@dataclass(frozen=True)
class GenerateRequest:
    """One request in token ids: at most `max_tokens` new tokens, sampled as `sampling` says; it stops at any of
    `stop_ids` (the token is kept, its text is not: special tokens are left out) or of the `stop` strings (cut
    before them)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Chunk:
    """What a request produced since its last chunk: new text and token ids; on the last chunk, `finish_reason`
    ('stop', 'length', or 'cancelled' when the engine shut down first) and the token counts."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ShuttingDown(Exception):
    """The engine takes no new requests (it is shutting down)."""


class EngineFailed(Exception):
    """The batcher's thread stopped on an error: every request fails with it, /health reports it."""


class IncrementalText:
    """A request's text as its tokens come: `add(token)` → (new text safe to emit, the stop string it hit)."""

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.sent = 0  # characters of the text emitted so far

    def add(self, token: int) -> tuple[str, str | None]:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        hits = [(text.find(s, max(0, self.sent - len(s) + 1)), s) for s in self.stop]
        hits = [(at, s) for at, s in hits if at >= 0]
        if hits:
            at, stop = min(hits)
            out, self.sent = text[self.sent:at], at
            return out, stop
        hold = 1 if text.endswith("\ufffd") else 0  # an incomplete UTF-8 character: wait for its next byte
        for stop in self.stop:  # the longest tail of the text that begins a stop string
            for size in range(min(len(stop) - 1, len(text)), hold, -1):
                if stop.startswith(text[-size:]):
                    hold = size
                    break
        end = max(self.sent, len(text) - hold)
        out, self.sent = text[self.sent:end], end
        return out, None

    def flush(self) -> str:
        """The text held back, once the request ended without a stop string."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        out, self.sent = text[self.sent:], len(text)
        return out


class Observer:
    """What the engine reports as it runs (runtime/serve/metrics.py turns it into Prometheus metrics); each method
    is called on the batcher's thread, so it must be quick. The defaults do nothing."""

    def step(self, report: StepReport, live: int, waiting: int) -> None:
        """After each iteration: what it did, sequences live, requests waiting."""

    def first_token(self, seconds: float) -> None:
        """A request's first token, `seconds` after it was submitted."""

    def next_token(self, seconds: float) -> None:
        """A request's next token, `seconds` after its previous one."""

    def finished(self, reason: str, seconds: float, prompt_tokens: int, completion_tokens: int) -> None:
        """A request ended ('stop', 'length', 'cancelled'), `seconds` after it was submitted."""

    def rejected(self) -> None:
        """A request was refused: the queue was full."""


@dataclass
class _Open:
    """A request in flight, as the event loop sees it."""

    handle: Handle
    queue: asyncio.Queue
    last_token: float = 0.0
    tokens: int = 0
    done: bool = False


class RequestStream:
    """One submitted request as the event loop sees it: `async for chunk in stream`, `await stream.collect()`,
    `stream.cancel()` (any time; a no-op once it finished)."""

    def __init__(self, engine: "AsyncEngine", state: "_Open", text: IncrementalText | None, prompt_tokens: int):
        self.engine, self.state, self.text, self.prompt_tokens = engine, state, text, prompt_tokens
        self.id = state.handle.id

    def cancel(self) -> None:
        if not self.state.done:
            self.state.done = True
            self.state.handle.cancel()  # its row is freed at the next iteration
        self.engine._open.pop(self.id, None)

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        state, text, handle = self.state, self.text, self.state.handle
        try:
            while not state.done:
                event = await state.queue.get()
                if isinstance(event, BaseException):
                    raise EngineFailed(str(event)) from event
                ids = () if event.token is None else (event.token,)
                state.tokens += len(ids)
                delta, hit = text.add(event.token) if text is not None and event.token is not None else ("", None)
                reason = "stop" if hit else event.finish_reason
                if hit:
                    handle.cancel("stop")  # its row is freed at the next iteration
                elif reason is not None and text is not None:
                    delta += text.flush()
                if reason is not None:
                    state.done = True
                    yield Chunk(delta, ids, reason, self.prompt_tokens, state.tokens)
                    return
                yield Chunk(delta, ids)
        finally:
            self.cancel()  # the consumer left early (or it finished: then only forgotten)

    async def collect(self) -> Chunk:
        """The whole result: one Chunk with all the text and tokens and the finish reason."""
        texts, ids, last = [], [], None
        async for chunk in self:
            texts.append(chunk.text)
            ids.extend(chunk.token_ids)
            last = chunk
        return Chunk("".join(texts), tuple(ids), last.finish_reason, last.prompt_tokens, last.completion_tokens)


class AsyncEngine:
    """See the module docstring.

    Args:
        engine: an Engine (from_plan); a serving plan's gives every live batch size its own placement.
        max_waiting: requests waiting for a row before `generate` raises QueueFull.
        max_prefill_tokens: prompt tokens prefilled per iteration at most (runtime/batching.py).
        static_batching: admit only into an empty batch (the baseline; runtime/batching.py).
        grace_seconds: how long a shutdown lets requests in flight finish before it cancels them.
        observer: gets the metrics (runtime/serve/metrics.py), or None.
    """

    def __init__(self, engine: Engine, max_waiting: int = 64, max_prefill_tokens: int | None = None,
                 observer: Observer | None = None, grace_seconds: float = 30.0, static_batching: bool = False):
        self.engine = engine
        self.grace_seconds = grace_seconds
        self.batcher = ContinuousBatcher(engine, max_waiting, max_prefill_tokens, static=static_batching)
        self.observer = observer or Observer()
        self.error: BaseException | None = None
        self.accepting = True
        self._open: dict[int, _Open] = {}
        self._seen: dict[int, list] = {}  # request → [handle, tokens so far], until the thread sees it finish
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="liac-batcher", daemon=True)
        self._thread.start()

    # -- the event loop's side ---------------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def stats(self) -> dict[str, int]:
        """Sequences live, requests waiting, requests in flight (both), the most live at once."""
        return {"live": len(self.batcher.live), "waiting": self.batcher.queue_depth, "in_flight": len(self._open),
                "rows": self.batcher.rows}

    def open(self, request: GenerateRequest) -> "RequestStream":
        """Submit a request now (on the event loop's thread) and return its stream: iterate it for the Chunks,
        `cancel()` it to free its row. Errors come here, before anything is streamed.

        Raises:
            LiacError: the plan cannot hold it (prompt or max_tokens too long). QueueFull: too many wait.
            ShuttingDown: the engine takes no new requests. EngineFailed: the batcher's thread failed.
        """
        if self.error is not None:
            raise EngineFailed(str(self.error))
        if not self.accepting:
            raise ShuttingDown("the server is shutting down")
        self._loop = self._loop or asyncio.get_running_loop()
        batch_request = Request(tuple(request.prompt_ids), request.max_tokens, request.sampling,
                                tuple(request.stop_ids))
        try:
            handle = self.batcher.submit(batch_request)
        except QueueFull:
            self.observer.rejected()
            raise
        state = _Open(handle, asyncio.Queue())
        self._open[handle.id] = state  # before the thread can report on it: its reports go through this loop
        self._seen[handle.id] = [handle, 0]  # the thread's own record, for the metrics
        with self._wake:
            self._wake.notify()
        text = IncrementalText(self.tokenizer, request.stop) if self._has_text() else None
        return RequestStream(self, state, text, len(request.prompt_ids))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        """The request's text and tokens as they come (see `Chunk`); closing the iterator early (a client that
        left) cancels the request. Raises as `open` does."""
        stream = self.open(request)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            stream.cancel()

    async def complete(self, request: GenerateRequest) -> Chunk:
        """The whole result at once: one Chunk with all the text and tokens and the finish reason."""
        return await self.open(request).collect()

    async def shutdown(self, grace_seconds: float = 30.0) -> None:
        """Take no new requests; let those in flight finish for up to `grace_seconds`, cancel the rest (their
        streams end with finish_reason 'cancelled'), then stop the thread."""
        self.accepting = False
        deadline = time.monotonic() + grace_seconds
        while self.batcher.busy and time.monotonic() < deadline and self.error is None:
            await asyncio.sleep(0.02)
        for state in list(self._open.values()):
            state.handle.cancel()
        while self.batcher.busy and self.error is None and time.monotonic() < deadline + 5:
            await asyncio.sleep(0.02)  # the cancellations reach their streams at the next iteration
        self.close()

    def close(self) -> None:
        """Stop the batcher's thread (requests still in flight get no more events)."""
        self.accepting = False
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=60)

    def _has_text(self) -> bool:
        return self.engine.text.available()

    # -- the batcher's thread ------------------------------------------------------------------------------------
    def _run(self) -> None:
        timing: dict[int, float] = {}  # request → its latest token's time, on this thread
        try:
            while True:
                with self._wake:
                    while not self._stop and not self.batcher.busy:
                        self._wake.wait(timeout=1.0)
                    if self._stop:
                        return
                events = self.batcher.step()
                now = time.perf_counter()
                self.observer.step(self.batcher.last, len(self.batcher.live), self.batcher.queue_depth)
                for event in events:
                    self._observe(event, now, timing)
                    self._deliver(event)
        except BaseException as error:  # noqa: BLE001 - reported to every request and to /health
            self.error = error
            self.accepting = False
            for state in list(self._open.values()):
                self._deliver_to(state, error)

    def _observe(self, event: TokenEvent, now: float, timing: dict[int, float]) -> None:
        seen = self._seen.get(event.request)
        if seen is None:
            return
        handle = seen[0]
        if event.token is not None:
            if event.request in timing:
                self.observer.next_token(now - timing[event.request])
            else:
                self.observer.first_token(now - handle.submitted)
            timing[event.request] = now
            seen[1] += 1
        if event.finish_reason is not None:
            timing.pop(event.request, None)
            self._seen.pop(event.request, None)
            self.observer.finished(event.finish_reason, now - handle.submitted, len(handle.request.prompt_ids),
                                   seen[1])

    def _deliver(self, event: TokenEvent) -> None:
        state = self._open.get(event.request)
        if state is not None:
            self._deliver_to(state, event)

    def _deliver_to(self, state: _Open, item) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(state.queue.put_nowait, item)
