"""The floor: a lower bound on prefill and decode time for a model, workload and GPU budget on a hardware profile.

    python3 bench/floor.py --model opt-30b --hw profile.yaml --batch 1 --prompt-len 128 --gen-len 32 \
        --gpu-budget-gib 24            # prints the floor as JSON

    from floor import workload_floor   # bench/ on sys.path, as bench/h200.py has it
    floor = workload_floor(graph, hw, batch=1, prompt_len=128, gen_len=32, gpu_budget_bytes=24 * 2**30)
    floor.decode_seconds_per_token, floor.tokens_per_second

Per step (prefill: Q = prompt tokens, C = Q; decode step t: Q = 1, C = prompt + t + 1; the LM head at Q = 1 in
prefill, as liac's cost model prices it), from the traced sublayer graph (bytes, FLOPs and KV as its Polys give them,
no per-model table):

  * W  = weight bytes the step reads (all decoder layers and the head; MoE experts: those the tokens hit),
         K = KV-cache bytes it reads, F = its FLOPs. Embedding lookups (a few rows, KB per step) are left
         out.
  * The GPU budget holds R weight bytes and a share f of the KV cache (whole generation): R + f·K_store ≤ budget
    − reserved, where reserved is what the process holds whatever the plan (a benchmark call's footprint stage
    measures the CUDA context and library workspaces: `process_bytes`; a budget is the whole footprint).
    Everything else lives in DDR: N_w = W·(1 − R/W_store) weight bytes and N_k = (1 − f)·K bytes of KV must each
    step either be read by the CPU (which then computes with them) or be copied over PCIe.
  * offload(N_w, N_k) = the least t with a split such that
        CPU:  x_w / r_cw + x_k / r_ck ≤ t     r_cw = min(DDR read rate, AMX FLOP/s at the step's rows / FLOPs per
                                               weight byte), r_ck likewise with the KV read rate
        PCIe: (N_w − x_w + N_k − x_k) / r_h2d ≤ t
    and DDR serving each kind's CPU reader beside the copies at the rate the call measured for that pair (the
    profile's `ddr_shared_gb_per_s`: a CPU GEMV beside pinned H2D copies, the two rates summed; and
    `ddr_shared_kv_gb_per_s`: the fused attention beside them, 0 = not measured, no cap). As an LP over the time
    spent in each state (the CPU on weights beside the copies, on KV beside them, the copies alone), each second the
    CPU reads a kind adds at most min(r_c, s_pair − r_h2d) bytes to the copies' r_h2d (`paired_seconds_per_byte`),
    so with one kind of bytes: offload = N / min(r_cpu + r_h2d, s_pair). The pairs are per kind because they differ:
    on the H200 the fused CPU attention beside the weight stream drew 113 GB/s (OPT-30B, prompt 1024, batch 32: 85 GB
    a step in 748-754 ms) where the GEMV pair measured 97, and a floor capping every byte at 97 (824 ms) lay above
    both runs (bench/results/h200-2026-12-02/i12q). `paired=False` gives the floor before 2026-12-03: each path at
    its own rate alone, which no run on the H200 approached (the DDR both paths share serves less than their sum).
  * step floor = max(offload, (W·R/W_store + f·K) / HBM rate, F / (GPU FLOP/s + CPU FLOP/s),
                     prefill only: (1 − f)·KV written / D2H rate). Prefill attention reads the K, V it has just
    produced, not the cache: there N_k = 0 and all of K counts in the HBM term.
  * R and f are chosen to minimise prefill + all decode steps (R = min(W_store, budget − f·K_store); f by a fine grid
    and golden-section refinement): the bound assumes the best residency, any split of any tensor, perfect
    overlap, no launch or synchronisation cost, and no activation transfers, so no plan can beat it.

docs/calibration.md ("The floor") states the same formula; tests/bench/test_floor.py checks it by hand.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

__all__ = ["StepWork", "Floor", "step_work", "offload_seconds", "step_floor", "workload_floor", "process_bytes", "main"]

_ATTENTION = ("attention_score", "softmax", "attention_context")


@dataclass(frozen=True)
class StepWork:
    """What one step of the whole model (all layers) must read and compute.

    Attributes:
        weight_bytes: weight bytes read (decoder × layers + head; MoE: the experts hit; no embedding tables).
        weight_store_bytes: those weights' whole size (what residency on the GPU takes).
        kv_read_bytes: KV-cache bytes read by attention.
        kv_written_bytes: KV-cache bytes appended.
        flops: all FLOPs.
        cpu_weight_seconds_per_byte: CPU seconds per weight byte when it computes the weight GEMMs itself.
        cpu_kv_seconds_per_byte: CPU seconds per KV byte when it computes attention itself.
        cpu_tflops: AMX throughput at the step's token rows (for the combined compute floor).
    """

    weight_bytes: float
    weight_store_bytes: float
    kv_read_bytes: float
    kv_written_bytes: float
    flops: float
    cpu_weight_seconds_per_byte: float
    cpu_kv_seconds_per_byte: float
    cpu_tflops: float


@dataclass(frozen=True)
class Floor:
    """The lower bound for one workload point (seconds), and the residency that attains it."""

    prefill_seconds: float
    decode_seconds_per_token: float
    decode_seconds: float
    total_seconds: float
    tokens_per_second: float
    resident_weight_bytes: float
    resident_kv_share: float
    prefill_bound: str  # which term binds: 'offload', 'hbm', 'compute', 'kv_write'
    decode_bound: str  # the term binding the most decode steps


def _experts_touched(num_experts: int, top_k: int, tokens: float) -> float:
    from liac.passes.costs import experts_touched

    return experts_touched(num_experts, top_k, tokens)


def step_work(graph, hw, batch: int, query: int, context: int, head_query: int | None = None) -> StepWork:
    """StepWork of one step at (B, Q, C) from a traced SublayerGraph; the head is evaluated at `head_query`
    (default Q)."""
    from liac.passes.costs import cpu_throughput_rows

    counts = graph.graph["layer_counts"]
    weight = store = kv_read = kv_written = flops = 0.0
    cpu_weight_seconds = cpu_kv_seconds = 0.0
    for sub in graph.sublayers():
        count = counts[sub.layer_class]
        q = head_query if (sub.layer_class == "head" and head_query is not None) else query
        point = (batch, q, context)
        flops += count * sub.flops(*point)
        kv = sub.kv_read(*point)
        kv_read += count * kv
        kv_written += count * sub.kv_written(*point)
        if kv and sub.kind in _ATTENTION:
            rate = hw.cpu_kv_read_gb_per_s * 1e9
            per_byte = sub.flops(*point) / kv
            if per_byte > 0:
                rate = min(rate, hw.cpu_tflops_at(cpu_throughput_rows(sub, batch, q)) * 1e12 / per_byte)
            cpu_kv_seconds += count * kv / rate
        if not sub.weights or sub.kind == "embedding":  # a lookup reads a few rows: left out (see the docstring)
            continue
        stored = float(sub.weight_bytes)
        touched = stored
        if sub.kind == "experts" and sub.experts[0]:
            touched = stored * _experts_touched(*sub.experts, batch * q) / sub.experts[0]
        weight += count * touched
        store += count * stored
        rate = hw.cpu_ddr_read_gb_per_s * 1e9
        per_byte = sub.flops(*point) / touched
        if per_byte > 0:
            rate = min(rate, hw.cpu_tflops_at(cpu_throughput_rows(sub, batch, q)) * 1e12 / per_byte)
        cpu_weight_seconds += count * touched / rate
    return StepWork(weight_bytes=weight, weight_store_bytes=store, kv_read_bytes=kv_read,
                    kv_written_bytes=kv_written, flops=flops,
                    cpu_weight_seconds_per_byte=cpu_weight_seconds / weight if weight else 0.0,
                    cpu_kv_seconds_per_byte=cpu_kv_seconds / kv_read if kv_read else 0.0,
                    cpu_tflops=hw.cpu_tflops_at(batch * query))


def offload_seconds(weight_bytes: float, kv_bytes: float, cpu_weight_seconds_per_byte: float,
                    cpu_kv_seconds_per_byte: float, h2d_bytes_per_s: float,
                    shared_bytes_per_s: float = math.inf) -> float:
    """The least time to move `weight_bytes` + `kv_bytes` out of DDR over the CPU and PCIe at once (module docstring).

    In time t the CPU takes the kind it reads fastest first, so what it can take is piecewise linear and concave in
    t; PCIe takes t·r_h2d. The least t where both together cover every byte is found piece by piece; a DDR rate
    `shared_bytes_per_s`, when given, caps the sum (the floor gives none: the module docstring says why).
    """
    total = weight_bytes + kv_bytes
    if total <= 0:
        return 0.0
    pairs = ((weight_bytes, cpu_weight_seconds_per_byte), (kv_bytes, cpu_kv_seconds_per_byte))
    kinds = sorted(((n, s) for n, s in pairs if n > 0), key=lambda item: item[1])
    if any(s <= 0 for _, s in kinds):  # a CPU rate without limit (a profile never has one): only the DDR cap
        return total / shared_bytes_per_s
    taken, start = 0.0, 0.0  # CPU bytes taken by the start of the current piece, and that piece's start time
    root = None
    for amount, per_byte in kinds:
        # on this piece: covered(t) = t·r_h2d + taken + (t − start)/per_byte
        t = (total - taken + start / per_byte) / (h2d_bytes_per_s + 1 / per_byte)
        end = start + amount * per_byte
        if t <= end:
            root = t
            break
        taken, start = taken + amount, end
    if root is None:  # the CPU alone could finish by `start`; PCIe adds to it, so the root lies before
        root = start
    return max(root, total / shared_bytes_per_s)


def paired_seconds_per_byte(cpu_seconds_per_byte: float, pair_bytes_per_s: float, h2d_bytes_per_s: float) -> float:
    """CPU seconds per byte of one kind that count toward the floor when DDR serves that kind's CPU reader and the
    PCIe copies together at `pair_bytes_per_s` (0 or inf: not measured, no cap).

    While the CPU reads a kind beside the copies, the two move at most the pair's rate s together, the CPU at most
    its own rate r and the copies at most h; the copies alone move h. So each second the CPU reads that kind adds
    at most min(r, s − h) bytes to what the copies alone would move (nothing when s ≤ h), and `offload_seconds`
    with these per-byte seconds is the least time of the LP over the time spent in each state (the CPU on weights
    beside the copies, on KV beside them, the copies alone): a bound the measured pairs allow, no tighter."""
    if not pair_bytes_per_s or math.isinf(pair_bytes_per_s):
        return cpu_seconds_per_byte
    gain = pair_bytes_per_s - h2d_bytes_per_s
    if gain <= 0:
        return math.inf
    return max(cpu_seconds_per_byte, 1.0 / gain)


def step_floor(work: StepWork, hw, resident_weight_bytes: float, kv_share: float,
               prefill: bool, paired: bool = True) -> tuple[float, str]:
    """(seconds, binding term) of one step with `resident_weight_bytes` and a KV share `kv_share` on the GPU;
    `paired`: the CPU's reads beside the copies at the pair rates the profile measured (module docstring), else
    each path at its own rate alone."""
    ratio = work.weight_bytes / work.weight_store_bytes if work.weight_store_bytes else 0.0
    resident_read = ratio * min(resident_weight_bytes, work.weight_store_bytes)
    offloaded_weights = max(work.weight_bytes - resident_read, 0.0)
    # Prefill attention reads the K, V it has just produced (on the device computing it), never the cache.
    offloaded_kv = 0.0 if prefill else (1.0 - kv_share) * work.kv_read_bytes
    resident_kv = work.kv_read_bytes if prefill else kv_share * work.kv_read_bytes
    h2d = hw.pcie_h2d_gb_per_s * 1e9
    per_weight, per_kv = work.cpu_weight_seconds_per_byte, work.cpu_kv_seconds_per_byte
    if paired:
        per_weight = paired_seconds_per_byte(per_weight, hw.ddr_shared_gb_per_s * 1e9, h2d)
        per_kv = paired_seconds_per_byte(per_kv, hw.ddr_shared_kv_gb_per_s * 1e9, h2d)
    terms = {
        "offload": offload_seconds(offloaded_weights, offloaded_kv, per_weight, per_kv, h2d),
        "hbm": (resident_read + resident_kv) / (hw.gpu_hbm_gb_per_s * 1e9),
        "compute": work.flops / (hw.gpu_bf16_tflops * 1e12 + work.cpu_tflops * 1e12),
    }
    if prefill:
        terms["kv_write"] = (1.0 - kv_share) * work.kv_written_bytes / (hw.pcie_d2h_gb_per_s * 1e9)
    bound = max(terms, key=terms.get)
    return terms[bound], bound


def _decode_points(batch: int, prompt_len: int, gen_len: int) -> list[tuple[int, int, int]]:
    from liac.ir import phase_point

    # gen_len tokens: the prefill gives the first, gen_len - 1 decode steps the rest (liac.passes.costs._points)
    return [phase_point("decode", batch, prompt_len, step) for step in range(gen_len - 1)]


def process_bytes(footprint: dict | None) -> float:
    """The GPU memory the process holds whatever the plan, from a call's footprint stage (bench/h200.py
    `measure_call_footprint`: the CUDA context with its loaded kernels and the GEMM libraries' workspaces, as
    measured, without the margin `liac profile` adds for kernels loaded later) → bytes; 0 where it did not run.

    A budget is the whole footprint (issue 12, deliverable 1: `--gpu-mem` bounds the context and the workspaces
    too), so no plan can keep weights in these bytes: the floor takes them out of the budget and stays a bound."""
    if not footprint:
        return 0.0
    return float(footprint.get("context_bytes", 0) or 0) + float(footprint.get("library_bytes", 0) or 0)


def workload_floor(graph, hw, batch: int, prompt_len: int, gen_len: int, gpu_budget_bytes: float,
                   reserved_bytes: float = 0.0, paired: bool = True) -> Floor:
    """The floor of one workload point (see the module docstring).

    Args:
        graph: the model's traced SublayerGraph (liac.passes.trace.trace_model).
        hw: the HardwareProfile measured in the same run.
        batch, prompt_len, gen_len: the workload (gen_len new tokens, the first from the prefill).
        gpu_budget_bytes: GPU memory for weights and KV cache.
        reserved_bytes: part of the budget no plan can give to weights or KV (a benchmark call passes the measured
            CUDA context and library workspaces, `process_bytes`; 0: the most optimistic bound).
        paired: the CPU's reads beside the copies at the DDR pair rates the profile measured (the default);
            False: each path at its own rate alone (the floor before 2026-12-03, a looser bound).
    """
    from liac.ir import phase_point

    prefill = step_work(graph, hw, *phase_point("prefill", batch, prompt_len), head_query=1)
    decode = [step_work(graph, hw, *point) for point in _decode_points(batch, prompt_len, gen_len)]
    kv_store = prefill.kv_written_bytes + sum(w.kv_written_bytes for w in decode)
    room = max(gpu_budget_bytes - reserved_bytes, 0.0)
    store = prefill.weight_store_bytes

    def evaluate(share: float):
        resident = min(store, room - share * kv_store)
        first, first_bound = step_floor(prefill, hw, resident, share, prefill=True, paired=paired)
        steps = [step_floor(w, hw, resident, share, prefill=False, paired=paired) for w in decode]
        return first + sum(s for s, _ in steps), first, steps, resident

    top = 1.0 if kv_store <= 0 else min(1.0, room / kv_store)
    grid = sorted({top * i / 400 for i in range(401)} | {min(top, max(0.0, (room - store) / kv_store))
                                                        if kv_store > 0 else 0.0})
    values = [evaluate(share)[0] for share in grid]
    best = min(range(len(grid)), key=lambda i: (values[i], grid[i]))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    share = grid[best]
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(60):  # refine inside the bracket; keep the grid point if nothing beats it
        a, b = high - golden * (high - low), low + golden * (high - low)
        if evaluate(a)[0] <= evaluate(b)[0]:
            high = b
        else:
            low = a
    middle = (low + high) / 2
    if evaluate(middle)[0] < values[best]:
        share = middle
    total, first, steps, resident = evaluate(share)
    prefill_bound = step_floor(prefill, hw, resident, share, prefill=True, paired=paired)[1]
    bounds = [b for _, b in steps]
    decode_seconds = sum(s for s, _ in steps)
    per_token = decode_seconds / len(steps) if steps else 0.0
    return Floor(prefill_seconds=first, decode_seconds_per_token=per_token, decode_seconds=decode_seconds,
                 total_seconds=total, tokens_per_second=batch * gen_len / total if total > 0 else 0.0,
                 resident_weight_bytes=resident, resident_kv_share=share, prefill_bound=prefill_bound,
                 decode_bound=max(set(bounds), key=bounds.count) if bounds else "none")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="floor.py", description="Lower bound on prefill and decode time.")
    parser.add_argument("--model", default="opt-30b", help="zoo name, config.json or checkpoint directory")
    parser.add_argument("--hw", default="h200-amx16", help="hardware profile (name or file)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--gen-len", type=int, default=32)
    parser.add_argument("--gpu-budget-gib", type=float, default=24.0)
    parser.add_argument("--reserved-gib", type=float, default=0.0,
                        help="budget no plan can give to weights or KV, e.g. the measured CUDA context (default 0)")
    args = parser.parse_args(argv)
    from liac.errors import LiacError
    from liac.models import resolve_model
    from liac.passes.trace import trace_model
    from liac.profile import resolve_profile

    for flag, value in (("--batch", args.batch), ("--prompt-len", args.prompt_len), ("--gen-len", args.gen_len)):
        if value < 1:
            parser.error(f"{flag}: must be a positive integer, got {value}")
    try:
        cfg = resolve_model(args.model)
        hw = resolve_profile(args.hw)
    except LiacError as e:
        parser.error(e.line())
    floor = workload_floor(trace_model(cfg), hw, args.batch, args.prompt_len, args.gen_len,
                           args.gpu_budget_gib * 2**30, args.reserved_gib * 2**30)
    print(json.dumps({"model": cfg.name, "profile": hw.name, "batch_size": args.batch, "prompt_len": args.prompt_len,
                      "gen_len": args.gen_len, "gpu_budget_gib": args.gpu_budget_gib, **asdict(floor)},
                     sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
