"""Prometheus metrics of a serving engine (`/metrics`): an `Observer` of runtime/serve/engine.py over
prometheus_client, in a registry of its own (several servers in one process, as the tests run them, do not mix).

    liac_time_to_first_token_seconds      histogram  submitted → first token
    liac_inter_token_latency_seconds      histogram  a request's token → its next one
    liac_request_seconds                  histogram  submitted → last token, by finish reason
    liac_step_seconds{phase}              histogram  one iteration's prefill and decode passes
    liac_decode_batch_size                histogram  sequences in each decode step (the live batch)
    liac_generated_tokens_total           counter    new tokens, all requests
    liac_prompt_tokens_total              counter    prompt tokens of finished requests
    liac_requests_total{finish_reason}    counter    finished requests: stop, length, cancelled
    liac_requests_rejected_total          counter    refused with 429 (the queue was full)
    liac_tokens_per_second                gauge      the last decode step: live batch / its seconds
    liac_queue_depth                      gauge      requests waiting for a row
    liac_live_batch_size                  gauge      sequences in the running batch
    liac_batch_rows                       gauge      the most that run at once (the plan's batch)
    liac_memory_bytes{tier, kind}         gauge      per tier: 'planned' (spec.memory), 'reserved' (this process's
                                                     arenas and shared weights), 'peak'
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from liac.runtime.batching import StepReport
from liac.runtime.serve.engine import Observer

__all__ = ["ServeMetrics", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Latency buckets from a tiny model on a CPU (milliseconds) to an offloaded 30B model (seconds per token).
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServeMetrics(Observer):
    """The engine's reports as Prometheus metrics; `render()` is the text /metrics serves."""

    def __init__(self, engine=None):
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("liac_time_to_first_token_seconds", "Submitted to first token", buckets=_SECONDS,
                              registry=r)
        self.itl = Histogram("liac_inter_token_latency_seconds", "A request's token to its next one",
                             buckets=_SECONDS, registry=r)
        self.latency = Histogram("liac_request_seconds", "Submitted to last token", ["finish_reason"],
                                 buckets=_SECONDS, registry=r)
        self.step_seconds = Histogram("liac_step_seconds", "One iteration's pass", ["phase"], buckets=_SECONDS,
                                      registry=r)
        self.decode_batch = Histogram("liac_decode_batch_size", "Sequences in each decode step",
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.generated = Counter("liac_generated_tokens", "New tokens", registry=r)
        self.prompt = Counter("liac_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.requests = Counter("liac_requests", "Finished requests", ["finish_reason"], registry=r)
        self.rejected_total = Counter("liac_requests_rejected", "Requests refused: the queue was full", registry=r)
        self.tokens_per_second = Gauge("liac_tokens_per_second", "Last decode step: live batch / seconds",
                                       registry=r)
        self.queue_depth = Gauge("liac_queue_depth", "Requests waiting for a row", registry=r)
        self.live = Gauge("liac_live_batch_size", "Sequences in the running batch", registry=r)
        self.rows = Gauge("liac_batch_rows", "Sequences that run at once at most (the plan's batch)", registry=r)
        self.memory = Gauge("liac_memory_bytes", "Memory per tier", ["tier", "kind"], registry=r)
        self.engine = engine
        if engine is not None:
            self.rows.set(engine.plan.spec.workload.batch_size)
            self.update_memory()

    def update_memory(self) -> None:
        """Per tier, the plan's reservation, what this process holds and the peak (Engine.memory_report)."""
        if self.engine is None or self.engine.closed:
            return
        for tier, row in self.engine.memory_report().items():
            for kind, key in (("planned", "planned_bytes"), ("reserved", "reserved_bytes"), ("peak", "peak_bytes")):
                if row.get(key) is not None:
                    self.memory.labels(tier=tier, kind=kind).set(row[key])

    def render(self) -> bytes:
        self.update_memory()
        return generate_latest(self.registry)

    # -- Observer ------------------------------------------------------------------------------------------------
    def step(self, report: StepReport, live: int, waiting: int) -> None:
        if report.prefill_sequences:
            self.step_seconds.labels(phase="prefill").observe(report.prefill_seconds)
        if report.decode_batch:
            self.step_seconds.labels(phase="decode").observe(report.decode_seconds)
            self.decode_batch.observe(report.decode_batch)
            if report.decode_seconds > 0:
                self.tokens_per_second.set(report.decode_batch / report.decode_seconds)
        self.generated.inc(report.prefill_sequences + report.decode_batch)
        self.queue_depth.set(waiting)
        self.live.set(live)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def next_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def finished(self, reason: str, seconds: float, prompt_tokens: int, completion_tokens: int) -> None:
        self.latency.labels(finish_reason=reason).observe(seconds)
        self.requests.labels(finish_reason=reason).inc()
        self.prompt.inc(prompt_tokens)

    def rejected(self) -> None:
        self.rejected_total.inc()
