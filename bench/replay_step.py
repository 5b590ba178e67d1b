"""Replay a plan's decode step through the runtime's protocol, with the cost model's prices: what the plan's
ordering costs beyond the steady state that Eq. 7 assumes.

    python bench/replay_step.py bench/results/h200-2026-12-02/i12-eq24             # every plan of the call
    python bench/replay_step.py CALL --plans opt-30b.h200-run.b32-p128-g32 --no-queue
    python bench/replay_step.py CALL --plans NAME --account      # where the step went: both paths, one, bubbles

The decode pass of each plan is built by the runtime itself (`liac.runtime.schedule.build_schedule`: its ops, moves,
stream units and staging slots) and each op gets its unit's price from the cost model (`price_plan` under the call's
run-profile.yaml: the unit's compute, which holds Eq. 24's host time, and its transfers). Three agents then run in
time steps of `--dt` seconds:

  * the main thread runs the ops in order: a CPU op for its price less the host time, then the host time; a GPU op
    spends the host time launching, then queues its kernel; a split queues its GPU part, computes its CPU part,
    then joins (waits for the compute stream); an op whose input must come from the GPU waits for the compute stream
    to drain (a copy to the host synchronises); after the pass, the next pass's first stream units are issued
    (`Streamer.prime`);
  * the compute stream runs the kernels in order; a 'wait' holds it until its stream unit's copy has landed, a
    'release' records the slot's event;
  * one host-to-GPU copy engine serves, one copy at a time, whichever is ready first of the copy stream's next
    copy (a stream unit's copy waits for its slot's release, as `Streamer.issue` orders it) and an activation copy
    the compute stream reached (with --no-queue activations never wait for it).

DDR is shared as the call's rates stage measured it: while the CPU computes and the engine copies weights, the CPU
runs at `concurrent_cpu_gb_per_s` / `cpu_ddr_read_gb_per_s` of its speed and the copy at `concurrent_h2d_gb_per_s`
(rates.json), alone each at its own rate. A replay is a model too (prices, not measurements, and every CPU op taken
as DDR-bound); it tells a plan's structure apart from its prices: docs/benchmarks.md ("Why the compiled plan lost at
batch 8 and 32"). No GPU is needed; prints a table, writes nothing.

--account prints, per plan, the replayed step by what ran at once: 'both' (the CPU computing while the engine copies
weights, what the floor assumes of the whole step), 'stream only' (the main thread in an op's host time or a sync),
'cpu only' (the engine idle or on an activation), and the bubbles where neither moves offloaded bytes, named by the
main thread's wait (an op's host time, or a sync on the compute stream) and the copy engine's (a slot not yet
released, nothing issued yet, an activation copy). --defer-issue replays a variant of the protocol in which a
release's copy is issued only once the next crossing to the GPU is queued (so that crossing never queues behind it).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Rates", "replay", "main"]

ACTIVATION_BYTES = 1e5  # an activation copy's bytes on the engine (a few hundred KB at most: µs, but it queues)


@dataclass(frozen=True)
class Rates:
    """Bytes/s of the H2D engine and the CPU's DDR reads, each alone and beside the other."""

    h2d: float
    h2d_beside: float
    cpu: float
    cpu_beside: float

    @classmethod
    def of_call(cls, folder: Path, profile) -> "Rates":
        """The call's rates.json (what its rates stage measured); the profile's where the file lacks them."""
        path = folder / "rates.json"
        rates = json.loads(path.read_text()) if path.is_file() else {}
        rates = rates.get("rates", rates)
        h2d = profile.pcie_h2d_gb_per_s * 1e9
        cpu = profile.cpu_ddr_read_gb_per_s * 1e9
        return cls(h2d, float(rates.get("concurrent_h2d_gb_per_s", h2d / 1e9)) * 1e9, cpu,
                   float(rates.get("concurrent_cpu_gb_per_s", cpu / 1e9)) * 1e9)


