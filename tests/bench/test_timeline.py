"""bench/timeline.py: a decode step's timeline from a chrome trace — the step is the span between the last two
token choices on the main thread; stream roles, busy times and their overlap are interval unions."""

import pytest
from timeline import summarize, union_ms

MAIN, OTHER, COMPUTE, COPY = 10, 11, 7, 21


def _op(name, ts, dur, tid=MAIN, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def _gpu(cat, ts, dur, stream):
    return {"ph": "X", "cat": cat, "name": cat, "pid": 0, "tid": stream, "ts": ts, "dur": dur}


def _trace():
    # prefill's pick at 0, decode step 1 from 1000 to 11000, step 2 from 11000 to 21000 (the one summarised)
    events = [_op("aten::argmax", t, 10) for t in (0, 1000, 11000, 21000)]
    events += [_op("aten::linear", 11000, 3000), _op("aten::mm", 11500, 1000),  # mm inside linear: not counted
               _op("aten::scaled_dot_product_attention", 15000, 2000), _op("cudaLaunchKernel", 17500, 500,
                                                                            cat="cuda_runtime"),
               _op("aten::linear", 20000, 2000),  # runs past the step's end: clipped
               _op("aten::add", 12000, 100, tid=OTHER)]  # another thread: never the main one
    events += [_gpu("kernel", 12000, 2000, COMPUTE), _gpu("kernel", 16000, 2000, COMPUTE),
               _gpu("gpu_memcpy", 17000, 2000, COMPUTE),  # a crossing on the compute stream
               _gpu("gpu_memcpy", 10000, 3000, COPY), _gpu("gpu_memcpy", 15000, 2000, COPY)]
    events.append({"ph": "i", "name": "marker", "ts": 1, "pid": 1, "tid": MAIN})  # not a span: ignored
    return {"traceEvents": events}


def test_union_merges_overlaps():
    assert union_ms([(0, 1000), (500, 1500), (3000, 4000)]) == 2.5


def test_the_last_decode_step_is_summarised():
    s = summarize(_trace())
    assert s["step_ms"] == 10.0
    # main thread busy: linear 11000-14000, sdpa 15000-17000, launch 17500-18000, linear 20000-21000 (clipped)
    assert s["main_busy_ms"] == 6.5 and s["main_idle_ms"] == 3.5
    assert s["cpu_ops"]["aten::linear"] == [2, 5.0] and "aten::mm" not in s["cpu_ops"]
    # compute stream 12000-14000, 16000-19000; copy stream 11000-13000 (clipped), 15000-17000
    assert s["compute_busy_ms"] == 5.0 and s["copy_busy_ms"] == 4.0
    assert s["overlap_ms"] == 2.0  # 12000-13000 and 16000-17000
    assert (s["copy_only_ms"], s["compute_only_ms"]) == (2.0, 3.0)
    assert s["gpu_idle_ms"] == 3.0  # 10 ms - (11000-14000 ∪ 15000-19000)
    assert s["streams"][str(COMPUTE)]["role"] == "compute" and s["streams"][str(COPY)]["role"] == "copy"
    # the copy stream stands still 13000-15000 and 17000-21000; the compute stream runs 13000-14000, 17000-19000
    gaps = s["copy_gaps"]
    assert (gaps["count"], gaps["total_ms"], gaps["compute_ms"]) == (2, 6.0, 3.0)
    assert gaps["main_ops"] == {"aten::linear": 2.0}  # 13000-14000 and 20000-21000; sdpa only touches a gap
    assert s["main_waits"] == {"cudaLaunchKernel": [1, 0.5]}


def test_the_prefill_is_summarised_up_to_the_first_token_choice():
    trace = _trace()
    trace["traceEvents"].append(_op("aten::embedding", -4000, 1000))  # the prefill begins at -4000
    trace["traceEvents"].append(_gpu("gpu_memcpy", -3500, 3000, COPY))  # a copy beside it, to -500
    trace["traceEvents"].append(_gpu("kernel", -3000, 1000, COMPUTE))
    s = summarize(trace, "prefill")
    assert s["step_ms"] == 4.0 and s["main_busy_ms"] == 1.0  # -4000 .. 0 (the first argmax)
    assert s["copy_busy_ms"] == 3.0 and s["compute_busy_ms"] == 1.0 and s["overlap_ms"] == 1.0
    assert summarize(trace)["step_ms"] == 10.0  # the decode step as before


def test_without_a_gpu_only_the_main_thread_is_summarised():
    trace = {"traceEvents": [e for e in _trace()["traceEvents"] if e.get("pid") != 0]}
    s = summarize(trace)
    assert s["step_ms"] == 10.0 and s["compute_busy_ms"] is None and s["streams"] == {}


def test_a_trace_without_two_token_choices_is_refused():
    with pytest.raises(ValueError, match="token choices"):
        summarize({"traceEvents": [_op("aten::argmax", 0, 10), _op("aten::linear", 5, 10)]})
