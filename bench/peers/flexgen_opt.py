"""Peer: FlexGen 0.1.8 (`flexgen.flex_opt.OptLM`) with dummy fp16 weights, one policy or its best within a budget.

    # one policy (FlexGen's flags)
    python3 bench/peers/flexgen_opt.py --model opt-30b --batch 8 --prompt-len 128 --gen-len 32 \
        --percent 30 70 100 0 100 0 --gpu-batch-size 8 --num-gpu-batches 1 [--cpu-cache-compute] --json-out fg.json
    # FlexGen's best --percent within the GPU budget
    python3 bench/peers/flexgen_opt.py --model opt-30b --batch 8 --prompt-len 128 --gen-len 32 \
        --gpu-budget-gib 24 --search --json-out fg.json

FlexGen is driven the way its own `run_flexgen` does (Policy, ExecutionEnv of TorchDevice/TorchDisk/TorchMixedDevice,
`OptLM(config, env, '_DUMMY_', policy)`, a warm-up `generate`, then the timed `generate` read from
`timers('generate')`: entry 0 is the prefill, the rest one per decode step), except: no tokenizer (random token ids),
and the dummy weights (FlexGen fills them with ones) are filled in place with `fill_(1)` rather than copied from a
NumPy array per tensor, which only makes loading faster. Overlap is on, attention and MLP are separate layers.

Search (`--search`): FlexGen has no search of its own in 0.1.8, so this script enumerates a few policies, filters
them with FlexGen's own size formulas (its `OptConfig.cache_bytes` / `hidden_bytes`, and its weight-placement rule
`init_weight_list` reproduced exactly in `weight_homes`) against the GPU budget and the host's memory (pinned
weights cost a power of two each in PyTorch's pinned allocator: where they do not fit, unpinned ones), runs each
survivor for a few tokens in a subprocess (a fresh CUDA context, so each peak is its own), and re-runs the fastest
for the full workload (a lone candidate runs the full workload at once). Candidates: cache on the GPU, or on the CPU with attention on the GPU or on the CPU
(`--cpu-cache-compute`), each with as many weights on the GPU as the estimate allows; GPU batch = the largest one
whose prefill activations stay small, and half of it. A candidate whose measured peak (reserved) exceeds the budget
is re-run once with fewer GPU weights, the overshoot set aside (the allocator keeps more than the tensors need: on
the H200 with OPT-1.3B, 2.28 GB reserved for 1.94 GB allocated). `--search-budget-s` bounds the whole search,
`--max-candidates` the runs. Every candidate, its estimate, measurement or error is in the result's `search.tried`.

FlexGen's placement is coarse: each weight goes whole to one device by where its midpoint falls in its layer, so
`w_gpu` moves weights in steps of a whole matrix (OPT-30B at 24 GiB: 25% puts only each out_proj on the GPU, 26%
adds every fc2 and overflows). Its disk device's copy threads (4, each pinning 2 GiB) also relay GPU → pageable-CPU
copies of a CPU-resident KV cache, so they run even without disk offload.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # peer_common beside this script

from peer_common import GIB, OptShapes, PeerResult, base_parser, gpu_peak_bytes, opt_shapes, positive_float, \
    positive_int, random_token_ids, reset_gpu_peak  # noqa: E402

__all__ = ["Candidate", "build_parser", "check_args", "weight_specs", "weight_homes", "gpu_weight_bytes",
           "activation_bytes", "estimate_gpu_bytes", "estimate_host_bytes", "max_weight_percent", "search_candidates",
           "shrink_candidate", "projected_tokens_per_second", "run_once", "run_search", "main"]

FP16 = 2
WEIGHT_STEP_PERCENT = 1  # --percent is integers in FlexGen's CLI
ESTIMATE_MARGIN = 0.92   # candidates must fit in this share of the budget: the allocator rounds and fragments
ACTIVATION_SHARE = 0.15  # the GPU batch is the largest whose prefill activations fit in this share of the budget
MAX_RETRIES = 2          # over-budget candidates re-run with fewer GPU weights (search only)
COPY_THREAD_BYTES = 4 * 2 * GIB  # TorchDisk's 4 copy threads each pin a 1 G-element fp16 relay buffer


def build_parser():
    parser = base_parser("flexgen_opt.py", "FlexGen 0.1.8 baseline (dummy fp16 OPT weights).", gen_len_default=32)
    parser.add_argument("--percent", nargs=6, type=int, metavar="P",
                        help="w_gpu w_cpu cache_gpu cache_cpu act_gpu act_cpu (FlexGen's six percentages)")
    parser.add_argument("--gpu-batch-size", type=positive_int, help="sequences per GPU batch (default: --batch)")
    parser.add_argument("--num-gpu-batches", type=positive_int,
                        help="GPU batches (default: --batch / --gpu-batch-size)")
    parser.add_argument("--pin-weight", choices=("true", "false"), default="true",
                        help="pin the CPU weights (FlexGen's default: true)")
    parser.add_argument("--cpu-cache-compute", action="store_true", help="compute decode attention on the CPU")
    parser.add_argument("--search", action="store_true", help="find FlexGen's best --percent within the budget")
    parser.add_argument("--search-gen-len", type=positive_int, default=3,
                        help="tokens each search candidate generates (default 3: prefill + 2 decode steps)")
    parser.add_argument("--search-budget-s", type=positive_float, default=900.0,
                        help="stop starting candidates after this many seconds (default 900)")
    parser.add_argument("--candidate-timeout-s", type=positive_float, default=600.0,
                        help="kill one candidate run after this many seconds (default 600)")
    parser.add_argument("--host-mem-gib", type=positive_float,
                        help="host memory the search may plan for (default: 90%% of MemTotal)")
    parser.add_argument("--max-candidates", type=positive_int, default=4,
                        help="run at most this many search candidates, most GPU weights first (default 4)")
    parser.add_argument("--offload-dir", help="FlexGen's disk directory (unused: no disk offload; default: a temp dir)")
    return parser


def check_args(args) -> str | None:
    """The first problem with the flags, as one line (None when fine)."""
    if args.search and args.percent:
        return "--percent: must not be given with --search (the search picks it)"
    if not args.search and not args.percent:
        return "--percent: required (or pass --search)"
    if args.percent:
        if any(p < 0 or p > 100 for p in args.percent):
            return f"--percent: each must be between 0 and 100, got {args.percent}"
        for label, pair in (("weights", args.percent[0:2]), ("cache", args.percent[2:4]),
                            ("activations", args.percent[4:6])):
            if sum(pair) > 100:
                return f"--percent: {label} GPU + CPU must be at most 100, got {pair[0]} + {pair[1]}"
        if args.percent[4] not in (0, 100) or args.percent[5] not in (0, 100):
            return "--percent: activations must sit wholly on one device (FlexGen: 100 0 or 0 100)"
        if sum(args.percent[0:2]) < 100 or sum(args.percent[2:4]) < 100:
            return "--percent: this driver has no disk offload: GPU + CPU must be 100 for weights and cache"
    gbs = args.gpu_batch_size or args.batch
    ngb = args.num_gpu_batches or max(args.batch // gbs, 1)
    if gbs * ngb != args.batch:
        return (f"--gpu-batch-size: {gbs} × --num-gpu-batches {ngb} must equal --batch {args.batch}")
    return None


# ---------------------------------------------------------------------------------------------------------------
# FlexGen's memory arithmetic (pure: tested on the CPU machine)


def weight_specs(shapes: OptShapes) -> list[list[tuple[int, ...]]]:
    """Weight shapes of each FlexGen layer in order (its `init_weight` lists): InputEmbed, then SelfAttention and
    MLP per decoder layer (sep_layer), then OutputEmbed. FlexGen's MLP is 4h wide, whatever ffn_dim says."""
    h, v, s = shapes.hidden_size, shapes.vocab_size, shapes.max_position
    attention = [(h, h), (h,)] * 4 + [(h,), (h,)]
    mlp = [(4 * h, h), (4 * h,), (h, 4 * h), (h,), (h,), (h,)]
    return [[(v, h), (s + 2, h)]] + [attention, mlp] * shapes.num_layers + [[(h,), (h,), (v, h)]]


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def weight_homes(shapes_of_layer: list[tuple[int, ...]], w_gpu: float, w_cpu: float) -> list[str]:
    """Where FlexGen's `init_weight_list` homes each weight of one layer: by its cumulative-size midpoint within the
    layer against the split [disk, cpu, gpu] (the same arithmetic as flex_opt.get_choice)."""
    sizes = [_numel(shape) for shape in shapes_of_layer]
    total = sum(sizes)
    bounds, running = [], 0.0
    for percent in (100 - w_gpu - w_cpu, w_cpu, w_gpu):
        running += percent
        bounds.append(running)
    homes, cumulative = [], 0
    for size in sizes:
        cumulative += size
        mid_percent = (cumulative - size / 2) / total * 100
        home = "gpu"
        for bound, name in zip(bounds, ("disk", "cpu", "gpu")):
            if mid_percent < bound:
                home = name
                break
        homes.append(home)
    return homes


