"""A per-step timeline of one decode step and of the prefill (issue 12): torch.profiler over a short generate,
summarised.

    from timeline import record
    summary = record(engine, ids)          # → {"step_ms": .., "main_idle_ms": .., "copy_busy_ms": .., ...}

`record` runs `engine.generate(ids, 3)` (prefill and two decode steps) under torch.profiler (CPU, and CUDA where
there is a GPU) and summarises the last decode step, between the last two token choices (`aten::argmax`, the
greedy pick) on the main thread:

  step_ms            the step's wall time
  main_busy_ms       the main thread inside any op or CUDA runtime call (a split's CPU part runs here too: one
                     thread, runtime/executor.py); main_idle_ms = step_ms - main_busy_ms (waiting: on an event, a
                     synchronising copy, the join of a split)
  compute_busy_ms    the GPU's compute stream (the one running the most kernel time) running anything
  copy_busy_ms       the copy stream (the other stream with the most memcpy time: staging) copying
  overlap_ms         both at once; copy_only_ms, compute_only_ms, gpu_idle_ms (neither)
  cpu_ops            the main thread's heaviest ops in the step: name → (count, total ms)
  main_waits         the main thread's heaviest CUDA runtime calls (synchronising copies and events wait there):
                     name → (count, total ms)
  copy_gaps          where the copy stream stood still inside the step: {count (gaps over 0.2 ms), total_ms,
                     main_ops: the main thread's top-level ops during those gaps (ms), compute_ms: the compute
                     stream's busy time during them}: what the copies waited for
  streams            every GPU stream seen: tid → {kernel_ms, memcpy_ms}

On the GPU-less emulation only the main thread's numbers exist (the GPU fields are None). The profiler slows a step
a little; compare the numbers between plans of one call, not with unprofiled timings.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["record", "summarize", "union_ms"]

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted, non-overlapping intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length (µs in, ms out) of the union of intervals."""
    return sum(end - start for start, end in union(intervals)) / 1e3


