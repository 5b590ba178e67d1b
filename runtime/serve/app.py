"""The OpenAI-compatible HTTP API over an AsyncEngine (FastAPI): what `lia-serve` runs.

    GET  /v1/models             the one model served (its name: --model-name, default the checkpoint's folder)
    POST /v1/completions        prompt (a string, strings, token ids or lists of them) → text; `stream` for SSE
    POST /v1/chat/completions   messages → the assistant's reply, through the checkpoint's chat template
    GET  /health                200 while the engine runs; 503 once it failed or is shutting down
    GET  /metrics               Prometheus text (runtime/serve/metrics.py)

Requests follow the OpenAI API: `max_tokens` (chat: also `max_completion_tokens`), `temperature`, `top_p`, `seed`,
`stop` (a string or up to 4), `stream` with `stream_options.include_usage`, `n` = 1; `top_k` as an extra field
(vLLM's name). A sequence ends at the checkpoint's EOS tokens, a stop string (cut before it) or `max_tokens`;
`usage` counts prompt and completion tokens. Fields liac does not implement (`logprobs`, `echo`, `best_of`,
`suffix`, penalties, `logit_bias`, `tools`, `n` > 1) are refused by name rather than ignored.

Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 a bad request (the field named:
pydantic's validation or the plan's limits: a prompt longer than spec.workload.prompt_len, a max_tokens past the
context), 404 another model, 429 the queue is full (with Retry-After), 503 shutting down, 500 the engine failed.
A client that disconnects cancels its request: its batch row is free at the next iteration. A server without a
tokenizer (`--random-weights`, benchmarks) takes token-id prompts and answers each completion choice, and each
streamed chunk, with its `token_ids` besides the (empty) text.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from liac.errors import LiacError
from liac.runtime.sampling import SamplingParams
from liac.runtime.serve.engine import (AsyncEngine, Chunk, EngineFailed, GenerateRequest, QueueFull, RequestStream,
                                       ShuttingDown)
from liac.runtime.serve.metrics import CONTENT_TYPE

__all__ = ["create_app", "CompletionRequest", "ChatRequest", "APIError"]

MAX_STOPS = 4  # the OpenAI API's limit on `stop` strings


# -- requests -------------------------------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    """The fields both endpoints share (unknown fields are ignored, as OpenAI-compatible servers do)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)  # not OpenAI's: vLLM's extra field (extra_body={"top_k": 40})
    seed: int | None = Field(default=None, ge=0)
    n: int = Field(default=1, ge=1)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(default=16, ge=1)  # the OpenAI API's default for completions
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: Union[str, list[dict[str, Any]], None] = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None


class APIError(Exception):
    """An OpenAI-style error response."""

    TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_exceeded",
             500: "internal_server_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.http_status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.http_status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.http_status, headers=self.headers)