def gpu_weight_bytes(shapes: OptShapes, w_gpu: float) -> tuple[int, int]:
    """(bytes of weights homed on the GPU, most offloaded bytes of two consecutive layers) at w_cpu = 100 - w_gpu.

    The second is what the GPU holds of streamed weights at once: the layer computing and the next one loading.
    """
    resident, offloaded = 0, []
    for layer in weight_specs(shapes):
        homes = weight_homes(layer, w_gpu, 100 - w_gpu)
        off = 0
        for shape, home in zip(layer, homes):
            if home == "gpu":
                resident += _numel(shape) * FP16
            else:
                off += _numel(shape) * FP16
        offloaded.append(off)
    pairs = max((a + b for a, b in zip(offloaded, offloaded[1:])), default=0)
    return resident, pairs


def _cache_bytes(shapes: OptShapes, batch: int, seq_len: int) -> int:
    """FlexGen's OptConfig.cache_bytes: K and V, fp16, every layer."""
    return 2 * batch * seq_len * shapes.num_layers * shapes.hidden_size * FP16


def _hidden_bytes(shapes: OptShapes, batch: int, seq_len: int) -> int:
    """FlexGen's OptConfig.hidden_bytes: one hidden state, fp16."""
    return batch * seq_len * shapes.hidden_size * FP16


