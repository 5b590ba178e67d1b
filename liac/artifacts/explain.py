"""Plan → why each sublayer runs where it does: prices on both devices, transfers, and the binding constraints.

`liac explain` re-prices a plan from its `spec` with the compiler's pricing (`liac.passes.price.price_plan`: the
same trace, profile and cost equations the solver used; the profile must still hash to `spec.hardware.sha256`),
then:

- per layer group, phase and unit: the unit's predicted time on the CPU and on the GPU as the plan places its
  tensors (`price.unit_prices`), the PCIe transfers each choice implies, the streaming the GPU would need;
- the *flip test*: the layer's time (Eq. 7 of docs/cost-model.md, `PlanPrice.alternatives`) with that one unit
  moved to the other device, everything else as planned. A positive difference is what the choice
  saves; a move that would be faster but was not taken is explained by memory (the bigger staging buffer it
  needs does not fit in HBM); an impossible move says which rule forbids it;
- per tier, its use against the budget and whether it binds: HBM binds when making one more decoder layer as
  HBM-heavy as the most resident group would not fit ("GPU memory full at 23.8 of 24.0 GiB: 20 layers resident").

The per-unit prices are per layer: decode's per token step (means over the steps), prefill's for the whole pass
(summed over its micro-batches, docs/cost-model.md Eq. 20).

A serving plan (`spec.serving`) is explained at one live batch size (`batch`, default the largest, whose placement
is `spec.layer_groups`'): that batch's placement priced at that batch (`liac.plan.batch_plan`), the memory of the
one shared placement; and a table of every batch size: its placements, its step time re-priced here beside
`status.serving`'s, and its own optimum's (what sharing one memory placement costs it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from liac.artifacts.footprint import group_tier_bytes
from liac.artifacts.validate import BUDGET_FIELD, staging_buffers
from liac.passes.costs import Microbatch
from liac.passes.price import ddr_sharing, plan_costs, plan_profile, price_plan, unit_prices
from liac.plan import PHASES, batch_plan, expert_placement
from liac.sweep import policy_string
from liac.sizes import format_gib

__all__ = ["UnitExplanation", "TierPressure", "GroupInfo", "ServingRow", "Explanation", "explain_plan",
           "render_text"]

_TIER_WORDS = {"hbm": "GPU memory (hbm)", "ddr": "host DDR (ddr)", "cxl": "CXL memory (cxl)"}


@dataclass(frozen=True)
class UnitExplanation:
    """One unit of one group in one phase. Seconds are per layer (decode: per token step); None = not allowed."""

    group: str
    unit: str
    phase: str
    device: str
    operand_tier: str
    cpu_seconds: float | None
    gpu_seconds: float
    transfer_seconds_on_cpu: float
    transfer_seconds_on_gpu: float
    stream_seconds_on_gpu: float
    flip_delta_seconds: float | None  # layer time if this unit alone moved, minus the planned layer time
    reason: str


@dataclass(frozen=True)
class TierPressure:
    """One tier's use against its budget. `need_bytes`: on HBM, what one more decoder layer as resident as the
    most resident group would add (0 when all are); on DDR/CXL, the smallest per-layer footprint of the plan. The
    tier binds when `need_bytes` exceeds `free_bytes`."""

    tier: str
    used_bytes: int
    budget_bytes: int
    need_bytes: int
    free_bytes: int
    binding: bool
    message: str


@dataclass(frozen=True)
class GroupInfo:
    name: str
    layer_class: str
    first_layer: int
    layer_count: int
    kv_cache: str
    layer_seconds: dict  # phase → planned time of one layer (decode: per step)


@dataclass(frozen=True)
class ServingRow:
    """One live batch size of a serving plan: its placements and step time (re-priced here, and as the compiler
    wrote it), beside its own optimum's step time."""

    batch_size: int
    share: float
    prefill_policy: str
    decode_policy: str
    step_seconds: float
    status_step_seconds: float
    own_step_seconds: float


