"""Re-price the plans a device call ran with a profile (today's cost model), beside what the call measured.

    python bench/reprice.py bench/results/h200-2026-12-02/i12-release            # the call's plans, its profile
    python bench/reprice.py CALL --profile my.yaml --set runtime_op_seconds=0.0003
    python bench/reprice.py CALL --op-seconds-from-runs --recompile 1,8,32,64

CALL is a result folder of bench/h200.py (runs.json, run-profile.yaml, plans.tgz or plans.tar.gz). Each run's plan is
priced with `liac.passes.price.price_plan` under the profile (default: the call's run-profile.yaml) and printed
beside the plan's own prediction (the cost model it was compiled with) and the run's measured decode ms/token and
first prefill ms; `error` is repriced / measured − 1 (for each phase); `splits` counts the split units of a decode
step, `pre` those of the prefill pass (a run that measured nothing prints '-').

--op-seconds-from-runs sets the profile's `runtime_op_seconds` (docs/cost-model.md Eq. 24) for a call whose
footprint stage did not measure it: the median, over the GPU units whose input crosses PCIe in the runs'
synchronised per-op decode step (`lia-run --profile-steps`), of measured − predicted (compute + transfers) ms, i.e.
the host time a unit costs beyond its kernels when it synchronises with the other device, as most units of an
offloading plan do (each such op also pays the profiling pass's two synchronisations: a slight overestimate). The
footprint stage measures the same on small runs that cross PCIe (liac.host.runtime_op_seconds).

--chain-from-runs sets the profile's `runtime_op_seconds_beside_cpu` (docs/cost-model.md Eq. 21d) from the runs'
timed decode steps (bench/moe_h200.py: runs.json `experts.decode.host_ms_per_cpu_part`, runtime/moe.py ExpertTally):
the host's seconds per CPU part (route + dispatch + merge + between) over the layer's host ops per CPU part (the
GPU's routed experts dispatched, streamed_experts / cpu_parts; the experts op's own, EXPERT_SPLIT_OPS with a GPU
part, else 1; the layer's other units, `price.chain_ops`), summed over the runs with CPU parts and no cut expert.

--ddr-experts-from-runs sets the profile's `ddr_shared_experts_gb_per_s` (docs/cost-model.md Eq. 21b's DDR term) from
the runs' timed decode steps: over the runs with CPU parts, routed experts streamed beside them and no cut expert,
(the CPU parts' expert bytes + the streamed experts' bytes) / the CPU parts' seconds (`ddr_experts_from_runs`).

--split-start-from-runs sets the profile's `split_cpu_start_seconds` (docs/cost-model.md Eq. 15b) from the call's
profiled decode split units (runs.json `metrics.sublayers`, device 'split', each CPU part timed alone): the
intercept of a robust line (Theil-Sen: the median of the pairwise slopes, then the median intercept) through each
CPU part's measured ms against its re-priced ms, i.e. what a CPU part costs to start whatever its width (narrow
parts of 358-2867 features ran 2x their price, wide ones at 0.8x: a fixed start beside a rate above the probe's).
The slope is printed beside it (the CPU's rate on the parts, over the profile's: --cpu-rates-from-runs's business).

--cpu-rates-from-runs sets the profile's `cpu_ddr_read_gb_per_s` and `cpu_kv_read_gb_per_s` to the rates the
runtime's own CPU kernels reached in the call's profiled decode steps (each op timed alone): the median over the
whole-CPU weight GEMV units (qkv, out_proj, fc1, fc2 at batch ≤ 8, where a unit is its weights' read) of their
weight bytes / measured ms, and over the fused CPU attention units (score and context together, batch ≥ 8) of the
KV bytes they read / measured ms. The rates stage probes other shapes (a 1 GiB matrix with 74898-long rows; a
batch-8, 32-head cache) and varied between calls more than the runtime's kernels did (docs/cost-model.md, A8).

--recompile B,... compiles the optimum for those batch sizes with the profile (the call's budget and generation
length, at each prompt length its plans ran) and prints what the ILP picks: its split units per decode step and per
prefill, its predicted decode and prefill, and the predicted decode of the optimum without splits (`--policy whole`):
the gain the ILP sees in its splits.

--attribute prints, per run with a profiled decode step, where that step's time went, summed over layers: the
non-expert units (attention, router, LM head, embedding, staging waits and releases) measured beside their re-priced
ms, and each experts unit taken apart: the routing read on the host (`route`), the CPU part, the GPU part (the
routed experts' copies and their compute), and the rest of a split (its measured time less the routing and the
slower part: the dispatch of the GPU's experts on the host thread, the merge, the profiling pass's sync). The last line sets the
profiled step's sum beside the timed steps' mean (the profiling pass synchronises after each op: the two differ).

--split-parts prints every profiled split unit (runs.json `metrics.sublayers`, device 'split', both phases) by the
width of its CPU part: its GEMM's rows M (B·Q tokens), the output features N the CPU part computes (N·permille //
1000 of the GEMM's), the CPU part and the GPU part measured beside their re-priced ms (Eq. 15's two terms, a decode
step's mean or a prefill's pass), the GPU part's stream at the PCIe rate (Eq. 16; on its own chain, not in the
part), and the whole unit measured beside its re-priced compute (the slower part, the sync, Eq. 24's ops).

--units NAME,... prints, per run and layer group, the profiled decode step's ms of those units (runs.json
`metrics.sublayers`, a mean per layer; a split also its CPU part and GPU part) beside the plan's own price and the
re-priced one (compute + transfers), e.g. `--units experts` for an MoE call (bench/moe_h200.py).
--kv-shared-from-rates sets `ddr_shared_kv_gb_per_s` (Eqs. 6 and 18 for the fused decode attention beside the
stream) for a call whose rates probe predates it, from what the probe did measure (`kv_shared_from_rates`).
--rates-after prices with the call's second rates probe (bench/h200.py's rates-after stage: rates-after.json, or
where that file did not come back, the 'after' side of summary.json's 'rates_probes'): its fields replace the
profile's (the profile's own fields the probe measured), so a run can be set beside the rates of the machine state
right after it as well as before it. --set still wins over it.
--gpu-gemm-shapes JSON sets the profile's `gpu_gemm_bf16_tflops` (docs/cost-model.md Eq. 1c, and with it Eq. 24b) from
bench/gpu_gemm_shapes.py's output, its shapes pooled per M as `liac profile` pools its own (`gemm_curve_from_shapes`);
--gpu-gemm-cap T caps that curve at T TFLOP/s (a burst curve standing for the sustained rate a pass keeps: 680 for
the H200 calls of 2026-12-01..03, docs/benchmarks.md section (l)).
No GPU is needed; prints a table, writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import statistics
import sys
import tarfile
from pathlib import Path

__all__ = ["load_call_plans", "gemm_curve_from_shapes", "kv_shared_from_rates", "op_seconds_from_runs", "chain_seconds_from_runs", "cpu_rates_from_runs", "reprice", "reprice_units",
           "attribute_decode", "split_parts", "split_start_from_runs", "robust_line", "error_summary", "main"]

GEMV_UNITS = frozenset({"qkv", "out_proj", "fc1", "fc2", "gate_up", "down"})  # one weight GEMM each
ATTENTION_UNITS = frozenset({"attn_score", "attn_context"})


def load_call_plans(folder: Path) -> dict[str, object]:
    """Plan name → OffloadPlan, from the call's plans archive (plans.tgz or plans.tar.gz) or a plans/ folder."""
    from liac.plan import parse_plan

    plans = {}
    archive = next((folder / n for n in ("plans.tgz", "plans.tar.gz") if (folder / n).is_file()), None)
    if archive is not None:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.endswith(".yaml") and not member.name.endswith("index.yaml"):
                    text = tar.extractfile(member).read().decode()
                    plan = parse_plan(_yaml(text, member.name), member.name)
                    plans[plan.metadata.name] = plan
    else:
        for path in sorted((folder / "plans").rglob("*.yaml")):
            if path.name != "index.yaml":
                plan = parse_plan(_yaml(path.read_text(), str(path)), str(path))
                plans[plan.metadata.name] = plan
    return plans