def activation_bytes(shapes: OptShapes, batch: int, gpu_batch: int, prompt_len: int) -> int:
    """Prefill activations on the GPU (act on GPU): every GPU batch's hidden state in and out, plus the largest
    transient of one GPU batch: attention scores (bmm, mask, softmax: three [b·heads, s, s] tensors) with q, k, v and
    the output; or the MLP's 4h-wide hidden; or the LM head's logits over every prompt position (FlexGen computes
    all of them)."""
    h, s, heads = shapes.hidden_size, prompt_len, shapes.num_heads
    attention = 3 * gpu_batch * heads * s * s * FP16 + 5 * _hidden_bytes(shapes, gpu_batch, s)
    mlp = gpu_batch * s * 4 * h * FP16 + 2 * _hidden_bytes(shapes, gpu_batch, s)
    logits = gpu_batch * s * shapes.vocab_size * FP16
    return 2 * _hidden_bytes(shapes, batch, s) + max(attention, mlp, logits)


def estimate_gpu_bytes(shapes: OptShapes, batch: int, prompt_len: int, gen_len: int, gpu_batch: int,
                       w_gpu: float, cache_gpu: float, cpu_cache_compute: bool) -> dict:
    """FlexGen's peak GPU memory for one policy, by part (bytes); 'total' sums them."""
    seq = prompt_len + gen_len
    resident, streamed = gpu_weight_bytes(shapes, w_gpu)
    cache = int(_cache_bytes(shapes, batch, seq) * cache_gpu / 100)
    # Decode attention on the GPU copies one layer's K and V (permute + reshape); with the cache on the CPU it also
    # holds the copied-in cache of the layer computing and of the next one.
    per_layer_kv = 2 * gpu_batch * seq * shapes.hidden_size * FP16
    kv_buffers = 0 if cpu_cache_compute and cache_gpu == 0 else per_layer_kv
    if cache_gpu < 100 and not cpu_cache_compute:
        kv_buffers += 2 * per_layer_kv
    parts = {"weights": resident, "streamed_weights": streamed, "kv_cache": cache, "kv_buffers": kv_buffers,
             "activations": activation_bytes(shapes, batch, gpu_batch, prompt_len)}
    parts["total"] = sum(parts.values())
    return parts


