"""Two plans (or two sweep directories) → their semantic differences, for code review (`liac diff`).

"Semantic" means what changes what the runtime does or what the compiler predicts, layer by layer — not how the
YAML spells it. Both plans are expanded to one configuration per layer (device per unit per phase, weight tier per
unit, KV tier), compared, and equal changes on consecutive layers are folded into one range, so re-cutting the
same placement into different `layer_groups` is no difference at all. Also compared: model and hardware identity,
workload, budgets, execution, memory reserved per tier (spec) and used per tier (status), predicted times and
tokens/s (with the change in %), and the solver report. Serving plans: the live batch sizes and their weights, each
batch size's placement layer by layer (`liac.plan.batch_plan`), and its predicted step time. Not compared:
`metadata` (name, liac version).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from liac.plan import PHASES, batch_plan, expert_placement
from liac.sweep import plan_files
from liac.sizes import format_gib

__all__ = ["Change", "PlanDiff", "SweepPairs", "diff_plans", "layer_table", "fold_layers", "pair_sweeps"]



@dataclass(frozen=True)
class Change:
    """One difference. `section` groups the output; `subject` says what changed; `detail` e.g. '-17.9%'."""

    section: str
    subject: str
    old: str
    new: str
    detail: str = ""

    def line(self) -> str:
        text = f"{self.section}: {self.subject}: {self.old} → {self.new}"
        return f"{text} ({self.detail})" if self.detail else text

    def to_json(self) -> dict:
        return {"section": self.section, "subject": self.subject, "old": self.old, "new": self.new,
                "detail": self.detail}


@dataclass(frozen=True)
class PlanDiff:
    """The differences between plan `a` and plan `b` (sources name the files)."""

    a: str
    b: str
    changes: tuple[Change, ...]


def layer_table(plan) -> dict[tuple[str, int], tuple[str, dict]]:
    """(layer class, layer index) → (KV tier, {unit: SublayerPlacement}) for every layer of a valid plan."""
    table = {}
    for group in plan.spec.layer_groups:
        units = {sub.name: sub for sub in group.sublayers}
        for layer in range(group.first_layer, group.first_layer + group.layer_count):
            table[(group.layer_class, layer)] = (group.kv_cache, units)
    return table


def fold_layers(changes_by_layer: dict[tuple[str, int], object]) -> list[tuple[str, object]]:
    """{(class, layer): change} → [(subject, change)], consecutive layers with equal changes folded into a range.

    >>> fold_layers({("decoder", 0): "x", ("decoder", 1): "x", ("decoder", 3): "x"})
    [('decoder layers 0..1', 'x'), ('decoder layer 3', 'x')]
    """
    order = {"embed": 0, "decoder": 1, "head": 2}
    out: list[tuple[str, str]] = []
    run: list = []  # [class, first, last, description]
    for (layer_class, layer), change in sorted(changes_by_layer.items(),
                                               key=lambda item: (order[item[0][0]], item[0][1])):
        if run and run[0] == layer_class and run[2] == layer - 1 and run[3] == change:
            run[2] = layer
            continue
        if run:
            out.append((_subject(*run[:3]), run[3]))
        run = [layer_class, layer, layer, change]
    if run:
        out.append((_subject(*run[:3]), run[3]))
    return out


def _subject(layer_class: str, first: int, last: int) -> str:
    if layer_class != "decoder":
        return layer_class
    return f"decoder layer {first}" if first == last else f"decoder layers {first}..{last}"


def _percent(old: float, new: float) -> str:
    if old == 0:
        return "new" if new else ""
    return f"{(new - old) / old * 100:+.1f}%"


def _bytes_detail(old: int, new: int) -> str:
    """'+5.7%, +14.5 GiB': the percentage alone hides a change that rounds to the same GiB."""
    delta = new - old
    return ", ".join(part for part in (_percent(old, new), ("+" if delta > 0 else "-") + format_gib(abs(delta)))
                     if part)


def _identity_changes(a, b) -> list[Change]:
    out = []
    pairs = [("model", "name", a.spec.model.name, b.spec.model.name),
             ("model", "config_sha256", a.spec.model.config_sha256[:12], b.spec.model.config_sha256[:12]),
             ("hardware", "profile", a.spec.hardware.profile, b.spec.hardware.profile),
             ("hardware", "sha256", a.spec.hardware.sha256[:12], b.spec.hardware.sha256[:12])]
    for section, field, old, new in pairs:
        if old != new:
            out.append(Change(section, field, str(old), str(new)))
    return out


def _record_changes(section: str, old_record, new_record, fields: list[str], as_bytes: bool = False) -> list[Change]:
    out = []
    for field in fields:
        old, new = getattr(old_record, field), getattr(new_record, field)
        if old != new:
            show = format_gib if as_bytes else str
            out.append(Change(section, field, show(old), show(new), _bytes_detail(old, new) if as_bytes else ""))
    return out


def _placement_changes(a, b) -> list[Change]:
    table_a, table_b = layer_table(a), layer_table(b)
    if set(table_a) != set(table_b):  # different models: the identity changes say so
        return []
    experts = a.model_config.num_experts

    def value(sub, attribute: str) -> str:
        if sub.name == "experts" and experts:  # expert counts tell MoE placements apart
            placed = expert_placement(sub, experts)
            if attribute in PHASES:
                return f"{getattr(sub, attribute)} ({placed.cpu(attribute)} of {experts} experts on the CPU)"
            if attribute == "weights" and 0 < placed.hbm < experts:
                return f"{sub.weights} ({placed.hbm} of {experts} experts in hbm)"
        if attribute in PHASES and getattr(sub, attribute) == "split":  # a split's share tells splits apart
            return f"split ({sub.cpu_permille(attribute)}‰ CPU)"
        return getattr(sub, attribute)

    def unit_moves(attribute: str) -> dict[tuple[str, int], tuple]:
        per_layer = {}
        for key, (_, units_a) in table_a.items():
            units_b = table_b[key][1]
            moves = tuple((name, value(units_a[name], attribute), value(units_b[name], attribute))
                          for name in units_a if name in units_b
                          and value(units_a[name], attribute) != value(units_b[name], attribute))
            if moves:
                per_layer[key] = moves
        return per_layer

    out = []
    for section, per_layer in [(f"placement {phase}", unit_moves(phase)) for phase in PHASES] + [
            ("weights", unit_moves("weights")),
            ("kv_cache", {key: (("", table_a[key][0], table_b[key][0]),) for key in table_a
                          if table_a[key][0] != table_b[key][0]})]:
        for subject, moves in fold_layers(per_layer):
            # One change per direction: "decoder layers 2..5: fc1, fc2: gpu → cpu".
            for old, new in dict.fromkeys((old, new) for _, old, new in moves):
                names = [name for name, o, n in moves if (o, n) == (old, new) and name]
                out.append(Change(section, f"{subject}: {', '.join(names)}" if names else subject, old, new))
    return out


def _serving_changes(a, b) -> list[Change]:
    """Live batch sizes added or removed, weights, and per batch size present in both its placement (tiers are the
    shared memory placement's, compared above) and its predicted step time."""
    sizes_a = {x.batch_size: x for x in a.spec.serving.batches}
    sizes_b = {x.batch_size: x for x in b.spec.serving.batches}
    rows_a = {r.batch_size: r for r in a.status.serving.batches}
    rows_b = {r.batch_size: r for r in b.status.serving.batches}
    out = []
    for size in sorted(set(sizes_a) | set(sizes_b)):
        subject = f"batch {size}"
        if size not in sizes_a or size not in sizes_b:
            old = f"weight {sizes_a[size].weight}" if size in sizes_a else "(no serving batch)"
            new = f"weight {sizes_b[size].weight}" if size in sizes_b else "(no serving batch)"
            out.append(Change("serving", subject, old, new))
            continue
        if sizes_a[size].weight != sizes_b[size].weight:
            out.append(Change("serving", f"{subject}: weight", str(sizes_a[size].weight), str(sizes_b[size].weight)))
        for change in _placement_changes(batch_plan(a, size), batch_plan(b, size)):
            if change.section.startswith("placement"):
                out.append(Change(f"serving {subject} {change.section}", change.subject, change.old, change.new))
        if size in rows_a and size in rows_b and rows_a[size].step_seconds != rows_b[size].step_seconds:
            old, new = rows_a[size].step_seconds, rows_b[size].step_seconds
            out.append(Change("serving predicted", f"{subject}: step", f"{old:.4g} s", f"{new:.4g} s",
                              _percent(old, new)))
    return out


def _status_changes(a, b) -> list[Change]:
    out = []
    pa, pb = a.status.predicted, b.status.predicted
    for field, label, unit in (("prefill_seconds", "prefill", "s"), ("decode_seconds_per_token", "decode per token",
                               "s"), ("total_seconds", "total", "s"), ("tokens_per_second", "tokens/s", "")):
        old, new = getattr(pa, field), getattr(pb, field)
        if old != new:
            out.append(Change("predicted", label, f"{old:.4g}{' ' + unit if unit else ''}",
                              f"{new:.4g}{' ' + unit if unit else ''}", _percent(old, new)))
    used_a = {u.tier: u.used_bytes for u in a.status.memory}
    used_b = {u.tier: u.used_bytes for u in b.status.memory}
    for tier in sorted(set(used_a) | set(used_b)):
        old, new = used_a.get(tier, 0), used_b.get(tier, 0)
        if old != new:
            out.append(Change("memory used", tier, format_gib(old), format_gib(new), _bytes_detail(old, new)))
    sa, sb = a.status.solver, b.status.solver
    for field in ("name", "status", "gap"):
        if getattr(sa, field) != getattr(sb, field):
            out.append(Change("solver", field, str(getattr(sa, field)), str(getattr(sb, field))))
    return out


def diff_plans(a, b, source_a: str = "a", source_b: str = "b") -> PlanDiff:
    """Two valid `OffloadPlan`s → their semantic differences (empty when they are equivalent)."""
    changes = _identity_changes(a, b)
    changes += _record_changes("workload", a.spec.workload, b.spec.workload,
                               ["batch_size", "prompt_len", "gen_len", "objective"])
    changes += _record_changes("budgets", a.spec.budgets, b.spec.budgets, ["gpu_bytes", "cpu_bytes", "cxl_bytes"],
                               as_bytes=True)
    changes += _record_changes("execution", a.spec.execution, b.spec.execution, ["prefetch_depth"])
    changes += _record_changes("execution", a.spec.execution, b.spec.execution, ["staging_bytes"], as_bytes=True)
    changes += _record_changes("memory reserved", a.spec.memory, b.spec.memory,
                               ["hbm_bytes", "ddr_bytes", "cxl_bytes"], as_bytes=True)
    changes += _placement_changes(a, b)
    changes += _serving_changes(a, b)
    changes += _status_changes(a, b)
    return PlanDiff(source_a, source_b, tuple(changes))


class SweepPairs(NamedTuple):
    """The plan files of two sweep directories: pairs with the same name, and those in one directory only."""

    pairs: list[tuple[Path, Path]]
    only_a: list[Path]
    only_b: list[Path]


def pair_sweeps(dir_a: Path, dir_b: Path) -> SweepPairs:
    """Plan files of two sweep directories paired by file name."""
    files_a = {p.name: p for p in plan_files(dir_a)}
    files_b = {p.name: p for p in plan_files(dir_b)}
    pairs = [(files_a[name], files_b[name]) for name in sorted(set(files_a) & set(files_b))]
    return SweepPairs(pairs, [files_a[n] for n in sorted(set(files_a) - set(files_b))],
                      [files_b[n] for n in sorted(set(files_b) - set(files_a))])
