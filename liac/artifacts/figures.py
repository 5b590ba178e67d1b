"""SweepPage → the data each figure plots (plain numbers) → PNG files drawn with matplotlib.

Three figures per page, each a pure function of its data dict, named `<kind>-<sha12>.png` by a hash of that dict
and of this module's source (`STYLE`), so changing the data or the drawing code renames the figure:

    placement  unit × batch heat map per phase: share of the unit's layers computed on the GPU (C, G or a fraction)
    latency    per batch, per phase, the predicted time split into CPU compute, GPU compute, PCIe transfers and
               weight/KV streaming, as shares of their sum (streaming overlaps compute, so the sum exceeds the
               predicted time printed above each bar)
    memory     per tier with a budget, bytes used per batch against the budget line
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

__all__ = ["STYLE", "FIGURES", "figure_name", "is_figure_name", "placement_data", "latency_data", "memory_data"]

# Any edit here changes every figure's name, so pages referencing old drawings show up as stale (line endings
# normalised: a Windows checkout hashes the same).
STYLE = hashlib.sha256(Path(__file__).read_bytes().replace(b"\r\n", b"\n")).hexdigest()[:12]
CPU_COLOR, GPU_COLOR = "#4c72b0", "#dd8452"
_CATEGORIES = (("cpu_compute", "CPU compute", CPU_COLOR), ("gpu_compute", "GPU compute", GPU_COLOR),
               ("split_compute", "split compute (slower part)", "#c44e52"),
               ("transfer", "PCIe transfers", "#55a868"), ("stream", "weight/KV streaming", "#8172b3"))
_NAME = re.compile(r"(placement|latency|memory)-[0-9a-f]{12}\.png")
_PHASES = ("prefill", "decode")


def _point_label(plan) -> str:
    return str(plan.spec.workload.batch_size)


def placement_data(page) -> dict:
    """{'batches', 'units', 'gpu_share': {phase: [[share per batch] per unit]}} for the heat map."""
    first = page.plans[0]
    units = [("embed", "embed")] + [("decoder", s.name) for s in next(
        g for g in first.spec.layer_groups if g.layer_class == "decoder").sublayers] + [("head", "lm_head")]
    shares = {}
    for phase in _PHASES:
        rows = []
        for layer_class, unit in units:
            row = []
            for plan in page.plans:
                on_gpu = total = 0
                for group in plan.spec.layer_groups:
                    if group.layer_class != layer_class:
                        continue
                    sub = next(s for s in group.sublayers if s.name == unit)
                    total += group.layer_count
                    on_gpu += group.layer_count * (1000 - sub.cpu_permille(phase)) / 1000  # a split: its share
                row.append(round(on_gpu / total, 4))
            rows.append(row)
        shares[phase] = rows
    return {"batches": [_point_label(p) for p in page.plans], "units": [u for _, u in units],
            "num_layers": first.model_config.num_layers, "gpu_share": shares}


def latency_data(page) -> dict:
    """{'batches', 'seconds': {phase: {category: [seconds per batch]}}, 'predicted': {phase: [...]}}."""
    seconds = {phase: {key: [] for key, _, _ in _CATEGORIES} for phase in _PHASES}
    predicted = {"prefill": [], "decode": []}
    for plan in page.plans:
        counts = {g.name: g.layer_count for g in plan.spec.layer_groups}
        sums = {phase: dict.fromkeys(seconds[phase], 0.0) for phase in _PHASES}
        for item in plan.status.predicted.sublayers:
            n = counts.get(item.group, 0)
            sums[item.phase][f"{item.device}_compute"] += item.compute_seconds * n
            sums[item.phase]["transfer"] += item.transfer_seconds * n
            sums[item.phase]["stream"] += item.stream_seconds * n
        for phase in _PHASES:
            for key in seconds[phase]:
                seconds[phase][key].append(float(f"{sums[phase][key]:.6g}"))
        predicted["prefill"].append(plan.status.predicted.prefill_seconds)
        predicted["decode"].append(plan.status.predicted.decode_seconds_per_token)
    return {"batches": [_point_label(p) for p in page.plans], "seconds": seconds, "predicted": predicted}


def memory_data(page) -> dict:
    """{'batches', 'tiers': {tier: {'used': [bytes per batch], 'budget': bytes}}} for tiers with a budget."""
    budget_field = {"hbm": "gpu_bytes", "ddr": "cpu_bytes", "cxl": "cxl_bytes"}
    tiers = {}
    for tier, field in budget_field.items():
        budgets = {getattr(p.spec.budgets, field) for p in page.plans}
        if max(budgets) == 0:
            continue
        used = [next((u.used_bytes for u in p.status.memory if u.tier == tier), 0) for p in page.plans]
        tiers[tier] = {"used": used, "budget": max(budgets)}
    return {"batches": [_point_label(p) for p in page.plans], "tiers": tiers}


def figure_name(kind: str, page) -> tuple[str, dict]:
    """(file name, data) of one figure of a page; the name hashes the data, the kind and STYLE."""
    data = {"placement": placement_data, "latency": latency_data, "memory": memory_data}[kind](page)
    data = {**data, "title": f"{page.model} on {page.hardware}"}
    digest = hashlib.sha256(json.dumps([kind, STYLE, data], sort_keys=True).encode()).hexdigest()[:12]
    return f"{kind}-{digest}.png", data


def is_figure_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _save(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", metadata={"Software": None})
    tmp.replace(path)


def draw_placement(data: dict, path: Path) -> None:
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.patches import Patch

    cmap = LinearSegmentedColormap.from_list("cpu-gpu", [CPU_COLOR, "#eeeeee", GPU_COLOR])
    batches, units, layers = data["batches"], data["units"], data["num_layers"]
    fig = _figure(max(6.0, 1.2 + 0.55 * len(batches) * 2), 0.9 + 0.42 * len(units))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, phase in zip(axes, _PHASES):
        share = data["gpu_share"][phase]
        ax.imshow(share, cmap=cmap, vmin=0, vmax=1, aspect="auto")
        for row, unit in enumerate(units):
            for col in range(len(batches)):
                value = share[row][col]
                decoder = unit not in ("embed", "lm_head")
                text = "G" if value == 1 else "C" if value == 0 else (
                    f"{round(value * layers)}G" if decoder else f"{value:.0%}")
                ax.text(col, row, text, ha="center", va="center", fontsize=8,
                        color="white" if value in (0, 1) else "black")
        ax.set_title(phase)
        ax.set_xticks(range(len(batches)), batches, fontsize=8)
        ax.set_xlabel("batch size")
        ax.set_yticks(range(len(units)), units, fontsize=9)
        ax.tick_params(length=0)
    fig.suptitle(f"{data['title']}: where each unit computes", fontsize=10)
    fig.legend(handles=[Patch(color=CPU_COLOR, label="C: CPU"), Patch(color=GPU_COLOR, label="G: GPU"),
                        Patch(color="#eeeeee", label=f"nG: n of {layers} decoder layers on the GPU")],
               loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    _save(fig, path)


def draw_latency(data: dict, path: Path) -> None:
    batches = data["batches"]
    fig = _figure(max(7.0, 1.5 + 0.5 * len(batches) * 2), 3.8)
    axes = fig.subplots(1, 2, sharey=True)
    titles = {"prefill": "prefill (whole batch)", "decode": "decode (per token step)"}
    for ax, phase in zip(axes, _PHASES):
        seconds = data["seconds"][phase]
        totals = [sum(seconds[key][col] for key, _, _ in _CATEGORIES) for col in range(len(batches))]
        bottom = [0.0] * len(batches)
        for key, label, color in _CATEGORIES:
            share = [100 * seconds[key][col] / totals[col] if totals[col] else 0 for col in range(len(batches))]
            ax.bar(range(len(batches)), share, bottom=bottom, color=color, label=label, width=0.7)
            bottom = [b + s for b, s in zip(bottom, share)]
        for col, value in enumerate(data["predicted"][phase]):
            ax.text(col, 101.5, _seconds(value), ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_ylim(0, 125)
        ax.set_yticks(range(0, 101, 25))
        ax.set_xticks(range(len(batches)), batches, fontsize=8)
        ax.set_xlabel("batch size")
        ax.set_title(titles[phase], fontsize=10)
    axes[0].set_ylabel("share of summed sublayer time (%)")
    fig.suptitle(f"{data['title']}: latency breakdown (label: predicted time; streaming overlaps compute)",
                 fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    _save(fig, path)


def _seconds(value: float) -> str:
    return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"


def draw_memory(data: dict, path: Path) -> None:
    batches, tiers = data["batches"], data["tiers"]
    fig = _figure(max(6.0, 2.2 + 2.4 * len(tiers) + 0.25 * len(batches) * len(tiers)), 3.4)
    axes = fig.subplots(1, len(tiers), squeeze=False)[0]
    colors = {"hbm": GPU_COLOR, "ddr": CPU_COLOR, "cxl": "#937860"}
    for ax, (tier, values) in zip(axes, tiers.items()):
        used = [b / 2**30 for b in values["used"]]
        budget = values["budget"] / 2**30
        bars = ax.bar(range(len(batches)), used, color=colors[tier], width=0.7)
        ax.bar_label(bars, [f"{u:.1f}" for u in used], fontsize=7, padding=2)
        ax.axhline(budget, color="black", linestyle="--", linewidth=1)
        ax.set_ylim(0, max(budget, max(used)) * 1.18)
        ax.set_xticks(range(len(batches)), batches, fontsize=8)
        ax.set_xlabel("batch size")
        ax.set_ylabel("GiB used")
        ax.set_title(f"{tier.upper()} (budget {budget:.1f} GiB, dashed)", fontsize=10)
    fig.suptitle(f"{data['title']}: memory per tier", fontsize=10)
    _save(fig, path)


FIGURES = {"placement": draw_placement, "latency": draw_latency, "memory": draw_memory}
