"""What one plan's engine does on this GPU, for diagnosis (issue 12): the allocator's segments when it runs out of
memory under the plan's budget, and a torch.profiler trace of one decode step.

    python bench/probe_step.py --out DIR PLAN.yaml [PLAN.yaml ...] [--trace PLAN_INDEX,...]

Per plan (all over ONE set of random weights, bench/run_plans.py's HostWeights): build the engine with its budget
enforced and warm up at the plan's workload, generate 4 tokens; on an out-of-memory error, record the allocator's
state: its segments grouped by stream, pool (small < 1 MiB requests / large) and segment size, with their allocated
and free bytes, the cap and the reserved and allocated totals (DIR/memory.json). With --trace, also write the chrome
trace of a 3-token generate of those plans (DIR/trace-N.json.gz; bench/timeline.py summarises one).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_plans import _import_liac  # noqa: E402


def segments(device) -> dict:
    import torch

    groups: dict[str, dict] = {}
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", 0) != device.index:
            continue
        key = f"stream {seg['stream']} {seg['segment_type']} {seg['total_size'] >> 20} MiB"
        row = groups.setdefault(key, {"segments": 0, "total": 0, "allocated": 0})
        row["segments"] += 1
        row["total"] += seg["total_size"]
        row["allocated"] += seg["allocated_size"]
    return {k: {"segments": v["segments"], "total_mib": round(v["total"] / 2**20, 2),
                "allocated_mib": round(v["allocated"] / 2**20, 2)}
            for k, v in sorted(groups.items(), key=lambda kv: -kv[1]["total"])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("plans", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--trace", default="")
    args = parser.parse_args(argv)
    _import_liac()
    import torch

    from liac.errors import LiacError
    from liac.plan import load_plan
    from liac.runtime import Engine, HostWeights, make_backend

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    traced = {int(i) for i in args.trace.split(",") if i}
    plans = [load_plan(p) for p in args.plans]
    backend = make_backend(False)
    device = backend.devices["gpu"]
    host = HostWeights.random(plans[0].model_config, 0, backend=backend, progress=False)
    report = []
    for index, plan in enumerate(plans):
        work = plan.spec.workload
        ids = torch.randint(0, plan.model_config.vocab_size, (work.batch_size, work.prompt_len),
                            generator=torch.Generator().manual_seed(0))
        row = {"plan": args.plans[index], "budget_gib": plan.spec.budgets.gpu_bytes / 2**30,
               "workspace_mib": plan.spec.execution.workspace_bytes / 2**20}
        try:
            with Engine.from_plan(plan, weights=host, backend=backend, warm_up=False) as engine:
                row["cap_mib"] = engine.budget.cap_bytes / 2**20
                row["arena_mib"] = engine.budget.arena_bytes / 2**20
                row["context_mib_at_start"] = backend.gpu_context_bytes() / 2**20
                try:
                    engine.warm_up(work.batch_size, work.prompt_len)
                    engine.generate(ids, 4)
                    row["ok"] = True
                except (LiacError, torch.cuda.OutOfMemoryError) as e:
                    row["error"] = str(e)[:300]
                    row["cause"] = str(e.__cause__)[:600] if e.__cause__ else None
                    row["segments"] = segments(device)
                row["reserved_mib"] = torch.cuda.memory_reserved(device) / 2**20
                row["allocated_mib"] = torch.cuda.memory_allocated(device) / 2**20
                row["peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / 2**20
                row["context_mib_after"] = backend.gpu_context_bytes() / 2**20
                if index in traced:
                    from torch.profiler import ProfilerActivity, profile

                    engine.budget = engine.budget  # the profiler's buffers are outside the allocator
                    backend.cap(None)
                    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                        engine.generate(ids, 3)
                    with tempfile.TemporaryDirectory() as folder:
                        path = Path(folder) / "t.json"
                        prof.export_chrome_trace(str(path))
                        with open(path, "rb") as src, gzip.open(out / f"trace-{index}.json.gz", "wb") as dst:
                            shutil.copyfileobj(src, dst)
        except LiacError as e:
            row["error"] = e.line()
        report.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "segments"}), flush=True)
        (out / "memory.json").write_text(json.dumps(report, indent=1))
    host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