def _unit_prices(plan, profile, graph) -> tuple[dict, dict]:
    """Per (group, unit): its decode UnitTime, and for a split unit its GPU part's mean seconds (Eq. 15)."""
    from liac.passes.price import price_plan

    price = price_plan(plan, hw=profile, graph=graph)
    costs = price.costs
    units, gpu_parts = {}, {}
    for group in price.groups:
        unit_costs = costs.layer_class(group.group.layer_class).decode.units
        for index, unit in enumerate(group.units["decode"]):
            units[(group.name, unit.name)] = unit
            permille = group.group.sublayers[index].cpu_permille("decode")
            if unit.device == "split":
                parts = unit_costs[index].split_gpu_seconds[costs.split_permille.index(permille)]
                gpu_parts[(group.name, unit.name)] = sum(parts) / len(parts)
    return units, gpu_parts


def _copies(stream_unit, kv_shape, batch: int, past: int, itemsize: int = 2) -> list[float]:
    """Bytes of each copy of one stream unit: its weight pieces, then its KV windows' past tokens."""
    _, groups, _, width = kv_shape
    out = [float(piece.numel * itemsize) for piece in stream_unit.weights]
    out += [float(batch * groups * past * width * itemsize) for _ in stream_unit.kv]
    return out


def _program(plan, profile, graph) -> tuple[list[tuple], list[list[float]], list[int]]:
    """The decode pass as (op kind, main-thread items, stream unit) and each stream unit's copies and slot."""
    from liac.runtime.schedule import build_schedule

    schedule = build_schedule(plan)
    phase = schedule.phases["decode"]
    prices, gpu_parts = _unit_prices(plan, profile, graph)
    op_seconds = profile.runtime_op_seconds
    work = plan.spec.workload
    past = work.prompt_len + work.gen_len // 2  # the middle decode step's cached tokens
    copies = [_copies(u, schedule.kv_shape, work.batch_size, past) for u in phase.stream_units]
    slots = [u.slot for u in phase.stream_units]
    program = []
    for op in phase.ops:
        if op.kind in ("wait", "release"):
            program.append((op.kind, [], op.stream_unit))
            continue
        price = prices.get((op.group, op.sublayers[0]))
        compute = price.compute_seconds if price is not None else 0.0
        to_host = any(m.src == "gpu" and m.dst == "cpu" for m in op.moves)
        to_gpu = sum(1 for m in op.moves if m.src == "cpu" and m.dst == "gpu")
        items: list[tuple] = [("drain",)] if to_host else []
        if op.device == "cpu":
            items += [("cpu", max(compute - op_seconds, 0.0)), ("host", op_seconds)]
            if op.kind == "qkv" and op.kv_write_crosses:
                items.append(("activation",))
        elif op.device == "gpu":
            items += [("activation",)] * to_gpu + [("host", op_seconds), ("kernel", max(compute - op_seconds, 1e-6))]
            if op.kind == "lm_head" and any(m.value == "next" for m in op.moves):
                items.append(("drain",))
        else:  # a split: its GPU part queued, its CPU part computed, the join waits for the GPU part
            gpu_part = gpu_parts[(op.group, op.sublayers[0])]
            cpu_part = compute - 3 * op_seconds - profile.split_sync_seconds  # the slower part, as Eq. 15 takes it
            items += [("host", op_seconds), ("kernel", max(gpu_part, 1e-6)), ("cpu", max(cpu_part, 0.0)),
                      ("host", op_seconds), ("drain",), ("host", op_seconds + profile.split_sync_seconds)]
        program.append((op.kind, items, op.stream_unit))
    return program, copies, slots


