"""Measure the host liac runs on: the numbers a `HardwareProfile` holds.

Every measurement reads data larger than the caches (weights rotated over several GiB by default), warms up
first, repeats and takes the median. With CUDA it also measures PCIe (pinned H2D, D2H, both at once), the GPU's
bf16 GEMM rate and HBM bandwidth, and the *concurrent* rate: the CPU reading DDR (GEMV) while DMA copies host
memory to the GPU — the number that says whether splitting a sublayer across both paths pays — and what one split
costs to synchronise: launching a tiny GPU part, computing a tiny CPU part meanwhile and joining them, as the
runtime does; and what a decode split's CPU part costs to start after the main thread's wait for the GPU
(`split_cpu_start`, Eq. 15b). `cpu_gemm_curve` measures the AMX curve on decoder-shaped weights (bench/h200.py's
rates stage; `liac profile`'s curve is square K×K).

    from liac.probe import ProbeSizes, measure_host
    numbers = measure_host(ProbeSizes.full(), progress=lambda step, total, name: print(f"[{step}/{total}] {name}"))
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from liac.models.mixtral import expert_ffn
from liac.sizes import GB, GIB, MIB

__all__ = ["ProbeSizes", "Measurements", "measure_host", "measure_rates", "expert_rates", "attention_curve",
           "split_sync_seconds", "split_cpu_start", "cpu_gemm_curve", "SPLIT_START_HIDDEN", "SPLIT_START_FEATURES",
           "SPLIT_START_WAITS", "GEMM_ROWS", "GPU_GEMM_ROWS", "GPU_GEMM_HIDDEN", "GPU_GEMM_SUSTAIN_SECONDS",
           "decoder_gemm_shapes", "gemm_curve", "ATTENTION_QUERIES", "EXPERT_IDLE_SECONDS",
           "EXPERT_ROUTE_SECONDS", "EXPERTS_BESIDE_COPIES", "experts_beside_copies_rate"]

GEMM_ROWS = (1, 16, 32, 64, 128, 256, 1024)  # the AMX curve's M points
# The GPU GEMM curve's M points (Eq. 1c): from where a decoder's weight GEMMs leave the HBM-bound GEMV (M ≈ 128 on an
# H100/H200-class GPU) to a long prompt's micro-batch; below the first point the curve is clamped, which leaves a
# GEMM of fewer rows priced by its bytes, as before (decode)
GPU_GEMM_ROWS = (128, 256, 512, 1024, 2048, 4096, 8192)
# The hidden sizes d whose decoder weight GEMMs (d→3d, d→d, d→4d, 4d→d) the GPU GEMM curve pools: generic shapes,
# not one model's (a 4096 and an 8192 model, as Llama-class 7-8B and 70B, OPT-30B's 7168 between them)
GPU_GEMM_HIDDEN = (4096, 8192)
# Seconds each point of the GPU GEMM curve runs back to back before it is timed: a prefill runs its GEMMs for seconds
# (OPT-30B at batch 256, prompt 128 on the H200: 3.2 s), and its timed passes at 2048-4096 rows a micro-batch ran
# ~10 % below the burst rate of the same shapes (docs/cost-model.md Eq. 1c); 8 × 7 points: ~17 s
GPU_GEMM_SUSTAIN_SECONDS = 0.3
ATTENTION_QUERIES = (16, 128, 512, 2048)  # the CPU attention curve's Q points (prefill: context = query)


@dataclass(frozen=True)
class ProbeSizes:
    """How much data each measurement touches (bytes) and how often it repeats."""

    weight_bytes: int  # one GEMV weight matrix; several are rotated so caches do not help
    rotate_bytes: int  # total bytes rotated over for bandwidth measurements
    gemm_k: int  # inner/outer dimension of the square weights of the GEMM curve
    copy_bytes: int  # one PCIe / HBM transfer
    repeats: int
    # The CPU GEMV's weights as (rows, columns) matrices, rotated to `rotate_bytes` (default: square-ish matrices
    # of `weight_bytes` with `gemm_k` rows): a benchmark passes the shapes its runs' CPU kernel reads (an MoE
    # expert's [2F, D] and [D, F]), so that `cpu_ddr_read_gb_per_s` is that kernel's rate.
    gemv_shapes: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def full() -> "ProbeSizes":
        return ProbeSizes(weight_bytes=GIB, rotate_bytes=3 * GIB, gemm_k=7168, copy_bytes=GIB, repeats=5)

    @staticmethod
    def quick() -> "ProbeSizes":
        """Small sizes for tests and a first look (numbers are optimistic: caches help)."""
        return ProbeSizes(weight_bytes=16 * MIB, rotate_bytes=48 * MIB, gemm_k=512, copy_bytes=16 * MIB, repeats=2)


@dataclass(frozen=True)
class Measurements:
    """Raw numbers, in the profile's units (TFLOP/s, GB/s, s). GPU fields are None without CUDA."""

    cpu_threads: int
    cpu_gemm_tflops: tuple[tuple[int, float], ...]  # (M, TFLOP/s)
    cpu_gemv_gb_per_s: float  # best small-M kernel reading weights
    cpu_gemv_kernel: str  # 'F.linear' or 'torch.mv'
    cpu_kv_read_gb_per_s: float  # decode attention (SDPA) over a bf16 cache
    cpu_launch_seconds: float
    split_sync_seconds: float  # one split's join beyond its slower part (event wait, merge launch)
    cpu_attention_tflops: tuple[tuple[int, float], ...] = ()  # (Q, TFLOP/s) of prefill SDPA on the CPU
    gpu_bf16_tflops: float | None = None
    gpu_hbm_gb_per_s: float | None = None
    gpu_launch_seconds: float | None = None
    pcie_h2d_gb_per_s: float | None = None
    pcie_d2h_gb_per_s: float | None = None
    pcie_bidir_gb_per_s: float | None = None
    pcie_latency_seconds: float | None = None
    concurrent_cpu_gb_per_s: float | None = None  # CPU GEMV while H2D runs
    concurrent_h2d_gb_per_s: float | None = None  # H2D while the CPU reads
    concurrent_kv_gb_per_s: float | None = None  # the fused decode attention's KV read while H2D runs
    concurrent_h2d_beside_kv_gb_per_s: float | None = None  # H2D while the fused attention reads
    gpu_hbm_gib: float | None = None
    cpu_ddr_gib: float = 0.0
    gpu_gemm_tflops: tuple[tuple[int, float], ...] = ()  # (M, TFLOP/s) on decoder-shaped weight GEMMs (Eq. 1c)
    split_cpu_start_seconds: float | None = None  # Eq. 15b's w (`split_cpu_start`): with a GPU only


