"""Run many offload plans of one model over ONE set of random weights; one JSON results file, rewritten per plan.

    python bench/run_plans.py PLAN.yaml [PLAN.yaml ...] --seed 0 --out bench/results/runs.json
        [--batch B] [--prompt-len P] [--gen-len M]      # default: each plan's workload (never more)
        [--runs RUNS.json]                              # per-run requests: [{"plan": path, "batch": .., ...}]
        [--max-seconds S] [--profile-steps K] [--metrics-dir DIR] [--emulate-gpu] [--timeline-batches 8,32]

For the H200 benchmark: generating 60 GB of random weights per plan would cost more than the runs, so the weights
are generated once (on the GPU, copied into one page-locked host arena: `liac.runtime.HostWeights`), and each plan
builds an engine over them that copies only its 'hbm' tensors to the GPU and frees them again on close. Per run:
build the engine (which warms up at the run's shapes: `Engine.warm_up`), the timed generate (the engine's first
request: its prefill is what a user's first request costs), a separate per-sublayer profiling pass over a few
decode steps (the numbers `liac calibrate` fits), peak GPU memory (allocated, reserved, and the whole footprint
against the plan's budget), close. A run whose estimate from the plan's own prediction (status.predicted, for
reporting and this budget only) exceeds `--max-seconds`, or no longer fits before `deadline`, is recorded as
skipped. The results file is written atomically after every run, so a timeout never loses finished runs; one
summary line per run goes to stdout.

The orchestrator may import it instead: `run_plans([RunSpec("a.yaml"), ...], seed=0, out="r.json")`.
Runs with the GPU machine's stock python3 from a checkout where liac is not installed: see `_import_liac`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunSpec", "run_plans", "estimate_seconds", "timeline_seconds", "main", "RESULTS_VERSION",
           "host_cpu_sample", "host_cpu_cores", "event_counters", "counters_delta"]

RESULTS_VERSION = 1
ROOT = Path(__file__).resolve().parent.parent


def _import_liac() -> None:
    """Make `liac.runtime` importable from a plain checkout: pyproject maps runtime/ → liac.runtime (and
    passes/ → liac.passes, which the runtime never needs); an installed liac is used as is."""
    try:
        import liac.runtime  # noqa: F401
        return
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT))
    import liac

    spec = importlib.util.spec_from_file_location("liac.runtime", ROOT / "runtime" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "runtime")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["liac.runtime"] = module
    liac.runtime = module  # type: ignore[attr-defined]
    spec.loader.exec_module(module)


@contextlib.contextmanager
def _restoring_threads(threads: int):
    """Give torch its intra-op thread count back when the block ends (a run with `RunSpec.threads` of its own)."""
    import torch

    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class RunSpec:
    """One run: a plan file and the request (None: the plan's workload value)."""

    plan: str
    batch: int | None = None
    prompt_len: int | None = None
    gen_len: int | None = None
    threads: int | None = None  # torch's intra-op (CPU) threads for this run; None: as the process has them
    expert_share: str | None = None  # Engine.from_plan(expert_share=...) for this run; None: the engine's default
    cpu_wake: bool | None = None  # Engine.from_plan(cpu_wake=...) for this run; None: the engine's default
    mapped_crossings: bool | None = None  # Engine.from_plan(mapped_crossings=...); None: the engine's default
    expert_split: bool | None = None  # Engine.from_plan(expert_split=...) for this run; None: the engine's default
    expert_launcher: bool | None = None  # Engine.from_plan(expert_launcher=...) for this run; None: the default


def estimate_seconds(predicted, work, batch: int, prompt_len: int, gen_len: int, profile_steps: int,
                     warm_share: float = 1.0) -> float:
    """Wall time a run should take by the plan's prediction: warm-up, timed generate, profiling pass.

    Prefill scales with batch × prompt against the plan's workload; decode per token with batch (both upper
    bounds for smaller requests, whose per-token cost is never more than linear). The warm-up runs a prefill and a
    decode step through `warm_share` of the layers (one per layer group), then a whole request of two tokens."""
    prefill, step = _phase_seconds(predicted, work, batch, prompt_len)
    warmup = (prefill + step) * (1.0 + warm_share)
    timed = prefill + step * (gen_len - 1)
    profile = (prefill + step * profile_steps) if profile_steps else 0.0
    return warmup + timed + profile


def timeline_seconds(predicted, work, batch: int, prompt_len: int, warm_share: float = 1.0) -> float:
    """Wall time of a run's timeline by the plan's prediction: a warm-up, a 3-token generate under the profiler
    (prefill and two decode steps), and ~5 s to build the engine and export and read the trace."""
    prefill, step = _phase_seconds(predicted, work, batch, prompt_len)
    return (prefill + step) * (1.0 + warm_share) + prefill + 2 * step + 5.0


def _phase_seconds(predicted, work, batch: int, prompt_len: int) -> tuple[float, float]:
    prefill = predicted.prefill_seconds * min(1.0, batch * prompt_len / (work.batch_size * work.prompt_len))
    step = predicted.decode_seconds_per_token * min(1.0, batch / work.batch_size)
    return prefill, step


def host_cpu_sample(stat_text: str | None = None) -> tuple[float, tuple[int, int, int], float] | None:
    """(monotonic seconds, (busy, steal, total) jiffies of the host's aggregate `cpu` line of /proc/stat, this
    process's CPU seconds, all threads) now; None where /proc/stat cannot be read (not Linux)."""
    import resource

    try:
        text = stat_text if stat_text is not None else Path("/proc/stat").read_text()
        fields = [int(v) for v in next(line for line in text.splitlines() if line.startswith("cpu "))
                  .split()[1:]]
    except (OSError, StopIteration, ValueError):
        return None
    fields += [0] * (8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    busy = user + nice + system + irq + softirq
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.monotonic(), (busy, steal, busy + idle + iowait + steal), usage.ru_utime + usage.ru_stime


def host_cpu_cores(before, after, cpus: int | None = None) -> dict | None:
    """Cores busy on average between two `host_cpu_sample`s: this process's, the rest of the host's (other
    processes, the kernel's interrupts) and stolen by a hypervisor. The CPU experts of an MoE plan run one OpenMP
    team over every core, so any other busy core delays each GEMV to its slowest thread."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    wall = after[0] - before[0]
    busy, steal, total = (a - b for a, b in zip(after[1], before[1]))
    if total <= 0:
        return None
    cpus = cpus or os.cpu_count() or 1  # shares of all CPUs' jiffies → cores
    ours = (after[2] - before[2]) / wall
    return {"wall_seconds": round(wall, 3), "ours_cores": round(ours, 2),
            "others_cores": round(max(busy / total * cpus - ours, 0.0), 2),
            "steal_cores": round(steal / total * cpus, 2)}


_GPU_COUNTERS = ("num_alloc_retries", "num_sync_all_streams", "num_device_alloc", "num_device_free", "num_ooms")


def event_counters() -> dict[str, float]:
    """Counters that grow with the costs a run may pay outside its ops: this process's page faults (minor, major),
    the CUDA caching allocator's retries (a full free of cached blocks and a device sync), device-wide syncs and
    cudaMalloc/cudaFree calls, and the pinned host allocator's allocations and the time they took. Their growth
    over a timed generate (`counters_delta`) tells a first run that pays for memory from one that does not."""
    import resource

    import torch

    usage = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, float] = {"minor_faults": usage.ru_minflt, "major_faults": usage.ru_majflt}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        stats = torch.cuda.memory_stats()
        out.update({f"gpu_{key}": stats[key] for key in _GPU_COUNTERS if key in stats})
        host_stats = getattr(torch.cuda, "host_memory_stats", None)
        if host_stats is not None:
            out.update({f"pinned_{key}": value for key, value in host_stats().items()
                        if isinstance(value, (int, float)) and (key.startswith("num_") or key.endswith(".total"))})
    return out


def counters_delta(before: dict, after: dict) -> dict[str, float]:
    """What each of `event_counters` grew by between two samples (counters in both only)."""
    return {key: round(after[key] - before[key], 6) for key in sorted(after) if key in before}


def _timeline(plan, host, backend, ids) -> dict:
    """bench/timeline.py's summary of one decode step of `plan` at `ids`, in an engine of its own (warmed up at
    those shapes, its budget not enforced: the profiler's GPU buffers sit outside torch's allocator); a failure is
    recorded, never loses the run."""
    from liac.runtime import Engine

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from timeline import record

        with Engine.from_plan(plan, weights=host, backend=backend, warm_up=tuple(ids.shape),
                              enforce_budget=False) as engine:
            return record(engine, ids)
    except Exception as e:  # the profiler is a measurement aid: the run's numbers stand without it
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
    finally:
        sys.path.remove(str(ROOT / "bench"))


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _warm_share(plan) -> float:
    """The share of a plan's decoder layers its warm-up runs: one per layer group."""
    groups = [g for g in plan.spec.layer_groups if g.layer_class == "decoder"]
    return len(groups) / max(1, sum(g.layer_count for g in groups))


def run_plans(runs: list[RunSpec], *, seed: int = 0, out: str | os.PathLike | None = None,
              max_seconds: float | None = None, profile_steps: int = 2, emulate_gpu: bool | None = None,
              metrics_dir: str | os.PathLike | None = None, log=print, deadline: float | None = None,
              timeline_batches: tuple[int, ...] = ()) -> dict:
    """Run `runs` over one HostWeights (see the module docstring); return the results document.

    Args:
        deadline: a time.monotonic() after which no run starts whose estimate would end past it (skipped).
        timeline_batches: runs at these batch sizes also record a timeline of one decode step (bench/timeline.py:
            torch.profiler over a 3-token generate) → the run's 'timeline'. The timelines come after every run,
            each in an engine of its own that does not enforce the budget: the profiler's own GPU buffers would
            count as CUDA context, in the footprint of the runs after it and against their budget at start. The
            deadline keeps room for the timelines of the runs that ran.

    Raises:
        LiacError: a plan that does not load, or plans for different models (before any weights are made).
    """
    _import_liac()
    import torch

    from liac.errors import LiacError
    from liac.fileio import write_atomic
    from liac.runtime import Engine, HostWeights, make_backend
    from liac.runtime.engine import check_request, resolve_plan
    from liac.runtime.metrics import build_metrics, write_metrics

    plans = [resolve_plan(run.plan)[0] for run in runs]
    if not plans:
        raise LiacError("run_plans", "needs at least one plan")
    hashes = {p.spec.model.config_sha256 for p in plans}
    if len(hashes) > 1:
        names = sorted({p.spec.model.name for p in plans})
        raise LiacError("run_plans", f"all plans must be for one model (one set of weights), got {', '.join(names)}")
    cfg = plans[0].model_config
    backend = make_backend(emulate_gpu)
    log(f"run_plans: {len(runs)} run(s) of {cfg.name} on {backend.describe()}; seed {seed}")
    host = HostWeights.random(cfg, seed, backend=backend, progress=True)
    log(f"run_plans: weights {host.nbytes / 2**30:.2f} GiB generated in {host.timings['total_seconds']:.1f} s "
        f"(allocate {host.timings['allocate_seconds']:.1f} s, touch + page-lock {host.timings['pin_seconds']:.1f} s, "
        f"fill {host.timings['fill_seconds']:.1f} s); pinned: {host.pinned}")
    results = {"version": RESULTS_VERSION, "model": cfg.name, "config_sha256": cfg.sha256(), "seed": seed,
               "max_seconds": max_seconds, "profile_steps": profile_steps,
               "host": {"gpu": backend.describe(), "emulated_gpu": backend.emulated, "torch": torch.__version__,
                        "cpu_threads": torch.get_num_threads()},
               "weights": host.describe(), "runs": []}

    def save() -> None:
        if out is not None:
            write_atomic(out, json.dumps(results, indent=1, sort_keys=True) + "\n")

    timelines_due, pending = 0.0, []  # the runs' timelines, recorded after every run
    for index, (run, plan) in enumerate(zip(runs, plans)):
        work = plan.spec.workload
        batch, prompt_len = run.batch or work.batch_size, run.prompt_len or work.prompt_len
        gen_len = run.gen_len or work.gen_len
        record = {"plan_file": str(run.plan), "plan": plan.metadata.name,
                  "request": {"batch_size": batch, "prompt_len": prompt_len, "gen_len": gen_len},
                  "predicted": {"prefill_ms": _ms(plan.status.predicted.prefill_seconds),  # reporting only
                                "decode_ms_per_token": _ms(plan.status.predicted.decode_seconds_per_token),
                                "tokens_per_second": round(plan.status.predicted.tokens_per_second, 3),
                                "total_ms": _ms(plan.status.predicted.total_seconds)}}
        estimate = estimate_seconds(plan.status.predicted, work, batch, prompt_len, gen_len, profile_steps,
                                    _warm_share(plan))
        timeline = timeline_seconds(plan.status.predicted, work, batch, prompt_len, _warm_share(plan)) \
            if batch in timeline_batches else 0.0
        record["estimated_seconds"] = round(estimate, 3)
        results["runs"].append(record)
        label = f"[{index + 1}/{len(runs)}] {Path(run.plan).name} ({plan.metadata.name})"
        began = time.perf_counter()
        try:
            check_request(plan, batch, prompt_len, gen_len)
            left = None if deadline is None else deadline - time.monotonic()
            if max_seconds is not None and estimate > max_seconds:
                record["skipped"] = (f"estimated {estimate:.0f} s from the plan's prediction exceeds --max-seconds "
                                     f"{max_seconds:g}")
            elif left is not None and estimate + 5 + timeline + timelines_due > left:  # + building the engine
                record["skipped"] = (f"out of time: estimated {estimate + timeline:.0f} s, {max(0.0, left):.0f} s "
                                     f"left" + (f" ({timelines_due:.0f} s kept for timelines)" if timelines_due
                                                else ""))
            if "skipped" in record:
                log(f"{label}: skipped ({record['skipped']})")
                save()
                continue
            # the same prompt for every contender at one (batch, prompt) point
            generator = torch.Generator().manual_seed(seed * 1_000_003 + batch * 10_007 + prompt_len)
            ids = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=generator)
            backend.reset_peak()
            threads = torch.get_num_threads()
            if run.threads:
                torch.set_num_threads(run.threads)
            record["cpu_threads"] = torch.get_num_threads()
            share = {"expert_share": run.expert_share} if run.expert_share else {}
            if share:
                record["expert_share"] = run.expert_share
            if run.cpu_wake is not None:
                share["cpu_wake"] = record["cpu_wake"] = run.cpu_wake
            if run.mapped_crossings is not None:
                share["mapped_crossings"] = record["mapped_crossings"] = run.mapped_crossings
            if run.expert_split is not None:
                share["expert_split"] = record["expert_split"] = run.expert_split
            if run.expert_launcher is not None:
                share["expert_launcher"] = record["expert_launcher"] = run.expert_launcher
            try:
                engine = Engine.from_plan(plan, weights=host, backend=backend, warm_up=(batch, prompt_len), **share)
            except BaseException:
                torch.set_num_threads(threads)
                raise
            with _restoring_threads(threads), engine:
                record["build_seconds"] = round(engine.build_seconds, 3)
                record["warmup_seconds"] = round(engine.warmup_seconds, 3)
                sample, counters = host_cpu_sample(), event_counters()
                generation = engine.generate(ids, gen_len)
                record["host_cpu"] = host_cpu_cores(sample, host_cpu_sample())  # during the timed generate
                record["events"] = counters_delta(counters, event_counters())
                steps = min(profile_steps, gen_len - 1)
                spent = time.perf_counter() - began
                if steps and max_seconds is not None and spent > max_seconds:
                    record["profile_skipped"] = f"the run took {spent:.0f} s, over --max-seconds {max_seconds:g}"
                    steps = 0
                profiled = bool(profile_steps) and "profile_skipped" not in record
                profile = engine.profile(ids, steps) if profiled else {}
                metrics = build_metrics(engine, generation, profile, profile_steps=steps if profiled else 0)
                metrics["plan_file"] = str(run.plan)
                record["metrics"] = metrics
                hbm = next(row for row in metrics["memory"] if row["tier"] == "hbm")
                record["gpu"] = {"peak_allocated_bytes": backend.gpu_peak_bytes(),
                                 "peak_reserved_bytes": backend.gpu_peak_reserved_bytes(),
                                 "context_bytes": hbm.get("context_bytes"),
                                 "peak_footprint_bytes": hbm.get("peak_footprint_bytes"),
                                 "budget_bytes": hbm.get("budget_bytes"), "budget_enforced": hbm.get("budget_enforced")}
            record["gpu"]["allocated_after_close_bytes"] = backend.gpu_allocated_bytes()
            if metrics_dir is not None:
                write_metrics(Path(metrics_dir) / f"{index:02d}-{plan.metadata.name}.json", metrics)
            if timeline:
                timelines_due += timeline
                pending.append((record, plan, ids, timeline, label))
            record["summary"] = {"prefill_ms": metrics["prefill_ms"],
                                 "decode_ms_per_token": metrics["decode_ms_per_token"],
                                 "tokens_per_second": metrics["tokens_per_second"]}
            peak = record["gpu"]["peak_footprint_bytes"] or record["gpu"]["peak_allocated_bytes"]
            log(f"{label} b{batch} p{prompt_len} g{gen_len}: prefill "
                f"{metrics['prefill_ms']:.1f} ms (pred {record['predicted']['prefill_ms']:.1f}), decode "
                + (f"{metrics['decode_ms_per_token']:.1f}" if metrics["decode_ms_per_token"] is not None else "-")
                + f" ms/token (pred {record['predicted']['decode_ms_per_token']:.1f}), "
                f"{metrics['tokens_per_second']:.1f} tokens/s"
                + (f", GPU peak {peak / 2**30:.2f} of {record['gpu']['budget_bytes'] / 2**30:.2f} GiB"
                   if peak is not None else "")
                + f" (load {engine.build_seconds:.1f} s, warm-up {engine.warmup_seconds:.1f} s)"
                + f" [{time.perf_counter() - began:.0f} s]")
        except LiacError as e:
            record["error"] = e.line()
            log(f"{label}: error: {e.line()}")
        except Exception as e:  # a crash in one run must not lose the others (the traceback goes to stderr)
            traceback.print_exc()
            record["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
            log(f"{label}: error: {record['error']}")
        gc.collect()  # a failed run's tensors go with its traceback: give their GPU memory back before the next
        backend.release_cached()
        record["wall_seconds"] = round(time.perf_counter() - began, 3)
        save()
    for record, plan, ids, seconds, label in pending:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and seconds > left:
            record["timeline"] = {"error": f"out of time: estimated {seconds:.0f} s, {max(0.0, left):.0f} s left"}
        else:
            record["timeline"] = _timeline(plan, host, backend, ids)
        log(f"{label}: timeline of a decode step: " + ", ".join(
            f"{k} {v}" for k, v in record["timeline"].items() if k.endswith("_ms") or k == "error"))
        gc.collect()
        backend.release_cached()
        save()
    host.close()
    return results


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _read_runs(path: str) -> list[RunSpec]:
    from liac.errors import LiacError

    try:
        data = json.loads(Path(path).read_text())
        runs = [RunSpec(str(item["plan"]), item.get("batch"), item.get("prompt_len"), item.get("gen_len"))
                for item in data]
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise LiacError("--runs", f"'{path}' must be a JSON list of objects with 'plan' and optional 'batch', "
                                  f"'prompt_len', 'gen_len' ({type(e).__name__}: {e})") from e
    for run in runs:
        for value in (run.batch, run.prompt_len, run.gen_len):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise LiacError("--runs", f"'{path}': batch, prompt_len and gen_len must be positive integers")
    return runs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="run_plans.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("plans", nargs="*", help="plan files (one model)")
    parser.add_argument("--runs", help="JSON list of {plan, batch?, prompt_len?, gen_len?} (after the plans)")
    parser.add_argument("--seed", type=int, default=0, help="random weights seed (default 0)")
    parser.add_argument("--out", help="results JSON, rewritten atomically after every run")
    parser.add_argument("--batch", type=_positive, help="batch for every plan (default: its workload)")
    parser.add_argument("--prompt-len", type=_positive, help="prompt tokens for every plan")
    parser.add_argument("--gen-len", type=_positive, help="new tokens for every plan (per-token numbers)")
    parser.add_argument("--max-seconds", type=float, help="skip runs estimated to take longer")
    parser.add_argument("--profile-steps", type=int, default=2, help="decode steps of the profiling pass (0: none)")
    parser.add_argument("--metrics-dir", help="also write each run's metrics (lia-run format) into this folder")
    parser.add_argument("--emulate-gpu", action="store_true", help="test mode: 'gpu' runs on the CPU")
    parser.add_argument("--timeline-batches", default="", help="e.g. '8,32': runs at these batches also record a "
                        "timeline of one decode step (bench/timeline.py)")
    return parser


def main(argv: list[str] | None = None) -> int:
    _import_liac()
    from liac.errors import EXIT_USER_ERROR, LiacError

    args = build_parser().parse_args(argv)
    try:
        runs = [RunSpec(p, args.batch, args.prompt_len, args.gen_len) for p in args.plans]
        if args.runs:
            runs += _read_runs(args.runs)
        run_plans(runs, seed=args.seed, out=args.out, max_seconds=args.max_seconds,
                  profile_steps=args.profile_steps, emulate_gpu=True if args.emulate_gpu else None,
                  metrics_dir=args.metrics_dir,
                  timeline_batches=tuple(int(b) for b in args.timeline_batches.split(",") if b))
    except LiacError as e:
        sys.stderr.write(f"run_plans: {e.line()}\n")
        return EXIT_USER_ERROR
    if args.out:
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
