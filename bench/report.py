"""Turn the H200 run's result folders (bench/h200.py's --out, one per device call) into the published results:
one raw JSON file under bench/results/, docs/benchmarks.md with tables, and plots beside it.

    python bench/report.py bench/results/h200-2026-11-29/call1 bench/results/h200-2026-11-29/call2 \
        --json bench/results/h200-2026-11-29.json --md docs/benchmarks.md --figures docs/benchmarks

(--md puts the tables between the page's '<!-- bench/report.py: begin -->' and '<!-- bench/report.py: end -->'.)

Calibration is re-done here (it needs no GPU): `liac calibrate` fits the measured profile to the runs' metrics,
once on every run (in-sample) and once on the prompt-128 runs only, judged on the prompt-1024 runs (held out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

from liac.sizes import GIB

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONTENDER_ORDER = ("optimal", "whole", "lia-cpu", "lia-partial", "lia-gpu", "shipped-profile")
LABELS = {"optimal": "liac (split)", "whole": "liac (whole sublayers)", "lia-cpu": "LIA all-CPU",
          "lia-partial": "LIA partial (attention on CPU)", "lia-gpu": "LIA all-GPU (streamed)",
          "shipped-profile": "liac, shipped h200-amx16 profile", "accelerate": "Accelerate (pageable)",
          "accelerate-pinned": "Accelerate (pinned)", "flexgen": "FlexGen (best --percent)", "floor": "floor"}


# The contenders the compiled plan must beat (issue 12's target): not the variants a call runs as experiments
# ('optimal@copies', 'whole+d2', 'optimal+nostart'), nor the plan compiled for the shipped profile.
RIVALS = ("whole", "lia-cpu", "lia-partial", "lia-gpu")


def _load(folder: Path, name: str, default=None):
    path = folder / name
    return json.loads(path.read_text()) if path.exists() else default


def same_plan(a, b) -> bool:
    """Whether two plans (OffloadPlan, or None where a call's plans are unknown) are one plan (`liac diff`: no
    semantic difference; names and profiles aside)."""
    if a is None or b is None:
        return False
    from liac.artifacts.diff import diff_plans

    return not diff_plans(a, b, a.metadata.name, b.metadata.name).changes


def refloor(folder: Path, floors: list[dict]) -> list[dict]:
    """A call's floor.json entries recomputed with today's bench/floor.py at the call's own rates (run-profile.yaml)
    and the footprint its footprint stage measured (summary.json): calls made before the floor's definition changed
    (2026-12-03: the DDR pairs, the reserved footprint) read against the floor of today. Each entry keeps what the
    call wrote under 'as_written'."""
    from floor import process_bytes, workload_floor

    from liac.models import resolve_model
    from liac.passes.trace import trace_model
    from liac.profile import resolve_profile

    if not floors or not (folder / "run-profile.yaml").exists():
        return floors
    summary = _load(folder, "summary.json", {}) or {}
    argv = summary.get("argv") or []
    model = argv[argv.index("--model") + 1] if "--model" in argv[:-1] else "opt-30b"
    budget = float(argv[argv.index("--gpu-budget-gib") + 1]) if "--gpu-budget-gib" in argv[:-1] else 24.0
    graph, hw = trace_model(resolve_model(model)), resolve_profile(str(folder / "run-profile.yaml"))
    reserved = process_bytes(summary.get("footprint"))
    out = []
    for entry in floors:
        steps = round(entry["decode_seconds"] / entry["decode_seconds_per_token"]) if entry.get(
            "decode_seconds_per_token") else 31
        f = workload_floor(graph, hw, batch=entry["batch"], prompt_len=entry["prompt_len"], gen_len=steps + 1,
                           gpu_budget_bytes=budget * 2**30, reserved_bytes=reserved)
        out.append({**entry, **dataclasses.asdict(f), "reserved_bytes": reserved, "as_written": entry})
    return out


def collect(folders: list[Path], refloor_calls: bool = False) -> dict:
    """Every call's results, keyed by what they are; runs are tagged with their contender and point
    (`refloor_calls`: each call's floors recomputed with today's definition, `refloor`)."""
    from reprice import load_call_plans

    runs, peers, floors, calls, floors_by_call, plans_by_call = [], [], {}, [], {}, {}
    for folder in folders:
        summary = _load(folder, "summary.json", {})
        calls.append({"folder": folder.name, "boot_id": summary.get("boot_id"), "stages": summary.get("stages"),
                      "skipped": summary.get("skipped", []), "argv": summary.get("argv")})
        index = summary.get("runs_index", [])
        contender_of = {Path(e["plan"]).name: e for e in index if e.get("contender") != "warmup"}
        finished = (_load(folder, "runs.json", {}) or {}).get("runs", [])
        plans_by_call[folder.name] = load_call_plans(folder)  # the plans the call compiled (plans.tar.gz)
        for position, run in enumerate(finished):
            if len(index) == len(finished):  # runs follow the index (a warm-up run shares its plan file)
                entry = index[position]
            else:
                entry = contender_of.get(Path(run["plan_file"]).name, {})
                if entry.get("contender"):  # a plan's '@copies' run (bench/h200.py) shares its plan file
                    base = entry["contender"].removesuffix("@copies")
                    entry = dict(entry, contender=base + "@copies" if run.get("mapped_crossings") is False else base)
            if entry.get("contender") == "warmup":
                continue
            run = dict(run, contender=entry.get("contender", "?"), call=folder.name)
            runs.append(run)
        for peer in _load(folder, "peers.json", []) or []:
            peers.append(dict(peer, call=folder.name))
        written = _load(folder, "floor.json", []) or []
        for floor in (refloor(folder, written) if refloor_calls else written):
            floors[(floor["prompt_len"], floor["batch"])] = floor
            floors_by_call.setdefault(folder.name, {})[(floor["prompt_len"], floor["batch"])] = floor
    return {"runs": runs, "peers": peers, "floors": floors, "floors_by_call": floors_by_call, "calls": calls,
            "plans_by_call": plans_by_call}


def run_rows(data: dict) -> list[dict]:
    """One row per finished run: point, contender, measured and predicted numbers."""
    rows = []
    for run in data["runs"]:
        request = run["request"]
        row = {"contender": run["contender"], "prompt_len": request["prompt_len"], "batch": request["batch_size"],
               "gen_len": request["gen_len"], "plan": run["plan"], "call": run["call"]}
        if "summary" in run:
            gpu = run["gpu"]
            footprint = gpu.get("peak_footprint_bytes")  # allocator peak + CUDA context (runs since issue 12)
            row.update(prefill_ms=run["summary"]["prefill_ms"], decode_ms=run["summary"]["decode_ms_per_token"],
                       tokens_per_second=run["summary"]["tokens_per_second"],
                       peak_gib=(footprint or gpu["peak_reserved_bytes"] or 0) / GIB,
                       budget_gib=gpu["budget_bytes"] / GIB if gpu.get("budget_bytes") else None,
                       load_s=run.get("build_seconds"), warmup_s=run.get("warmup_seconds"),
                       predicted_prefill_ms=run["predicted"]["prefill_ms"],
                       predicted_decode_ms=run["predicted"]["decode_ms_per_token"])
            if run.get("timeline"):
                row["timeline"] = run["timeline"]
        else:
            row["missing"] = run.get("skipped") or run.get("error") or "no result"
        rows.append(row)
    return rows


def peer_rows(data: dict) -> list[dict]:
    rows = []
    for peer in data["peers"]:
        result = peer.get("result") or {}
        command = peer["command"]
        point = {"batch": int(command[command.index("--batch") + 1]),
                 "prompt_len": int(command[command.index("--prompt-len") + 1])}
        row = {"contender": peer["peer"], **point}
        if result.get("decode_ms_per_token") is not None:
            reserved = result.get("peak_gpu_reserved_bytes")
            row.update(call=peer.get("call"), prefill_ms=result.get("prefill_ms"), decode_ms=result["decode_ms_per_token"],
                       tokens_per_second=result.get("tokens_per_second"),
                       peak_gib=(reserved or 0) / GIB if reserved else None, settings=result.get("settings"))
        else:
            row["missing"] = result.get("error") or peer.get("error") or f"exit {peer.get('returncode')}"
        rows.append(row)
    return rows


def best(rows: list[dict], contender: str, prompt: int, batch: int) -> dict | None:
    """The fastest finished row of a contender at a point (decode ms/token)."""
    found = [r for r in rows if r["contender"] == contender and r["prompt_len"] == prompt and r["batch"] == batch
             and "decode_ms" in r and r["decode_ms"] is not None]
    return min(found, key=lambda r: r["decode_ms"]) if found else None


def calibration(data: dict, profile: Path, plans_dirs: list[Path], write_profile: Path | None = None) -> dict:
    """In-sample and held-out calibration of the measured profile on the runs' metrics; the in-sample calibrated
    profile goes to `write_profile` when given (a profile `liac compile --hw` takes)."""
    sys.path.insert(0, str(ROOT))
    from liac.calibrate import calibrate, load_measurements, profile_yaml, report_data
    from liac.fileio import write_atomic
    from liac.profile import load_profile

    base = load_profile(profile)
    with tempfile.TemporaryDirectory() as tmp:
        files = {"all": [], "p128": [], "other": []}
        for index, run in enumerate(data["runs"]):
            if "metrics" not in run or run["contender"] == "shipped-profile":
                continue
            path = Path(tmp) / f"{index:03d}.json"
            path.write_text(json.dumps(run["metrics"]))
            files["all"].append(path)
            files["p128" if run["request"]["prompt_len"] == 128 else "other"].append(path)
        out = {}
        if files["all"]:
            runs = load_measurements(files["all"], plan_paths=plans_dirs, profile_steps=1)
            result = calibrate(base, runs)
            out["in_sample"] = report_data(result, base)
            if write_profile is not None:
                write_atomic(write_profile, profile_yaml(result, base, write_profile.stem))
        if files["p128"] and files["other"]:
            from liac.calibrate import judge

            sides = {"prompt 128 runs": load_measurements(files["p128"], plan_paths=plans_dirs, profile_steps=1),
                     "prompt 1024 runs": load_measurements(files["other"], plan_paths=plans_dirs, profile_steps=1)}
            out["held_out"] = []
            for fit_on, judged_on in (("prompt 128 runs", "prompt 1024 runs"), ("prompt 1024 runs", "prompt 128 runs")):
                fit = calibrate(base, sides[fit_on])
                held = judge(base, fit, sides[judged_on])  # liac calibrate --hold-out-prompt
                out["held_out"].append({"fit_on": fit_on, "judged_on": judged_on, "before": held["error_before"],
                                        "after": held["error_after"],
                                        "factors": report_data(fit, base).get("factors")})
        return out


def _fmt(value, digits=3) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:.0f}"


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def call_points(rows: list[dict], peers: list[dict], floors_by_call: dict,
                plans_by_call: dict | None = None) -> list[dict]:
    """Per device call and point where the compiled plan ran: the plan (median over repeats, and the spread), the
    other contenders (`RIVALS`, each the median of its runs: an A B B A call runs each twice), the peers and the
    floor — all from that one call (the host's CPU side varies between starts). A contender whose plan is the
    compiled plan (`same_plan`: the policy chose the same placement) is no rival: its runs count as the compiled
    plan's (`same_plan_as`)."""
    out = []
    for call in sorted({r["call"] for r in rows}):
        plans = (plans_by_call or {}).get(call, {})
        here = [r for r in rows if r["call"] == call and "decode_ms" in r]
        for prompt, batch in sorted({(r["prompt_len"], r["batch"]) for r in here if r["contender"] == "optimal"}):
            at = [r for r in here if (r["prompt_len"], r["batch"]) == (prompt, batch)]
            mine = [r for r in at if r["contender"] == "optimal"]
            rivals, same = {}, []
            for rival in sorted({r["contender"] for r in at if r["contender"] in RIVALS}):
                theirs = [r for r in at if r["contender"] == rival]
                if same_plan(plans.get(mine[0].get("plan")), plans.get(theirs[0].get("plan"))):
                    same.append(rival)  # the same plan under another policy's name: its runs are mine, no rival
                    mine = mine + theirs
                else:
                    rivals[rival] = theirs
            point = {"call": call, "prompt_len": prompt, "batch": batch, "repeats": len(mine), "same_plan_as": same,
                     "decode_ms": _median([r["decode_ms"] for r in mine]),
                     "decode_ms_range": [min(r["decode_ms"] for r in mine), max(r["decode_ms"] for r in mine)],
                     "tokens_per_second": _median([r["tokens_per_second"] for r in mine]),
                     "prefill_ms": _median([r["prefill_ms"] for r in mine]),
                     "predicted_decode_ms": mine[0]["predicted_decode_ms"],
                     "predicted_prefill_ms": mine[0].get("predicted_prefill_ms"),
                     "peak_gib": max((r.get("peak_gib") or 0) for r in at) or None,
                     "budget_gib": mine[0].get("budget_gib"), "others": {}, "peers": {}}
            for rival, theirs in rivals.items():  # A B B A: the median of its runs, as for mine
                point["others"][rival] = {k: _median([r[k] for r in theirs]) for k in ("decode_ms",
                                                                                        "tokens_per_second",
                                                                                        "prefill_ms")}
            for r in peers:
                if r.get("call") == call and (r["prompt_len"], r["batch"]) == (prompt, batch) and "decode_ms" in r:
                    point["peers"][r["contender"]] = {k: r.get(k) for k in ("decode_ms", "tokens_per_second",
                                                                            "prefill_ms", "peak_gib")}
            floor = floors_by_call.get(call, {}).get((prompt, batch))
            if floor:
                point["floor_decode_ms"] = floor["decode_seconds_per_token"] * 1e3
                point["floor_tokens_per_second"] = floor["tokens_per_second"]
            out.append(point)
    return out


def targets_markdown(points: list[dict]) -> str:
    """The issue's targets, point by point, each within one call: decode against the plan's prediction and the
    floor, whether the compiled plan was the fastest contender, the peers, the first request's prefill against its
    prediction, and the largest GPU footprint of any contender at the point against the budget."""
    lines = ["| call | prompt | batch | liac decode ms (range) | predicted | vs floor | fastest? (decode / tokens/s) "
             "| vs FlexGen (tokens/s) | vs Accelerate (decode) | first prefill ms (predicted) | GPU peak / budget GiB |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for p in points:
        others = p["others"]
        fastest_decode = all(p["decode_ms"] <= o["decode_ms"] for o in others.values())
        fastest_rate = all(p["tokens_per_second"] >= o["tokens_per_second"] for o in others.values())
        worst = max((p["decode_ms"] / o["decode_ms"] for o in others.values()), default=1.0)
        fastest = ("yes" if fastest_decode else f"no ({worst:.2f}x the best)") + " / " + (
            "yes" if fastest_rate else "no")
        if p.get("same_plan_as"):
            fastest += f" (the same plan as {', '.join(p['same_plan_as'])}: runs pooled)"
        floor = f"{p['decode_ms'] / p['floor_decode_ms']:.2f}x" if p.get("floor_decode_ms") else "–"
        flexgen = p["peers"].get("flexgen")
        vs_fg = f"{p['tokens_per_second'] / flexgen['tokens_per_second']:.2f}x" if flexgen else "–"
        acc = p["peers"].get("accelerate")
        vs_acc = f"{acc['decode_ms'] / p['decode_ms']:.1f}x" if acc else "–"
        low, high = p["decode_ms_range"]
        spread = f"{_fmt(p['decode_ms'])} ({_fmt(low)}–{_fmt(high)})" if p["repeats"] > 1 else _fmt(p["decode_ms"])
        prefill = f"{_fmt(p['prefill_ms'])} ({_fmt(p.get('predicted_prefill_ms'))})"
        peak = (f"{p['peak_gib']:.2f} / {p['budget_gib']:.2f}" if p.get("peak_gib") and p.get("budget_gib")
                else "–")
        lines.append(f"| {p['call']} | {p['prompt_len']} | {p['batch']} | {spread} | {_fmt(p['predicted_decode_ms'])} "
                     f"| {floor} | {fastest} | {vs_fg} | {vs_acc} | {prefill} | {peak} |")
    return "\n".join(lines) + "\n"


def targets_summary(points: list[dict], rows: list[dict]) -> str:
    """Issue 12's targets over every point: the compiled plan the fastest (decode ms/token) in ≥ 90 % of points and
    never > 5 % slower than the best; decode within 1.15x the floor at batch 1 and 1.25x everywhere; the first
    prefill within 15 % of its prediction; every run's GPU peak within its budget."""
    if not points:
        return ""
    ratio = [p["decode_ms"] / min([p["decode_ms"], *(o["decode_ms"] for o in p["others"].values())])
             for p in points]
    floors = [(p["batch"], p["decode_ms"] / p["floor_decode_ms"]) for p in points if p.get("floor_decode_ms")]
    prefill = [p["prefill_ms"] / p["predicted_prefill_ms"] for p in points if p.get("predicted_prefill_ms")]
    budgets = [(r["peak_gib"], r["budget_gib"]) for r in rows if r.get("budget_gib") and r.get("peak_gib")]
    over = [(peak, budget) for peak, budget in budgets if peak > budget]
    lines = ["| target | result |", "|---|---|",
             f"| compiled plan the fastest in ≥ 90 % of points | {sum(r <= 1.0 for r in ratio)} of {len(ratio)} "
             f"points |",
             f"| never more than 5 % slower than the best | worst {max(ratio):.2f}x |"]
    if floors:
        one = [r for b, r in floors if b == 1]
        lines.append(f"| decode within 1.15x the floor at batch 1 | "
                     + (", ".join(f"{r:.2f}x" for r in one) if one else "–") + " |")
        lines.append(f"| decode within 1.25x the floor at every batch | worst {max(r for _, r in floors):.2f}x |")
    if prefill:
        lines.append(f"| first prefill within 15 % of its prediction | {sum(abs(r - 1) <= 0.15 for r in prefill)} "
                     f"of {len(prefill)} points (measured / predicted {min(prefill):.2f}-{max(prefill):.2f}) |")
    if budgets:
        lines.append(f"| GPU peak (allocator + context) within the budget, every run | {len(budgets) - len(over)} "
                     f"of {len(budgets)} runs" + (f" (worst {max(p / b for p, b in over):.3f}x)" if over else "")
                     + " |")
    return "\n".join(lines) + "\n"


def timeline_markdown(rows: list[dict]) -> str:
    """One decode step under torch.profiler (bench/timeline.py), per run that recorded one: where the step's time
    went on the main thread and the GPU's compute and copy streams."""
    timed = [r for r in rows if r.get("timeline") and "error" not in r["timeline"]]
    if not timed:
        return ""
    lines = ["\n**One decode step under the profiler (bench/timeline.py), ms**\n",
             "| call | prompt | batch | contender | step | main thread idle | compute stream busy | copy stream busy "
             "| both at once | GPU idle |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    order = {c: i for i, c in enumerate(CONTENDER_ORDER)}
    for r in sorted(timed, key=lambda r: (r["call"], r["prompt_len"], r["batch"], order.get(r["contender"], 99))):
        t = r["timeline"]
        lines.append(f"| {r['call']} | {r['prompt_len']} | {r['batch']} | {LABELS.get(r['contender'], r['contender'])} "
                     f"| {_fmt(t['step_ms'])} | {_fmt(t['main_idle_ms'])} | {_fmt(t.get('compute_busy_ms'))} "
                     f"| {_fmt(t.get('copy_busy_ms'))} | {_fmt(t.get('overlap_ms'))} | {_fmt(t.get('gpu_idle_ms'))} |")
    return "\n".join(lines) + "\n"


def markdown_tables(rows: list[dict], peers: list[dict], floors: dict) -> str:
    """Per prompt length: one table per metric family, contenders as rows, batches as columns."""
    lines = []
    everyone = [*CONTENDER_ORDER, "accelerate", "accelerate-pinned", "flexgen"]
    for prompt in sorted({r["prompt_len"] for r in rows}):
        batches = sorted({r["batch"] for r in rows if r["prompt_len"] == prompt})
        for metric, title in (("decode_ms", "decode ms/token"), ("tokens_per_second", "tokens/s"),
                              ("prefill_ms", "prefill ms"),
                              ("peak_gib", "peak GPU GiB (allocator peak + CUDA context; before issue 12: "
                                           "allocator reserved)")):
            lines.append(f"\n**Prompt {prompt}: {title}**\n")
            lines.append("| contender | " + " | ".join(f"b={b}" for b in batches) + " |")
            lines.append("|---|" + "---:|" * len(batches))
            for contender in everyone:
                source = rows if contender in CONTENDER_ORDER else peers
                cells = []
                for batch in batches:
                    r = best(source, contender, prompt, batch)
                    cells.append(_fmt(r.get(metric)) if r else "–")
                if any(c != "–" for c in cells):
                    lines.append(f"| {LABELS[contender]} | " + " | ".join(cells) + " |")
            if metric in ("decode_ms", "tokens_per_second", "prefill_ms"):
                key = {"decode_ms": ("decode_seconds_per_token", 1e3), "tokens_per_second": ("tokens_per_second", 1),
                       "prefill_ms": ("prefill_seconds", 1e3)}[metric]
                cells = [_fmt(floors[(prompt, b)][key[0]] * key[1]) if (prompt, b) in floors else "–"
                         for b in batches]
                lines.append("| floor | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figures(rows: list[dict], peers: list[dict], floors: dict, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for prompt in sorted({r["prompt_len"] for r in rows}):
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        batches = sorted({r["batch"] for r in rows if r["prompt_len"] == prompt})
        for contender in [*CONTENDER_ORDER, "accelerate", "accelerate-pinned", "flexgen"]:
            source = rows if contender in CONTENDER_ORDER else peers
            points = [(b, best(source, contender, prompt, b)) for b in batches]
            points = [(b, r) for b, r in points if r]
            if not points or contender == "shipped-profile":
                continue
            style = "-o" if contender in CONTENDER_ORDER else "--s"
            axes[0].plot([b for b, _ in points], [r["decode_ms"] for _, r in points], style, label=LABELS[contender])
            axes[1].plot([b for b, _ in points], [r["tokens_per_second"] for _, r in points], style,
                         label=LABELS[contender])
        fl = [(b, floors[(prompt, b)]) for b in batches if (prompt, b) in floors]
        if fl:
            axes[0].plot([b for b, _ in fl], [f["decode_seconds_per_token"] * 1e3 for _, f in fl], "k:",
                         label="floor")
            axes[1].plot([b for b, _ in fl], [f["tokens_per_second"] for _, f in fl], "k:", label="floor")
        for ax, title in zip(axes, ("decode ms/token (lower is better)", "tokens/s (higher is better)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch")
            ax.set_title(f"OPT-30B, prompt {prompt}: {title}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        name = f"decode-p{prompt}.png"
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        names.append(name)
    measured = [r for r in rows if "decode_ms" in r and r.get("predicted_decode_ms")]
    if measured:
        fig, ax = plt.subplots(figsize=(5.5, 5))
        for key, marker in (("decode", "o"), ("prefill", "^")):
            xs = [r[f"predicted_{key}_ms"] for r in measured]
            ys = [r[f"{key}_ms"] for r in measured]
            ax.scatter(xs, ys, marker=marker, label=key, alpha=0.7)
        lims = [min(min(r["predicted_decode_ms"], r["decode_ms"]) for r in measured) / 2,
                max(max(r["predicted_prefill_ms"], r["prefill_ms"]) for r in measured) * 2]
        ax.plot(lims, lims, "k:", label="predicted = measured")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("predicted ms (the plans' own: profile of call 1, uncalibrated)")
        ax.set_ylabel("measured ms")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(folder / "fidelity.png", dpi=110)
        plt.close(fig)
        names.append("fidelity.png")
    return names


def calibration_markdown(calib: dict) -> str:
    if not calib:
        return ""
    lines = ["\n**Prediction error (|predicted / measured − 1|), before and after `liac calibrate`**\n",
             "| fit | judged on | rows | median before | median after | mean before | mean after |",
             "|---|---|---:|---:|---:|---:|---:|"]

    def add(name, judged, before, after):
        picks = [("all rows", before.get("all"), after.get("all"))]
        for phase in ("prefill", "decode"):
            picks.append((f"{phase} totals", before.get("totals", {}).get(phase), after.get("totals", {}).get(phase)))
            picks.append((f"{phase} sublayers + totals", before.get("by_phase", {}).get(phase),
                           after.get("by_phase", {}).get(phase)))
        for label, b, a in picks:
            if b:
                a = a or {}
                lines.append(f"| {name} | {judged} {label} | {b.get('count', '–')} | {_pct(b.get('median'))} | "
                             f"{_pct(a.get('median'))} | {_pct(b.get('mean'))} | {_pct(a.get('mean'))} |")

    if "in_sample" in calib:
        add("every run (in-sample)", "every run:", calib["in_sample"]["error_before"],
            calib["in_sample"]["error_after"])
    held_out = calib.get("held_out", [])
    for held in ([held_out] if isinstance(held_out, dict) else held_out):  # one dict in results before issue 12
        add(f"{held['fit_on']}", f"{held['judged_on']}:", held["before"], held["after"])
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- bench/report.py: begin -->", "<!-- bench/report.py: end -->"


def page_parts(page: Path) -> tuple[str, str]:
    """The page before its BEGIN marker line and from its END marker line on; SystemExit(2) with one line on stderr
    when the page cannot be read or lacks one of them (checked before anything is written)."""
    try:
        text = page.read_text()
    except OSError as e:
        sys.stderr.write(f"report.py: --md {page}: cannot read: {e.strerror}\n")
        raise SystemExit(2) from e
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        sys.stderr.write(f"report.py: --md {page}: needs one '{BEGIN}' line and one '{END}' line after it\n")
        raise SystemExit(2)
    head, rest = text.split(BEGIN)
    return head, END + rest.split(END)[1]


def fill_markdown(page: Path, tables: str) -> None:
    """Put `tables` between the page's BEGIN and END markers (replacing what was there): the docs' results stay
    what the committed raw results give."""
    head, tail = page_parts(page)
    page.write_text(f"{head}{BEGIN}\n{tables.strip()}\n{tail}")


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--json", required=True, type=Path, help="raw results file to write")
    parser.add_argument("--figures", type=Path, help="folder for the plots (PNG)")
    parser.add_argument("--profile", type=Path, help="the profile the plans were compiled with (default: a "
                        "profile.yaml in a folder)")
    parser.add_argument("--plans", type=Path, nargs="*", help="folders holding the plans that ran")
    parser.add_argument("--calibrated-profile", type=Path, help="write the in-sample calibrated profile here (YAML)")
    parser.add_argument("--tables", type=Path, help="write the Markdown tables here (docs/benchmarks.md embeds them)")
    parser.add_argument("--refloor", action="store_true", help="recompute each call's floors with today's "
                        "bench/floor.py at the call's rates and footprint (what the call wrote kept as 'as_written')")
    parser.add_argument("--md", type=Path, help=f"and put them into this page, between its '{BEGIN}' and '{END}' "
                        "lines")
    args = parser.parse_args(argv)
    if args.md:
        page_parts(args.md)  # a page without its markers: one line, nothing written
    data = collect(args.folders, refloor_calls=args.refloor)
    rows, peers = run_rows(data), peer_rows(data)
    profile = args.profile or next((f / "profile.yaml" for f in args.folders if (f / "profile.yaml").exists()), None)
    plans = args.plans or [f / "plans" for f in args.folders if (f / "plans").exists()]
    calib = calibration(data, profile, plans, args.calibrated_profile) if profile else {}
    points = call_points(rows, peers, data["floors_by_call"], data["plans_by_call"])
    out = {"calls": data["calls"], "runs": rows, "peers": peers, "points": points,
           "floors": [dict(v, call=call, prompt_len=k[0], batch=k[1])
                      for call, floors in sorted(data["floors_by_call"].items()) for k, v in sorted(floors.items())],
           "calibration": calib}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.json}: {len(rows)} runs, {len(peers)} peer runs, {len(data['floors'])} floors")
    drawn = figures(rows, peers, data["floors"], args.figures) if args.figures else []
    if drawn:
        print("figures:", ", ".join(drawn))
    tables = ("**Targets, point by point (each row from one call)**\n\n" + targets_markdown(points)
              + "\n**Targets over every point**\n\n" + targets_summary(points, rows)
              + timeline_markdown(rows) + markdown_tables(rows, peers, data["floors"]) + calibration_markdown(calib))
    if args.tables:
        args.tables.write_text(tables)
        print(f"wrote {args.tables}")
    if args.md:
        if drawn:  # linked from the page, relative to it
            import os

            where = Path(os.path.relpath(args.figures.resolve(), args.md.resolve().parent))
            tables += "\n" + "\n".join(f"![{name}]({(where / name).as_posix()})" for name in drawn) + "\n"
        fill_markdown(args.md, tables)
        print(f"wrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
