"""`liac calibrate`: fit a hardware profile to measured runs (lia-run metrics) and report the error before/after.

    liac calibrate runs/*.json --plans plans/ --hw h200-run.yaml -o h200-run.calibrated.yaml [--report r.json]
        [--hold-out-prompt 1024 | --judge other/*.json]     # fit on some runs, judge the fit on the others
        [--run-profiles call1/run-profile.yaml call2/run-profile.yaml]   # runs of several calls, each its rates

See liac/calibrate.py for what is fitted and how, docs/calibration.md for the workflow.
"""

from __future__ import annotations

import json
from pathlib import Path

from liac.commands.flags import positive_int
from liac.errors import LiacError
from liac.fileio import check_writable, write_atomic
from liac.profile import resolve_profile

__all__ = ["register", "run"]


def register(sub) -> None:
    parser = sub.add_parser("calibrate", help="fit a hardware profile to measured runs",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", nargs="+", help="metrics JSON files from 'lia-run --metrics-out'")
    parser.add_argument("--plans", nargs="+", default=[], metavar="PLAN",
                        help="the plans the runs executed: files or directories (matched by metadata.name)")
    parser.add_argument("--hw", required=True, help="the profile the plans were priced with (name or file)")
    parser.add_argument("--run-profiles", nargs="+", default=[], metavar="PROFILE",
                        help="profiles measured with the runs (one per device call): a run whose plan was compiled "
                             "for one of them (the sha256 the plan records) is priced with it, scaled by the same "
                             "factors; other runs with --hw")
    parser.add_argument("-o", "--output", required=True, help="calibrated profile to write (YAML)")
    parser.add_argument("--name", help="profile name (default: the output file's stem)")
    parser.add_argument("--report", metavar="FILE", help="also write the report (JSON, with every row)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="what to print")
    parser.add_argument("--profile-steps", default="4", metavar="K",
                        help="decode steps of the runs' profiling pass when a document does not say (lia-run's "
                             "--profile-steps; default 4)")
    parser.add_argument("--max-evals", default="600", metavar="N",
                        help="cost-model evaluations the fit may spend (default 600)")
    parser.add_argument("--prior", default=None, metavar="W",
                        help="weight W of the prior ½·W·Σ log2(factor)² that keeps factors near the measured "
                             "profile (default 0.01; 0: none, for exact measurements)")
    held = parser.add_mutually_exclusive_group()
    held.add_argument("--judge", nargs="+", default=[], metavar="METRICS",
                      help="held-out metrics files: not fitted, judged with the calibrated profile (their error "
                           "before and after)")
    held.add_argument("--hold-out-prompt", metavar="N",
                      help="hold out the runs of prompt length N: fit on the others, judge on these")
    parser.set_defaults(func=run)


def _non_negative(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0 or value == float("inf"):
        raise LiacError(flag, f"must be a number at least 0, got '{text}'")
    return value


def run(args) -> int:
    # late import: calibration re-prices plans (numpy, the cost model); `liac --help` loads none of it
    from liac.calibrate import (PRIOR, calibrate, judge, load_measurements, profile_yaml, report_data,
                                report_lines, split_by_prompt)

    profile_steps = positive_int(args.profile_steps, "--profile-steps")
    max_evals = positive_int(args.max_evals, "--max-evals")
    prior = PRIOR if args.prior is None else _non_negative(args.prior, "--prior")
    out = Path(args.output)
    if out.suffix not in (".yaml", ".yml"):
        raise LiacError("--output", f"must end in '.yaml' or '.yml', got '{args.output}'")
    if args.report and Path(args.report).suffix != ".json":
        raise LiacError("--report", f"must end in '.json', got '{args.report}'")
    check_writable(out, "--output")  # before the fit
    if args.report:
        check_writable(args.report, "--report")
    base = resolve_profile(args.hw)
    own = [resolve_profile(p) for p in args.run_profiles]
    runs = load_measurements(args.metrics, args.plans, profile_steps=profile_steps, run_profiles=own)
    held = (load_measurements(args.judge, args.plans, profile_steps=profile_steps, run_profiles=own)
            if args.judge else [])
    if args.hold_out_prompt is not None:
        prompt = positive_int(args.hold_out_prompt, "--hold-out-prompt")
        runs, held = split_by_prompt(runs, prompt)
        if not runs or not held:
            raise LiacError("--hold-out-prompt", f"must leave runs on both sides: {len(runs)} runs of other prompt "
                                                 f"lengths, {len(held)} of prompt {prompt}")
    result = calibrate(base, runs, max_evals=max_evals, prior=prior)
    held_out = judge(base, result, held) if held else None
    text = profile_yaml(result, base, args.name or out.stem)
    data = report_data(result, base)
    if held_out is not None:
        data["held_out"] = held_out
    write_atomic(out, text, source="--output")
    if args.report:
        write_atomic(args.report, json.dumps(data, indent=2, sort_keys=True) + "\n", source="--report")
    if args.format == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in report_lines(result, base, held_out):
            print(line)
        print(f"wrote {out}" + (f" and {args.report}" if args.report else ""))
    return 0