def _yaml(text: str, source: str):
    from liac.fileio import parse_yaml

    return parse_yaml(text, source)


def gemm_curve_from_shapes(path: Path) -> tuple[tuple[int, float], ...]:
    """Eq. 1c's curve (`gpu_gemm_bf16_tflops`) from bench/gpu_gemm_shapes.py's output: its units' GEMMs at each of
    liac.probe.GPU_GEMM_ROWS rows it measured, pooled as `liac profile` pools its own shapes (liac.probe.gemm_curve:
    summed FLOPs over summed seconds)."""
    from liac.probe import GPU_GEMM_ROWS, gemm_curve

    units = json.loads(Path(path).read_text())["units"]
    return gemm_curve({(int(m), unit["k"], unit["n"]): row["seconds"] for unit in units.values()
                       for m, row in unit["rows"].items() if int(m) in GPU_GEMM_ROWS})


def kv_shared_from_rates(folder: Path) -> float:
    """GB/s DDR serves the fused decode attention and the copies beside it (`ddr_shared_kv_gb_per_s`, Eq. 6), for a
    call whose rates probe did not measure it, from what it did measure (rates.json): the attention's KV read alone
    slowed by the ratio the GEMV kept beside the copies, plus the copies' rate beside the GEMV,

        cpu_kv_read · concurrent_cpu / cpu_ddr_read + concurrent_h2d

    (the H200 calls of 2026-12-02: 116.4 for i12q, whose prompt-1024 batch-32 runs drew 113 with the attention
    beside the stream; 99.5 for i12k, whose LIA-partial batch-256 run drew 99.6). A measured field wins."""
    from liac.errors import LiacError

    path = folder / "rates.json"
    try:
        rates = json.loads(path.read_text())
        rates = rates.get("rates", rates)
        if rates.get("ddr_shared_kv_gb_per_s"):
            return float(rates["ddr_shared_kv_gb_per_s"])
        return (float(rates["cpu_kv_read_gb_per_s"]) * float(rates["concurrent_cpu_gb_per_s"])
                / float(rates["cpu_ddr_read_gb_per_s"]) + float(rates["concurrent_h2d_gb_per_s"]))
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        raise LiacError(str(path), f"--kv-shared-from-rates needs the rates stage's fields ({e})") from None