def replay(plan, profile, graph, rates: Rates, steps: int = 2, dt: float = 1e-5, queue: bool = True,
           account: list[dict] | None = None, defer: bool = False) -> list[float]:
    """Seconds of each of `steps` decode steps of `plan` replayed through the runtime's protocol (module docstring);
    the first step's copies start at time 0, every later one's at the previous step's prime.

    `account`, when given, receives one dict per step: seconds by what the main thread and the copy engine were
    doing at once (`_state`: 'both' CPU computing and weights copying, 'stream only', 'cpu only', and the bubbles
    where neither moves bytes, by what each agent waits for)."""
    program, copies, slots = _program(plan, profile, graph)
    nbuf = max(slots) + 1 if slots else 1
    copy_queue: list[list] = []   # ['wait', record id] | ['copy', bytes left] | ['landed', (step, unit)]
    compute: list[list] = []      # ['kernel', seconds] | ['waitcopy', key] | ['record', id] | ['activation', bytes]
    recorded: set[int] = set()
    landed: set[tuple[int, int]] = set()
    last_record: dict[int, int] = {}
    record_ids = iter(range(1, 10**9))

    def issue(step: int, unit: int) -> None:
        copy_queue.append(["wait", last_record.get(slots[unit])])
        copy_queue.extend(["copy", nbytes] for nbytes in copies[unit])
        copy_queue.append(["landed", (step, unit)])

    for unit in range(min(nbuf, len(copies))):
        issue(0, unit)
    work = [(step, entry) for step in range(steps) for entry in program + [("prime", [], -1)]]
    position, now, ends = 0, 0.0, []
    deferred: list[tuple[int, int]] = []  # defer: copies a release would issue, held until the next crossing
    current: list[tuple] | None = None
    engine: list | None = None  # [source, bytes left, carries weights]
    while True:
        if current is None:  # the main thread takes its next op
            if position == len(work):
                break
            step, (kind, items, unit) = work[position]
            position += 1
            if kind in ("prime", "wait"):
                for key in deferred:
                    issue(*key)
                deferred.clear()
            if kind == "prime":
                ends.append(now)
                if step + 1 < steps:
                    for first in range(min(nbuf, len(copies))):
                        issue(step + 1, first)
                continue
            if kind == "wait":
                compute.append(["waitcopy", (step, unit)])
                continue
            if kind == "release":
                rid = next(record_ids)
                compute.append(["record", rid])
                last_record[slots[unit]] = rid
                if unit + nbuf < len(copies):
                    if defer:
                        deferred.append((step, unit + nbuf))
                    else:
                        issue(step, unit + nbuf)
                continue
            current = [list(item) for item in items]
            continue
        while current and current[0][0] in ("activation", "kernel", "drain"):  # the instant items
            head = current[0]
            if head[0] == "drain" and compute:
                break
            if head[0] == "activation" and queue:
                compute.append(["activation", ACTIVATION_BYTES])
            if head[0] == "activation":
                for key in deferred:
                    issue(*key)
                deferred.clear()
            elif head[0] == "kernel":
                compute.append(["kernel", head[1]])
            current.pop(0)
        if not current:
            current = None
            continue
        # one time step: the engine picks its next copy, then every agent advances by dt
        if engine is None:
            while copy_queue and copy_queue[0][0] != "copy":
                head = copy_queue[0]
                if head[0] == "wait" and head[1] is not None and head[1] not in recorded:
                    break
                if head[0] == "landed":
                    landed.add(head[1])
                copy_queue.pop(0)
            if compute and compute[0][0] == "activation":
                engine = ["compute", compute[0][1], False]
            elif copy_queue and copy_queue[0][0] == "copy":
                engine = ["copy", copy_queue[0][1], True]
        cpu_busy = current[0][0] == "cpu"
        dma_busy = engine is not None and engine[2]
        if account is not None:
            while len(account) <= step:
                account.append({})
            key = _state(current[0][0], engine, copy_queue, recorded, compute)
            account[step][key] = account[step].get(key, 0.0) + dt
        if compute:
            head = compute[0]
            if head[0] == "kernel":
                head[1] -= dt
                if head[1] <= 0:
                    compute.pop(0)
            elif head[0] == "record":
                recorded.add(head[1])
                compute.pop(0)
            elif head[0] == "waitcopy" and head[1] in landed:
                compute.pop(0)
        if engine is not None:
            engine[1] -= (rates.h2d_beside if (cpu_busy and engine[2]) else rates.h2d) * dt
            if engine[1] <= 0:
                (compute if engine[0] == "compute" else copy_queue).pop(0)
                engine = None
        head = current[0]
        if head[0] == "cpu":
            head[1] -= dt * (rates.cpu_beside / rates.cpu if dma_busy else 1.0)
        elif head[0] == "host":
            head[1] -= dt
        if head[0] in ("cpu", "host") and head[1] <= 0:
            current.pop(0)
        if not current:
            current = None
        now += dt
    return [b - a for a, b in zip([0.0] + ends, ends)]