def estimate_host_bytes(shapes: OptShapes, batch: int, prompt_len: int, gen_len: int, gpu_batch: int,
                        w_gpu: float, cache_gpu: float, cpu_cache_compute: bool, pin_weight: bool = True) -> int:
    """Host memory one policy needs (bytes): weights not on the GPU (pinned ones, FlexGen's default and always its
    vectors, rounded up to a power of two each as PyTorch's pinned allocator does), the KV cache not on the GPU, with
    --cpu-cache-compute FlexGen's fp32 K/V workspace of one GPU batch, and the pinned relay buffers of its disk
    copy threads (4 × 2 GiB, allocated whatever the policy)."""
    weights = 0
    for layer in weight_specs(shapes):
        for shape, home in zip(layer, weight_homes(layer, w_gpu, 100 - w_gpu)):
            if home != "gpu":
                nbytes = _numel(shape) * FP16
                weights += 1 << max(nbytes - 1, 0).bit_length() if (pin_weight or len(shape) < 2) else nbytes
    cache = _cache_bytes(shapes, batch, prompt_len + gen_len) * (100 - cache_gpu) / 100
    workspace = 2 * gpu_batch * (prompt_len + gen_len) * shapes.hidden_size * 4 if cpu_cache_compute else 0
    return int(weights + cache + workspace + COPY_THREAD_BYTES)


def max_weight_percent(shapes: OptShapes, batch: int, prompt_len: int, gen_len: int, gpu_batch: int,
                       cache_gpu: float, cpu_cache_compute: bool, budget_bytes: float) -> int | None:
    """The largest integer w_gpu whose estimate fits `budget_bytes` (None when even 0 does not)."""
    best = None
    for w_gpu in range(0, 101, WEIGHT_STEP_PERCENT):
        need = estimate_gpu_bytes(shapes, batch, prompt_len, gen_len, gpu_batch, w_gpu, cache_gpu,
                                  cpu_cache_compute)["total"]
        if need <= budget_bytes:
            best = w_gpu
    return best


@dataclass(frozen=True)
class Candidate:
    """One FlexGen policy the search may run."""

    percent: tuple[int, int, int, int, int, int]
    gpu_batch_size: int
    num_gpu_batches: int
    cpu_cache_compute: bool
    pin_weight: bool
    estimated_gpu_bytes: int

    def flags(self) -> list[str]:
        out = ["--percent", *map(str, self.percent), "--gpu-batch-size", str(self.gpu_batch_size),
               "--num-gpu-batches", str(self.num_gpu_batches), "--pin-weight", "true" if self.pin_weight else "false"]
        return out + (["--cpu-cache-compute"] if self.cpu_cache_compute else [])