def op_seconds_from_runs(runs: list[dict]) -> tuple[float, int]:
    """(seconds, samples): the median of measured − predicted over the GPU units whose input crosses PCIe in the
    runs' profiled decode steps (runs.json `metrics.sublayers`; the staging 'wait' and 'release' ops and the
    embedding excluded)."""
    excess = []
    for run in runs:
        for entry in (run.get("metrics") or {}).get("sublayers", []):
            if entry.get("phase") != "decode" or entry.get("device") != "gpu" or entry.get("predicted_ms") is None:
                continue
            if entry.get("group") in ("embed",) or not entry.get("predicted_transfer_ms"):
                continue  # a unit whose input crosses PCIe: it synchronises with the other device, as most do
            predicted = entry["predicted_compute_ms"] + entry["predicted_transfer_ms"]
            excess.append((entry["measured_ms"] - predicted) / 1e3)
    if not excess:
        raise SystemExit("reprice: the runs hold no profiled decode step (run lia-run with --profile-steps 1)")
    return max(0.0, statistics.median(excess)), len(excess)


def chain_seconds_from_runs(runs: list[dict], plans: dict, profile) -> tuple[float, int]:
    """(seconds, runs): Eq. 21d's o_c, the host's seconds per op of a decode MoE layer beside a CPU part, from the
    runs' timed steps (`experts.decode.host_ms_per_cpu_part`): Σ host seconds / Σ host ops over their CPU parts."""
    from liac.passes.price import EXPERT_SPLIT_OPS, chain_ops, plan_costs

    seconds = ops = 0.0
    used = 0
    for run in runs:
        decode = (((run.get("metrics") or {}).get("experts") or {}).get("decode") or {})
        host, parts = decode.get("host_ms_per_cpu_part"), decode.get("cpu_parts") or 0
        if not host or not parts or run.get("expert_split") or run.get("expert_launcher") or \
                run.get("plan") not in plans:  # a cut expert or the launcher thread: not the chain priced
            continue
        plan = plans[run["plan"]]
        if any(_cpu_beside_cpu_experts(g) for g in plan.spec.layer_groups):
            continue  # another unit's CPU work is in `between` (the chain prices it as that unit's compute)
        costs = plan_costs(plan, profile)
        others = next((chain_ops(cls.phase("decode"), "decode") for cls in costs.classes
                       if chain_ops(cls.phase("decode"), "decode") is not None), None)
        if others is None:
            continue
        dispatched = decode.get("streamed_experts", 0) / parts
        own = EXPERT_SPLIT_OPS if dispatched else 1
        seconds += parts * sum(host.get(k, 0.0) for k in ("route", "dispatch", "merge", "between")) / 1e3
        ops += parts * (dispatched + own + others)
        used += 1
    if not ops:
        raise SystemExit("reprice: no run measured the host's time per CPU part (experts.decode.host_ms_per_cpu_part)")
    return seconds / ops, used


def _cpu_beside_cpu_experts(group) -> bool:
    """Whether a layer group computes experts on the CPU at decode and another of its sublayers there too."""
    cpu = [s.name for s in group.sublayers if s.decode != "gpu"]
    return "experts" in cpu and len(cpu) > 1


def ddr_experts_from_runs(runs: list[dict]) -> tuple[float, int]:
    """(GB/s, runs): `ddr_shared_experts_gb_per_s` (Eq. 21b's DDR term) from the runs' timed decode steps
    (`experts.decode`, runtime/moe.py ExpertTally): over the runs whose CPU parts had routed experts copied beside
    them and no cut expert, Σ (the CPU parts' expert bytes + the streamed experts' bytes) / Σ the CPU parts' host
    seconds: DDR's total while a split experts unit's CPU part runs, as the runtime reached it. An expert's bytes
    are the CPU's bytes per CPU expert (every expert of a layer weighs the same). A lower bound where a copy
    outlasts its CPU part (at batch 1 the copy, ~7 ms on the H200, is about as long as the part)."""
    nbytes = seconds = 0.0
    used = 0
    for run in runs:
        decode = (((run.get("metrics") or {}).get("experts") or {}).get("decode") or {})
        cpu, streamed = decode.get("cpu_experts") or 0, decode.get("streamed_experts") or 0
        if not cpu or not streamed or decode.get("cut_experts") or run.get("expert_split") or \
                run.get("expert_launcher") or \
                not decode.get("cpu_ms"):
            continue
        expert = decode["cpu_bytes"] / cpu
        nbytes += decode["cpu_bytes"] + streamed * expert
        seconds += decode["cpu_ms"] / 1e3
        used += 1
    if not seconds:
        raise SystemExit("reprice: no run timed CPU parts with experts streamed beside them (experts.decode)")
    return nbytes / seconds / 1e9, used


def cpu_rates_from_runs(folder: Path, profile, plans: dict) -> dict[str, tuple[float, int]]:
    """Profile field → (GB/s, samples): the CPU read rates the runtime's kernels reached in the runs' profiled decode
    steps (runs.json `metrics.sublayers`, each op timed alone): `cpu_ddr_read_gb_per_s` from whole-CPU weight GEMV
    units at batch ≤ 8 (their weight bytes, Eq. 6's R, over the measured ms), `cpu_kv_read_gb_per_s` from fused
    CPU decode attention (score and context in one op) at batch ≥ 8 (the KV bytes it reads). A field without a
    sample is left out."""
    samples: dict[str, list[float]] = {"cpu_ddr_read_gb_per_s": [], "cpu_kv_read_gb_per_s": []}
    for run, plan, entries, price, _ in _profiled_runs(folder, profile, plans, lambda e: e.get("phase") == "decode" and
                                                    e.get("device") == "cpu" and e.get("measured_ms")):
        batch = plan.spec.workload.batch_size
        for entry in entries:
            names = set(entry["sublayers"])
            if len(names) == 1 and names <= GEMV_UNITS and batch <= 8:
                field = "cpu_ddr_read_gb_per_s"
            elif names == ATTENTION_UNITS and batch >= 8:
                field = "cpu_kv_read_gb_per_s"
            else:
                continue
            try:
                group = price.group(entry["group"])
            except KeyError:
                continue
            units = price.costs.layer_class(group.group.layer_class).phase("decode").units
            nbytes = sum(statistics.fmean(u.cpu_read_bytes) for u in units if u.name in names)
            samples[field].append(nbytes / (entry["measured_ms"] / 1e3) / 1e9)
    return {field: (statistics.median(v), len(v)) for field, v in samples.items() if v}


