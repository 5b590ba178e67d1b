"""`liac demo`: the README's main job on a built-in default, end to end.

1. Compile a batch sweep for OPT-30B on the H200 machine's profile with a 24 GiB GPU budget (so most of the model
   is offloaded) and print the summary table: per batch, the placement per phase, predicted latency and tokens/s,
   memory per tier.
2. Compile a plan for a small built-in model (OPT-125M) for this host — on the CPU alone when there is no GPU — and
   run it with the runtime on random weights, printing the measured metrics beside the plan's predictions.

Everything is written under `-o DIR` (default: a new temporary directory, printed at the end).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from liac.commands.compile import summary_table
from liac.commands.flags import parse_batches, parse_bytes

__all__ = ["register", "run"]


def register(sub) -> None:
    parser = sub.add_parser("demo", help="compile a built-in sweep and run a small model's plan end to end",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", help="directory for the plans and metrics (default: a new temp dir)")
    parser.add_argument("--model", default="opt-30b", help="model of the sweep (default opt-30b)")
    parser.add_argument("--hw", default="h200-amx16", help="hardware profile of the sweep (default h200-amx16)")
    parser.add_argument("--batch", default="1..64", help="batch sizes of the sweep (default 1..64)")
    parser.add_argument("--gpu-mem", default="24GiB", help="GPU budget of the sweep (default 24GiB)")
    parser.set_defaults(func=run)


def run(args) -> int:
    # late import: the compiler loads numpy and pulp, the runtime torch; `liac --help` needs neither
    import torch

    from liac.api import compile_plans, write_plans
    from liac.runtime.cli import main as lia_run

    out = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="liac-demo-"))
    print(f"== 1. compile {args.model} on {args.hw}, GPU budget {args.gpu_mem}, batch {args.batch}", flush=True)
    sweep = compile_plans(args.model, args.hw, batches=parse_batches(args.batch),
                          gpu_mem=parse_bytes(args.gpu_mem, "--gpu-mem"))
    write_plans(sweep, out / "sweep")
    sys.stdout.write(summary_table(sweep))

    gpu = torch.cuda.is_available()
    where = "CPU + GPU" if gpu else "the CPU (no GPU here)"
    print(f"\n== 2. compile opt-125m for {where} and run it on random weights", flush=True)
    small = compile_plans("opt-125m", args.hw, batches=(1,), prompt_len=32, gen_len=16,
                          gpu_mem=parse_bytes("1GiB", "--gpu-mem") if gpu else 0)
    plan_path = write_plans(small, out / "opt-125m.yaml")[0]
    sys.stdout.write(summary_table(small))
    status = lia_run([str(plan_path), "--random-weights", "0", "--metrics-out", str(out / "opt-125m.metrics.json")])
    print(f"\n(the predictions are for profile '{args.hw}'; `liac profile -o host.yaml` measures this host, and "
          f"`liac compile --hw host.yaml` plans for it)")
    print(f"plans and metrics: {out}")
    return status
