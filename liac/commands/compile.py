"""`liac compile`: model + hardware profile + workload points → offload plans (one YAML per point, index.yaml).

    liac compile --model opt-175b --hw spr-h100 --batch 1..256 -o plans/opt-175b
    liac compile --model facebook/opt-30b --gpu-mem 24GiB -o plan.yaml        # for this host, by repo id
    liac compile --model opt-30b --hw h200-amx16 --gpu-mem 24GiB --serve --batch 1..64 -o serve.yaml

Without `--hw` it plans for this host (liac/host.py: the profile in the user's cache directory, measured on first
use). Exit status: 0 every point compiled, 3 some (or all) points are infeasible (the feasible ones are written),
2 bad input. `--json` puts one JSON document on stdout and the human text on stderr.
"""

from __future__ import annotations

import json
import sys

from liac.commands.flags import parse_batch_weights, parse_batches, parse_bytes
from liac.errors import EXIT_INFEASIBLE, InfeasibleError, LiacError
from liac.host import host_profile
from liac.models import resolve_model
from liac.plan import OBJECTIVES, batch_plan
from liac.profile import HOST_PROFILE
from liac.progress import progress_bar
from liac.schema_tools import to_data
from liac.sizes import GIB
from liac.sweep import INDEX_NAME, microbatch_string, policy_string

__all__ = ["register", "run", "summary_table", "serving_table"]


def register(sub) -> None:
    parser = sub.add_parser("compile", help="compile offload plans (placement ILP over a hardware profile)",
                            description="Compile one offload plan per batch size; a sweep writes a directory with "
                                        "index.yaml.")
    parser.add_argument("--model", required=True, help="zoo name, config.json, checkpoint directory, or Hugging "
                                                       "Face repo id (e.g. facebook/opt-30b; its config.json only)")
    parser.add_argument("--hw", default=None, help="hardware profile: shipped name (see docs/compile.md), 'host', "
                                                   "or a YAML file (default: this host's profile, measured on "
                                                   "first use)")
    parser.add_argument("--batch", default="1", help="'1..256' (powers of two), '1,8,64', or one number")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per sequence (default 128)")
    parser.add_argument("--gen-len", type=int, default=32, help="generated tokens per sequence (default 32)")
    parser.add_argument("--gpu-mem", default=None, help="GPU budget with a unit: 24GiB, 24GB, 512MiB, or 0 for "
                                                        "CPU only (default: HBM minus the profile's reserve)")
    parser.add_argument("--cpu-mem", default=None, help="host DDR budget, e.g. 200GiB (default: DDR minus the "
                                                        "reserve)")
    parser.add_argument("--cxl-mem", default=None, help="CXL budget, e.g. 64GiB (default: the profile's CXL "
                                                        "capacity)")
    parser.add_argument("--objective", default="latency", choices=OBJECTIVES,
                        help="latency: prefill + all decode steps; throughput: the same per point, and the index "
                             "names the batch with the most tokens/s")
    parser.add_argument("--policy", default=None, help="a restricted placement space instead of the optimum: "
                                                       "lia-cpu, lia-partial, lia-gpu, lia, whole (no split "
                                                       "sublayers), or PREFILL/DECODE (e.g. lia-gpu/lia-cpu)")
    parser.add_argument("--no-resident-layers", dest="resident_layers", action="store_false",
                        help="switch off LIA's Optimization-1: no decoder layer keeps all its weights in HBM (the "
                             "paper's ablation, Table 4)")
    parser.add_argument("--solver", default="auto", choices=("auto", "cbc", "highs"),
                        help="ILP solver: auto (HiGHS when highspy is installed, else CBC), cbc, highs")
    parser.add_argument("--prefetch-depth", type=int, default=1, help="layers of streamed weights staged ahead "
                                                                      "(default 1: double buffering)")
    parser.add_argument("--serve", action="store_true",
                        help="compile ONE serving plan for every batch size of --batch: one memory placement (KV "
                             "cache for the largest batch), a compute placement per batch size (lia-serve)")
    parser.add_argument("--batch-weights", default=None,
                        help="with --serve: the batch distribution the objective weighs, '1:4,8:2,64:1' or one "
                             "integer per batch size '4,2,1' (default: uniform)")
    parser.add_argument("-o", "--output", required=True, help="directory (sweep) or .yaml file (one point)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout (the sweep's index "
                                                            "and the files written); the table goes to stderr")
    parser.set_defaults(func=run)


