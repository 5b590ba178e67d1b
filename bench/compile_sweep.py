"""Benchmark: compile sweeps 1..256 on every shipped profile (the speed goal: ≤ 10 s per sweep on the 2-core dev
machine, each point proven optimal).

    .venv/bin/python bench/compile_sweep.py                      # every section → bench/results/compile-sweep.json
    .venv/bin/python bench/compile_sweep.py --sections profiles  # only the profile × model sweeps
    .venv/bin/python bench/compile_sweep.py --sections profiles --models mixtral-8x7b --profiles spr-h100

The profile section compiles OPT-175B, Llama-3.1-405B and Mixtral-8x7B at batch 1..256 (prompt 128, gen 32,
default budgets, HiGHS) on every shipped profile: per point the seconds of cost pricing, column generation + master
solve and plan emission, the status and proven gap; per sweep the total and whether the goal is met. The tracer
runs once per model and is timed apart. A point the budgets cannot hold fails fast (no columns are generated).

For each solver (HiGHS, CBC) it times the tracer once, then every point's cost pricing, column generation + master
solve and plan emission, and records each point's solver status, proven gap, objective and placements; a third
run (HiGHS, `--policy whole`) compiles the same points without split sublayers. A second, untimed-goal sweep
(512..2048, DDR budget lifted to 4 TiB like the paper's analytical points) records where decode moves the weight
GEMMs to the GPU. The split sweep compiles OPT-30B on h200-amx16 with a 24 GiB GPU budget (the H200 benchmark's
setting) with and without splits, and LIA's CPU-only and stream-only policies, at batch 1..256. The split
decisions section compiles OPT-175B (default budgets) and OPT-30B (24 GiB GPU budget) at batch 1 and 256 on every
shipped profile and on spr-h100 with the CPU alone saturating DDR (ddr_shared = its own rate): how many decoder
layers split per phase, and the gain over whole placements. Timings vary with machine load (other jobs share the
2 cores): the goal is checked on the total of compile seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

__all__ = ["main"]

GOAL_SECONDS = 10.0


def _machine() -> dict:
    import highspy  # noqa: F401 - version below
    import numpy
    import pulp

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from importlib.metadata import version

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "pulp": pulp.__version__, "highspy": version("highspy"), "numpy": numpy.__version__}


def _sweep(graph, cfg, hw, batches, solver, budgets, policy=None, prompt_len=128):
    from liac.sweep import policy_string
    from liac.passes.costs import Workload, annotate_costs
    from liac.passes.emit import emit_plan
    from liac.passes.ilp import SolverOptions, solve_placement

    points = []
    for batch in batches:
        start = time.perf_counter()
        costs = annotate_costs(graph, hw, Workload(batch, prompt_len, 32), budgets)
        assignment, report = solve_placement(costs, SolverOptions(solver=solver, policy=policy))
        plan = emit_plan(costs, assignment, report, cfg, "latency")
        seconds = time.perf_counter() - start
        predicted = plan.status.predicted
        points.append({"batch_size": batch, "seconds": round(seconds, 3), "solver": report.name,
                       "status": report.status, "gap": report.gap, "configurations": report.configurations,
                       "objective_seconds": round(report.objective_seconds, 6),
                       "prefill": policy_string(plan, "prefill"), "decode": policy_string(plan, "decode"),
                       "tokens_per_second": round(predicted.tokens_per_second, 4),
                       "prefill_seconds": round(predicted.prefill_seconds, 6),
                       "decode_seconds_per_token": round(predicted.decode_seconds_per_token, 6),
                       "split_layers": {phase: sum(g.layer_count for g in plan.spec.layer_groups
                                                   if g.layer_class == "decoder"
                                                   and any(getattr(u, phase) == "split" for u in g.sublayers))
                                        for phase in ("prefill", "decode")}})
        print(f"  {solver:6s} {policy or 'optimal':8s} B={batch:5d} {seconds:6.2f} s  {report.status} gap={report.gap:g}  "
              f"{predicted.tokens_per_second:8.3f} tok/s  decode {policy_string(plan, 'decode')}", flush=True)
    return points


def _split_sweep(batches) -> dict:
    """OPT-30B on h200-amx16, 24 GiB GPU budget: the optimum with splits against whole placements and LIA's
    CPU-only and stream-only policies (decode ms/token is what the split is for)."""
    from liac.models import ZOO
    from liac.passes.costs import TierBudgets
    from liac.passes.trace import trace_model
    from liac.profile import resolve_profile
    from liac.sizes import GIB

    cfg, hw = ZOO["opt-30b"], resolve_profile("h200-amx16")
    graph = trace_model(cfg)
    budgets = TierBudgets(24 * GIB, hw.cpu_budget_bytes, hw.cxl_budget_bytes)
    runs = {policy or "optimal": _sweep(graph, cfg, hw, batches, "highs", budgets, policy)
            for policy in (None, "whole", "lia-cpu", "lia-gpu")}
    gains = []
    for split, whole in zip(runs["optimal"], runs["whole"]):
        gains.append({"batch_size": split["batch_size"],
                      "decode_ms_per_token": {"split": round(split["decode_seconds_per_token"] * 1e3, 3),
                                              "whole": round(whole["decode_seconds_per_token"] * 1e3, 3)},
                      "prefill_seconds": {"split": split["prefill_seconds"], "whole": whole["prefill_seconds"]},
                      "total_gain_percent": round((1 - split["objective_seconds"] / whole["objective_seconds"]) * 100,
                                                  3)})
    return {"what": "opt-30b on h200-amx16, --gpu-mem 24GiB, prompt 128, gen 32: the optimum (with splits), "
                    "whole placements only, lia-cpu and lia-gpu", "runs": runs, "split_vs_whole": gains}


def _split_decisions() -> dict:
    """Per profile (the shipped ones and spr-h100 with saturated DDR), model and batch: split layers per phase,
    decode s/token and the total with and without splits."""
    import dataclasses

    from liac.errors import InfeasibleError
    from liac.models import ZOO
    from liac.passes.costs import TierBudgets, Workload, annotate_costs
    from liac.passes.ilp import SolverOptions, solve_placement
    from liac.passes.trace import trace_model
    from liac.profile import profile_names, resolve_profile
    from liac.sizes import GIB

    profiles = {name: resolve_profile(name) for name in profile_names()}
    base = profiles["spr-h100"]
    profiles["spr-h100 saturated"] = dataclasses.replace(base, ddr_shared_gb_per_s=base.cpu_ddr_read_gb_per_s)
    rows = []
    for model, gpu_gib in (("opt-175b", None), ("opt-30b", 24)):
        graph = trace_model(ZOO[model])
        for name, hw in profiles.items():
            budgets = TierBudgets(hw.gpu_budget_bytes if gpu_gib is None else gpu_gib * GIB, hw.cpu_budget_bytes,
                                  hw.cxl_budget_bytes)
            for batch in (1, 256):
                costs = annotate_costs(graph, hw, Workload(batch, 128, 32), budgets)
                start = time.perf_counter()
                try:
                    split, report = solve_placement(costs)
                    whole, whole_report = solve_placement(costs, SolverOptions(policy="whole"))
                except InfeasibleError as e:
                    rows.append({"profile": name, "model": model, "batch_size": batch, "infeasible": e.message})
                    continue
                seconds = time.perf_counter() - start

                def layers(assignment, phase):
                    return sum(n for cls, c, n in assignment.choices
                               if cls == "decoder" and any(0 < p < 1000 for p in c.cpu_permille(phase)))

                def decode(assignment):
                    return sum(c.decode_seconds * n for _, c, n in assignment.choices) / max(costs.workload.gen_len - 1, 1)

                rows.append({"profile": name, "model": model, "gpu_gib": gpu_gib or round(hw.gpu_budget_bytes / GIB, 1),
                             "batch_size": batch, "split_layers": {"prefill": layers(split, "prefill"),
                                                                    "decode": layers(split, "decode")},
                             "decode_ms_per_token": {"split": round(decode(split) * 1e3, 3),
                                                     "whole": round(decode(whole) * 1e3, 3)},
                             "total_gain_percent": round((1 - report.objective_seconds
                                                          / whole_report.objective_seconds) * 100, 3),
                             "status": [report.status, whole_report.status], "seconds": round(seconds, 3)})
                print(f"  split decisions {name:20s} {model} B={batch:4d}: split layers {rows[-1]['split_layers']} "
                      f"gain {rows[-1]['total_gain_percent']} %", flush=True)
    return {"what": "split decoder layers per phase at batch 1 and 256 (prompt 128, gen 32; OPT-175B at the "
                    "profile's default budgets, OPT-30B with 24 GiB of HBM), decode ms/token with and without "
                    "splits, and the total's gain; 'spr-h100 saturated' is spr-h100 with ddr_shared_gb_per_s = "
                    "cpu_ddr_read_gb_per_s (the CPU alone saturates DDR)", "rows": rows}


PROFILE_MODELS = ("opt-175b", "llama-3.1-405b", "mixtral-8x7b")


def _profile_sweeps(batches, models=PROFILE_MODELS, profiles=None, previous=None) -> dict:
    """Every shipped profile (or `profiles`) × `models`: the sweep's seconds per point (wall and this process's
    CPU: HiGHS runs in-process on one thread, so CPU seconds are what the sweep costs on an idle core), status and
    gap. Rows of `previous` (an earlier result) for pairs not compiled now are kept."""
    from liac.errors import InfeasibleError
    from liac.models import ZOO
    from liac.passes.costs import TierBudgets, Workload, annotate_costs
    from liac.passes.emit import emit_plan
    from liac.passes.ilp import SolverOptions, solve_placement
    from liac.passes.trace import trace_model
    from liac.profile import profile_names, resolve_profile

    rows = []
    for model in models:
        cfg = ZOO[model]
        start = time.perf_counter()
        graph = trace_model(cfg)
        trace_seconds = time.perf_counter() - start
        for name in profiles or profile_names():
            hw = resolve_profile(name)
            budgets = TierBudgets(hw.gpu_budget_bytes, hw.cpu_budget_bytes, hw.cxl_budget_bytes)
            points = []
            for batch in batches:
                start, cpu_start = time.perf_counter(), time.process_time()
                try:
                    costs = annotate_costs(graph, hw, Workload(batch, 128, 32), budgets)
                    assignment, report = solve_placement(costs, SolverOptions(solver="highs"))
                    emit_plan(costs, assignment, report, cfg, "latency")
                    point = {"status": report.status, "gap": report.gap,
                             "objective_seconds": round(report.objective_seconds, 6),
                             "configurations": report.configurations}
                except InfeasibleError as e:
                    point = {"status": "infeasible", "reason": e.message}
                point = {"batch_size": batch, "seconds": round(time.perf_counter() - start, 3),
                         "cpu_seconds": round(time.process_time() - cpu_start, 3),
                         "load_average": round(os.getloadavg()[0], 2), **point}
                points.append(point)
                gap = f" gap={point['gap']:g}" if "gap" in point else ""
                print(f"  {model:15s} {name:14s} B={batch:4d} {point['seconds']:7.2f} s  cpu {point['cpu_seconds']:7.2f} s"
                      f"  load {point['load_average']:5.2f}  {point['status']}{gap}", flush=True)
            total = sum(p["seconds"] for p in points)
            cpu = sum(p["cpu_seconds"] for p in points)
            proven = all(p["status"] in ("optimal", "infeasible") for p in points)
            rows.append({"model": model, "profile": name, "trace_seconds": round(trace_seconds, 3),
                         "compile_seconds_total": round(total, 3), "cpu_seconds_total": round(cpu, 3),
                         "all_proven": proven, "goal_met": proven and total <= GOAL_SECONDS,
                         "goal_met_cpu": proven and cpu <= GOAL_SECONDS, "points": points})
            print(f"{model} on {name}: {total:.2f} s ({cpu:.2f} s CPU) for {len(points)} points, "
                  f"{'all proven' if proven else 'NOT all proven'}", flush=True)
    done = {(r["model"], r["profile"]) for r in rows}
    kept = [r for r in (previous or {}).get("sweeps", []) if (r["model"], r["profile"]) not in done]
    rows = sorted(kept + rows, key=lambda r: (PROFILE_MODELS.index(r["model"]) if r["model"] in PROFILE_MODELS
                                              else len(PROFILE_MODELS), r["model"], r["profile"]))
    return {"what": "liac compile sweeps, prompt 128, gen 32, default budgets, HiGHS; seconds per point = "
                    "annotate_costs + solve_placement + emit_plan (the tracer once per model, apart); wall "
                    "seconds depend on the machine's load (recorded per point), CPU seconds much less",
            "goal_seconds": GOAL_SECONDS, "sweeps": rows}


SECTIONS = ("profiles", "solvers", "trend", "split", "decisions")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "compile-sweep.json"))
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {', '.join(SECTIONS)} (default: all); the others are kept "
                             "from an existing --out file")
    parser.add_argument("--models", default=",".join(PROFILE_MODELS),
                        help="profiles section: comma-separated models (default: %(default)s); other models' rows "
                             "are kept from an existing --out file")
    parser.add_argument("--profiles", default="",
                        help="profiles section: comma-separated profiles (default: every shipped one)")
    args = parser.parse_args(argv)
    sections = [name for name in args.sections.split(",") if name]
    unknown = [name for name in sections if name not in SECTIONS]
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)}: must be among {', '.join(SECTIONS)}")
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {}
    batches = [2**k for k in range(9)]
    result["machine"] = _machine()
    result["goal_seconds"] = GOAL_SECONDS
    if "profiles" in sections:
        result["profile_sweeps"] = _profile_sweeps(
            batches, [m for m in args.models.split(",") if m], [p for p in args.profiles.split(",") if p] or None,
            result.get("profile_sweeps"))
    if any(name in sections for name in ("solvers", "trend")):
        result.update(_opt175b_sections(sections, batches))
    if "split" in sections:
        result["split_sweep"] = _split_sweep(batches)
    if "decisions" in sections:
        result["split_decisions"] = _split_decisions()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0


def _opt175b_sections(sections, batches) -> dict:
    """OPT-175B on spr-h100: each solver and --policy whole over 1..256, and the trend sweep to 2048."""

    from liac.models import ZOO
    from liac.passes.costs import TierBudgets
    from liac.passes.trace import trace_model
    from liac.profile import resolve_profile

    cfg, hw = ZOO["opt-175b"], resolve_profile("spr-h100")
    start = time.perf_counter()
    graph = trace_model(cfg)
    trace_seconds = time.perf_counter() - start
    print(f"trace opt-175b: {trace_seconds:.2f} s", flush=True)
    budgets = TierBudgets(hw.gpu_budget_bytes, hw.cpu_budget_bytes, hw.cxl_budget_bytes)
    out = {"trace_seconds": round(trace_seconds, 3)}
    if "solvers" in sections:
        runs = {}
        for name, solver, policy in (("highs", "highs", None), ("cbc", "cbc", None), ("highs-whole", "highs", "whole")):
            points = _sweep(graph, cfg, hw, batches, solver, budgets, policy)
            total = sum(p["seconds"] for p in points)
            runs[name] = {"points": points, "compile_seconds_total": round(total, 3), "policy": policy or "optimal",
                          "all_optimal": all(p["status"] == "optimal" and p["gap"] == 0 for p in points),
                          "goal_met": total <= GOAL_SECONDS}
            print(f"{name}: {total:.2f} s for {len(points)} points (goal {GOAL_SECONDS} s)", flush=True)
        objectives = {s: [p["objective_seconds"] for p in r["points"]] for s, r in runs.items()}
        out.update({
            "what": "liac compile, opt-175b on spr-h100, prompt 128, gen 32, objective latency; seconds per point = "
                    "annotate_costs + solve_placement + emit_plan (the tracer runs once per model, timed apart)",
            "solvers": runs,
            "solvers_agree": all(abs(a - b) <= 1e-6 * max(a, 1e-9)
                                 for a, b in zip(objectives["highs"], objectives["cbc"]))})
    if "trend" in sections:
        trend_budgets = TierBudgets(hw.gpu_budget_bytes, 4 * 2**40, 0)
        out["trend_sweep"] = {"note": "DDR budget 4 TiB (the paper's analytical points); where decode moves the "
                                      "weight GEMMs to the GPU",
                              "points": _sweep(graph, cfg, hw, [1, 16, 256, 512, 1024, 2048], "highs", trend_budgets)}
    return out


if __name__ == "__main__":
    sys.exit(main())