def robust_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the Theil-Sen line through the points: the median of the slopes between every two
    points with different x, then the median of y − slope·x (a few outliers, e.g. a part slowed by the machine,
    move neither)."""
    import numpy as np

    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    i, j = np.triu_indices(x.size, k=1)
    apart = np.abs(x[j] - x[i]) > 1e-12
    if not apart.any():
        raise ValueError("the points need two different x")
    slope = float(np.median((y[j] - y[i])[apart] / (x[j] - x[i])[apart]))
    return float(np.median(y - slope * x)), slope


def split_start_from_runs(folder: Path, profile, plans: dict) -> tuple[float, float, int]:
    """(seconds, slope, samples): Eq. 15b's `split_cpu_start_seconds`, the intercept (at least 0) of the robust line
    through the call's profiled decode split CPU parts, measured ms against re-priced ms (`split_parts`, which prices
    the part alone, without the start)."""
    rows = [r for r in split_parts(folder, profile, plans) if r["phase"] == "decode"]
    if len(rows) < 3:
        raise SystemExit("reprice: --split-start-from-runs needs at least 3 profiled decode split units "
                         f"(the call has {len(rows)}; run lia-run with --profile-steps 1 on plans that split)")
    intercept, slope = robust_line([r["repriced_cpu_part_ms"] for r in rows], [r["cpu_part_ms"] for r in rows])
    return max(intercept, 0.0) / 1e3, slope, len(rows)


def error_summary(rows: list[dict]) -> dict[str, tuple[float, float, int]]:
    """Phase → (median |error|, worst |error|, runs) of re-priced against measured, over the runs that measured it."""
    out = {}
    for phase in ("decode", "prefill"):
        errors = [abs(r[f"repriced_{phase}_ms"] / r[f"measured_{phase}_ms"] - 1) for r in rows
                  if r[f"measured_{phase}_ms"]]
        if errors:
            out[phase] = (statistics.median(errors), max(errors), len(errors))
    return out


def reprice(folder: Path, profile, plans: dict) -> list[dict]:
    """One row per run of the call: measured, the plan's prediction, and the re-priced prediction."""
    from liac.passes.price import price_plan

    runs = json.loads((folder / "runs.json").read_text())["runs"]
    rows, graphs = [], {}
    for run in runs:
        plan = plans.get(run["plan"])
        if plan is None:
            continue
        key = plan.spec.model.config_sha256
        if key not in graphs:
            from liac.passes.trace import trace_model

            graphs[key] = trace_model(plan.model_config)
        price = price_plan(plan, hw=profile, graph=graphs[key])
        splits = sum(g.layer_count for g in plan.spec.layer_groups for s in g.sublayers if s.decode == "split")
        prefill_splits = sum(g.layer_count for g in plan.spec.layer_groups for s in g.sublayers
                             if s.prefill == "split")
        summary = run.get("summary") or {}
        rows.append({"plan": run["plan"], "batch": plan.spec.workload.batch_size, "splits": splits,
                     "prompt": plan.spec.workload.prompt_len, "prefill_splits": prefill_splits,
                     "measured_decode_ms": summary.get("decode_ms_per_token"),
                     "planned_decode_ms": run["predicted"]["decode_ms_per_token"],
                     "repriced_decode_ms": price.decode_seconds_per_token * 1e3,
                     "measured_prefill_ms": summary.get("prefill_ms"),
                     "planned_prefill_ms": run["predicted"]["prefill_ms"],
                     "repriced_prefill_ms": price.prefill_seconds * 1e3})
    return rows


def _profiled_runs(folder: Path, profile, plans: dict, keep):
    """(run, plan, its profiled entries that `keep` accepts, the plan priced under `profile`, the model's traced
    graph) for every run of a known plan with such entries (runs.json `metrics.sublayers`; one trace per model)."""
    from liac.passes.price import price_plan
    from liac.passes.trace import trace_model

    graphs = {}
    for run in json.loads((folder / "runs.json").read_text())["runs"]:
        plan = plans.get(run["plan"])
        entries = [e for e in (run.get("metrics") or {}).get("sublayers", []) if keep(e)]
        if plan is None or not entries:
            continue
        key = plan.spec.model.config_sha256
        if key not in graphs:
            graphs[key] = trace_model(plan.model_config)
        yield run, plan, entries, price_plan(plan, hw=profile, graph=graphs[key]), graphs[key]


def _decode_groups(price) -> dict:
    return {g.name: g for g in price.groups}