@dataclass(frozen=True)
class Explanation:
    source: str
    model: str
    hardware: str
    batch_size: int
    prompt_len: int
    gen_len: int
    objective: str
    predicted: dict
    tiers: tuple[TierPressure, ...]
    groups: tuple[GroupInfo, ...]
    units: tuple[UnitExplanation, ...]
    microbatch: str = ""  # the decoder's prefill micro-batch, '4 sequences x 2016 tokens'
    microbatches: int = 1  # micro-batches per layer
    workspace_bytes: int = 0  # the decoder's activation workspace at that micro-batch (Eq. 14)
    whole_batch_workspace_bytes: int = 0  # ... and with the whole batch at once
    serving: tuple[ServingRow, ...] = ()

    def to_json(self) -> dict:
        return asdict(self)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e3:.3g} ms"


def _tier_pressure(plan) -> list[TierPressure]:
    """HBM: could one more decoder layer be as HBM-heavy as the most resident group? DDR, CXL: is there room for
    one more layer's data (the smallest per-layer footprint of the plan)? Binding when the answer is no."""
    spec = plan.spec
    used = {u.tier: u.used_bytes for u in plan.status.memory}
    decoders = [g for g in spec.layer_groups if g.layer_class == "decoder"]
    per_layer = {g.name: group_tier_bytes(plan, g) for g in decoders}
    num_layers = sum(g.layer_count for g in decoders)
    out = []
    for tier, field in BUDGET_FIELD.items():
        budget = getattr(spec.budgets, field)
        if budget == 0:
            continue
        free = budget - used.get(tier, 0)
        head = f"{_TIER_WORDS[tier]}: {format_gib(used.get(tier, 0))} of {format_gib(budget)} used"
        if tier == "hbm":
            heaviest = max(per_layer[g.name]["hbm"] for g in decoders)
            top = [g for g in decoders if per_layer[g.name]["hbm"] == heaviest]
            holders = sum(g.layer_count for g in top)
            needs = [heaviest - per_layer[g.name]["hbm"] for g in decoders if per_layer[g.name]["hbm"] < heaviest]
            need = min(needs) if needs else 0
            resident = all(s.weights in ("hbm", "none") for s in top[0].sublayers) and top[0].kv_cache == "hbm"
            how = "resident" if resident else f"with {format_gib(heaviest)} each in HBM"
            what = f"{holders} of {num_layers} decoder layers {how}; one more needs"
            idle = (f"not binding: one more layer like the {holders} with the most in HBM would fit "
                    f"({format_gib(need)} of {format_gib(free)} free), and the solver found it no faster")
        else:
            need = min(sum(per_layer[g.name].values()) for g in decoders)
            what = "one more layer's weights and KV cache need"
            idle = "not binding"
        if need and need > free:
            message = (f"{_TIER_WORDS[tier].split(' (')[0]} full at {format_gib(used.get(tier, 0))} of "
                       f"{format_gib(budget)}: {what} {format_gib(need)}, {format_gib(max(free, 0))} free")
            out.append(TierPressure(tier, used.get(tier, 0), budget, need, free, True, message))
        else:
            out.append(TierPressure(tier, used.get(tier, 0), budget, need, free, False,
                                    f"{head}; {idle if need else 'not binding'}"))
    return out


def _flip_reason(operand: str, tier: str, price, delta, staging_needed, staging_free) -> str:
    """Why `price.device`: from the flip test's `delta` (None when the other device is not allowed)."""
    other = "GPU" if price.device == "cpu" else "CPU"
    if delta is None:
        if price.device == "gpu" and operand == "kv":
            return "must run on the GPU: the CPU does not read a KV cache held in HBM"
        if price.device == "gpu":
            return "weights resident in HBM: the CPU does not compute from HBM"
        return "no other device allowed"
    if delta >= 0:
        parts = []
        if other == "GPU" and price.stream_seconds_on_gpu:
            what = "weights" if operand == "weights" else "KV cache"
            parts.append(f"streaming its {what} from {tier.upper()} takes {_ms(price.stream_seconds_on_gpu)}")
        on_other = price.transfer_seconds_on_gpu if other == "GPU" else price.transfer_seconds_on_cpu
        here = price.transfer_seconds_on_cpu if other == "GPU" else price.transfer_seconds_on_gpu
        if on_other > here:
            parts.append(f"PCIe transfers grow by {_ms(on_other - here)}")
        elif here > on_other:
            parts.append(f"its PCIe transfers here cost {_ms(here - on_other)}")
        why = f" ({'; '.join(parts)})" if parts else ""
        return f"on the {other} the layer would take {_ms(delta)} longer{why}"
    if staging_needed > staging_free:
        return (f"on the {other} the layer would be {_ms(-delta)} faster, but its staging buffers would need "
                f"{format_gib(staging_needed)} more HBM, {format_gib(max(staging_free, 0))} free")
    return (f"on the {other} the layer would be {_ms(-delta)} faster alone; the solver's joint choice over all "
            "layers and tiers keeps it here")