def _gpu_batches(shapes: OptShapes, batch: int, prompt_len: int, budget_bytes: float) -> list[int]:
    divisors = [g for g in range(batch, 0, -1) if batch % g == 0]
    fitting = [g for g in divisors
               if activation_bytes(shapes, batch, g, prompt_len) - 2 * _hidden_bytes(shapes, batch, prompt_len)
               <= ACTIVATION_SHARE * budget_bytes]
    if not fitting:
        return [1]
    largest = fitting[0]
    half = [g for g in fitting if g <= largest // 2][:1]
    return [largest] + half


def search_candidates(shapes: OptShapes, batch: int, prompt_len: int, gen_len: int, budget_bytes: float,
                      host_budget_bytes: float | None = None) -> list[Candidate]:
    """The policies worth running, most GPU-resident weights first; dominated ones dropped (see the docstring).

    With `host_budget_bytes`, a policy whose host memory (`estimate_host_bytes`) exceeds it with pinned weights is
    kept with unpinned ones if those fit, else dropped.
    A CPU-cache policy with no more GPU weights than the GPU-cache policy of the same GPU batch is dropped (keeping
    the cache on the GPU is then never slower), and so is a smaller GPU batch that gains no GPU weights.
    """
    usable = budget_bytes * ESTIMATE_MARGIN
    out: list[Candidate] = []
    best_by_mode: dict[tuple[int, bool], int] = {}
    for gpu_batch in _gpu_batches(shapes, batch, prompt_len, budget_bytes):
        gpu_cache_w = None
        for cache_gpu, compute in ((100, False), (0, False), (0, True)):
            w_gpu = max_weight_percent(shapes, batch, prompt_len, gen_len, gpu_batch, cache_gpu, compute, usable)
            if w_gpu is None:
                continue
            pin = True
            if host_budget_bytes is not None and estimate_host_bytes(
                    shapes, batch, prompt_len, gen_len, gpu_batch, w_gpu, cache_gpu, compute) > host_budget_bytes:
                # Pinned weights cost a power of two each: unpinned ones (copied through a pinned relay) may fit.
                pin = False
                if estimate_host_bytes(shapes, batch, prompt_len, gen_len, gpu_batch, w_gpu, cache_gpu, compute,
                                       pin_weight=False) > host_budget_bytes:
                    continue
            if cache_gpu == 100:
                gpu_cache_w = w_gpu
            elif gpu_cache_w is not None and w_gpu <= gpu_cache_w:
                continue
            mode = (cache_gpu, compute)
            if mode in best_by_mode and w_gpu <= best_by_mode[mode]:
                continue
            best_by_mode[mode] = w_gpu
            need = estimate_gpu_bytes(shapes, batch, prompt_len, gen_len, gpu_batch, w_gpu, cache_gpu, compute)
            out.append(Candidate(percent=(w_gpu, 100 - w_gpu, cache_gpu, 100 - cache_gpu, 100, 0),
                                 gpu_batch_size=gpu_batch, num_gpu_batches=batch // gpu_batch,
                                 cpu_cache_compute=compute, pin_weight=pin, estimated_gpu_bytes=need["total"]))
    return sorted(out, key=lambda c: (-c.percent[0], -c.percent[2], c.cpu_cache_compute, -c.gpu_batch_size))


def shrink_candidate(shapes: OptShapes, batch: int, prompt_len: int, gen_len: int, budget_bytes: float,
                     candidate: Candidate, overshoot_bytes: float) -> Candidate | None:
    """The same policy with the most GPU weights that fit once a measured overshoot (peak − budget, plus 2% of the
    budget) is set aside; None when that leaves no fewer weights on the GPU or nothing fits."""
    usable = budget_bytes * ESTIMATE_MARGIN - max(overshoot_bytes, 0) - 0.02 * budget_bytes
    cache_gpu, compute = candidate.percent[2], candidate.cpu_cache_compute
    w_gpu = max_weight_percent(shapes, batch, prompt_len, gen_len, candidate.gpu_batch_size, cache_gpu, compute,
                               usable)
    if w_gpu is None or gpu_weight_bytes(shapes, w_gpu)[0] >= gpu_weight_bytes(shapes, candidate.percent[0])[0]:
        return None
    need = estimate_gpu_bytes(shapes, batch, prompt_len, gen_len, candidate.gpu_batch_size, w_gpu, cache_gpu, compute)
    return Candidate(percent=(w_gpu, 100 - w_gpu, *candidate.percent[2:]), gpu_batch_size=candidate.gpu_batch_size,
                     num_gpu_batches=candidate.num_gpu_batches, cpu_cache_compute=compute,
                     pin_weight=candidate.pin_weight, estimated_gpu_bytes=need["total"])


def projected_tokens_per_second(result: dict, batch: int, gen_len: int) -> float | None:
    """Tokens/s of the full workload projected from a short run: prefill + (gen_len − 1) mean decode steps."""
    prefill, step = result.get("prefill_ms"), result.get("decode_ms_per_token")
    if prefill is None or (gen_len > 1 and step is None):
        return None
    total_ms = prefill + (gen_len - 1) * (step or 0.0)
    return batch * gen_len / (total_ms / 1e3) if total_ms > 0 else None


# ---------------------------------------------------------------------------------------------------------------
# Running FlexGen (GPU machine only)


def _flexgen_config(shapes: OptShapes):
    from flexgen.opt_config import OptConfig, get_opt_config

    try:
        return get_opt_config(shapes.name)
    except (ValueError, NotImplementedError):
        return OptConfig(name=shapes.name, num_hidden_layers=shapes.num_layers, max_seq_len=shapes.max_position,
                         hidden_size=shapes.hidden_size, n_head=shapes.num_heads, input_dim=shapes.hidden_size,
                         ffn_embed_dim=shapes.ffn_dim, vocab_size=shapes.vocab_size)


def _fast_init_weight_list(weight_specs_, policy, env):
    """flex_opt.init_weight_list for dummy weights, filled in place (same homes, same pinning, same values: ones)."""
    import numpy as np

    assert not policy.compress_weight, "compressed weights are not driven here"
    devices = {"disk": env.disk, "cpu": env.cpu, "gpu": env.gpu}
    homes = weight_homes([tuple(spec[0]) for spec in weight_specs_], policy.w_gpu_percent, policy.w_cpu_percent)
    out = []
    for (shape, dtype, filename), home in zip(weight_specs_, homes):
        pin = True if len(shape) < 2 else policy.pin_weight
        weight = devices[home].allocate(shape, dtype, pin_memory=pin)
        if home == "disk":
            weight.load_from_np(np.ones(shape, dtype))
        else:
            weight.data.fill_(1)
        out.append(weight)
    return out


def _gpu_bytes_of(value) -> int:
    """Bytes of CUDA tensors inside FlexGen's weight holders (ValueHolder / tuples of TorchTensor)."""
    from flexgen.pytorch_backend import DeviceType, TorchTensor

    if isinstance(value, TorchTensor):
        return int(value.bytes) if value.device.device_type == DeviceType.CUDA else 0
    if isinstance(value, (list, tuple)):
        return sum(_gpu_bytes_of(v) for v in value)
    if hasattr(value, "val"):
        return _gpu_bytes_of(value.val)
    return 0


def run_once(args, result: PeerResult, shapes: OptShapes) -> None:
    """One FlexGen policy: load, warm up, time `generate`, record numbers and peak memory into `result`."""
    import shutil

    import torch
    from flexgen import flex_opt
    from flexgen.compression import CompressionConfig
    from flexgen.pytorch_backend import TorchDevice, TorchDisk, TorchMixedDevice
    from flexgen.timer import timers
    from flexgen.utils import ExecutionEnv

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available: FlexGen runs on the GPU machine only")
    gbs = args.gpu_batch_size or args.batch
    ngb = args.num_gpu_batches or args.batch // gbs
    percent = list(args.percent)
    policy = flex_opt.Policy(
        gbs, ngb, *percent, overlap=True, sep_layer=True, pin_weight=args.pin_weight == "true",
        cpu_cache_compute=args.cpu_cache_compute, attn_sparsity=1.0, compress_weight=False,
        comp_weight_config=CompressionConfig(num_bits=4, group_size=64, group_dim=0, symmetric=False),
        compress_cache=False,
        comp_cache_config=CompressionConfig(num_bits=4, group_size=64, group_dim=2, symmetric=False))
    estimate = estimate_gpu_bytes(shapes, args.batch, args.prompt_len, args.gen_len, gbs, percent[0], percent[2],
                                  args.cpu_cache_compute)
    result["settings"] = {"percent": percent, "gpu_batch_size": gbs, "num_gpu_batches": ngb,
                          "pin_weight": policy.pin_weight, "cpu_cache_compute": policy.cpu_cache_compute,
                          "overlap": True, "sep_layer": True, "dtype": "float16", "weights": "dummy (ones)",
                          "estimated_gpu_bytes": estimate, "torch": torch.__version__}
    flex_opt.init_weight_list = _fast_init_weight_list
    offload_dir = args.offload_dir or tempfile.mkdtemp(prefix="flexgen-offload-")
    gpu, cpu = TorchDevice("cuda:0"), TorchDevice("cpu")
    # Its copy threads also relay GPU → pageable-CPU copies (a KV cache on the CPU is not pinned): keep FlexGen's 4.
    disk = TorchDisk(offload_dir)
    env = ExecutionEnv(gpu=gpu, cpu=cpu, disk=disk, mixed=TorchMixedDevice([gpu, cpu, disk]))
    inputs = random_token_ids(args.batch, args.prompt_len, shapes.vocab_size, args.seed)
    warm = [row[: min(32, args.prompt_len)] for row in inputs]
    model = None
    try:
        reset_gpu_peak()
        start = time.perf_counter()
        model = flex_opt.OptLM(_flexgen_config(shapes), env, "_DUMMY_", policy)
        result["load_seconds"] = round(time.perf_counter() - start, 3)
        result["settings"]["gpu_weight_bytes"] = sum(_gpu_bytes_of(h) for h in model.weight_home)
        model.generate(warm, max_new_tokens=2)  # CUDA and cuBLAS start-up: not timed
        timers("generate").reset()
        model.generate(inputs, max_new_tokens=args.gen_len)
        costs = list(timers("generate").costs)
        result.set_times(costs[0], costs[1:])
    finally:
        try:
            result.set_memory(gpu_peak_bytes())
        finally:
            env.close_copy_threads()
        del model
        if not args.offload_dir:
            shutil.rmtree(offload_dir, ignore_errors=True)


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _run_candidate(args, candidate: Candidate, gen_len: int, timeout_s: float) -> dict:
    """Run one policy in a fresh python (own CUDA context and peak counters); its JSON result or an error."""
    with tempfile.TemporaryDirectory(prefix="flexgen-search-") as folder:
        out = os.path.join(folder, "result.json")
        command = [sys.executable, os.path.abspath(__file__), "--model", args.model, "--batch", str(args.batch),
                   "--prompt-len", str(args.prompt_len), "--gen-len", str(gen_len), "--gpu-budget-gib",
                   str(args.gpu_budget_gib), "--seed", str(args.seed), "--json-out", out, *candidate.flags()]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            tail = " ".join(_text(e.stderr).split())[-400:]
            return {"error": f"timed out after {timeout_s:.0f} s; stderr ends: {tail}"}
        if os.path.exists(out):
            with open(out) as handle:
                return json.load(handle)
        tail = " ".join((proc.stderr or proc.stdout or "").split())[-400:]
        return {"error": f"exit {proc.returncode} without a result: {tail}"}


def _mem_total_bytes() -> float:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 100.0 * GIB


_FINAL_KEYS = ("prefill_ms", "decode_ms_per_token", "decode_steps", "total_ms", "tokens_per_second",
               "peak_gpu_allocated_bytes", "peak_gpu_reserved_bytes", "within_budget", "load_seconds", "settings")


def _run_alone(args, result: PeerResult, shapes: OptShapes, candidate: Candidate, budget: float, search: dict,
               start: float) -> None:
    """The only candidate: its full run is the result; over the budget, the same with fewer GPU weights (bounded)."""
    for _ in range(MAX_RETRIES + 1):
        final = _run_candidate(args, candidate, args.gen_len, args.candidate_timeout_s)
        row = {"candidate": asdict(candidate), "gen_len": args.gen_len}
        row.update({k: final.get(k) for k in ("prefill_ms", "decode_ms_per_token", "peak_gpu_allocated_bytes",
                                              "peak_gpu_reserved_bytes", "within_budget", "error")})
        search["tried"].append(row)
        smaller = None
        if final.get("within_budget") is False and not final.get("error"):
            smaller = shrink_candidate(shapes, args.batch, args.prompt_len, args.gen_len, budget, candidate,
                                       final["peak_gpu_reserved_bytes"] - budget)
        if smaller is None:
            break
        row["retry"] = asdict(smaller)
        candidate = smaller
    search["seconds"] = round(time.perf_counter() - start, 3)
    search["chosen"] = asdict(candidate)
    for key in _FINAL_KEYS:
        if key in final:
            result[key] = final[key]
    if final.get("error"):
        raise RuntimeError(f"the only candidate failed: {final['error']}")


def run_search(args, result: PeerResult, shapes: OptShapes) -> None:
    """Enumerate, run the survivors briefly, keep the fastest within the budget, re-run it for the full workload."""
    budget = args.gpu_budget_gib * GIB
    start = time.perf_counter()
    host = (args.host_mem_gib * GIB) if args.host_mem_gib else 0.9 * _mem_total_bytes()
    candidates = search_candidates(shapes, args.batch, args.prompt_len, args.gen_len, budget, host)
    search = {"candidates": len(candidates), "gen_len": args.search_gen_len, "tried": [], "chosen": None,
              "host_budget_bytes": int(host), "not_run": [asdict(c) for c in candidates[args.max_candidates:]]}
    candidates = candidates[:args.max_candidates]
    result["search"] = search
    if not candidates:
        raise RuntimeError(f"no FlexGen policy fits {args.gpu_budget_gib} GiB of GPU and {host / GIB:.0f} GiB of host "
                           "memory by FlexGen's size formulas")
    if len(candidates) == 1:  # nothing to compare: run it for the whole workload at once
        _run_alone(args, result, shapes, candidates[0], budget, search, start)
        return
    ranked, queue, retries = [], list(candidates), 0
    while queue:
        candidate = queue.pop(0)
        index = len(search["tried"])
        row = {"candidate": asdict(candidate)}
        search["tried"].append(row)
        elapsed = time.perf_counter() - start
        if elapsed > args.search_budget_s:
            row["skipped"] = f"search budget of {args.search_budget_s:.0f} s spent"
            continue
        timeout = min(args.candidate_timeout_s, max(args.search_budget_s - elapsed, 60.0))
        measured = _run_candidate(args, candidate, min(args.search_gen_len, args.gen_len), timeout)
        row.update({k: measured.get(k) for k in ("prefill_ms", "decode_ms_per_token", "peak_gpu_allocated_bytes",
                                                 "peak_gpu_reserved_bytes", "within_budget", "error")})
        row["gpu_weight_bytes"] = (measured.get("settings") or {}).get("gpu_weight_bytes")
        rate = projected_tokens_per_second(measured, args.batch, args.gen_len)
        row["projected_tokens_per_second"] = rate
        if not measured.get("error") and rate is not None and measured.get("within_budget") is not False:
            ranked.append((-rate, index, candidate))
        elif measured.get("within_budget") is False and retries < MAX_RETRIES:
            # Over budget by what the allocator kept beyond the estimate: the same policy with fewer GPU weights.
            smaller = shrink_candidate(shapes, args.batch, args.prompt_len, args.gen_len, budget, candidate,
                                       measured["peak_gpu_reserved_bytes"] - budget)
            if smaller is not None:
                retries += 1
                row["retry"] = asdict(smaller)
                queue.insert(0, smaller)
    search["seconds"] = round(time.perf_counter() - start, 3)
    if not ranked:
        raise RuntimeError("every FlexGen candidate failed or exceeded the budget (see search.tried)")
    # The short runs held a shorter KV cache: if the fastest fails or overflows on the full run, take the next.
    failures = []
    for _, _, candidate in sorted(ranked, key=lambda item: item[:2])[:2]:
        final = _run_candidate(args, candidate, args.gen_len, args.candidate_timeout_s)
        if not final.get("error") and final.get("within_budget") is not False:
            search["chosen"] = asdict(candidate)
            for key in _FINAL_KEYS:
                if key in final:
                    result[key] = final[key]
            search["final_failures"] = failures
            return
        failures.append({"candidate": asdict(candidate), "error": final.get("error"),
                         "peak_gpu_reserved_bytes": final.get("peak_gpu_reserved_bytes")})
    search["final_failures"] = failures
    raise RuntimeError("the fastest candidates failed or exceeded the budget on the full run (see "
                       "search.final_failures)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = check_args(args)
    if problem:
        parser.error(problem)
    result = PeerResult.start("flexgen", args)
    with result.guard():
        shapes = opt_shapes(args.model)
        result["model"] = shapes.name
        if shapes.ffn_dim != 4 * shapes.hidden_size:
            raise ValueError(f"--model: FlexGen's OPT has ffn_dim = 4 × hidden, '{shapes.name}' has {shapes.ffn_dim}")
        if args.search:
            run_search(args, result, shapes)
        else:
            run_once(args, result, shapes)
    return result.finish()


if __name__ == "__main__":
    sys.exit(main())
