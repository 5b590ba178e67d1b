"""Write each run's metrics document from a benchmark call's runs.json, one file per run, for `liac calibrate`.

    python bench/extract_metrics.py bench/results/h200-2026-12-02/i12j/runs.json cal/i12j/m
    liac calibrate cal/i12j/m/*.json --plans ... --hw bench/results/h200-2026-12-02/i12j/run-profile.yaml ...

Files are named NN-<plan>.json (NN: the run's position, so repeats of a plan keep their own file). A document
without `run.profile_steps` (calls before it was recorded) gets runs.json's `profile_steps`, capped at the run's
decode steps as bench/run_plans.py caps it, unless the run's profiling pass was skipped (then 0). Runs that wrote
no metrics (skipped, failed) are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def extract(runs_json: Path, out: Path) -> list[Path]:
    data = json.loads(runs_json.read_text())
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for index, record in enumerate(data["runs"]):
        metrics = record.get("metrics")
        if metrics is None:
            continue
        run = metrics.setdefault("run", {})
        if "profile_steps" not in run:
            skipped = "profile_skipped" in record or not data.get("profile_steps")
            run["profile_steps"] = 0 if skipped else min(data["profile_steps"], run["gen_len"] - 1)
        path = out / f"{index:02d}-{metrics['plan']}.json"
        path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_json", type=Path, help="a call's runs.json (bench/run_plans.py)")
    parser.add_argument("out", type=Path, help="directory for the metrics documents")
    args = parser.parse_args(argv)
    written = extract(args.runs_json, args.out)
    print(f"wrote {len(written)} metrics documents to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