def _state(main: str, engine, copy_queue, recorded, compute) -> str:
    """What one time step of the replay is spent on (replay's `account`)."""
    if main == "cpu":
        return "both" if engine is not None and engine[2] else "cpu only"
    if engine is not None and engine[2]:
        return "stream only"
    # neither moves offloaded bytes: a bubble, named by what the main thread and the copy engine wait for
    if main == "drain":
        thread = "sync"  # a join or a copy to the host waits for the compute stream
    else:
        thread = "host"  # an op's host time (launch, dispatch, Eq. 24)
    if engine is not None:
        copy = "activation copy"
    elif copy_queue and copy_queue[0][0] == "wait" and copy_queue[0][1] not in recorded:
        copy = "slot release"  # the next copy waits for the layer that holds its slot to release it
    elif not copy_queue:
        copy = "nothing issued"
    else:
        copy = "queued"
    kernel = " (GPU computing)" if compute and compute[0][0] == "kernel" else ""
    return f"bubble: {thread}; copy {copy}{kernel}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("call", type=Path, help="a device call's result folder (runs.json, run-profile.yaml, plans)")
    parser.add_argument("--plans", default="", help="comma-separated plan names (default: every run of the call)")
    parser.add_argument("--dt", type=float, default=1e-5, help="time step, seconds")
    parser.add_argument("--no-queue", action="store_true", help="activation copies never wait for the copy engine")
    parser.add_argument("--defer-issue", action="store_true",
                        help="a release's copy is issued only after the next crossing to the GPU is queued")
    parser.add_argument("--account", action="store_true",
                        help="also print where each replayed step went: both paths busy, one, or a bubble and its wait")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reprice import load_call_plans

    from liac.errors import LiacError
    from liac.passes.trace import trace_model
    from liac.profile import resolve_profile

    try:
        profile = resolve_profile(str(args.call / "run-profile.yaml"))
        plans = load_call_plans(args.call)
        runs = json.loads((args.call / "runs.json").read_text())["runs"]
    except (LiacError, OSError) as e:
        print(f"replay_step: {e}", file=sys.stderr)
        return 2
    measured = {run["plan"]: (run.get("summary") or {}).get("decode_ms_per_token") for run in runs}
    names = [n for n in args.plans.split(",") if n] or list(dict.fromkeys(run["plan"] for run in runs))
    unknown = [n for n in names if n not in plans]
    if unknown:
        print(f"replay_step: --plans: the call has no plan '{unknown[0]}'", file=sys.stderr)
        return 2
    rates = Rates.of_call(args.call, profile)
    graphs: dict[str, object] = {}
    from liac.passes.price import price_plan

    print(f"{'plan':44s} {'decode ms/token: measured':>25s} {'repriced':>9s} {'replayed':>9s}")
    for name in names:
        plan = plans[name]
        graph = graphs.setdefault(plan.spec.model.config_sha256, trace_model(plan.model_config))
        account: list[dict] = []
        step = replay(plan, profile, graph, rates, dt=args.dt, queue=not args.no_queue, account=account,
                      defer=args.defer_issue)[-1]
        value = measured.get(name)
        priced = price_plan(plan, hw=profile, graph=graph).decode_seconds_per_token
        print(f"{name:44s} {value if value is not None else float('nan'):25.1f} {priced * 1e3:9.1f} "
              f"{step * 1e3:9.1f}")
        if args.account:
            for key, seconds in sorted(account[-1].items(), key=lambda item: (-item[1], item[0])):
                print(f"    {key:58s} {seconds * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
