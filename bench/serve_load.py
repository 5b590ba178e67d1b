"""A bounded load test of an OpenAI-compatible server (lia-serve, or any other): streamed completions from
asyncio clients on loopback, ending by itself; every request either completes or gets an explicit error.

    python bench/serve_load.py --url http://127.0.0.1:8000/v1 --model tiny-llama --clients 8 --seconds 30
    python bench/serve_load.py --url ... --model opt-30b --rate 0.5 --seconds 120 --token-ids 50272 \\
        --prompt-len 32:256 --max-tokens 16:64 --json out.json

Two arrival modes: `--clients N` (closed loop: N clients, each sends its next request when its last one ends) or
`--rate R` (open loop: Poisson arrivals, R requests/s on average, however many are in flight). New requests stop
at `--seconds`; those in flight may finish for `--drain` seconds more, then are cut (counted as errors 'cut').
Prompts: text (`--prompt-len` words of a fixed vocabulary) or, with `--token-ids VOCAB`, random token ids (a
server without a tokenizer: `lia-serve --random-weights`); lengths and max_tokens uniform in their ranges, from
`--seed`. Every request is `stream: true` with `stream_options.include_usage`: time to first token (TTFT) is the
first chunk with text or token ids, inter-token latency (ITL) the gaps between later ones divided by the tokens
they carry, output tokens the server's usage count.

**A newcomer's prefill and the running streams.** lia-serve prefills a newcomer between two decode steps of the
running streams and delivers that iteration's tokens together: the newcomer's first token and one token of every
running stream. So a running stream's inter-token gap that ends within `--burst` seconds (default 0.05; the
iterations are far longer) of another request's first token spanned a newcomer's prefill; a gap that ends with
no first token near it did not. The summary splits ITL into `itl_beside_prefill_seconds` and
`itl_without_prefill_seconds` (p50, p99, mean and count each; `split_by_prefill`); gaps of at most `--burst`
(a newcomer's second token, decoded in the iteration that prefilled it) are in neither.

Prints a summary (p50/p99 TTFT, ITL and end-to-end seconds, output tokens/s, requests/s, errors by kind) and, with
`--json`, writes it and every request's record. Needs httpx (a dependency of the openai client and of the device's
image). Exit status 0 when every request completed, 1 when some got an error.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

WORDS = ("the plan says which layer runs where and where each weight lives the cpu computes some layers next "
         "to the weights and sends only the activations a large model does not fit in the memory of one gpu").split()


@dataclass
class Record:
    """One request: when it was sent (seconds from the start), its sizes, and what came back."""

    sent: float
    prompt_len: int
    max_tokens: int
    status: str = "ok"            # ok, http-<code>, error, cut
    ttft: float | None = None
    seconds: float | None = None
    output_tokens: int = 0
    gaps: list[float] = field(default_factory=list)  # inter-token latencies
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (seconds from the start, tokens) per chunk
    finish_reason: str | None = None
    message: str = ""


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    low, high = int(low), int(high or low)
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"must be N or LOW:HIGH with 1 <= LOW <= HIGH, got '{text}'")
    return low, high


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def split_by_prefill(records: list[Record], burst: float) -> tuple[list[float], list[float]]:
    """(ITLs beside a newcomer's prefill, ITLs without one) of the completed requests' streams (the module
    docstring): a gap longer than `burst` whose end is within `burst` of another request's first token, or not."""
    firsts = sorted((r.chunks[0][0], index) for index, r in enumerate(records) if r.chunks)
    times = [t for t, _ in firsts]
    beside, without = [], []
    for index, record in enumerate(records):
        if record.status != "ok":
            continue
        for (before, _), (at, tokens) in zip(record.chunks, record.chunks[1:]):
            if at - before <= burst:
                continue  # decoded in the same iteration as the previous token (a newcomer's second token)
            low = bisect.bisect_left(times, at - burst)
            high = bisect.bisect_right(times, at + burst)
            near = any(firsts[k][1] != index for k in range(low, high))
            (beside if near else without).extend([(at - before) / tokens] * tokens)
    return beside, without


class Load:
    def __init__(self, args):
        self.args = args
        self.random = random.Random(args.seed)
        self.records: list[Record] = []
        self.start = 0.0

    def _body(self) -> tuple[dict, int, int]:
        a = self.args
        length = self.random.randint(*a.prompt_len)
        max_tokens = self.random.randint(*a.max_tokens)
        if a.token_ids:
            prompt = [self.random.randrange(4, a.token_ids) for _ in range(length)]
        else:
            prompt = " ".join(self.random.choice(WORDS) for _ in range(length))
        body = {"model": a.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": a.temperature,
                "stream": True, "stream_options": {"include_usage": True}, "seed": self.random.randrange(1 << 30)}
        return body, length, max_tokens

    async def one(self, client) -> None:
        body, length, max_tokens = self._body()
        sent = time.perf_counter()
        record = Record(sent - self.start, length, max_tokens)
        self.records.append(record)
        last = None
        try:
            async with client.stream("POST", "/completions", json=body) as response:
                if response.status_code != 200:
                    record.status = f"http-{response.status_code}"
                    record.message = (await response.aread()).decode(errors="replace")[:300]
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    doc = json.loads(line[6:])
                    if "error" in doc:
                        record.status, record.message = "error", json.dumps(doc["error"])[:300]
                        return
                    if doc.get("usage"):
                        record.output_tokens = doc["usage"]["completion_tokens"]
                    for choice in doc.get("choices", []):
                        tokens = len(choice.get("token_ids") or ()) or (1 if choice.get("text") else 0)
                        now = time.perf_counter()
                        if tokens:
                            record.chunks.append((now - self.start, tokens))
                            if last is None:
                                record.ttft = now - sent
                            else:
                                record.gaps.extend([(now - last) / tokens] * tokens)
                            last = now
                        if choice.get("finish_reason"):
                            record.finish_reason = choice["finish_reason"]
            record.seconds = time.perf_counter() - sent
            if record.finish_reason is None:
                record.status, record.message = "error", "the stream ended without a finish_reason"
        except asyncio.CancelledError:
            record.status = "cut"
            raise
        except Exception as e:  # noqa: BLE001 - every failure is a counted, explicit error
            record.status, record.message = "error", f"{type(e).__name__}: {e}"[:300]

    async def run(self) -> dict:
        try:
            import httpx
        except ImportError:  # the openai client's fork of it, in newer releases
            import httpx2 as httpx

        a = self.args
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=a.url, timeout=httpx.Timeout(a.seconds + a.drain + 60),
                                     limits=limits) as client:
            self.start = time.perf_counter()
            end = self.start + a.seconds
            tasks: set[asyncio.Task] = set()
            if a.rate:
                while True:
                    wait = self.random.expovariate(a.rate)
                    if time.perf_counter() + wait >= end:
                        break
                    await asyncio.sleep(wait)
                    task = asyncio.ensure_future(self.one(client))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            else:
                async def loop() -> None:
                    while time.perf_counter() < end:
                        await self.one(client)
                tasks = {asyncio.ensure_future(loop()) for _ in range(a.clients)}
            if tasks:
                _, late = await asyncio.wait(tasks, timeout=max(0.0, end - time.perf_counter()) + a.drain)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
            wall = time.perf_counter() - self.start
        return self.summary(wall)

    def summary(self, wall: float) -> dict:
        ok = [r for r in self.records if r.status == "ok"]
        errors: dict[str, int] = {}
        for r in self.records:
            if r.status != "ok":
                errors[r.status] = errors.get(r.status, 0) + 1
        gaps = [g for r in ok for g in r.gaps]
        tokens = sum(r.output_tokens for r in ok)

        def stats(values):
            return {"p50": percentile(values, 50), "p99": percentile(values, 99),
                    "mean": statistics.fmean(values) if values else None, "count": len(values)}

        beside, without = split_by_prefill(self.records, self.args.burst)

        a = self.args
        return {"mode": f"rate {a.rate}/s" if a.rate else f"{a.clients} clients", "seconds": a.seconds,
                "wall_seconds": round(wall, 3), "requests": len(self.records), "completed": len(ok),
                "errors": errors, "output_tokens": tokens, "output_tokens_per_second": tokens / wall if wall else 0,
                "requests_per_second": len(ok) / wall if wall else 0,
                "ttft_seconds": stats([r.ttft for r in ok if r.ttft is not None]), "itl_seconds": stats(gaps),
                "itl_beside_prefill_seconds": stats(beside), "itl_without_prefill_seconds": stats(without),
                "e2e_seconds": stats([r.seconds for r in ok]),
                "prompt_len": list(a.prompt_len), "max_tokens": list(a.max_tokens)}


