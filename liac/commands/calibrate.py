"""`liac calibrate`: fit a hardware profile to measured runs (lia-run metrics) and report the error before/after.

    liac calibrate runs/*.json --plans plans/ --hw h200-run.yaml -o h200-run.calibrated.yaml [--report r.json]

See liac/calibrate.py for what is fitted and how, docs/calibration.md for the workflow.
"""

from __future__ import annotations

import json
from pathlib import Path

from liac.commands.flags import positive_int
from liac.errors import LiacError
from liac.fileio import write_atomic
from liac.profile import resolve_profile

__all__ = ["register", "run"]


def register(sub) -> None:
    parser = sub.add_parser("calibrate", help="fit a hardware profile to measured runs",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", nargs="+", help="metrics JSON files from 'lia-run --metrics-out'")
    parser.add_argument("--plans", nargs="+", default=[], metavar="PLAN",
                        help="the plans the runs executed: files or directories (matched by metadata.name)")
    parser.add_argument("--hw", required=True, help="the profile the plans were priced with (name or file)")
    parser.add_argument("-o", "--output", required=True, help="calibrated profile to write (YAML)")
    parser.add_argument("--name", help="profile name (default: the output file's stem)")
    parser.add_argument("--report", metavar="FILE", help="also write the report (JSON, with every row)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="what to print")
    parser.add_argument("--profile-steps", default="4", metavar="K",
                        help="decode steps of the runs' profiling pass when a document does not say (lia-run's "
                             "--profile-steps; default 4)")
    parser.add_argument("--max-evals", default="600", metavar="N",
                        help="cost-model evaluations the fit may spend (default 600)")
    parser.set_defaults(func=run)


def run(args) -> int:
    # late import: calibration re-prices plans (numpy, the cost model); `liac --help` loads none of it
    from liac.calibrate import calibrate, load_measurements, profile_yaml, report_data, report_lines

    profile_steps = positive_int(args.profile_steps, "--profile-steps")
    max_evals = positive_int(args.max_evals, "--max-evals")
    out = Path(args.output)
    if out.suffix not in (".yaml", ".yml"):
        raise LiacError("--output", f"must end in '.yaml' or '.yml', got '{args.output}'")
    if args.report and Path(args.report).suffix != ".json":
        raise LiacError("--report", f"must end in '.json', got '{args.report}'")
    base = resolve_profile(args.hw)
    runs = load_measurements(args.metrics, args.plans, profile_steps=profile_steps)
    result = calibrate(base, runs, max_evals=max_evals)
    text = profile_yaml(result, base, args.name or out.stem)
    data = report_data(result, base)
    write_atomic(out, text)
    if args.report:
        write_atomic(args.report, json.dumps(data, indent=2, sort_keys=True) + "\n")
    if args.format == "json":
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in report_lines(result, base):
            print(line)
        print(f"wrote {out}" + (f" and {args.report}" if args.report else ""))
    return 0