def _split_reason(price, deltas: dict, sharing) -> str:
    """Why a split: what the layer would take with the unit wholly on each device instead, and how DDR is shared
    (docs/cost-model.md Eq. 18: the headroom DMA has beside the CPU's reads)."""
    parts = []
    for target, name in ((1000, "CPU"), (0, "GPU")):  # the CPU's permille wholly on each device
        delta = deltas.get(target)
        if delta is None:
            parts.append(f"wholly on the {name} not allowed")
        else:
            parts.append(f"wholly on the {name} the layer would take {_ms(delta)} "
                         + ("longer" if delta >= 0 else "less"))
    if sharing.beside_gb_per_s > 0:
        ddr = (f"DDR serves {sharing.shared_gb_per_s:.0f} GB/s to the CPU ({sharing.cpu_gb_per_s:.0f}) and PCIe "
               f"({sharing.pcie_gb_per_s:.0f}) together: {sharing.beside_gb_per_s:.0f} GB/s of headroom beside the "
               "CPU's reads")
    else:
        ddr = (f"the CPU alone saturates DDR ({sharing.cpu_gb_per_s:.0f} of {sharing.shared_gb_per_s:.0f} GB/s): "
               "PCIe reads it only while the CPU does not (GPU work, launches)")
    return (f"split, {price.cpu_permille}‰ of its output features on the CPU: " + "; ".join(parts)
            + f"; {ddr}; sync {sharing.split_sync_seconds * 1e6:.0f} µs")


def _experts_reason(placed, phase: str, experts: int, tier: str, deltas: dict) -> str:
    """Where an MoE layer's experts are (docs/cost-model.md Eq. 21), and what the layer would take with all its
    non-resident experts on the CPU, or all streamed to the GPU, instead."""
    cpu, streamed = placed.cpu(phase), placed.streamed(phase, experts)
    where = [f"{placed.hbm} of {experts} experts resident in HBM"] if placed.hbm else []
    if cpu:
        where.append(f"{cpu} on the CPU from {tier.upper()}")
    if streamed:
        where.append(f"{streamed} streamed to the GPU when routed")
    parts = []
    for target, name in ((1000, "all on the CPU"), (0, "all on the GPU (the non-resident ones streamed)")):
        delta = deltas.get(target)
        if target == (1000 if cpu == experts else 0 if cpu == 0 else -1):
            continue  # that is the plan
        if delta is None:
            parts.append(f"{name} not allowed" + (" (some are resident in HBM)" if target == 1000 else ""))
        else:
            parts.append(f"{name} the layer would take {_ms(abs(delta))} " + ("longer" if delta >= 0 else "less"))
    return ", ".join(where) + (f"; {'; '.join(parts)}" if parts else "")


def _serving_rows(plan, profile, graph) -> tuple[ServingRow, ...]:
    """Every live batch size of a serving plan, re-priced at its own batch (over one traced `graph`)."""
    batches, rows = plan.spec.serving.batches, plan.status.serving.batches
    if not batches:
        return ()
    gen = plan.spec.workload.gen_len
    out = []
    for batch, row in zip(batches, rows):
        live = batch_plan(plan, batch.batch_size)
        priced = price_plan(live, hw=profile, graph=graph)
        out.append(ServingRow(batch.batch_size, row.share, policy_string(live, "prefill"),
                              policy_string(live, "decode"), priced.total_seconds / gen, row.step_seconds,
                              row.own_step_seconds))
    return tuple(out)