def run(args) -> int:
    from liac.api import (check_serving_model, compile_plans, compile_serving,  # late import: numpy and pulp
                          output_target, write_plans)

    sizes = {name: parse_bytes(value, f"--{name.replace('_', '-')}") if value is not None else None
             for name, value in (("gpu_mem", args.gpu_mem), ("cpu_mem", args.cpu_mem), ("cxl_mem", args.cxl_mem))}
    batches = parse_batches(args.batch)
    if args.batch_weights is not None and not args.serve:
        raise LiacError("--batch-weights", "applies to a serving plan only: add --serve")
    weights = parse_batch_weights(args.batch_weights) if args.batch_weights is not None else None
    if args.serve and args.objective != "latency":
        raise LiacError("--objective", "must be 'latency' with --serve: a serving plan minimises the weighted "
                                       "step time of its batch sizes")
    cfg = resolve_model(args.model)  # before a first-use probe: a mistyped model answers at once
    if args.serve:
        check_serving_model(cfg)  # before the output is created
    human = sys.stderr if args.json else sys.stdout
    try:
        # The output is checked (and a sweep directory locked) before any compute: an unwritable -o fails at once.
        with output_target(args.output) as target:
            if args.hw in (None, HOST_PROFILE):
                hw = host_profile(say=lambda text: sys.stderr.write(f"liac compile: {text}\n"))
            else:
                hw = args.hw
            with progress_bar(len(batches), f"compile {cfg.name}", unit="point") as bar:
                def solved(batch: int) -> None:
                    bar.set_postfix_str(f"batch {batch}", refresh=False)
                    bar.update(1)

                if args.serve:
                    result = compile_serving(cfg, hw, batches=batches, batch_weights=weights,
                                             prompt_len=args.prompt_len, gen_len=args.gen_len, policy=args.policy,
                                             solver=args.solver, prefetch_depth=args.prefetch_depth,
                                             resident_layers=args.resident_layers, progress=solved, **sizes)
                else:
                    result = compile_plans(cfg, hw, batches=batches, prompt_len=args.prompt_len,
                                           gen_len=args.gen_len, objective=args.objective, policy=args.policy,
                                           solver=args.solver, prefetch_depth=args.prefetch_depth,
                                           resident_layers=args.resident_layers, progress=solved, **sizes)
            written = write_plans(result, args.output, target)
    except InfeasibleError as e:  # no point fits: nothing is written
        sys.stderr.write(f"liac compile: {e.line()}\n")
        if args.json:
            _print_json({"error": e.line(), "written": []})
        return EXIT_INFEASIBLE
    human.write(serving_table(result.points[0].plan) if args.serve else summary_table(result))
    where = written[0] if len(written) == 1 else f"{args.output} ({len(written) - 1} plans + {INDEX_NAME})"
    human.write(f"wrote {where}\n")
    if result.infeasible:
        sys.stderr.write(f"liac compile: {len(result.infeasible)} of {len(batches)} points infeasible (batch "
                         + ", ".join(str(b) for b, _ in result.infeasible) + "); the feasible ones are written\n")
    if args.json:
        # floats as index.yaml has them (6 significant digits)
        doc = {key: value for key, value in to_data(result.index()).items() if key not in ("apiVersion", "kind")}
        _print_json(dict(doc, written=[str(path) for path in written]))
    return EXIT_INFEASIBLE if result.infeasible else 0


def _print_json(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / GIB:.1f}"


def summary_table(result) -> str:
    """One row per point: batch, placements per phase, predicted seconds, tokens/s, GiB per tier."""
    header = ("batch", "prefill policy", "decode policy", "prefill s", "decode s/tok", "tokens/s", "HBM GiB",
              "DDR GiB", "CXL GiB", "prefill micro-batch")
    rows = []
    for point in result.points:
        plan = point.plan
        predicted = plan.status.predicted
        memory = {u.tier: u.used_bytes for u in plan.status.memory}
        rows.append((str(plan.spec.workload.batch_size), policy_string(plan, "prefill"),
                     policy_string(plan, "decode"), f"{predicted.prefill_seconds:.3g}",
                     f"{predicted.decode_seconds_per_token:.3g}", f"{predicted.tokens_per_second:.3g}",
                     _gib(memory["hbm"]), _gib(memory["ddr"]), _gib(memory["cxl"]), microbatch_string(plan)))
    for batch, reason in result.infeasible:
        rows.append((str(batch), "infeasible: " + reason, "", "", "", "", "", "", "", ""))
    widths = [max(len(h), *(len(r[i]) for r in rows if not r[1].startswith("infeasible"))) if rows else len(h)
              for i, h in enumerate(header)]
    lines = [f"{result.model} on {result.profile} ({result.objective}, policy {result.policy}); "
             f"policy letters per decoder unit: C = CPU, G = GPU, S = split"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        if row[1].startswith("infeasible"):
            lines.append(f"{row[0].ljust(widths[0])}  {row[1]}")
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    return "\n".join(lines) + "\n"


def serving_table(plan) -> str:
    """A serving plan: its memory per tier, then one row per live batch size: its share of the objective, its
    placements per phase, predicted prefill, decode step and step time (prefill amortised), beside the step time
    of that batch size's own optimum and what sharing one memory placement costs it."""
    memory = {u.tier: u.used_bytes for u in plan.status.memory}
    header = ("batch", "share", "prefill policy", "decode policy", "prefill s", "decode s/tok", "step s", "alone s",
              "sharing")
    rows = []
    for row in plan.status.serving.batches:
        live = batch_plan(plan, row.batch_size)
        cost = row.step_seconds / row.own_step_seconds - 1 if row.own_step_seconds > 0 else 0.0
        rows.append((str(row.batch_size), f"{row.share:.2f}", policy_string(live, "prefill"),
                     policy_string(live, "decode"), f"{row.prefill_seconds:.3g}",
                     f"{row.decode_seconds_per_token:.3g}", f"{row.step_seconds:.3g}", f"{row.own_step_seconds:.3g}",
                     f"{round(100 * cost, 1) + 0.0:+.1f}%"))  # + 0.0: a rounding noise of -0.0 reads +0.0
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    solver = plan.status.solver
    lines = [f"{plan.metadata.name}: one memory placement for batch sizes "
             + ", ".join(r[0] for r in rows) + f" (HBM {_gib(memory['hbm'])} GiB, DDR {_gib(memory['ddr'])} GiB, "
             f"CXL {_gib(memory['cxl'])} GiB; KV cache for batch {plan.spec.workload.batch_size}), a compute "
             f"placement per batch size; weighted step time "
             f"{solver.objective_seconds / plan.spec.workload.gen_len:.3g} s ({solver.name}, {solver.status}, gap "
             f"{solver.gap:g})",
             "policy letters per decoder unit: C = CPU, G = GPU, S = split; 'alone': the step time of a plan for "
             "that batch size alone; 'sharing': what one memory placement for all costs it"]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(lines) + "\n"