def reprice_units(folder: Path, profile, plans: dict, names: set[str]) -> list[dict]:
    """Per run and decode row of its profiled step whose units include one of `names`: measured, planned and
    re-priced ms per layer (compute + transfers, as `liac explain` and the row's own prediction add them)."""
    rows = []
    for run, plan, entries, price, _ in _profiled_runs(folder, profile, plans, lambda e: e.get("phase") == "decode" and
                                                    bool(names & set(e.get("sublayers", ())))):
        groups = _decode_groups(price)
        for entry in entries:
            group = groups.get(entry["group"])
            if group is None:
                continue
            units = [u for u in group.units["decode"] if u.name in entry["sublayers"]]
            rows.append({"plan": run["plan"], "batch": plan.spec.workload.batch_size, "group": entry["group"],
                         "layers": group.group.layer_count, "device": entry["device"],
                         "units": "+".join(entry["sublayers"]), "measured_ms": entry["measured_ms"],
                         "cpu_part_ms": entry.get("measured_cpu_part_ms"),
                         "gpu_part_ms": entry.get("measured_gpu_part_ms"), "planned_ms": entry.get("predicted_ms"),
                         "repriced_ms": sum(u.compute_seconds + u.transfer_seconds for u in units) * 1e3})
    return rows


def split_parts(folder: Path, profile, plans: dict) -> list[dict]:
    """Per profiled split unit of the call's runs (see --split-parts): its shape, its parts measured and re-priced."""
    import numpy as np

    from liac.passes.costs import TIERS
    from liac.passes.price import _per_pass

    rows = []
    for run, plan, entries, price, graph in _profiled_runs(folder, profile, plans, lambda e: e.get("device") == "split"
                                                           and e.get("measured_cpu_part_ms") is not None):
        work = plan.spec.workload
        for entry in entries:
            try:
                priced = price.group(entry["group"])
            except KeyError:
                continue
            group, phase, name = priced.group, entry["phase"], entry["sublayers"][0]
            pc = price.costs.layer_class(group.layer_class).phase(phase)
            index = [u.name for u in pc.units].index(name)
            unit, permille = pc.units[index], group.sublayers[index].cpu_permille(phase)
            if not unit.can_split or permille not in price.costs.split_permille:
                continue  # an MoE experts unit: --attribute takes it apart
            k, tier = price.costs.split_permille.index(permille), priced.tiers[index]
            gemm = next(s for s in graph.sublayers(group.layer_class) if s.unit == name and s.kind == "linear")
            query = 1 if phase == "decode" or name == "lm_head" else work.prompt_len

            def ms(values):
                return float(_per_pass(np.asarray([values], dtype=np.float64), pc, phase)[0]) * 1e3

            stream = ms(unit.split_stream_bytes[k]) / (profile.pcie_h2d_gb_per_s * 1e9)
            rows.append({"plan": run["plan"], "phase": phase, "group": entry["group"], "unit": name,
                         "layers": group.layer_count, "rows_m": work.batch_size * query, "permille": permille,
                         "cpu_features": gemm.weights[0].shape[0] * permille // 1000,
                         "features": gemm.weights[0].shape[0],
                         "cpu_part_ms": entry["measured_cpu_part_ms"],
                         "repriced_cpu_part_ms": ms(unit.split_cpu_seconds[k][TIERS.index(tier)]),
                         "gpu_part_ms": entry["measured_gpu_part_ms"],
                         "repriced_gpu_part_ms": ms(unit.split_gpu_seconds[k]), "repriced_stream_ms": stream,
                         "measured_ms": entry["measured_ms"],
                         "repriced_ms": priced.units[phase][index].compute_seconds * 1e3})
    return sorted(rows, key=lambda r: (r["phase"], r["cpu_features"], r["rows_m"]))


ATTRIBUTE_KINDS = {"qkv": "attention", "attn_score": "attention", "attn_context": "attention", "attn": "attention",
                   "out_proj": "attention", "router": "router", "lm_head": "lm_head", "embed": "embed",
                   "wait": "stream_wait", "release": "release"}


def attribute_decode(folder: Path, profile, plans: dict) -> list[dict]:
    """Per run with a profiled decode step: ms per step by part (see --attribute), measured beside re-priced."""
    out = []
    for run, plan, entries, price, _ in _profiled_runs(folder, profile, plans, lambda e: e.get("phase") == "decode"):
        groups = _decode_groups(price)
        counts = {g.name: g.layer_count for g in plan.spec.layer_groups}
        measured: dict[str, float] = {}
        priced: dict[str, float] = {}
        for entry in entries:
            layers = counts.get(entry["group"], 1)
            names = entry.get("sublayers", [])
            group = groups.get(entry["group"])
            units = [u for u in group.units["decode"] if u.name in names] if group is not None else []
            price = sum(u.compute_seconds + u.transfer_seconds for u in units) * 1e3 * layers
            ms = entry["measured_ms"] * layers
            if "experts" in names and entry.get("measured_cpu_part_ms") is not None:
                cpu, gpu = entry["measured_cpu_part_ms"] * layers, entry["measured_gpu_part_ms"] * layers
                route = (entry.get("measured_route_ms") or 0.0) * layers
                parts = {"experts_route": route, "experts_cpu_part": cpu, "experts_gpu_part": gpu,
                         "experts_split_rest": ms - route - max(cpu, gpu)}
                for name, value in parts.items():
                    measured[name] = measured.get(name, 0.0) + value
                measured["experts_split"] = measured.get("experts_split", 0.0) + ms
                priced["experts_split"] = priced.get("experts_split", 0.0) + price
                continue
            kind = f"experts_{entry['device']}" if "experts" in names else \
                ATTRIBUTE_KINDS.get(names[0], "other") if names else "other"
            measured[kind] = measured.get(kind, 0.0) + ms
            if units:
                priced[kind] = priced.get(kind, 0.0) + price
        summary = run.get("summary") or {}
        out.append({"plan": run["plan"], "batch": plan.spec.workload.batch_size,
                    "measured_ms": {k: round(v, 3) for k, v in sorted(measured.items())},
                    "repriced_ms": {k: round(v, 3) for k, v in sorted(priced.items())},
                    "profiled_step_ms": round(sum(v for k, v in measured.items()
                                                  if k not in ("experts_route", "experts_cpu_part",
                                                               "experts_gpu_part", "experts_split_rest")), 3),
                    "timed_step_ms": summary.get("decode_ms_per_token"),
                    "planned_step_ms": run["predicted"]["decode_ms_per_token"]})
    return out