def _intersection_ms(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    a, b = union(a), union(b)
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total / 1e3


def _clip(events: list[dict], t0: float, t1: float) -> list[tuple[float, float]]:
    out = []
    for e in events:
        start, end = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
        if end > start:
            out.append((start, end))
    return out


def summarize(trace: dict, window: str = "decode") -> dict:
    """The last decode step of a chrome trace (torch.profiler's export) as the module docstring describes; with
    `window` 'prefill', the prefill instead: from the main thread's first op to its first token choice."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    cpu = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    if not ops:
        raise ValueError("the trace holds no CPU ops")
    by_thread: dict = {}
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))] = by_thread.get((e.get("pid"), e.get("tid")), 0.0) + e["dur"]
    main = max(by_thread, key=by_thread.get)
    picks = sorted(e["ts"] for e in ops if e["name"] == "aten::argmax" and (e.get("pid"), e.get("tid")) == main)
    need = 1 if window == "prefill" else 2
    if len(picks) < need:
        raise ValueError(f"the trace holds {len(picks)} token choices (aten::argmax) on the main thread: need {need}")
    if window == "prefill":
        t0, t1 = min(e["ts"] for e in ops if (e.get("pid"), e.get("tid")) == main), picks[0]
    else:
        t0, t1 = picks[-2], picks[-1]
    main_events = [e for e in cpu if (e.get("pid"), e.get("tid")) == main]
    step_ms = (t1 - t0) / 1e3
    main_busy = union_ms(_clip(main_events, t0, t1))
    heavy: dict[str, list[float]] = {}
    # top-level ops only (an op inside another on the same thread is counted in its parent)
    spans = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in ops
                    if (e.get("pid"), e.get("tid")) == main and t0 <= e["ts"] < t1), key=lambda s: (s[0], -s[1]))
    end_of_parent = -1.0
    for start, end, name in spans:
        if start < end_of_parent:
            continue
        end_of_parent = end
        count_total = heavy.setdefault(name, [0, 0.0])
        count_total[0] += 1
        count_total[1] += (end - start) / 1e3
    cpu_ops = {name: [count, round(total, 3)] for name, (count, total) in
               sorted(heavy.items(), key=lambda kv: -kv[1][1])[:8]}
    waits: dict[str, list[float]] = {}
    for e in main_events:
        if e.get("cat") != "cpu_op" and t0 <= e["ts"] < t1:
            count_total = waits.setdefault(e["name"], [0, 0.0])
            count_total[0] += 1
            count_total[1] += e["dur"] / 1e3
    main_waits = {name: [count, round(total, 3)] for name, (count, total) in
                  sorted(waits.items(), key=lambda kv: -kv[1][1])[:4]}
    top_level = []
    end_of_parent = -1.0
    for start, end, name in spans:
        if start >= end_of_parent:
            top_level.append((start, end, name))
            end_of_parent = end
    summary = {"step_ms": round(step_ms, 3), "main_busy_ms": round(main_busy, 3),
               "main_idle_ms": round(step_ms - main_busy, 3), "cpu_ops": cpu_ops, "main_waits": main_waits,
               "copy_gaps": None,
               "compute_busy_ms": None, "copy_busy_ms": None, "overlap_ms": None, "copy_only_ms": None,
               "compute_only_ms": None, "gpu_idle_ms": None, "streams": {}}
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        return summary
    streams: dict = {}
    for e in gpu:
        row = streams.setdefault(e.get("tid"), {"kernel": [], "memcpy": [], "all": []})
        row["all"].append(e)
        row["kernel" if e["cat"] == "kernel" else "memcpy"].append(e)
    kernel_ms = {tid: union_ms(_clip(row["kernel"], t0, t1)) for tid, row in streams.items()}
    memcpy_ms = {tid: union_ms(_clip(row["memcpy"], t0, t1)) for tid, row in streams.items()}
    compute = max(kernel_ms, key=kernel_ms.get)
    others = [tid for tid in streams if tid != compute]
    copy = max(others, key=memcpy_ms.get) if others else None
    compute_spans = _clip(streams[compute]["all"], t0, t1)
    copy_spans = _clip(streams[copy]["all"], t0, t1) if copy is not None else []
    compute_busy, copy_busy = union_ms(compute_spans), union_ms(copy_spans)
    overlap = _intersection_ms(compute_spans, copy_spans)
    either = union_ms(compute_spans + copy_spans)
    gaps, last = [], t0
    for start, end in union(copy_spans):
        if start - last > 200:  # µs
            gaps.append((last, start))
        last = max(last, end)
    if t1 - last > 200:
        gaps.append((last, t1))
    during: dict[str, float] = {}
    for start, end, name in top_level:
        for a, b in gaps:
            overlap_us = min(end, b) - max(start, a)
            if overlap_us > 0:
                during[name] = during.get(name, 0.0) + overlap_us / 1e3
    summary["copy_gaps"] = {
        "count": len(gaps), "total_ms": round(sum(b - a for a, b in gaps) / 1e3, 3),
        "compute_ms": round(_intersection_ms(compute_spans, gaps), 3),
        "main_ops": {name: round(ms, 3) for name, ms in sorted(during.items(), key=lambda kv: -kv[1])[:6]}}
    summary.update(compute_busy_ms=round(compute_busy, 3), copy_busy_ms=round(copy_busy, 3),
                   overlap_ms=round(overlap, 3), copy_only_ms=round(copy_busy - overlap, 3),
                   compute_only_ms=round(compute_busy - overlap, 3), gpu_idle_ms=round(step_ms - either, 3),
                   streams={str(tid): {"kernel_ms": round(kernel_ms[tid], 3), "memcpy_ms": round(memcpy_ms[tid], 3),
                                       "role": "compute" if tid == compute else "copy" if tid == copy else "other"}
                            for tid in sorted(streams, key=str)})
    return summary


def record(engine, ids, new_tokens: int = 3, keep: str | os.PathLike | None = None) -> dict:
    """Profile `engine.generate(ids, new_tokens)` and summarise its last decode step, and under 'prefill' its
    prefill (the same fields: step_ms is the prefill's wall time, copy_* the weight stream beside the micro-batches'
    chain); `keep`: also write the trace there (gzipped chrome trace)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and not engine.backend.emulated:
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        engine.generate(ids, max(3, new_tokens))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
        if keep is not None:
            with open(path, "rb") as src, gzip.open(keep, "wb") as dst:
                shutil.copyfileobj(src, dst)
    summary = summarize(trace)
    try:
        summary["prefill"] = summarize(trace, "prefill")
    except ValueError as e:
        summary["prefill"] = {"error": str(e)}
    return summary