def explain_plan(plan, source: str = "plan", hw=None, batch: int | None = None) -> Explanation:
    """Re-price `plan` (see the module docstring). `hw`: a profile (name, file, HardwareProfile) to use instead.
    `batch`: for a serving plan, the live batch size whose placement to explain (default: the largest)."""
    profile = plan_profile(plan, hw)
    from liac.passes.trace import trace_model  # late import: tracing loads torch (price_plan would load it too)

    graph = trace_model(plan.model_config)
    shared, serving = plan, _serving_rows(plan, profile, graph)
    if batch is not None:
        plan = batch_plan(plan, batch)
    price = price_plan(plan, hw=profile, graph=graph)
    work = price.costs.workload
    microbatch = price.costs.microbatch
    whole = Microbatch(work.batch_size, work.prompt_len)
    whole_costs = price.costs if microbatch == whole else plan_costs(plan, profile, graph, microbatch=whole)
    sharing = ddr_sharing(profile)
    prices = {(p.group, p.unit, p.phase): p for p in unit_prices(price)}
    spec = plan.spec
    used_hbm = next((u.used_bytes for u in plan.status.memory if u.tier == "hbm"), 0)
    hbm_free = spec.budgets.gpu_bytes - used_hbm
    buffers = staging_buffers(max(spec.execution.prefetch_depth, 1))
    experts = plan.model_config.num_experts
    groups, units = [], []
    for group in spec.layer_groups:
        priced = price.group(group.name)
        cls = price.costs.layer_class(group.layer_class)
        layer = {}
        for phase in PHASES:
            # a decode figure is per token step; a prefill's is the whole pass, all its micro-batches
            steps = max(cls.phase(phase).steps, 1) if phase == "decode" else 1
            # CPU permille (1000 = CPU, 0 = GPU, in between a split); a whole unit flips to the other device, a
            # split one to each device wholly
            planned = np.array([s.cpu_permille(phase) for s in group.sublayers])
            rows, flips = [planned], []
            for i, permille in enumerate(planned):
                targets = (1000, 0) if 0 < permille < 1000 or (group.sublayers[i].name == "experts" and experts) \
                    else (1000 - permille,)
                flips.append([(len(rows) + k, target) for k, target in enumerate(targets)])
                rows.extend(np.where(np.arange(len(planned)) == i, target, planned) for target in targets)
            moved = price.alternatives(group.name, phase, np.vstack(rows))
            seconds, staging, valid = moved.seconds, moved.staging_bytes, moved.valid
            layer[phase] = float(seconds[0]) / steps
            for index, sub in enumerate(group.sublayers):
                unit = prices[(group.name, sub.name, phase)]
                operand = cls.operands[index]
                tier = priced.tiers[index] if operand != "none" else "none"
                deltas = {target: float(seconds[row] - seconds[0]) / steps if valid[row] else None
                          for row, target in flips[index]}
                if sub.name == "experts" and experts:
                    others = [d for t, d in deltas.items() if d is not None and t != planned[index]]
                    delta = min(others, default=None)
                    reason = _experts_reason(expert_placement(sub, experts), phase, experts, tier, deltas)
                elif unit.device == "split":
                    delta = min((d for d in deltas.values() if d is not None), default=None)
                    reason = _split_reason(unit, deltas, sharing)
                else:
                    row = flips[index][0][0]
                    delta = deltas[flips[index][0][1]]
                    extra_staging = max(0.0, float(staging[row]) - spec.execution.staging_bytes) * buffers
                    reason = _flip_reason(operand, tier, unit, delta, extra_staging, hbm_free)
                units.append(UnitExplanation(group.name, sub.name, phase, unit.device, tier,
                                             unit.cpu_seconds, unit.gpu_seconds, unit.transfer_seconds_on_cpu,
                                             unit.transfer_seconds_on_gpu, unit.stream_seconds_on_gpu, delta,
                                             reason))
        groups.append(GroupInfo(group.name, group.layer_class, group.first_layer, group.layer_count,
                                group.kv_cache, layer))
    predicted = {"prefill_seconds": price.prefill_seconds, "decode_seconds_per_token": price.decode_seconds_per_token,
                 "total_seconds": price.total_seconds, "tokens_per_second": price.tokens_per_second}
    if plan is shared:  # the compiler's own numbers, as the plan states them (equal to the re-pricing)
        status = plan.status.predicted
        predicted = {"prefill_seconds": status.prefill_seconds,
                     "decode_seconds_per_token": status.decode_seconds_per_token,
                     "total_seconds": status.total_seconds, "tokens_per_second": status.tokens_per_second}
    return Explanation(
        source, spec.model.name, spec.hardware.profile, spec.workload.batch_size, spec.workload.prompt_len,
        spec.workload.gen_len, spec.workload.objective, predicted,
        tuple(_tier_pressure(shared)), tuple(groups), tuple(units),
        microbatch=f"{microbatch.sequences} sequence{'s' if microbatch.sequences > 1 else ''} x {microbatch.tokens} tokens",
        microbatches=microbatch.count(work),
        workspace_bytes=price.costs.layer_class("decoder").workspace_bytes,
        whole_batch_workspace_bytes=whole_costs.layer_class("decoder").workspace_bytes, serving=serving)