def _recompile(folder: Path, profile, plans: dict, batches: list[int]) -> list[dict]:
    from liac.api import compile_plans

    out = []
    for prompt_len in sorted({p.spec.workload.prompt_len for p in plans.values()}):
        spec = next(p for p in plans.values() if p.spec.workload.prompt_len == prompt_len).spec
        sample = next(p for p in plans.values() if p.spec.workload.prompt_len == prompt_len)
        result = compile_plans(sample.model_config, profile, batches=tuple(batches), prompt_len=prompt_len,
                               gen_len=spec.workload.gen_len, gpu_mem=spec.budgets.gpu_bytes,
                               cpu_mem=spec.budgets.cpu_bytes)
        whole = compile_plans(sample.model_config, profile, batches=tuple(batches), prompt_len=prompt_len,
                              gen_len=spec.workload.gen_len, gpu_mem=spec.budgets.gpu_bytes,
                              cpu_mem=spec.budgets.cpu_bytes, policy="whole")
        whole_ms = {p.plan.spec.workload.batch_size: p.plan.status.predicted.decode_seconds_per_token * 1e3
                    for p in whole.points if p.plan is not None}
        for point in result.points:
            plan = point.plan
            splits = [(g.name, g.layer_count, s.name, s.decode_cpu_permille) for g in plan.spec.layer_groups
                      for s in g.sublayers if s.decode == "split"]
            prefill = [(g.name, g.layer_count, s.name, s.prefill_cpu_permille) for g in plan.spec.layer_groups
                       for s in g.sublayers if s.prefill == "split"]
            attention = sum(g.layer_count for g in plan.spec.layer_groups
                            if {s.name for s in g.sublayers if s.decode == "cpu"} >= ATTENTION_UNITS)
            routers = sum(g.layer_count for g in plan.spec.layer_groups
                          for s in g.sublayers if s.name == "router" and s.decode == "cpu")
            out.append({"batch": plan.spec.workload.batch_size, "prompt": prompt_len,
                        "cpu_attention_layers": attention, "cpu_router_layers": routers,
                        "decode_ms": plan.status.predicted.decode_seconds_per_token * 1e3,
                        "whole_decode_ms": whole_ms.get(plan.spec.workload.batch_size),
                        "prefill_ms": plan.status.predicted.prefill_seconds * 1e3,
                        "split_units": sum(n for _, n, _, _ in splits),
                        "splits": ", ".join(f"{g}×{n} {u}@{p}‰" for g, n, u, p in splits) or "none",
                        "prefill_split_units": sum(n for _, n, _, _ in prefill),
                        "prefill_splits": ", ".join(f"{g}×{n} {u}@{p}‰" for g, n, u, p in prefill) or "none"})
    return out


def rates_after_fields(call: Path) -> dict:
    """The call's rates-after probe (bench/h200.py): rates-after.json, else the 'after' values of summary.json's
    'rates_probes' → {profile field: value} (the attention curve as [{m, tflops}])."""
    from liac.errors import LiacError

    path = call / "rates-after.json"
    if path.exists():
        return json.loads(path.read_text())
    summary = call / "summary.json"
    probes = json.loads(summary.read_text()).get("rates_probes") if summary.exists() else None
    if not probes:
        raise LiacError(str(path), "not found (and no 'rates_probes' in summary.json): run the call with the "
                        "rates-after stage")
    return {f: [{"m": p["m"], "tflops": p["after"]} for p in r] if isinstance(r, list) else r["after"]
            for f, r in probes.items()}