def summary_line(s: dict) -> str:
    without = s.get("itl_without_prefill_seconds") or {"p50": None, "count": 0}
    beside = s.get("itl_beside_prefill_seconds") or {"p50": None, "count": 0}

    def ms(block, key):
        value = block[key]
        return "-" if value is None else f"{value * 1000:.0f}"
    return (f"{s['mode']:>14}: {s['completed']}/{s['requests']} done, errors {s['errors'] or 0}; "
            f"{s['output_tokens_per_second']:.1f} tok/s, {s['requests_per_second']:.2f} req/s; "
            f"TTFT p50/p99 {ms(s['ttft_seconds'], 'p50')}/{ms(s['ttft_seconds'], 'p99')} ms, "
            f"ITL p50/p99 {ms(s['itl_seconds'], 'p50')}/{ms(s['itl_seconds'], 'p99')} ms, "
            f"e2e p50/p99 {ms(s['e2e_seconds'], 'p50')}/{ms(s['e2e_seconds'], 'p99')} ms; "
            f"ITL p50 without/beside a newcomer's prefill {ms(without, 'p50')}/{ms(beside, 'p50')} ms "
            f"({without['count']}/{beside['count']} gaps)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True, help="the model id the server lists")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--clients", type=int, help="closed loop: this many clients at once")
    mode.add_argument("--rate", type=float, help="open loop: Poisson arrivals, requests per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="send new requests for this long (default 30)")
    parser.add_argument("--drain", type=float, default=60.0,
                        help="then let those in flight finish for this long at most (default 60)")
    parser.add_argument("--prompt-len", type=_range, default=(4, 24), help="prompt length range, words or token "
                                                                            "ids (default 4:24)")
    parser.add_argument("--max-tokens", type=_range, default=(8, 32), help="max_tokens range (default 8:32)")
    parser.add_argument("--token-ids", type=int, metavar="VOCAB", help="random token-id prompts below VOCAB")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths, prompts and arrivals")
    parser.add_argument("--burst", type=float, default=0.05,
                        help="seconds within which tokens of one iteration arrive (splits ITL by whether a newcomer's "
                             "prefill ran in the gap; default 0.05)")
    parser.add_argument("--json", metavar="FILE", help="write the summary and every request's record")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    load = Load(args)
    summary = asyncio.run(load.run())
    print(summary_line(summary), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "requests": [asdict(r) for r in load.records]}, f, indent=1)
    return 0 if not summary["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