# -- the app --------------------------------------------------------------------------------------------------------
def create_app(engine: AsyncEngine, model_name: str, metrics=None, close_engine: bool = True) -> FastAPI:
    """The FastAPI app serving `engine` as model `model_name`; `metrics` (a ServeMetrics) for /metrics. On the
    app's shutdown the engine finishes what is in flight (AsyncEngine.shutdown) and, with `close_engine`, frees
    its memory."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await engine.shutdown(engine.grace_seconds)
        if close_engine:
            engine.engine.close()

    app = FastAPI(title="liac", version="1", lifespan=lifespan)
    created = int(time.time())
    served = Served(engine, model_name)

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError):
        return _validation_error(error).response()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "liac"}]}

    @app.get("/health")
    async def health():
        if engine.error is not None:
            return APIError(503, f"the engine failed: {engine.error}", code="engine_failed").response()
        if not engine.accepting:
            return APIError(503, "the server is shutting down", code="shutting_down").response()
        return {"status": "ok", **engine.stats()}

    @app.get("/metrics")
    async def prometheus():
        if metrics is None:
            raise APIError(404, "metrics are off on this server")
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        served.check_model(body.model)
        for name, value, default in (("logprobs", body.logprobs, None), ("echo", body.echo, False),
                                     ("best_of", body.best_of if body.best_of != 1 else None, None),
                                     ("suffix", body.suffix, None)):
            if value != default:
                raise APIError(400, f"'{name}' is not supported by liac", param=name, code="unsupported")
        prompts = served.completion_prompts(body.prompt)
        return await served.respond(body, prompts, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        served.check_model(body.model)
        for name, value in (("logprobs", body.logprobs), ("top_logprobs", body.top_logprobs), ("tools", body.tools)):
            if value:
                raise APIError(400, f"'{name}' is not supported by liac", param=name, code="unsupported")
        if body.response_format and body.response_format.get("type", "text") != "text":
            raise APIError(400, "only response_format {'type': 'text'} is supported", param="response_format",
                           code="unsupported")
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        prompts = [served.chat_prompt(body.messages)]
        return await served.respond(body, prompts, request, chat=True)

    return app


def _validation_error(error: RequestValidationError) -> APIError:
    first = error.errors()[0] if error.errors() else {}
    where = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(where) or None
    message = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return APIError(400, "the request body is not valid JSON", code="invalid_json")
    if first.get("type") == "missing":
        return APIError(400, f"'{param}' is required", param=param, code="missing_required_parameter")
    return APIError(400, f"'{param}': {message}" if param else message, param=param, code="invalid_value")


class Served:
    """What both endpoints do: check, tokenize, submit, and answer in one JSON body or as SSE."""

    def __init__(self, engine: AsyncEngine, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise APIError(404, f"The model '{model}' does not exist: this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    def _tokenizer(self, param: str):
        try:
            return self.engine.tokenizer
        except LiacError as e:
            raise APIError(400, f"this server has no tokenizer for text: {e.message}", param=param) from None

    def completion_prompts(self, prompt) -> list[tuple[int, ...]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise APIError(400, "'prompt' must not be empty", param="prompt")
        if all(isinstance(p, int) for p in prompt):
            return [tuple(prompt)]
        if all(isinstance(p, list) for p in prompt):
            return [tuple(p) for p in prompt]
        tokenizer = self._tokenizer("prompt")
        return [tuple(tokenizer(p)["input_ids"]) for p in prompt]

    def chat_prompt(self, messages: list[Message]) -> tuple[int, ...]:
        tokenizer = self._tokenizer("messages")
        if not getattr(tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions",
                           param="messages", code="no_chat_template")
        turns = []
        for index, message in enumerate(messages):
            content = message.content
            if isinstance(content, list):  # content parts: text only
                if any(part.get("type") != "text" for part in content):
                    raise APIError(400, "only text content parts are supported", param=f"messages.{index}.content")
                content = "".join(str(part.get("text", "")) for part in content)
            turns.append({"role": message.role, "content": content or ""})
        try:
            text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - the template's own error (e.g. roles must alternate)
            raise APIError(400, f"the chat template refused the messages: {e}", param="messages") from None
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])

    def _requests(self, body: _Common, prompts: list[tuple[int, ...]]) -> list[GenerateRequest]:
        if body.n != 1:
            raise APIError(400, "'n' must be 1 (one choice per prompt)", param="n", code="unsupported")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(body, name):
                raise APIError(400, f"'{name}' is not supported by liac (it must be 0)", param=name,
                               code="unsupported")
        if body.logit_bias:
            raise APIError(400, "'logit_bias' is not supported by liac", param="logit_bias", code="unsupported")
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stops) > MAX_STOPS:
            raise APIError(400, f"'stop' holds at most {MAX_STOPS} strings, got {len(stops)}", param="stop")
        try:
            sampling = SamplingParams(body.temperature, body.top_p, body.top_k, body.seed)
        except LiacError as e:
            raise APIError(400, e.line(), param=e.source) from None
        eos = self.engine.engine.text.eos_ids() if self.engine.engine.text.available() else ()
        max_tokens = body.max_tokens
        requests = []
        for ids in prompts:
            most = self.engine.batcher.context - len(ids)
            requests.append(GenerateRequest(ids, max_tokens if max_tokens is not None else max(1, most), sampling,
                                            tuple(eos), tuple(s for s in stops if s)))
        return requests

    def _open(self, requests: list[GenerateRequest]) -> list[RequestStream]:
        """Submit every prompt's request, or none (an error cancels those already in)."""
        streams: list[RequestStream] = []
        try:
            for request in requests:
                streams.append(self.engine.open(request))
        except BaseException as error:
            for stream in streams:
                stream.cancel()
            raise _api_error(error) from None
        return streams

    async def respond(self, body: _Common, prompts: list[tuple[int, ...]], request: Request, chat: bool):
        streams = self._open(self._requests(body, prompts))
        kind = "chat.completion" if chat else "text_completion"
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self._sse(streams, ident, created, chat, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        results = await _until_done(streams, request)
        if any(r.finish_reason == "cancelled" for r in results):
            raise APIError(503, "the server shut down before the request finished", code="shutting_down")
        choices = []
        for index, result in enumerate(results):
            if chat:
                choices.append({"index": index, "message": {"role": "assistant", "content": result.text},
                                "logprobs": None, "finish_reason": result.finish_reason})
            else:
                choices.append({"index": index, "text": result.text, "logprobs": None,
                                "finish_reason": result.finish_reason})
                if not self.engine.engine.text.available():
                    choices[-1]["token_ids"] = list(result.token_ids)
        return {"id": ident, "object": kind, "created": created, "model": self.model_name, "choices": choices,
                "usage": _usage(results)}

    async def _sse(self, streams: list[RequestStream], ident: str, created: int, chat: bool,
                   include_usage: bool) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if chat else "text_completion"

        def event(choices: list[dict], **extra) -> str:
            doc = {"id": ident, "object": kind, "created": created, "model": self.model_name, "choices": choices,
                   **extra}
            return f"data: {json.dumps(doc, ensure_ascii=False)}\n\n"

        ids = not self.engine.engine.text.available()  # no tokenizer: each chunk carries its token ids

        def choice(index: int, text: str | None, reason: str | None, role: bool = False, tokens=()) -> dict:
            if not chat:
                doc = {"index": index, "text": text or "", "logprobs": None, "finish_reason": reason}
                return {**doc, "token_ids": list(tokens)} if ids else doc
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}

        finals: list[Chunk | None] = [None] * len(streams)
        try:
            if chat:
                yield event([choice(i, None, None, role=True) for i in range(len(streams))])
            async for index, chunk in _merged(streams):
                if chunk.finish_reason is not None:
                    finals[index] = chunk
                    if chunk.text and chat:
                        yield event([choice(index, chunk.text, None)])
                    yield event([choice(index, None if chat else chunk.text, chunk.finish_reason,
                                        tokens=chunk.token_ids)])
                elif chunk.text or (ids and chunk.token_ids):
                    yield event([choice(index, chunk.text, None, tokens=chunk.token_ids)])
            if include_usage:
                yield event([], usage=_usage([f for f in finals if f is not None]))
            yield "data: [DONE]\n\n"
        except EngineFailed as e:
            yield f"data: {json.dumps(APIError(500, f'the engine failed: {e}', code='engine_failed').body())}\n\n"
        finally:
            for stream in streams:  # a client that left: free the rows (no-op for finished ones)
                stream.cancel()