def _median_seconds(fn: Callable[[], object], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    fn()
    sync()  # warm-up (kernel selection, page faults)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _random(*shape: int, scale: float = 1.0) -> torch.Tensor:
    """A host bf16 tensor of normal values; drawn on the GPU where there is one (the host's generator takes
    about a minute for the few GiB a profile rotates over)."""
    if torch.cuda.is_available():
        return (torch.randn(*shape, dtype=torch.bfloat16, device="cuda") * scale).cpu()
    return torch.randn(*shape, dtype=torch.bfloat16) * scale


def _rotated_weights(rows: int, cols: int, total_bytes: int) -> list[torch.Tensor]:
    one = rows * cols * 2
    count = max(2, -(-total_bytes // one))
    return [_random(rows, cols, scale=0.02) for _ in range(count)]


def _rotated_shapes(shapes: tuple[tuple[int, int], ...], total_bytes: int) -> list[torch.Tensor]:
    """Matrices of `shapes` in turn, repeated until they hold `total_bytes` (at least one round)."""
    one = sum(rows * cols * 2 for rows, cols in shapes)
    return [_random(rows, cols, scale=0.02) for _ in range(max(1, -(-total_bytes // one))) for rows, cols in shapes]


def _gemv_rate(weights: list[torch.Tensor], kernel: str, repeats: int) -> float:
    inputs = {w.shape[1]: torch.randn(w.shape[1], dtype=torch.bfloat16) for w in weights}

    def run():
        for w in weights:
            x = inputs[w.shape[1]]
            if kernel == "torch.mv":
                torch.mv(w, x)
            else:
                F.linear(x[None, :], w)

    seconds = _median_seconds(run, repeats)
    return sum(w.numel() * 2 for w in weights) / seconds / GB


def _gemm_curve(k: int, rotate_bytes: int, repeats: int) -> list[tuple[int, float]]:
    weights = _rotated_weights(k, k, rotate_bytes)
    curve = []
    for m in GEMM_ROWS:
        x = torch.randn(m, k, dtype=torch.bfloat16)
        # small M reads every weight (memory-bound); large M is compute-bound, one weight suffices
        ws = weights if m < 128 else weights[:1]

        def run(ws=ws, x=x):
            for w in ws:
                F.linear(x, w)

        seconds = _median_seconds(run, repeats)
        curve.append((m, 2.0 * m * k * k * len(ws) / seconds / 1e12))
    return curve


def _kv_attention(total_bytes: int) -> Callable[[], int]:
    """The fused decode attention over a batch-8, 32-head bf16 KV cache of about `total_bytes`: a call runs it
    once and returns the KV bytes it read."""
    heads, head_dim = 32, 128
    per_token = 2 * heads * head_dim * 2  # K and V, bf16
    batch = 8
    ctx = max(64, total_bytes // (per_token * batch))
    k = _random(batch, heads, ctx, head_dim)
    v = _random(batch, heads, ctx, head_dim)
    q = torch.randn(batch, heads, 1, head_dim, dtype=torch.bfloat16)
    nbytes = (k.numel() + v.numel()) * 2

    def run() -> int:
        F.scaled_dot_product_attention(q, k, v)
        return nbytes
    return run


def _kv_read_rate(total_bytes: int, repeats: int) -> float:
    attention = _kv_attention(total_bytes)
    nbytes = attention()
    return nbytes / _median_seconds(attention, repeats) / GB


def attention_curve(queries: tuple[int, ...], repeats: int) -> list[tuple[int, float]]:
    """CPU prefill attention as the runtime runs it (liac.models' Attention over a whole prompt:
    scaled_dot_product_attention over bf16 q, k, v [B·H, Q, E], causal by the kernel's own masking), at each query
    length Q = context C: TFLOP/s counted as the cost model counts attention FLOPs (4·Q·C·E per head, the masked
    half included). Heads are chosen so each point does at least ~4 GFLOP. (Profiles measured before 2026-12-02 d
    timed the kernel over a boolean [Q, C] mask, as the runtime then ran it: 1.4-1.8x slower on the CPU.)"""
    head_dim, curve = 128, []
    for query in queries:
        heads = max(4, -(-(2**30) // (query * query * head_dim)))
        q, k, v = (_random(1, heads, query, head_dim) for _ in range(3))
        seconds = _median_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats)
        curve.append((query, 4.0 * heads * query * query * head_dim / seconds / 1e12))
    return curve


def _launch_seconds(device: str, sync: Callable[[], None]) -> float:
    x = torch.ones(16, device=device)
    n = 2000

    def run():
        for _ in range(n):
            x.add_(1.0)

    return _median_seconds(run, 3, sync) / n


def split_sync_seconds(use_gpu: bool, repeats: int = 2000) -> float:
    """What one split sublayer adds beyond its slower part (docs/cost-model.md Eq. 15), as the runtime runs it
    (runtime/executor.py `_split_step`, one thread): launch the GPU part (a tiny kernel, and an event recorded after
    it), compute the CPU part inline meanwhile, wait for the event, launch the merge (a concatenation). The median
    of that less the median of the slower part alone (the GPU part launched and waited for, or the CPU part) is the
    synchronisation. Without a GPU both parts run on the host, one after the other, and the baseline is their sum.
    The interleaved repeats make drifting load hit every variant alike."""
    host = torch.ones(64, dtype=torch.bfloat16)
    device = torch.ones(64, dtype=torch.bfloat16, device="cuda") if use_gpu else host

    def cpu_part():
        return host * 2.0

    def gpu_part():
        out = device * 2.0
        if use_gpu:
            event = torch.cuda.Event()
            event.record()
            return out, event
        return out, None

    def split():
        out, event = gpu_part()
        cpu_out = cpu_part()
        if event is not None:
            event.synchronize()
        return torch.cat((out, out if use_gpu else cpu_out))

    def gpu_alone():
        out, event = gpu_part()
        if event is not None:
            event.synchronize()
        return out

    variants = (split, gpu_alone, cpu_part)
    with torch.inference_mode():
        for fn in variants:  # warm-up: kernel selection, first allocations
            for _ in range(100):
                fn()
        times: dict = {fn: [] for fn in variants}
        for _ in range(repeats):
            for fn in variants:
                start = time.perf_counter()
                fn()
                times[fn].append(time.perf_counter() - start)
    medians = {fn: statistics.median(values) for fn, values in times.items()}
    parts = (max if use_gpu else sum)((medians[gpu_alone], medians[cpu_part]))
    return max(0.0, medians[split] - parts)


def decoder_gemm_shapes(hidden: int) -> tuple[tuple[int, int], ...]:
    """(K, N) of a decoder layer's four weight GEMMs at hidden size d: d→3d (fused q, k, v), d→d (the output
    projection), d→4d and 4d→d (the MLP)."""
    return ((hidden, 3 * hidden), (hidden, hidden), (hidden, 4 * hidden), (4 * hidden, hidden))


def gemm_curve(seconds: dict) -> tuple[tuple[int, float], ...]:
    """{(M, K, N): seconds of one [M, K] × [K, N] GEMM} → ((M, TFLOP/s), ...) by increasing M: at each M the
    shapes' FLOPs over their summed seconds (a layer's GEMMs one after another: each weighs by its time)."""
    rows = sorted({m for m, _, _ in seconds})
    out = []
    for m in rows:
        shapes = [(k, n, t) for (mm, k, n), t in seconds.items() if mm == m]
        out.append((m, sum(2.0 * m * k * n for k, n, _ in shapes) / sum(t for _, _, t in shapes) / 1e12))
    return tuple(out)


# The narrow weight slices a decode split's CPU part reads (Eq. 15b): features (output rows) of a hidden-7168
# decoder (OPT-30B) where the H200's profiled CPU parts ran about 2x their price (358-2867 features) — the start w
# is what those parts pay beyond their roofline
SPLIT_START_HIDDEN = 7168
SPLIT_START_FEATURES = (384, 1024, 2867)
SPLIT_START_WAITS = (0.002, 0.008)  # the main thread's wait for the GPU before the CPU part: a layer's GPU work
SPLIT_START_ROTATE_BYTES = 512 * MIB  # the slices rotated over, per probe: far beyond the last-level cache


def _gpu_wait(seconds: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function that makes the GPU busy for about `seconds` (a spin kernel, `torch.cuda._sleep`, its cycles
    calibrated here against CUDA events) and then copies its argument to the host, which waits for it: the main
    thread's wait for a split part's input (runtime/backend.py `transfer`: `.to('cpu')` of a GPU tensor)."""
    cycles = 1_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # warm-up (module load)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    per_second = cycles / max(start.elapsed_time(end) / 1e3, 1e-6)
    wait_cycles = max(1, int(per_second * seconds))

    def wait(x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(wait_cycles)
        return x.to("cpu")
    return wait


def _host_wait(seconds: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Without a GPU: the main thread sleeps `seconds` (its OpenMP team idle meanwhile), then copies its input."""
    def wait(x: torch.Tensor) -> torch.Tensor:
        time.sleep(seconds)
        return x.clone()
    return wait


def split_cpu_start(use_gpu: bool, hidden: int = SPLIT_START_HIDDEN,
                    features: tuple[int, ...] = SPLIT_START_FEATURES, waits: tuple[float, ...] = SPLIT_START_WAITS,
                    rotate_bytes: int = SPLIT_START_ROTATE_BYTES, repeats: int = 40) -> float:
    """Eq. 15b's w (docs/cost-model.md; the profile's `split_cpu_start_seconds`): what a decode split's CPU part
    costs beyond its roofline, as the runtime meets it (runtime/executor.py `_split_step`: the main thread waits for
    the part's input from the GPU, a copy to the host, its OpenMP team idle through the wait, then computes the CPU
    part inline, F.linear over a narrow slice of the weights read from DDR).

    Each timed sample: the wait (with `use_gpu` a CUDA spin kernel of each of `waits` seconds and a blocking copy of
    the input to the host; without, `time.sleep`), then F.linear of one row [1, hidden] by a slice [f, hidden] of
    bf16 weights, each of `features`, the slices rotated over `rotate_bytes` so each comes from DDR. The baseline:
    the same slices' F.linear back to back (the team and the kernel warm, the weights still from DDR). Samples of
    every wait and width interleave with the baseline's, so drifting load hits both alike. w is the median over
    (wait, width) of median(after the wait) − median(back to back), clamped at 0 (s). About 1.5 s at the defaults
    (the waits: 40 × 3 × 10 ms); without a GPU the number means little (no split runs there)."""
    per_width = max(1, rotate_bytes // len(features))
    slices = {f: _rotated_weights(f, hidden, per_width) for f in features}
    x_host = torch.randn(1, hidden, dtype=torch.bfloat16)
    x = x_host.to("cuda") if use_gpu else x_host
    waits_fns = {s: (_gpu_wait if use_gpu else _host_wait)(s) for s in waits}
    after: dict = {(s, f): [] for s in waits for f in features}
    warm: dict = {f: [] for f in features}
    turn = {f: 0 for f in features}

    def next_slice(f: int) -> torch.Tensor:
        turn[f] += 1
        return slices[f][turn[f] % len(slices[f])]

    with torch.inference_mode():
        for f in features:  # warm-up: oneDNN's kernel choice, first touch of every slice
            for w in slices[f]:
                F.linear(x_host, w)
        for _ in range(repeats):
            for f in features:
                for s in waits:
                    y = waits_fns[s](x)  # the wait, then the CPU part at once
                    w = next_slice(f)
                    began = time.perf_counter()
                    F.linear(y, w)
                    after[(s, f)].append(time.perf_counter() - began)
                F.linear(x_host, next_slice(f))  # the team awake: the baseline's runs follow back to back
                for _ in range(2):
                    w = next_slice(f)
                    began = time.perf_counter()
                    F.linear(x_host, w)
                    warm[f].append(time.perf_counter() - began)
    differences = [statistics.median(after[(s, f)]) - statistics.median(warm[f]) for s in waits for f in features]
    return max(0.0, statistics.median(differences))


def cpu_gemm_curve(hidden: int = SPLIT_START_HIDDEN, rows: tuple[int, ...] = GEMM_ROWS, rotate_bytes: int = GIB,
                   repeats: int = 3, max_seconds: float = 6.0) -> tuple[tuple[int, float], ...]:
    """The AMX (or AVX) bf16 GEMM curve (the profile's `cpu_amx_bf16_tflops`, (M, TFLOP/s) by increasing M) on a
    decoder layer's four weight GEMMs at hidden size `hidden` (`decoder_gemm_shapes`: d→3d, d→d, d→4d, 4d→d),
    pooled per M as `gemm_curve` does, rather than `liac profile`'s square K×K weights: the shapes a CPU linear
    node runs. Each round runs the four GEMMs one after another (as a layer does); the layer's weights are copied
    until they hold `rotate_bytes` and a round takes the next copy, so a small M reads its weights from DDR (one
    hidden-7168 layer is 1.2 GB already). Each shape's median over `repeats` rounds after a warm-up round; the rounds
    at each M stop early once the curve has spent its share of `max_seconds` (at least one timed round)."""
    shapes = decoder_gemm_shapes(hidden)
    layer = [_random(n, k, scale=0.02) for k, n in shapes]
    layer_bytes = sum(w.numel() * 2 for w in layer)
    copies = [layer] + [[w.clone() for w in layer] for _ in range(max(1, -(-rotate_bytes // layer_bytes)) - 1)]
    seconds, began = {}, time.perf_counter()
    turn = 0
    with torch.inference_mode():
        for index, m in enumerate(rows):
            xs = {k: torch.randn(m, k, dtype=torch.bfloat16) for k, _ in shapes}
            times: dict = {(k, n): [] for k, n in shapes}
            share_end = began + max_seconds * (index + 1) / len(rows)
            for round_ in range(repeats + 1):
                ws = copies[turn % len(copies)]
                turn += 1
                for (k, n), w in zip(shapes, ws):
                    start = time.perf_counter()
                    F.linear(xs[k], w)
                    if round_:  # the first: kernel choice, first touch
                        times[(k, n)].append(time.perf_counter() - start)
                if round_ and time.perf_counter() > share_end:
                    break
            for (k, n), values in times.items():
                seconds[(m, k, n)] = max(statistics.median(values), 1e-9)
    return gemm_curve(seconds)


def _event_seconds(fn: Callable[[], object], repeats: int, sustain_seconds: float = 0.0) -> float:
    """Median GPU time of `fn` between CUDA events: a wall clock around a synchronise would add its ~10-20 µs of
    launch and sync to 0.05-0.5 ms GEMMs of few rows. First `fn` runs back to back for `sustain_seconds`, so that
    the timed launches see the clocks a pass of such GEMMs runs at, not a cool GPU's boost."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    while time.perf_counter() - begin < sustain_seconds:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _gpu_gemm_curve(rows: tuple[int, ...], hidden: tuple[int, ...], repeats: int,
                    sustain_seconds: float = 0.0) -> tuple[tuple[int, float], ...]:
    """Eq. 1c's curve: F.linear (the runtime's call) over decoder-shaped bf16 weights of each hidden size, at each
    of `rows` rows, pooled per M (`gemm_curve`), each timed after `sustain_seconds` of it back to back (a prefill
    runs its GEMMs for seconds: GPU_GEMM_SUSTAIN_SECONDS)."""
    cuda = torch.device("cuda")
    seconds = {}
    for d in hidden:
        for k, n in decoder_gemm_shapes(d):
            w = torch.randn(n, k, device=cuda, dtype=torch.bfloat16)
            for m in rows:
                x = torch.randn(m, k, device=cuda, dtype=torch.bfloat16)
                seconds[(m, k, n)] = _event_seconds(lambda: F.linear(x, w), repeats, sustain_seconds)
                del x
            del w
    return gemm_curve(seconds)


def _gpu_numbers(sizes: ProbeSizes, step: Callable[[str], None]) -> dict:
    cuda = torch.device("cuda")
    sync = torch.cuda.synchronize
    out = {}
    step("GPU bf16 GEMM")
    n = 8192 if sizes.gemm_k >= 4096 else 1024
    a = torch.randn(n, n, device=cuda, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=cuda, dtype=torch.bfloat16)
    out["gpu_bf16_tflops"] = 2 * n**3 / _median_seconds(lambda: a @ b, 10, sync) / 1e12
    del a, b
    step("GPU GEMM curve")
    full = sizes.gemm_k >= 4096
    out["gpu_gemm_tflops"] = _gpu_gemm_curve(GPU_GEMM_ROWS if full else GPU_GEMM_ROWS[:2],
                                             GPU_GEMM_HIDDEN if full else (256,), 10 if full else 2,
                                             GPU_GEMM_SUSTAIN_SECONDS if full else 0.0)
    step("HBM bandwidth")
    src = torch.empty(sizes.copy_bytes * 2, dtype=torch.uint8, device=cuda)
    dst = torch.empty_like(src)
    out["gpu_hbm_gb_per_s"] = 2 * src.numel() / _median_seconds(lambda: dst.copy_(src), 10, sync) / GB
    del src, dst
    out["gpu_launch_seconds"] = _launch_seconds("cuda", sync)
    out["gpu_hbm_gib"] = torch.cuda.get_device_properties(0).total_memory / GIB

    step("PCIe copies")
    host = torch.empty(sizes.copy_bytes, dtype=torch.uint8).pin_memory()
    host2 = torch.empty_like(host).pin_memory()
    dev = torch.empty(sizes.copy_bytes, dtype=torch.uint8, device=cuda)
    dev2 = torch.empty_like(dev)
    out["pcie_h2d_gb_per_s"] = host.numel() / _median_seconds(
        lambda: dev.copy_(host, non_blocking=True), sizes.repeats, sync) / GB
    out["pcie_d2h_gb_per_s"] = host.numel() / _median_seconds(
        lambda: host2.copy_(dev2, non_blocking=True), sizes.repeats, sync) / GB
    up, down = torch.cuda.Stream(), torch.cuda.Stream()

    def both():
        with torch.cuda.stream(up):
            dev.copy_(host, non_blocking=True)
        with torch.cuda.stream(down):
            host2.copy_(dev2, non_blocking=True)

    out["pcie_bidir_gb_per_s"] = 2 * host.numel() / _median_seconds(both, sizes.repeats, sync) / GB
    small_h, small_d = torch.empty(4096, dtype=torch.uint8).pin_memory(), torch.empty(4096, dtype=torch.uint8,
                                                                                        device=cuda)
    out["pcie_latency_seconds"] = _median_seconds(lambda: small_d.copy_(small_h, non_blocking=True), 50, sync)
    del host2, dev2

    step("CPU reads while PCIe copies")
    weights = _rotated_weights(sizes.gemm_k, max(1, sizes.weight_bytes // (sizes.gemm_k * 2)), sizes.rotate_bytes)
    copies = max(4, -(-sizes.rotate_bytes // host.numel()))
    cpu_rate, h2d_rate = _concurrent(weights, host, dev, copies, sizes.repeats)
    out["concurrent_cpu_gb_per_s"], out["concurrent_h2d_gb_per_s"] = cpu_rate, h2d_rate
    del weights
    kv_rate, h2d_kv_rate = _beside_copies(_kv_attention(sizes.weight_bytes), host, dev, copies, sizes.repeats)
    out["concurrent_kv_gb_per_s"], out["concurrent_h2d_beside_kv_gb_per_s"] = kv_rate, h2d_kv_rate
    return out


def _concurrent(weights, host, dev, copies: int, repeats: int) -> tuple[float, float]:
    """CPU GEMV over `weights` while `copies` H2D copies of `host` run; both rates over the overlapped window."""
    x = torch.randn(1, weights[0].shape[1], dtype=torch.bfloat16)

    def gemv() -> int:
        read = 0
        for w in weights:
            F.linear(x, w)
            read += w.numel() * 2
        return read
    return _beside_copies(gemv, host, dev, copies, repeats)


def _beside_copies(read: Callable[[], int], host, dev, copies: int, repeats: int) -> tuple[float, float]:
    """A CPU kernel (`read()` runs it and returns the bytes it read) run back to back while `copies` H2D copies of
    `host` run: (its GB/s, the copies' GB/s) over the overlapped window, the median of `repeats`."""
    stream = torch.cuda.Stream()
    cpu_rates, h2d_rates = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        done = torch.cuda.Event()
        start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start_event.record(stream)
            for _ in range(copies):
                dev.copy_(host, non_blocking=True)
            end_event.record(stream)
            done.record(stream)
        start = time.perf_counter()
        nbytes = 0
        while not done.query():  # keep the CPU reading as long as the copies run
            nbytes += read()
        cpu_seconds = time.perf_counter() - start
        torch.cuda.synchronize()
        cpu_rates.append(nbytes / cpu_seconds / GB)
        h2d_rates.append(copies * host.numel() / (start_event.elapsed_time(end_event) / 1e3) / GB)
    return statistics.median(cpu_rates), statistics.median(h2d_rates)


EXPERT_IDLE_SECONDS = 0.005  # the pause before each expert in the idle cases: a layer's GPU work at batch 1
EXPERT_ROUTE_SECONDS = 0.0003  # between the wake and the expert: the routing read on the host


EXPERTS_BESIDE_COPIES = (3, 4)  # a batch-8 split experts layer on the H200: ~3.4 CPU experts a part, ~3.7 copied


def experts_beside_copies_rate(compute: Callable[[int], object], copy: Callable[[int, int], object],
                               wait: Callable[[], object], count: int, expert_bytes: int,
                               shape: tuple[int, int] = EXPERTS_BESIDE_COPIES, repeats: int = 3,
                               pause: Callable[[], object] | None = None) -> float:
    """GB/s DDR serves in total while a split experts unit runs as the runtime runs it: `copies` routed experts'
    copies launched first (`copy(slot, expert)`, two slots in turn as the layer's expert slots), then `cpu` experts
    computed on the CPU back to back (`compute(expert)`), until both are done (`wait()`); both sides' bytes over
    that span, per group of experts (rotated over `count`, none twice in a group when count allows), the median of
    `repeats` rounds after a warm-up round. `pause()` before each group: the layer's GPU work and the routing read
    (an idle CPU, its team woken). `ddr_shared_experts_gb_per_s`, Eq. 21b's DDR term (docs/cost-model.md)."""
    cpu, copies = shape
    means = []
    for round_ in range(repeats + 1):
        total, groups = 0.0, 0
        for first in range(0, count, cpu):
            if pause is not None:
                pause()
            began = time.perf_counter()
            for j in range(copies):
                copy(j % 2, (first + cpu + j) % count)
            for j in range(cpu):
                compute((first + j) % count)
            wait()
            total += time.perf_counter() - began
            groups += 1
        if round_:  # the first: kernel choice, first touch
            means.append(total / groups)
    return (cpu + copies) * expert_bytes / statistics.median(means) / GB


def expert_rates(hidden: int, ffn: int, rotate_bytes: int, repeats: int = 3, use_gpu: bool | None = None,
                 idle_seconds: float = EXPERT_IDLE_SECONDS) -> dict[str, float]:
    """GB/s of expert weights the CPU reads running an MoE expert as the runtime's CPU experts do at batch 1: one
    SwiGLU expert (liac.models.mixtral.expert_ffn: gate_up [2F, D], then down [D, F]) at one row, over rotated
    bf16 experts (none cached) page-locked as the runtime's host arena is, with the faster of F.linear and torch.mv
    (the engine's `choose_cpu_linear` choice), in three cases:

    - `cpu_expert_gb_per_s`: back to back (the rates stage's GEMV on these shapes, through the expert's code);
    - `cpu_expert_after_idle_gb_per_s`: each expert after `idle_seconds` with the CPU idle (at batch 1 a layer's
      CPU part follows its attention and router on the GPU; the OpenMP team may sleep between);
    - `cpu_expert_after_idle_woken_gb_per_s`: the same, with the team woken at the end of the pause and the expert
      `EXPERT_ROUTE_SECONDS` later, as the runtime's experts op does (runtime/executor.py `_CpuTeamWake`, before
      its routing read);
    - `cpu_expert_beside_copy_gb_per_s` (CUDA only): as the previous, with another expert's weights copied to the
      GPU beside it (pinned H2D, launched just before: a batch-1 split experts unit, one routed expert on each
      side; Eq. 21c's rate); `h2d_beside_expert_gb_per_s`, that copy's rate;
    - `ddr_shared_experts_gb_per_s` (CUDA only): DDR's total while 3 experts compute on the CPU beside 4 others'
      copies, as a batch-8 split experts unit (`experts_beside_copies_rate`; Eq. 21b's DDR term).

    Only the expert's own seconds count (not the pauses). Each case takes the median of `repeats` rounds over the
    rotated experts, after a warm-up round."""
    gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
    one = 3 * hidden * ffn * 2  # bytes of one bf16 expert
    count = min(32, max(3, -(-rotate_bytes // one)))  # ≥ 3 GB of a real model's experts fit well under the cap
    gate_up = [_random(2 * ffn, hidden, scale=0.02) for _ in range(count)]
    down = [_random(hidden, ffn, scale=0.02) for _ in range(count)]
    x = torch.randn(1, hidden, dtype=torch.bfloat16)
    registered = []
    if gpu:  # page-locked as the runtime's arena (cudaHostRegister), so the copies are DMA
        for t in (*gate_up, *down):
            if int(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)) == 0:
                registered.append(t)

    def mv(x, w, bias):
        return torch.mv(w, x[0])[None]

    team = torch.empty(max(1, torch.get_num_threads()) * 32768, dtype=torch.float32)  # a chunk per thread

    def rounds(linear, idle: float = 0.0, copy=None, wake: bool = False) -> float:
        seconds = []
        with torch.inference_mode():
            for round_ in range(repeats + 1):
                total = 0.0
                for e in range(count):
                    if idle:
                        time.sleep(idle)
                    if wake:
                        team.zero_()  # one parallel op: every thread of the team runs a chunk
                        time.sleep(EXPERT_ROUTE_SECONDS)
                    if copy is not None:
                        copy((e + 1) % count)
                    began = time.perf_counter()
                    expert_ffn(gate_up[e], down[e], x, linear)
                    total += time.perf_counter() - began
                    if copy is not None:
                        torch.cuda.synchronize()
                if round_:  # the first: oneDNN's kernel choice, first touch
                    seconds.append(total)
        return count * one / statistics.median(seconds) / GB

    try:
        kernels = {"F.linear": F.linear, "torch.mv": mv}
        alone = {name: rounds(kernel) for name, kernel in kernels.items()}
        name = max(alone, key=alone.get)
        out = {"cpu_expert_gb_per_s": alone[name],
               "cpu_expert_after_idle_gb_per_s": rounds(kernels[name], idle_seconds),
               "cpu_expert_after_idle_woken_gb_per_s": rounds(kernels[name], idle_seconds, wake=True)}
        if gpu:
            stream = torch.cuda.Stream()
            staged = [torch.empty_like(gate_up[0], device="cuda"), torch.empty_like(down[0], device="cuda")]
            events = []

            def copy(e: int) -> None:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with torch.cuda.stream(stream):
                    start.record(stream)
                    staged[0].copy_(gate_up[e], non_blocking=True)
                    staged[1].copy_(down[e], non_blocking=True)
                    end.record(stream)
                events.append((start, end))

            out["cpu_expert_beside_copy_gb_per_s"] = rounds(kernels[name], idle_seconds, copy, wake=True)
            torch.cuda.synchronize()
            copies = events[count:]  # after the warm-up round
            out["h2d_beside_expert_gb_per_s"] = len(copies) * one / (
                sum(a.elapsed_time(b) for a, b in copies) / 1e3) / GB
            slots = [staged, [torch.empty_like(gate_up[0], device="cuda"), torch.empty_like(down[0], device="cuda")]]

            def copy_to(slot: int, e: int) -> None:
                with torch.cuda.stream(stream):
                    slots[slot][0].copy_(gate_up[e], non_blocking=True)
                    slots[slot][1].copy_(down[e], non_blocking=True)

            def pause() -> None:
                time.sleep(idle_seconds)
                team.zero_()
                time.sleep(EXPERT_ROUTE_SECONDS)

            with torch.inference_mode():
                out["ddr_shared_experts_gb_per_s"] = experts_beside_copies_rate(
                    lambda e: expert_ffn(gate_up[e], down[e], x, kernels[name]), copy_to, torch.cuda.synchronize,
                    count, one, repeats=repeats, pause=pause)
        return out
    finally:
        for t in registered:
            torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


def measure_rates(sizes: ProbeSizes, use_gpu: bool | None = None) -> dict[str, float]:
    """The bandwidths a memory-bound step depends on, in profile fields, in seconds rather than minutes: CPU GEMV
    and decode-attention reads over rotated data, and with CUDA pinned H2D, D2H and the CPU reading while H2D runs
    (their sum is `ddr_shared_gb_per_s`), and the fused decode attention reading its KV cache while H2D runs (their
    sum is `ddr_shared_kv_gb_per_s`). bench/h200.py measures them beside its runs, so that the floor uses the
    rates of the same machine start (the CPU side of a shared host varies 2-3x between starts)."""
    gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
    weights = _rotated_weights(sizes.gemm_k, max(1, sizes.weight_bytes // (sizes.gemm_k * 2)), sizes.rotate_bytes)
    gemv = _rotated_shapes(sizes.gemv_shapes, sizes.rotate_bytes) if sizes.gemv_shapes else weights
    rates = {"cpu_ddr_read_gb_per_s": max(_gemv_rate(gemv, k, sizes.repeats) for k in ("F.linear", "torch.mv")),
             "cpu_kv_read_gb_per_s": _kv_read_rate(sizes.weight_bytes, sizes.repeats)}
    if gpu:
        cuda, sync = torch.device("cuda"), torch.cuda.synchronize
        host = torch.empty(sizes.copy_bytes, dtype=torch.uint8).pin_memory()
        dev = torch.empty(sizes.copy_bytes, dtype=torch.uint8, device=cuda)
        rates["pcie_h2d_gb_per_s"] = host.numel() / _median_seconds(
            lambda: dev.copy_(host, non_blocking=True), sizes.repeats, sync) / GB
        rates["pcie_d2h_gb_per_s"] = host.numel() / _median_seconds(
            lambda: host.copy_(dev, non_blocking=True), sizes.repeats, sync) / GB
        copies = max(4, -(-sizes.rotate_bytes // host.numel()))
        cpu_rate, h2d_rate = _concurrent(weights, host, dev, copies, sizes.repeats)
        rates["ddr_shared_gb_per_s"] = cpu_rate + h2d_rate
        rates["concurrent_cpu_gb_per_s"], rates["concurrent_h2d_gb_per_s"] = cpu_rate, h2d_rate
        # the fused decode attention beside the same copies: what DDR serves that kernel and the stream
        # (`ddr_shared_kv_gb_per_s`, Eqs. 6 and 18: it drew more than the GEMV's total on the H200)
        kv_rate, h2d_kv_rate = _beside_copies(_kv_attention(sizes.weight_bytes), host, dev, copies, sizes.repeats)
        rates["ddr_shared_kv_gb_per_s"] = kv_rate + h2d_kv_rate
        rates["concurrent_kv_gb_per_s"], rates["concurrent_h2d_beside_kv_gb_per_s"] = kv_rate, h2d_kv_rate
    return rates


def _ddr_gib() -> float:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return 0.0


def measure_host(sizes: ProbeSizes, progress: Callable[[int, int, str], None] | None = None,
                 use_gpu: bool | None = None) -> Measurements:
    """Run every measurement this host supports; `progress(step, total, name)` is called as each step starts
    (steps count from 1)."""
    steps = ["CPU GEMM curve", "CPU GEMV", "CPU decode attention", "CPU prefill attention", "CPU launch",
             "split sync"]
    gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
    if gpu:
        steps += ["split start", "GPU bf16 GEMM", "GPU GEMM curve", "HBM bandwidth", "PCIe copies", "CPU reads while PCIe copies"]
    done = [0]

    def step(name: str) -> None:
        done[0] += 1
        if progress:
            progress(done[0], len(steps), name)

    step("CPU GEMM curve")
    curve = _gemm_curve(sizes.gemm_k, sizes.rotate_bytes, sizes.repeats)
    step("CPU GEMV")
    weights = _rotated_weights(sizes.gemm_k, max(1, sizes.weight_bytes // (sizes.gemm_k * 2)), sizes.rotate_bytes)
    rates = {kernel: _gemv_rate(weights, kernel, sizes.repeats) for kernel in ("F.linear", "torch.mv")}
    kernel = max(rates, key=rates.get)
    del weights
    step("CPU decode attention")
    kv = _kv_read_rate(sizes.weight_bytes, sizes.repeats)
    step("CPU prefill attention")
    attention = attention_curve(ATTENTION_QUERIES if sizes.repeats >= 5 else ATTENTION_QUERIES[:2],
                                 max(2, sizes.repeats // 2))
    step("CPU launch")
    cpu_launch = _launch_seconds("cpu", lambda: None)
    step("split sync")
    sync = split_sync_seconds(gpu, repeats=2000 if sizes.repeats >= 5 else 300)
    gpu_numbers = {}
    if gpu:  # without a GPU no split runs, and a start after a host sleep would price nothing real
        step("split start")
        quick = sizes.repeats < 5
        gpu_numbers["split_cpu_start_seconds"] = split_cpu_start(
            True, rotate_bytes=min(sizes.rotate_bytes, SPLIT_START_ROTATE_BYTES), repeats=8 if quick else 40)
        gpu_numbers.update(_gpu_numbers(sizes, step))
    return Measurements(cpu_threads=torch.get_num_threads(), cpu_gemm_tflops=tuple(curve),
                        cpu_gemv_gb_per_s=rates[kernel], cpu_gemv_kernel=kernel, cpu_kv_read_gb_per_s=kv,
                        cpu_launch_seconds=cpu_launch, split_sync_seconds=sync, cpu_ddr_gib=_ddr_gib(),
                        cpu_attention_tflops=tuple(attention),
                        **gpu_numbers)