def _number(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIELD=NUMBER, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("call", type=Path, help="a device call's result folder (runs.json, run-profile.yaml, plans)")
    parser.add_argument("--profile", help="profile to price with (default: the call's run-profile.yaml)")
    parser.add_argument("--set", type=_number, action="append", default=[], metavar="FIELD=NUMBER",
                        help="override a numeric profile field (repeatable)")
    parser.add_argument("--op-seconds-from-runs", action="store_true",
                        help="set runtime_op_seconds from the runs' profiled decode steps (see the docstring)")
    parser.add_argument("--chain-from-runs", action="store_true",
                        help="set runtime_op_seconds_beside_cpu from the runs' host time per CPU part (Eq. 21d)")
    parser.add_argument("--ddr-experts-from-runs", action="store_true",
                        help="set ddr_shared_experts_gb_per_s from the runs' timed CPU parts and the experts "
                             "streamed beside them (Eq. 21b's DDR term)")
    parser.add_argument("--split-start-from-runs", action="store_true",
                        help="set split_cpu_start_seconds from the runs' profiled split CPU parts (Eq. 15b)")
    parser.add_argument("--cpu-rates-from-runs", action="store_true",
                        help="set the CPU GEMV and KV read rates from the runs' profiled decode steps (docstring)")
    parser.add_argument("--rates-after", action="store_true",
                        help="price with the call's rates-after probe (rates-after.json) in place of its rates")
    parser.add_argument("--kv-shared-from-rates", action="store_true",
                        help="set ddr_shared_kv_gb_per_s from the call's rates.json (a call whose probe did not "
                             "measure it): the fused attention's KV rate slowed as the GEMV was beside the copies, "
                             "plus the copies' rate")
    parser.add_argument("--recompile", default="", metavar="B,...", help="compile the optimum at these batches")
    parser.add_argument("--units", default="", metavar="NAME,...",
                        help="per layer group, these units' profiled decode ms beside their prices")
    parser.add_argument("--split-parts", action="store_true",
                        help="every profiled split unit by its CPU part's width, parts beside prices (docstring)")
    parser.add_argument("--attribute", action="store_true",
                        help="per run, its profiled decode step taken apart by part (see the docstring)")
    parser.add_argument("--gpu-gemm-shapes", type=Path, metavar="JSON",
                        help="set gpu_gemm_bf16_tflops (Eq. 1c) from bench/gpu_gemm_shapes.py's output")
    parser.add_argument("--gpu-gemm-cap", type=float, default=0.0, metavar="TFLOPS",
                        help="cap that curve at this rate (a burst curve standing for the sustained one)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)

    from liac.errors import LiacError
    from liac.profile import parse_profile, resolve_profile
    from liac.schema_tools import to_data

    try:
        profile = resolve_profile(args.profile or str(args.call / "run-profile.yaml"))
        overrides = dict(args.set)
        runs = json.loads((args.call / "runs.json").read_text())["runs"]
        notes = []
        if args.op_seconds_from_runs:
            seconds, samples = op_seconds_from_runs(runs)
            overrides.setdefault("runtime_op_seconds", seconds)
            notes.append(f"runtime_op_seconds = {seconds * 1e3:.3f} ms (median of {samples} profiled GPU units)")
        if args.chain_from_runs:
            seconds, used = chain_seconds_from_runs(runs, load_call_plans(args.call), profile)
            overrides.setdefault("runtime_op_seconds_beside_cpu", seconds)
            notes.append(f"runtime_op_seconds_beside_cpu = {seconds * 1e3:.3f} ms (the host per op beside a CPU "
                         f"part, {used} runs' timed steps)")
        if args.ddr_experts_from_runs:
            rate, used = ddr_experts_from_runs(runs)
            overrides.setdefault("ddr_shared_experts_gb_per_s", rate)
            notes.append(f"ddr_shared_experts_gb_per_s = {rate:.1f} GB/s (DDR's total beside the CPU parts, {used} "
                         f"runs' timed steps; ddr_shared_gb_per_s {profile.ddr_shared_gb_per_s:.1f})")
        if args.split_start_from_runs:
            seconds, slope, samples = split_start_from_runs(args.call, profile, load_call_plans(args.call))
            overrides.setdefault("split_cpu_start_seconds", seconds)
            notes.append(f"split_cpu_start_seconds = {seconds * 1e3:.3f} ms (the intercept over {samples} profiled "
                         f"decode split CPU parts; their slope over the price {slope:.2f})")
        if args.cpu_rates_from_runs:
            for field, (rate, samples) in cpu_rates_from_runs(args.call, profile, load_call_plans(args.call)).items():
                overrides.setdefault(field, rate)
                notes.append(f"{field} = {rate:.1f} GB/s (median of {samples} profiled CPU units; the rates stage "
                             f"measured {getattr(profile, field):.1f})")
        if args.kv_shared_from_rates:
            rate = kv_shared_from_rates(args.call)
            overrides.setdefault("ddr_shared_kv_gb_per_s", rate)
            notes.append(f"ddr_shared_kv_gb_per_s = {rate:.1f} GB/s (from rates.json; the GEMV's shared rate "
                         f"{profile.ddr_shared_gb_per_s:.1f})")
        if args.gpu_gemm_shapes:
            curve = tuple((m, min(t, args.gpu_gemm_cap or t)) for m, t in gemm_curve_from_shapes(args.gpu_gemm_shapes))
            overrides.setdefault("gpu_gemm_bf16_tflops", [{"m": m, "tflops": t} for m, t in curve])
            notes.append(f"gpu_gemm_bf16_tflops from {args.gpu_gemm_shapes}: "
                         + ", ".join(f"{m}: {t:.0f}" for m, t in curve))
        after = {}
        if args.rates_after:
            after = {k: v for k, v in rates_after_fields(args.call).items() if k in to_data(profile)}
            notes.append("rates-after: " + ", ".join(f"{k} = {v:g}" for k, v in sorted(after.items())
                                                     if isinstance(v, (int, float))))
        if overrides or after:
            data = to_data(profile)
            unknown = sorted(set(overrides) - set(data))
            if unknown:
                raise LiacError("--set", f"unknown profile field '{unknown[0]}'")
            data.update(after)
            data["sources"] = {**data["sources"], **{k: "bench/reprice.py --rates-after (rates-after.json)"
                                                     for k in after}}
            data.update(overrides)
            data["sources"] = {**data["sources"], **{k: "bench/reprice.py override" for k in overrides}}
            profile = parse_profile(data, "--set")
        plans = load_call_plans(args.call)
        rows = reprice(args.call, profile, plans)
        picks = _recompile(args.call, profile, plans, [int(b) for b in args.recompile.split(",")]) \
            if args.recompile else []
        units = reprice_units(args.call, profile, plans, set(args.units.split(","))) if args.units else []
        parts = attribute_decode(args.call, profile, plans) if args.attribute else []
        splits = split_parts(args.call, profile, plans) if args.split_parts else []
    except LiacError as e:
        print(f"reprice: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"notes": notes, "runs": rows, "recompiled": picks, "units": units, "attribution": parts,
                          "split_parts": splits, "errors": error_summary(rows)}, indent=1))
        return 0
    for note in notes:
        print(note)
    out = io.StringIO()
    out.write(f"{'plan':44s} {'splits':>6s} {'pre':>3s} {'decode ms/token: measured':>25s} {'planned':>8s} "
              f"{'repriced':>9s} {'error':>7s} | {'prefill ms: measured':>20s} {'planned':>8s} {'repriced':>9s} "
              f"{'error':>7s}\n")

    def cell(value, width: int, form: str = ".1f") -> str:
        return f"{value:{form[0] if form[0] == '+' else ''}{width}{form.lstrip('+')}}" if value is not None else f"{'-':>{width}s}"

    def error(repriced, measured):
        return repriced / measured - 1 if measured else None

    for row in rows:
        decode_error = error(row["repriced_decode_ms"], row["measured_decode_ms"])
        out.write(f"{row['plan']:44s} {row['splits']:6d} {row['prefill_splits']:3d} "
                  f"{cell(row['measured_decode_ms'], 25)} {row['planned_decode_ms']:8.1f} "
                  f"{row['repriced_decode_ms']:9.1f} {cell(decode_error, 7, '+.1%')} | "
                  f"{cell(row['measured_prefill_ms'], 20)} {row['planned_prefill_ms']:8.1f} "
                  f"{row['repriced_prefill_ms']:9.1f} "
                  f"{cell(error(row['repriced_prefill_ms'], row['measured_prefill_ms']), 7, '+.1%')}\n")
    for phase, (median, worst, count) in error_summary(rows).items():
        out.write(f"{phase}: median |error| {median:.1%}, worst {worst:.1%} over {count} runs\n")
    for pick in picks:
        out.write(f"recompiled b{pick['batch']} p{pick['prompt']}: decode {pick['decode_ms']:.1f} ms/token, prefill "
                  f"{pick['prefill_ms']:.1f} ms predicted (the whole-unit optimum: decode "
                  f"{cell(pick['whole_decode_ms'], 0)}); {pick['split_units']} split units per decode step "
                  f"({pick['splits']}), {pick['prefill_split_units']} in the prefill ({pick['prefill_splits']}); "
                  f"decode attention on the CPU in {pick['cpu_attention_layers']} layers, the router in "
                  f"{pick['cpu_router_layers']}\n")
    if units:
        out.write(f"{'plan':44s} {'group':>10s} {'layers':>6s} {'units':>8s} {'decode ms per layer: measured':>29s} "
                  f"{'(CPU part, GPU part)':>20s} {'planned':>8s} {'repriced':>9s} {'error':>7s}\n")
    for row in units:
        parts = "" if row["cpu_part_ms"] is None else f"({row['cpu_part_ms']:.1f}, {row['gpu_part_ms']:.1f})"
        planned = float("nan") if row["planned_ms"] is None else row["planned_ms"]
        out.write(f"{row['plan']:44s} {row['group']:>10s} {row['layers']:6d} {row['units']:>8s} "
                  f"{row['measured_ms']:29.2f} {parts:>20s} {planned:8.2f} {row['repriced_ms']:9.2f} "
                  f"{row['repriced_ms'] / row['measured_ms'] - 1:+7.1%}\n")
    if splits:
        out.write(f"{'plan':44s} {'phase':7s} {'unit':>8s} {'layers':>6s} {'M':>5s} {'N cpu':>11s} "
                  f"{'CPU part ms (priced)':>20s} {'ratio':>5s} {'GPU part ms (priced)':>20s} {'stream':>6s} "
                  f"{'unit ms (priced)':>16s}\n")
    for row in splits:
        cpu = f"{row['cpu_part_ms']:.2f} ({row['repriced_cpu_part_ms']:.2f})"
        gpu = f"{row['gpu_part_ms']:.2f} ({row['repriced_gpu_part_ms']:.2f})"
        unit = f"{row['measured_ms']:.2f} ({row['repriced_ms']:.2f})"
        width = f"{row['cpu_features']}@{row['permille']}‰"
        out.write(f"{row['plan']:44s} {row['phase']:7s} {row['unit']:>8s} {row['layers']:6d} {row['rows_m']:5d} "
                  f"{width:>11s} {cpu:>20s} {row['cpu_part_ms'] / row['repriced_cpu_part_ms']:5.2f} {gpu:>20s} "
                  f"{row['repriced_stream_ms']:6.2f} {unit:>16s}\n")
    for row in parts:
        out.write(f"{row['plan']} b{row['batch']}: decode ms per step by part, measured (re-priced)\n")
        for name, value in row["measured_ms"].items():
            price = row["repriced_ms"].get(name)
            out.write(f"  {name:20s} {value:9.2f}" + (f" ({price:.2f})" if price is not None else "") + "\n")
        out.write(f"  {'profiled step':20s} {row['profiled_step_ms']:9.2f}; timed steps {cell(row['timed_step_ms'], 0)}"
                  f" ms/token, planned {row['planned_step_ms']:.1f}\n")
    print(out.getvalue(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