def _usage(results) -> dict:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _api_error(error: BaseException) -> BaseException:
    if isinstance(error, LiacError):
        return APIError(400, f"'{error.source}' {error.message}" if error.source in ("prompt", "max_tokens")
                        else error.line(),
                        param=error.source, code="context_length_exceeded" if error.source in ("prompt", "max_tokens")
                        else "invalid_value")
    if isinstance(error, QueueFull):
        return APIError(429, f"the server is at capacity: {error}; retry later", code="queue_full",
                        headers={"Retry-After": "1"})
    if isinstance(error, ShuttingDown):
        return APIError(503, "the server is shutting down", code="shutting_down")
    if isinstance(error, EngineFailed):
        return APIError(500, f"the engine failed: {error}", code="engine_failed")
    return error


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, Chunk]]:
    """(index, chunk) of every stream as they come."""
    if len(streams) == 1:
        async for chunk in streams[0]:
            yield 0, chunk
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for chunk in stream:
                await queue.put((index, chunk))
        except BaseException as error:  # noqa: BLE001 - handed to the consumer
            await queue.put((index, error))
        finally:
            await queue.put((index, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(streams)
        while running:
            index, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def _until_done(streams: list[RequestStream], request: Request) -> list[Chunk]:
    """Every stream's whole result; a client that disconnects meanwhile cancels them all."""
    work = asyncio.ensure_future(asyncio.gather(*(s.collect() for s in streams)))
    try:
        while True:
            done, _ = await asyncio.wait({work}, timeout=0.25)
            if done:
                try:
                    return work.result()
                except EngineFailed as e:
                    raise APIError(500, f"the engine failed: {e}", code="engine_failed") from None
            if await request.is_disconnected():
                raise asyncio.CancelledError
    finally:
        if not work.done():
            work.cancel()
        for stream in streams:
            stream.cancel()