def render_text(ex: Explanation) -> str:
    """Plain-text report: header, memory per tier (binding first), then one table per group and phase."""
    p = ex.predicted
    lines = [f"{ex.source}: {ex.model} on {ex.hardware}, batch {ex.batch_size}, prompt {ex.prompt_len}, "
             f"gen {ex.gen_len} (objective {ex.objective})",
             f"predicted: prefill {p['prefill_seconds']:.3g} s, decode {p['decode_seconds_per_token']:.3g} s/token, "
             f"total {p['total_seconds']:.3g} s, {p['tokens_per_second']:.3g} tokens/s", "",
             "Memory per tier (binding constraints first):"]
    for tier in sorted(ex.tiers, key=lambda t: not t.binding):
        lines.append(f"  {'BINDING ' if tier.binding else ''}{tier.message}")
    lines += ["", f"Prefill: {ex.microbatches} micro-batch{'es' if ex.microbatches > 1 else ''} per layer of "
                  f"{ex.microbatch}; activation workspace {format_gib(ex.workspace_bytes)}"
                  + (f" (the whole batch at once would need {format_gib(ex.whole_batch_workspace_bytes)})"
                     if ex.microbatches > 1 else "")]
    if ex.serving:
        lines += ["", f"Serving: one memory placement, a compute placement per live batch size (this page explains "
                      f"batch {ex.batch_size}; --batch N another); step = (prefill + decode) / gen, re-priced here, "
                      "beside the plan's status and the step time of a plan for that batch size alone:",
                  f"    {'batch':>5} {'share':>6}  {'prefill policy':<24} {'decode policy':<24} {'step':>10} "
                  f"{'status':>10} {'alone':>10} {'sharing':>8}"]
        for row in ex.serving:
            cost = row.step_seconds / row.own_step_seconds - 1 if row.own_step_seconds > 0 else 0.0
            lines.append(f"    {row.batch_size:>5} {row.share:>6.2f}  {row.prefill_policy:<24} {row.decode_policy:<24} "
                         f"{_ms(row.step_seconds):>10} {_ms(row.status_step_seconds):>10} "
                         f"{_ms(row.own_step_seconds):>10} {100 * cost:>+7.1f}%")
    header = (f"    {'unit':<13} {'device':<6} {'operand in':<10} {'CPU':>11} {'GPU':>11} {'PCIe if CPU':>11} "
              f"{'if GPU':>11} {'stream':>11}   why (stream: if on the GPU)")
    for group in ex.groups:
        last = group.first_layer + group.layer_count - 1
        span = group.layer_class if group.layer_class != "decoder" else (
            f"layer {last}" if group.layer_count == 1 else f"layers {group.first_layer}..{last}")
        kv = f", KV cache in {group.kv_cache}" if group.kv_cache != "none" else ""
        lines += ["", f"group '{group.name}': {span} ({group.layer_count} layer"
                      f"{'s' if group.layer_count > 1 else ''}){kv}"]
        for phase in PHASES:
            per = "per layer per token step"
            if phase == "prefill":
                per = "per layer" + (f", in {ex.microbatches} micro-batches of {ex.microbatch}"
                                     if ex.microbatches > 1 and group.layer_class == "decoder" else "")
            lines += [f"  {phase}: {_ms(group.layer_seconds[phase])} {per}", header]
            for u in ex.units:
                if u.group != group.name or u.phase != phase:
                    continue
                numbers = (u.cpu_seconds, u.gpu_seconds, u.transfer_seconds_on_cpu, u.transfer_seconds_on_gpu,
                           u.stream_seconds_on_gpu)
                lines.append(f"    {u.unit:<13} {u.device.upper():<6} {u.operand_tier:<10} "
                             + " ".join(f"{_ms(n):>11}" for n in numbers) + f"   {u.reason}")
    return "\n".join(lines) + "\n"
