"""CostGraph + placement → seconds: the cost equations evaluated on a placement, and the price of a plan.

The CostGraph (passes/costs.py) prices every placement unit alone: its compute on each device with its operand in
each tier, the bytes it would stream or read, each activation edge's copy in each direction. This module is the
only code that combines those numbers for a placement (docs/cost-model.md):

    unit terms     compute on the chain (Eq. 1; a split's slower part plus the sync, Eq. 15), the DMA's room
                   beside a CPU part (Eq. 18a), streamed and read bytes (Eqs. 5, 6, 16), the KV write (Eq. 3), the
                   activation copies (Eqs. 2, 17), the stream rate of a tier (Eq. 5)
    layer_time     one layer in one phase: max(chain, stream, shared DDR, DMA fitted beside the CPU) per step, summed
                   over the phase's steps (Eqs. 4-9, 18), for many placements at once (`LayerTime`)
    LayerPricer    the same for many placements under many tier vectors: every term tabulated once per CPU share,
                   then gathered and summed in layer_time's order (the same floats): the ILP prices every
                   candidate with it
    unit_times     the same terms per unit, as `status.predicted.sublayers` reports them (`UnitTime`)
    price_groups   a plan's layer groups on a CostGraph → `PlanPrice`: what `emit_plan` writes into `status.predicted`
    price_plan     a plan alone → its `PlanPrice`, the CostGraph rebuilt from `spec` (explain, calibrate)

Everyone who needs a price calls here: the ILP (passes/ilp.py), `emit_plan`, `liac explain` (the per-unit prices
and the flip test, `PlanPrice.alternatives`) and `liac calibrate` (predictions under scaled profiles). A change to
how a placement is priced is a change to this file; a change to what one unit costs is a change to costs.py.

    price = price_plan(load_plan("plans/opt-30b.spr-h100/opt-30b.spr-h100.b1-p128-g32.yaml"))
    price.total_seconds == plan.status.predicted.total_seconds    # to the 6 digits the file keeps

Placements are given as the CPU's share of each unit's output features in permille, as the plan writes them:
1000 = CPU, 0 = GPU, in between a split at a share of the CostGraph's grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from liac.errors import LiacError
from liac.passes.costs import (SPLIT_PERMILLE, ClassCosts, CostGraph, EdgeCosts, Microbatch, PhaseCosts, TierBudgets,
                               UnitCosts, Workload, annotate_costs)
from liac.plan import (EXPERT_SLOTS, HOST_TIERS, PHASES, TIERS, LayerGroup, OffloadPlan, expert_placement,
                       experts_from_permille, placement_of)
from liac.profile import HardwareProfile, resolve_profile
from liac.sizes import GB

__all__ = ["SPLIT_OPS", "EXPERT_SPLIT_OPS", "LayerTime", "UnitTime", "UnitPrice", "GroupPrice", "PlanPrice",
           "DdrSharing", "operand_tiers", "gpu_shares", "share_transfer_seconds", "dma_beside_cpu_seconds",
           "shared_ddr_seconds",
           "expert_reads_beside_copies", "expert_ddr_shared_gb_per_s", "LayerPricer", "layer_time", "unit_times",
           "price_groups", "price_plan", "plan_profile", "plan_costs", "split_grid", "unit_prices", "ddr_sharing",
           "group_hbm_experts", "chain_ops"]


# Eq. 24: the ops the runtime dispatches for a split unit (its GPU part, its CPU part and their join), each costing
# the profile's `runtime_op_seconds` of host time; a whole unit is one op. On the H200 (2026-12-02, call 4's profiled
# decode steps) a split took 0.57-1.2 ms beyond its slower part and a GPU unit 0.17-0.31 ms beyond its kernel:
# 2.2-3.9 ops' worth per split (docs/benchmarks.md, "Where the decode time goes").
SPLIT_OPS = 3
# Eq. 21b: a split MoE experts unit is SPLIT_OPS ops and one more, the routing read on the host before either part
# (the router's indices, weights and normalised input cross from the GPU, then one synchronisation, then the
# counts per expert): on the H200 (2026-12-02 c, profiled decode steps) 0.15-0.27 ms per layer, ~o (0.21 ms).
EXPERT_SPLIT_OPS = SPLIT_OPS + 1

# Eq. 25: the option value (beside the CPU shares 0 … 1000 in permille) of a decode attention unit on the CPU whose
# partner (score's context, context's score) runs on the GPU: the runtime then runs it alone, a matmul over the
# cache's whole capacity, not the fused kernel of both on the CPU (costs.UnitCosts.cpu_apart_seconds).
APART = 1001


# ---------------------------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class LayerTime:
    """One layer of a class in one phase, for each of P placements (arrays of length P)."""

    seconds: np.ndarray  # Eq. 8: Eq. 7 summed over the phase's steps
    staging_bytes: np.ndarray  # Eq. 9: the most bytes one step stages on the GPU (streamed weights, KV, expert slots)
    valid: np.ndarray  # bool: the rules allow the placement (no CPU compute from HBM, splits from DDR/CXL only)
    chain_seconds: np.ndarray  # Eq. 4 summed: the sequential part alone (breaks ties the max() of Eq. 7 hides)


@dataclass(frozen=True)
class UnitTime:
    """One unit of a layer in one phase, as placed: means over the phase's steps (0 when it has none)."""

    name: str
    device: str  # 'cpu', 'gpu' or 'split'
    compute_seconds: float  # on the chain (a split: the slower part plus the sync, Eq. 15)
    transfer_seconds: float  # the activations it receives and the K, V it writes (Eqs. 2, 3, 17)
    stream_seconds: float  # its streamed bytes at the link rate, and a prefill's K, V writes to a host cache:
    # overlapped with compute (Eqs. 5, 7, 20)


@dataclass(frozen=True)
class UnitPrice:
    """One unit of one group in one phase: its time on each device, as the plan places its tensors (`liac explain`).

    `cpu_seconds` is None when the CPU may not compute it there (weights in HBM, or a decode KV cache in HBM).
    Transfers: the PCIe seconds its incoming and outgoing activations (and KV writes) cost with the unit wholly on
    each device, given where the plan puts its neighbours (a split neighbour's parts per Eq. 17);
    `stream_seconds_on_gpu` is what streaming its operand would take (0 when in HBM). `device` is the plan's
    placement ('cpu', 'gpu' or 'split'); for a split, `cpu_permille` is the CPU's share and `split_seconds` the
    slower of its two parts plus the profile's `split_sync_seconds` (Eq. 15).
    """

    group: str
    unit: str
    phase: str
    device: str
    cpu_seconds: float | None
    gpu_seconds: float
    transfer_seconds_on_cpu: float
    transfer_seconds_on_gpu: float
    stream_seconds_on_gpu: float
    cpu_permille: int = 0
    split_seconds: float | None = None


@dataclass(frozen=True)
class GroupPrice:
    """One layer group of a plan, priced as the plan places it."""

    group: LayerGroup
    tiers: tuple[str, ...]  # per unit, the tier of its operand (`operand_tiers`)
    layer_seconds: dict[str, float]  # phase → one layer, summed over the phase's steps (Eq. 8)
    units: dict[str, tuple[UnitTime, ...]]  # phase → per unit
    hbm_experts: int = 0  # an MoE layer's experts resident in HBM (its other experts are in the experts unit's tier)

    @property
    def name(self) -> str:
        return self.group.name


@dataclass(frozen=True)
class PlanPrice:
    """A plan's layer groups priced on a CostGraph: the numbers `status.predicted` holds, and the means to price
    an alternative placement of one group's layer (`alternatives`)."""

    costs: CostGraph
    groups: tuple[GroupPrice, ...]
    prefill_seconds: float  # Σ groups: layer_count × one layer's prefill
    decode_seconds: float  # Σ groups: layer_count × one layer's decode steps, all of them

    @property
    def decode_steps(self) -> int:
        return self.costs.workload.gen_len - 1

    @property
    def decode_seconds_per_token(self) -> float:
        return self.decode_seconds / self.decode_steps if self.decode_steps > 0 else 0.0

    @property
    def total_seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        work = self.costs.workload
        total = self.total_seconds
        return work.batch_size * work.gen_len / total if total > 0 else 0.0

    def group(self, name: str) -> GroupPrice:
        for priced in self.groups:
            if priced.name == name:
                return priced
        raise KeyError(name)

    def alternatives(self, group: str, phase: str, cpu_permille) -> LayerTime:
        """One layer of `group` in `phase` at each row of `cpu_permille` [P, U] (the group's tiers kept)."""
        priced = self.group(group)
        cls = self.costs.layer_class(priced.group.layer_class)
        return layer_time(self.costs, cls, phase, priced.tiers, cpu_permille, priced.hbm_experts)


@dataclass(frozen=True)
class DdrSharing:
    """How the CPU and PCIe DMA share DDR on a profile (docs/cost-model.md Eqs. 6, 18): why a split pays.

    `beside_gb_per_s` is what DMA can read while the CPU reads DDR at its own rate, min(PCIe, shared − CPU): 0
    when the CPU alone saturates DDR, and then a split gains only from DMA reading while the CPU does not.
    """

    cpu_gb_per_s: float
    pcie_gb_per_s: float
    shared_gb_per_s: float
    split_sync_seconds: float

    @property
    def beside_gb_per_s(self) -> float:
        return max(0.0, min(self.pcie_gb_per_s, self.shared_gb_per_s - self.cpu_gb_per_s))


# ---------------------------------------------------------------------------------------------------------------
# Placements


def operand_tiers(cls: ClassCosts, weights: tuple[str, ...], kv_cache: str) -> tuple[str, ...]:
    """Per unit, the tier its operand lives in: its weights' tier, the KV cache's for attention ('ddr' for a unit
    with neither, which reads only activations)."""
    out = []
    for operand, tier in zip(cls.operands, weights):
        out.append(tier if operand == "weights" else kv_cache if operand == "kv" else "ddr")
    return tuple(out)


def gpu_shares(cpu_permille) -> np.ndarray:
    """The GPU's share of each unit's output features (1 = GPU, 0 = CPU) for CPU shares in permille (`APART`: the
    CPU)."""
    return 1.0 - np.minimum(np.asarray(cpu_permille), 1000) / 1000.0


def _apart_pair(pc: PhaseCosts) -> tuple[int, int] | None:
    """The decode attention units (score, context) that the runtime runs apart when they sit on different devices
    (Eq. 25): the two units priced for it (`cpu_apart_seconds`); None when the phase has no such pair."""
    pair = tuple(index for index, unit in enumerate(pc.units) if unit.cpu_apart_seconds)
    return pair if len(pair) == 2 else None


def _with_apart(pc: PhaseCosts, permille: np.ndarray) -> np.ndarray:
    """[P, U] CPU shares → the option each unit is priced at: `APART` for a decode attention unit on the CPU whose
    partner is on the GPU (Eq. 25), its share otherwise."""
    pair = _apart_pair(pc)
    if pair is None:
        return permille
    out = np.array(permille, dtype=np.int64, copy=True)
    first, second = pair
    for unit, partner in ((first, second), (second, first)):
        out[:, unit] = np.where((permille[:, unit] == 1000) & (permille[:, partner] != 1000), APART,
                                permille[:, unit])
    return out


def _group_permille(group: LayerGroup, phase: str) -> tuple[int, ...]:
    return tuple(s.cpu_permille(phase) for s in group.sublayers)


def group_hbm_experts(cls: ClassCosts, group: LayerGroup) -> int:
    """How many of an MoE layer's experts a group keeps in HBM (0 for a class without an experts unit)."""
    for unit, sub in zip(cls.prefill.units, group.sublayers):
        if unit.experts:
            return expert_placement(sub, unit.experts).hbm
    return 0


# ---------------------------------------------------------------------------------------------------------------
# The terms of one unit


def share_transfer_seconds(seconds, fraction: np.ndarray, latency: float) -> np.ndarray:
    """[P, steps] seconds of copying `fraction` [P] of a transfer that takes `seconds` [steps] whole (Eqs. 2, 17):
    the bytes scale, the fixed latency does not; nothing copied costs nothing."""
    seconds = np.asarray(seconds, dtype=np.float64)[None, :]
    fraction = fraction[:, None]
    moved = (fraction > 0) & (seconds > 0)
    return np.where(moved, fraction * (seconds - latency) + latency, 0.0)


def _edge_seconds(costs: CostGraph, edge: EdgeCosts, shares: np.ndarray, partial: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Eqs. 2, 17: ([P, steps] H2D, [P, steps] D2H) of one activation edge: every device computing part of its
    destination needs the parts of its source that it lacks. A source whose parts are partial sums (MoE experts,
    `partial`) hands over its whole output from each device that computes part of it (Eq. 21)."""
    src, dst = shares[:, edge.src], shares[:, edge.dst]
    cpu_part, gpu_part = (1.0 - src, src) if not partial else ((src < 1).astype(float), (src > 0).astype(float))
    latency = costs.pcie_latency_seconds
    return (share_transfer_seconds(edge.h2d_seconds, cpu_part * (dst > 0), latency),
            share_transfer_seconds(edge.d2h_seconds, gpu_part * (dst < 1), latency))


def _kv_write_seconds(costs: CostGraph, unit: UnitCosts, kv_tier: str, share: np.ndarray) -> np.ndarray:
    """Eq. 3: [P, steps] seconds of copying the new K, V a unit at GPU share `share` [P] writes to the KV tier's side
    of PCIe (a split: its parts' shares)."""
    if kv_tier == "hbm":
        return share_transfer_seconds(unit.kv_to_gpu_seconds, 1.0 - share, costs.pcie_latency_seconds)
    return share_transfer_seconds(unit.kv_to_host_seconds, share, costs.pcie_latency_seconds)


def _stream_rate(costs: CostGraph, tier: str) -> float:
    """Eq. 5: bytes/s an operand in `tier` streams to the GPU at (DDR: PCIe; CXL: the slower of CXL and PCIe)."""
    return (costs.h2d_gb_per_s if tier == "ddr" else costs.cxl_stream_gb_per_s) * GB


def _kv_tier(cls: ClassCosts, tiers: tuple[str, ...]) -> str | None:
    """The class's KV tier in `tiers` (None for a class without a KV cache)."""
    return next((t for t, op in zip(tiers, cls.operands) if op == "kv"), None)


def chain_ops(pc: PhaseCosts, phase: str) -> int | None:
    """Eq. 21d: the host ops of a decode layer's units other than its MoE experts unit (one each, as Eq. 24 counts
    a whole unit), which run on the host thread after the experts op's CPU part; None in a prefill or a layer
    without an experts unit (no such chain is priced)."""
    if phase != "decode" or not any(u.experts for u in pc.units):
        return None
    return sum(1 for u in pc.units if not u.experts)


def _unit_options(costs: CostGraph, unit: UnitCosts, tier: str, permille: np.ndarray, steps: int,
                  hbm_experts: int = 0, other_ops: int | None = None, phase: str = "decode") -> dict:
    """Per distinct CPU permille in `permille` [O], arrays [O, steps]: 'compute' seconds on the chain (Eqs. 1, 15),
    'stream' bytes to the GPU, 'staged' bytes it needs in the staging buffer, 'read' bytes the CPU reads from the
    tier, 'cpu' seconds the CPU computes and the DDR bytes DMA can read 'beside' it (Eq. 18); and 'ok' [O], whether
    the option is allowed. An MoE experts unit keeps `hbm_experts` of its experts in HBM (Eq. 21); `other_ops`, the
    ops of its layer's other units at decode (`chain_ops`), prices its layer's host chain beside a CPU part (Eq. 21d).
    `phase` ('decode' or 'prefill'): Eq. 15b prices the start of a split's CPU part in decode only."""
    if unit.experts:
        return _expert_options(costs, unit, tier, permille, steps, hbm_experts, other_ops)
    tier_index = TIERS.index(tier)
    out = {key: np.zeros((permille.size, steps)) for key in ("compute", "stream", "read", "cpu", "beside",
                                                             "yield_read", "yield_cpu", "kv_read")}
    ok = np.ones(permille.size, dtype=bool)
    grid = {p: k for k, p in enumerate(costs.split_permille)}
    op = costs.runtime_op_seconds  # Eq. 24: the runtime's host time per unit it runs, on the chain
    for option, value in enumerate(permille):
        if value == 0:
            if phase == "prefill" and costs.prefill_op_hidden:
                # Eq. 24b: in a prefill the host thread dispatches a GPU unit while the GPU runs the kernels queued
                # before it, so its host time hides under its own kernels (per micro-batch); decode keeps Eq. 24
                out["compute"][option] = np.maximum(np.asarray(unit.gpu_seconds), op)
            else:
                out["compute"][option] = np.asarray(unit.gpu_seconds) + op
            out["stream"][option] = unit.stream_bytes
        elif value == 1000 or value == APART:
            # Eq. 25: a decode attention unit run apart from its partner, over the cache's capacity
            apart = value == APART and bool(unit.cpu_apart_seconds)
            seconds = (unit.cpu_apart_seconds if apart else unit.cpu_seconds)[tier_index]
            out["cpu"][option] = seconds
            out["compute"][option] = np.asarray(seconds) + op
            out["beside"][option] = (unit.cpu_apart_beside_bytes if apart else unit.cpu_beside_bytes)[tier_index]
            out["read"][option] = unit.cpu_apart_read_bytes if apart else unit.cpu_read_bytes
            if value == 1000 and unit.cpu_apart_seconds:  # Eq. 18c: the fused decode attention kernel yields DDR
                out["yield_read"][option], out["yield_cpu"][option] = out["read"][option], seconds
                out["kv_read"][option] = out["read"][option]  # Eqs. 6, 18c: at DDR's total beside this kernel
            ok[option] = tier != "hbm" or unit.cpu_allows_hbm
        elif unit.can_split and int(value) in grid:
            k = grid[int(value)]
            # Eq. 15: both parts run at once; the unit is done when the slower one is, and the join costs the sync
            # on top; the runtime dispatches its GPU part, its CPU part and the join: SPLIT_OPS ops (Eq. 24)
            # Eq. 15b: in decode the CPU part starts late by the profile's split_cpu_start_seconds (0: unpriced)
            start = costs.split_cpu_start_seconds if phase == "decode" else 0.0
            out["compute"][option] = (np.maximum(np.asarray(unit.split_cpu_seconds[k][tier_index]) + start,
                                                 unit.split_gpu_seconds[k])
                                      + costs.split_sync_seconds + SPLIT_OPS * op)
            out["cpu"][option] = unit.split_cpu_seconds[k][tier_index]
            out["beside"][option] = unit.split_cpu_beside_bytes[k][tier_index]
            out["stream"][option] = unit.split_stream_bytes[k]
            out["read"][option] = unit.split_cpu_read_bytes[k]
            ok[option] = tier in HOST_TIERS  # a split reads its CPU share from DDR/CXL, never from HBM
        elif unit.can_split:
            raise ValueError(f"unit '{unit.name}' is priced at CPU shares {costs.split_permille} permille, not {value}")
        else:
            ok[option] = False  # this unit cannot split
    out["staged"] = out["stream"]  # Eq. 9: what it streams, it stages
    out["ok"] = ok
    return out


def _expert_options(costs: CostGraph, unit: UnitCosts, tier: str, permille: np.ndarray, steps: int,
                    hbm: int, other_ops: int | None = None) -> dict:
    """`_unit_options` of an MoE experts unit (Eq. 21): of its E experts, `hbm` are resident in HBM, and at a CPU
    share `permille` the CPU computes c of the others from `tier` (1000 · c // E = permille), while the GPU computes
    the resident ones and the s = E − hbm − c streamed ones. Streamed experts are copied only when routed, so after
    the router: their expected routed bytes cross PCIe on the chain (the GPU meanwhile computing the resident
    experts), one expert's compute after the last copy, and the copies need `EXPERT_SLOTS` slots in the staging
    buffer. Both devices at once: the slower part plus the sync of a split (Eq. 15), where (Eq. 21b) the CPU's part
    begins once the one host thread has dispatched the GPU's routed experts (an op each, Eq. 24), and the routed
    experts' copies and the CPU's expert reads share DDR while both run (Eq. 6 over the unit alone), the CPU's
    reads beside the copies at the rate its expert kernel keeps beside a copy (Eq. 21c).

    Eq. 21d (decode, `other_ops` given, the profile's `runtime_op_seconds_beside_cpu` o_c > 0): with a CPU part the
    one host thread runs, after it, the merge, the layer's other units' launches (the next layer's attention and
    router) and the routing read, while the GPU finishes only its copies: the layer's host ops (the GPU's routed
    experts dispatched, this unit's own, the `other_ops` of the layer's other units) at o_c each join the CPU side
    of the max, and the other units' Eq. 24 ops, which the chain adds with each of them, are taken back here."""
    experts = unit.experts
    beside_cpu = costs.runtime_op_seconds_beside_cpu if other_ops is not None else 0.0
    tier_index = TIERS.index(tier)
    out = {key: np.zeros((permille.size, steps)) for key in ("compute", "stream", "staged", "read", "cpu", "beside",
                                                             "yield_read", "yield_cpu", "kv_read")}
    ok = np.ones(permille.size, dtype=bool)
    one_expert = np.asarray(unit.expert_bytes, dtype=np.float64)
    rate = _stream_rate(costs, tier) if tier in HOST_TIERS else 1.0
    # E_hit / E per step: the share of an expert's weights a step reads, i.e. the chance that it is routed at all
    routed = one_expert / unit.expert_slot_bytes if unit.expert_slot_bytes else np.zeros(steps)
    for option, value in enumerate(permille):
        cpu_count = experts_from_permille(int(value), experts)
        streamed = experts - hbm - cpu_count
        gpu_count = experts - cpu_count
        ok[option] = streamed >= 0 and (tier in HOST_TIERS or (hbm == experts and cpu_count == 0))
        if not ok[option] or steps == 0:
            continue
        cpu = np.asarray(unit.expert_cpu_seconds[cpu_count][tier_index]) if cpu_count else np.zeros(steps)
        gpu = np.asarray(unit.expert_gpu_seconds[gpu_count])
        gpu_side = gpu
        if streamed:
            copy = streamed * one_expert / rate + costs.pcie_latency_seconds
            gpu_side = np.maximum(copy, gpu) + np.asarray(unit.expert_gpu_seconds[1])  # the last expert after its copy
            out["stream"][option] = streamed * one_expert
            out["staged"][option] = min(streamed, EXPERT_SLOTS) * unit.expert_slot_bytes
        both = cpu_count > 0 and gpu_count > 0
        cpu_side, unit_seconds = cpu, None
        chain = beside_cpu > 0 and cpu_count > 0  # Eq. 21d: the layer's host chain beside the CPU part
        own_ops = EXPERT_SPLIT_OPS if both else 1
        if both:
            # Eq. 21b: the host dispatches the GPU's routed experts before it computes the CPU's, an op each (Eq. 24)
            if not chain:
                cpu_side = cpu + gpu_count * routed * costs.runtime_op_seconds
            if streamed and tier == "ddr":  # Eq. 6 over the unit: its copies and the CPU's reads share DDR
                unit_seconds = (cpu_count + streamed) * one_expert / (expert_ddr_shared_gb_per_s(costs) * GB)
                cpu_side = cpu_side + expert_reads_beside_copies(cpu_count * one_expert, unit.expert_slot_bytes,
                                                                 costs)  # Eq. 21c
        if chain:
            # Eq. 21d: the DDR term is how long the CPU part itself takes (its reads wait for DDR beside the copies);
            # the host chain follows it on the one host thread, so it adds to it rather than hiding under it
            if unit_seconds is not None:
                cpu_side, unit_seconds = np.maximum(cpu_side, unit_seconds), None
            cpu_side = cpu_side + (gpu_count * routed + own_ops + other_ops) * beside_cpu
        slower = np.maximum(cpu_side, gpu_side)
        if unit_seconds is not None:
            slower = np.maximum(slower, unit_seconds)
        if chain:  # Eq. 21d: every host op of the layer is in the CPU side; the others' Eq. 24 ops taken back
            out["compute"][option] = np.maximum(slower + (costs.split_sync_seconds if both else 0.0)
                                                - other_ops * costs.runtime_op_seconds, 0.0)
        else:
            out["compute"][option] = (slower + (costs.split_sync_seconds if both else 0.0)
                                      + own_ops * costs.runtime_op_seconds)  # Eq. 24
        out["cpu"][option] = cpu
        if cpu_count:
            out["beside"][option] = unit.expert_cpu_beside_bytes[cpu_count][tier_index]
            out["read"][option] = cpu_count * one_expert
            # Eq. 18c: the experts' GEMMs keep the fluid stretch they were calibrated with (docs/moe.md)
            out["yield_read"][option], out["yield_cpu"][option] = out["read"][option], cpu
    out["ok"] = ok
    return out


def expert_ddr_shared_gb_per_s(costs: CostGraph) -> float:
    """Eq. 21b's DDR rate for a split experts unit: DDR's total measured in that unit's own pattern (the CPU's
    expert GEMVs beside several routed experts' copies, `ddr_shared_experts_gb_per_s`) where the profile has it,
    else the GEMV's beside one copy (`ddr_shared_gb_per_s`, Eq. 6)."""
    return costs.ddr_shared_experts_gb_per_s or costs.ddr_shared_gb_per_s


def expert_reads_beside_copies(read_bytes, expert_bytes: float, costs: CostGraph):
    """Eq. 21c: the seconds a split experts unit's CPU side takes beyond its expert reads at the alone rate
    (`cpu_ddr_read_gb_per_s`): its first expert's worth of reads (`expert_bytes`, one expert's weights; all of
    `read_bytes`, the CPU's expected expert bytes per step, when fewer) runs at the rate the CPU's expert kernel
    keeps when it starts after the layer's GPU work with an expert's copy beside it
    (`cpu_expert_beside_copy_gb_per_s`, probed on the expert's own shapes), the rest at the alone rate.
    Elementwise over `read_bytes`; 0 where the beside rate is not measured or not below the alone rate."""
    alone, beside = costs.cpu_ddr_read_gb_per_s * GB, costs.cpu_expert_beside_copy_gb_per_s * GB
    read_bytes = np.asarray(read_bytes, dtype=np.float64)
    if not 0 < beside < alone:
        return np.zeros_like(read_bytes)
    return np.minimum(read_bytes, expert_bytes) * (1.0 / beside - 1.0 / alone)


def shared_ddr_seconds(cpu_bytes, kv_bytes, stream_bytes, costs: CostGraph):
    """Eq. 6: the least time DDR takes to serve the CPU's reads of it (`cpu_bytes`, of which `kv_bytes` the fused
    decode attention's KV reads) and the DMA's (`stream_bytes`). At one shared rate s: (R + S) / s. Where the
    profile measures DDR's total beside the fused attention apart (s_kv, `ddr_shared_kv_gb_per_s`), each CPU byte
    brings its share of the stream at its own kernel's rate:

        T_shared = (R + S) · (R_w / s + R_kv / s_kv) / R      (R = R_w + R_kv > 0; S / s when R = 0)
    """
    s = costs.ddr_shared_gb_per_s * GB
    if not costs.ddr_shared_kv_gb_per_s or costs.ddr_shared_kv_gb_per_s == costs.ddr_shared_gb_per_s:
        return (cpu_bytes + stream_bytes) / s
    s_kv = costs.ddr_shared_kv_gb_per_s * GB
    kv = np.minimum(kv_bytes, cpu_bytes)
    seconds_per_byte = np.where(cpu_bytes > 0, ((cpu_bytes - kv) / s + kv / s_kv) / np.maximum(cpu_bytes, 1e-30),
                                1.0 / s)
    return (cpu_bytes + stream_bytes) * seconds_per_byte


def _yield_shared(yield_bytes, kv_bytes, costs: CostGraph):
    """Eq. 18c's shared rate (GB/s) beside the kernels that yield DDR: the GEMV's s, or where the profile measures
    DDR's total beside the fused attention (s_kv), their mean over the yielding bytes (harmonic: R_y / Σ R_i / s_i);
    None where that is s."""
    if not costs.ddr_shared_kv_gb_per_s or costs.ddr_shared_kv_gb_per_s == costs.ddr_shared_gb_per_s:
        return None
    s, s_kv = costs.ddr_shared_gb_per_s, costs.ddr_shared_kv_gb_per_s
    kv = np.minimum(kv_bytes, yield_bytes)
    return np.where(yield_bytes > 0, yield_bytes / np.maximum((yield_bytes - kv) / s + kv / s_kv, 1e-30), s)


def dma_beside_cpu_seconds(chain, cpu_seconds, beside_bytes, cpu_bytes, stream_bytes, h2d_gb_per_s: float,
                           shared_gb_per_s: float, yield_seconds=None, yield_shared_gb_per_s=None):
    """Eq. 18: the least step time that fits the DMA's reads of DDR beside the CPU's (elementwise over arrays).

    A fluid model of the memory system. While the CPU computes (`cpu_seconds` of the chain), DMA can read the
    `beside_bytes` the CPU's kernels leave it (Eq. 18a, per kernel: what the shared DDR rate leaves beside the
    kernel's own reads, at most the PCIe rate; its launch overhead at min(PCIe, shared)); the rest of the chain
    (GPU work, transfers, a split's sync) it reads DDR alone, at min(PCIe, shared). When the streamed bytes do not
    fit, the step stretches: first by slowing the reads of the CPU kernels that yield DDR (Eq. 18c: `cpu_bytes`
    and `yield_seconds` are theirs, the fused decode attention's and MoE experts'; `yield_seconds` defaults to
    `cpu_seconds`, every kernel yielding), each second of it giving the DMA `shared` bytes, until the DMA beside
    them runs at the PCIe rate (their seconds = cpu_bytes / (shared − PCIe)); then by waiting for the DMA alone. A
    weight GEMV does not yield: beside it the deficit waits for the DMA at the PCIe rate. So where the CPU alone
    saturates DDR (shared = its rate), moving a unit's bytes from the CPU to PCIe gains only what DMA reads while
    the CPU does not read DDR.
    """
    h, s = h2d_gb_per_s * GB, shared_gb_per_s * GB
    chain = np.asarray(chain, dtype=np.float64)
    gaps = np.maximum(chain - cpu_seconds, 0.0)
    deficit = np.maximum(stream_bytes - beside_bytes - min(h, s) * gaps, 0.0)
    if s <= h:  # the DMA alone gets the shared rate: every second of stretch gives it that
        return chain + deficit / s
    yield_seconds = cpu_seconds if yield_seconds is None else yield_seconds
    if yield_shared_gb_per_s is not None:  # beside the fused attention DDR serves its own total (Eq. 6)
        s = np.maximum(np.asarray(yield_shared_gb_per_s, dtype=np.float64) * GB, h * (1 + 1e-9))
    slow = np.maximum(cpu_bytes / (s - h) - yield_seconds, 0.0)
    return chain + np.where(deficit <= s * slow, deficit / s, slow + (deficit - s * slow) / h)


# ---------------------------------------------------------------------------------------------------------------
# One layer


def _overlapped_kv_write(phase: str, kv_tier: str | None) -> bool:
    """Eq. 20: a prefill writes its K, V into a host cache on a stream of its own, beside the compute of the
    micro-batches and layers that follow; a decode step's small write stays on the chain (Eq. 3). (Unless the
    layer's attention reads them there on the CPU: `_attention_waits_for_kv`.)"""
    return phase == "prefill" and kv_tier in HOST_TIERS


def _attention_waits_for_kv(cls: ClassCosts, phase: str, kv_tier: str | None, permille: np.ndarray) -> np.ndarray:
    """Eq. 20a: [P] whether a prefill's K, V write to a host cache is on the chain after all: an attention unit of
    the layer computes on the CPU (permille [P, U]) and reads this step's K, V in that cache, so it starts once the
    GPU's write of them has landed (runtime/executor.py, kv_read 'stored'); nothing of the layer runs beside it."""
    attention = [u for u, operand in enumerate(cls.operands) if operand == "kv"]
    if not _overlapped_kv_write(phase, kv_tier) or not attention:
        return np.zeros(permille.shape[0], dtype=bool)
    return (permille[:, attention] == 1000).any(axis=1)


def _per_pass(values: np.ndarray, pc: PhaseCosts, phase: str) -> np.ndarray:
    """[P, steps] → [P]: a prefill pass sums its micro-batches (each step as often as micro-batches share it); a
    decode phase's figure is its mean step."""
    if phase == "prefill":
        return (values * np.asarray(pc.step_repeats, dtype=np.float64)[None, :]).sum(axis=1)
    return values.mean(axis=1)


def _common(tiers: tuple[str, ...], previous: tuple[str, ...], most: int) -> int:
    """How many leading units (at most `most`) two tier vectors agree on."""
    common = 0
    while common < most and common < len(previous) and tiers[common] == previous[common]:
        common += 1
    return common


def _plus(total: np.ndarray, term: np.ndarray, own: dict | None) -> np.ndarray:
    """total + term: in place when `total` is in `own` and the shapes allow ([.., 1] terms broadcast over the
    steps, each element summed as from a full array), else a new array, which joins `own` (when given)."""
    if own is not None and id(total) in own and term.shape[1] <= total.shape[1]:
        np.add(total, term, out=total)
        return total
    out = total + term
    if own is not None:
        own[id(out)] = out
    return out


def _full(values: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """`values` as a C-contiguous array of `shape` (broadcast and copied unless it already is one): summed along
    its rows, every element is then summed in the same order whatever shape it was priced in."""
    if values.shape == shape and values.flags.c_contiguous:
        return values
    return np.broadcast_to(values, shape).copy()


def _table(values: np.ndarray) -> np.ndarray | None:
    """[V, steps] → itself, [V, 1] when constant over the steps, None when all zero (adding it changes nothing)."""
    values = np.asarray(values, dtype=np.float64)
    if not values.any():
        return None
    if values.shape[1] > 1 and (values == values[:, :1]).all():
        return values[:, :1].copy()
    return values


class LayerPricer:
    """`layer_time` for many placements under many tier vectors of one layer class in one phase.

    Every term of a layer's time is a unit's own (its compute, bytes and K, V write at its CPU share, given its
    operand's tier) or an activation edge's (given the shares of its two ends). The pricer computes each once per
    CPU share that occurs in `permille` [P, U] (per unit) and keeps it, so pricing a batch of placements is gathers
    and sums in the order of `layer_time`'s equations: the same floats, bit for bit, as pricing each alone. Terms
    constant over the steps (a weight GEMM's) stay [.., 1] until they meet one that is not, and all-zero terms are
    skipped.

        pricer = LayerPricer(costs, cls, "decode", all_rows)
        pricer.price(tiers, rows, hbm_experts)       # == layer_time(costs, cls, "decode", tiers, rows, hbm_experts)
    """

    def __init__(self, costs: CostGraph, cls: ClassCosts, phase: str, permille):
        self.costs, self.cls, self.phase = costs, cls, phase
        self.pc = pc = cls.phase(phase)
        permille = _with_apart(pc, np.asarray(permille, dtype=np.int64).reshape(-1, len(pc.units)))
        self.values = [np.unique(permille[:, u]) for u in range(len(pc.units))]  # per unit, the shares priced
        self.lookup = np.full((len(pc.units), APART + 1), -1, dtype=np.int64)
        for u, values in enumerate(self.values):
            self.lookup[u, values] = np.arange(values.size)
        self.shares = [gpu_shares(values) for values in self.values]
        self.steps = max(pc.steps, 1)
        self._options: dict = {}
        self._kv: dict = {}
        self._edges: list | None = None
        self._gathered: dict = {}

    def _unit(self, index: int, tier: str, hbm_experts: int) -> dict:
        unit = self.pc.units[index]
        key = (index, tier, hbm_experts if unit.experts else 0)
        if key not in self._options:
            options = _unit_options(self.costs, unit, tier, self.values[index], self.steps if self.pc.steps else 0,
                                    hbm_experts, chain_ops(self.pc, self.phase), self.phase)
            if self.pc.steps:
                options = {name: (_table(v) if name != "ok" else v) for name, v in options.items()}
            self._options[key] = options
        return self._options[key]

    def _kv_write(self, index: int, kv_tier: str) -> np.ndarray | None:
        key = (index, kv_tier)
        if key not in self._kv:
            self._kv[key] = _table(_kv_write_seconds(self.costs, self.pc.units[index], kv_tier, self.shares[index]))
        return self._kv[key]

    def _edge_tables(self) -> list:
        """Per edge, (src, dst, its copies H2D and D2H as [V_src · V_dst, steps] tables (or None))."""
        if self._edges is None:
            self._edges = []
            units = len(self.pc.units)
            for edge in self.pc.edges:
                src, dst = self.shares[edge.src], self.shares[edge.dst]
                pairs = np.zeros((src.size * dst.size, units))
                pairs[:, edge.src] = np.repeat(src, dst.size)
                pairs[:, edge.dst] = np.tile(dst, src.size)
                copies = _edge_seconds(self.costs, edge, pairs, bool(self.pc.units[edge.src].experts))
                self._edges.append((edge.src, edge.dst, dst.size, tuple(_table(c) for c in copies)))
        return self._edges

    def price(self, tiers: tuple[str, ...], cpu_permille, hbm_experts: int = 0) -> LayerTime:
        """`layer_time(costs, cls, phase, tiers, cpu_permille, hbm_experts)` (every share in `cpu_permille` must be
        one the pricer was built with)."""
        return self.price_many([(tiers, cpu_permille, hbm_experts, None)])[0]

    def price_many(self, items) -> list[LayerTime]:
        """`price` for each (tiers, cpu_permille, hbm_experts, key) of `items`, in their order. Items with the same
        `key` (not None) must have the same `cpu_permille` (one array, a tier vector's placements shared with
        others): their sums over the first units are shared where their tiers agree on those units (the terms of
        unit u added to the same partial sums: the same floats, bit for bit, as `price` alone)."""
        out: list = [None] * len(items)
        if self.pc.steps == 0:
            for i, (tiers, permille, hbm_experts, _) in enumerate(items):
                index = self._index(permille)
                valid = np.ones(index.shape[0], dtype=bool)
                for u in range(len(self.pc.units)):
                    valid &= self._unit(u, tiers[u], hbm_experts)["ok"][index[:, u]]
                num = index.shape[0]
                out[i] = LayerTime(np.zeros(num), np.zeros(num), valid, np.zeros(num))
            return out
        # in an order where items sharing placements and leading tiers follow each other
        kv_tiers = [_kv_tier(self.cls, tiers) for tiers, _, _, _ in items]
        keyed = [((0, id(permille)) if key is None else (1, key), hbm_experts, kv_tiers[i] or "")
                 for i, (_, permille, hbm_experts, key) in enumerate(items)]
        order = sorted(range(len(items)), key=lambda i: (keyed[i], items[i][0]))
        bases = [keyed[i] for i in order]
        units = len(self.pc.units)
        base, index, stack, previous = None, None, [], ()
        for position, i in enumerate(order):
            tiers, permille, hbm_experts, key = items[i]
            kv_tier = kv_tiers[i]
            if bases[position] != base or key is None:
                base, index, stack, previous = bases[position], self._index(permille), [], ()
                self._gathered = {}  # a table's rows at these placements: the same for every vector of the base
            common = _common(tiers, previous, len(stack))
            del stack[common:]
            # the next item starts from the states over its common units with this one: sums past them are this
            # item's own and may be added to in place
            shared = 0
            if position + 1 < len(order) and bases[position + 1] == base and key is not None:
                shared = _common(items[order[position + 1]][0], tiers, units)
            state = stack[-1] if stack else self._start(index.shape[0])
            own: dict = {}  # id → array: this item's own partial sums (kept alive, so ids stay unique)
            for u in range(common, units):
                state = self._add_unit(state, u, tiers[u], hbm_experts, kv_tier, index[:, u], own if u >= shared else None)
                stack.append(state)
            previous = tiers
            out[i] = self._finish(state, index, own, kv_tier, tiers, hbm_experts)
        return out

    def _index(self, cpu_permille) -> np.ndarray:
        """[P, U] positions of each placement's shares among the ones priced per unit."""
        pc = self.pc
        permille = _with_apart(pc, np.asarray(cpu_permille, dtype=np.int64).reshape(-1, len(pc.units)))  # Eq. 25
        index = np.empty_like(permille)
        for u in range(len(pc.units)):
            index[:, u] = self.lookup[u, permille[:, u]]
        if (index < 0).any():
            raise ValueError(f"placements at CPU shares the pricer was not built with: {permille[(index < 0).any(axis=1)][0]}")
        return index

    @staticmethod
    def _start(num: int) -> tuple:
        """(valid, chain, stream_ddr, stream_cxl, staged, cpu_ddr, cpu_seconds, beside, store, yield_ddr,
        yield_seconds, kv_ddr) before any unit."""
        zero = np.zeros((num, 1))
        return (np.ones(num, dtype=bool),) + (zero,) * 11

    def _add_unit(self, state: tuple, u: int, tier: str, hbm_experts: int, kv_tier: str | None,
                  rows: np.ndarray, own: dict | None = None) -> tuple:
        """The partial sums `state` with unit u's terms added (a new tuple). Only arrays in `own` are written to
        (in place, the same sums); with `own` given, the arrays made here join it."""
        (valid, chain, stream_ddr, stream_cxl, staged, cpu_ddr, cpu_seconds, beside, store, yield_ddr,
         yield_seconds, kv_ddr) = state
        options = self._unit(u, tier, hbm_experts)
        valid = valid & options["ok"][rows]
        gathered = self._gathered

        def add(total, name):
            table = options[name]
            if table is None:
                return total
            key = (u, tier, name)
            term = gathered.get(key)
            if term is None:
                term = gathered[key] = table[rows]
            return _plus(total, term, own)

        chain = add(chain, "compute")  # Eqs. 1, 15, 21
        if tier in HOST_TIERS:
            staged = add(staged, "staged")
        cpu_seconds = add(cpu_seconds, "cpu")
        yield_seconds = add(yield_seconds, "yield_cpu")  # Eq. 18c: the CPU kernels whose DDR reads yield to DMA
        beside = add(beside, "beside")
        if tier == "ddr":
            stream_ddr = add(stream_ddr, "stream")
            cpu_ddr = add(cpu_ddr, "read")
            yield_ddr = add(yield_ddr, "yield_read")
            kv_ddr = add(kv_ddr, "kv_read")
        elif tier == "cxl":
            stream_cxl = add(stream_cxl, "stream")
        if kv_tier is not None:
            written = self._kv_write(u, kv_tier)  # Eq. 3
            if written is not None:
                key = (u, kv_tier, "kv")
                if key not in gathered:
                    gathered[key] = written[rows]
                if _overlapped_kv_write(self.phase, kv_tier):
                    store = _plus(store, gathered[key], own)
                else:
                    chain = _plus(chain, gathered[key], own)
        return (valid, chain, stream_ddr, stream_cxl, staged, cpu_ddr, cpu_seconds, beside, store, yield_ddr,
                yield_seconds, kv_ddr)

    def _copy_queue(self, index: np.ndarray, kv_tier: str | None, tiers: tuple[str, ...],
                    hbm_experts: int) -> np.ndarray | None:
        """Eq. 26 (decode): [P, steps] the seconds the chain runs, per step, from the first host → GPU activation
        crossing after the layer's staging release through that release (cyclically: the layer's units in order,
        the next layer's like them, A1), while the copy engine has nothing to copy; 0 where the layer streams no
        prefetched operand or has no such crossing. None when no placement has one.

        The release (after the last unit that reads the staging buffer) queues the copy of the stream unit two
        ahead; host → GPU copies of all streams run in the order they were queued on the one copy engine, so the
        first crossing queued after it waits for that whole copy, and the copy after it is queued only at the next
        release. A crossing out of a split unit is its join, inside the split op (the release follows it).

        Where the release and the first crossing are depends on the placements and on which operands are off HBM
        only (a unit streams the same bytes from DDR as from CXL): `_queue_window` computes them once per
        placements' base and host pattern, and each unit's masked term once per tier; the terms are added in the
        same order as ever (the same floats)."""
        units = len(self.pc.units)
        host = tuple(t in HOST_TIERS for t in tiers)
        window = self._queue_window(index, tiers, hbm_experts, host)
        if window is None:
            return None
        inside, crossing = window
        gathered = self._gathered

        def masked(key, table, rows, u):  # `rows()`: the table's rows at the placements, only when not kept yet
            key = ("queue", host) + key
            term = gathered.get(key)
            if term is None:
                term = gathered[key] = np.where(inside[u], table[rows()], 0.0)
            return term

        tail = np.zeros((index.shape[0], 1))
        own = {id(tail): tail}  # the sum is this call's own: added to in place where the shapes allow (`_plus`)
        for u in range(units):
            table = self._unit(u, tiers[u], hbm_experts)["compute"]
            if table is not None:
                tail = _plus(tail, masked((u, tiers[u], "compute"), table, lambda: index[:, u], u), own)
            if kv_tier is not None:
                table = self._kv_write(u, kv_tier)
                if table is not None:
                    tail = _plus(tail, masked((u, kv_tier, "kv"), table, lambda: index[:, u], u), own)
        for edge, (src, dst, width, copies) in enumerate(self._edge_tables()):
            for k, table in enumerate(copies):
                if table is not None:
                    tail = _plus(tail, masked(("edge", edge, k), table,
                                              lambda: index[:, src] * width + index[:, dst], dst), own)
        return np.where(crossing, tail, 0.0)

    def _queue_window(self, index: np.ndarray, tiers: tuple[str, ...], hbm_experts: int, host: tuple[bool, ...]):
        """`_copy_queue`'s window at these placements (kept per base and host pattern `host`): ([P, 1] per unit,
        whether it runs from the first crossing to the release; [P, 1] whether a placement has such a crossing),
        or None when no placement has one."""
        key = ("queue window", host)
        if key in self._gathered:
            return self._gathered[key]
        pc, units = self.pc, len(self.pc.units)
        num = index.shape[0]
        window = None
        last = np.full(num, -1, dtype=np.int64)  # the staging buffer's last reader (its release follows it)
        for u in range(units):
            if tiers[u] in HOST_TIERS and not pc.units[u].experts:  # routed experts are copied in their op
                stream = self._unit(u, tiers[u], hbm_experts)["stream"]
                if stream is not None:
                    last = np.where(stream[index[:, u]].max(axis=1) > 0, u, last)
        if not (last < 0).all():
            shares = [self.shares[u][index[:, u]] for u in range(units)]

            def position(u):  # [P] u's place in the cyclic order that starts right after the release
                return (u - last - 1) % units

            first = np.full(num, units, dtype=np.int64)
            gathered = self._gathered
            for edge, (src, dst, width, copies) in enumerate(self._edge_tables()):
                if copies[0] is None:
                    continue
                edge_key = ("edge", edge, 0)
                if edge_key not in gathered:
                    gathered[edge_key] = copies[0][index[:, src] * width + index[:, dst]]
                crosses = gathered[edge_key].max(axis=1) > 0
                join = (shares[src] > 0) & (shares[src] < 1)  # a split's CPU part joins the GPU's at its own op
                at = np.where(join, position(src) + 1, position(dst))
                first = np.where(crosses & (at < units), np.minimum(first, at), first)
            first = np.where(last >= 0, first, units)
            if not (first >= units).all():
                inside = [(position(u) >= first)[:, None] for u in range(units)]  # from it to the release
                window = (inside, (first < units)[:, None])
        self._gathered[key] = window
        return window

    def _finish(self, state: tuple, index: np.ndarray, own: dict, kv_tier: str | None = None,
                tiers: tuple[str, ...] | None = None, hbm_experts: int = 0) -> LayerTime:
        """Every unit's terms summed (`state`) → the layer's time: the activation copies, then Eqs. 5-9, 18, 20,
        20a, 26. Only the arrays in `own` (this item's own partial sums) are written to."""
        costs, pc, phase = self.costs, self.pc, self.phase
        (valid, chain, stream_ddr, stream_cxl, staged, cpu_ddr, cpu_seconds, beside, store, yield_ddr,
         yield_seconds, kv_ddr) = state
        num = index.shape[0]
        gathered = self._gathered
        waits = None
        if _overlapped_kv_write(phase, kv_tier):  # (a prefill over a host cache only)
            permille = np.stack([self.values[u][index[:, u]] for u in range(len(pc.units))], axis=1)
            waits = _attention_waits_for_kv(self.cls, phase, kv_tier, permille)
        if waits is not None and waits.any():  # Eq. 20a: the K, V write the CPU's attention reads is on the chain
            for u in range(len(pc.units)):
                written = self._kv_write(u, kv_tier)
                if written is not None:
                    chain = _plus(chain, np.where(waits[:, None], written[index[:, u]], 0.0), own)
        for edge, (src, dst, width, copies) in enumerate(self._edge_tables()):  # Eqs. 2, 17
            pair = None
            for k, table in enumerate(copies):
                if table is not None:
                    key = ("edge", edge, k)
                    if key not in gathered:
                        pair = index[:, src] * width + index[:, dst] if pair is None else pair
                        gathered[key] = table[pair]
                    chain = _plus(chain, gathered[key], own)
        full = (num, self.steps)
        if phase == "prefill":  # Eq. 20: one pass over the micro-batches; the weights are staged once for all
            chain, cpu_seconds, beside, cpu_ddr, store = (_per_pass(np.broadcast_to(v, full), pc, phase)[:, None]
                                                          for v in (chain, cpu_seconds, beside, cpu_ddr, store))
            stream_ddr, stream_cxl = stream_ddr.max(axis=1, keepdims=True), stream_cxl.max(axis=1, keepdims=True)
            # Eq. 18c in decode only: a prefill keeps the stretch Eq. 18a's rule was fitted with (every kernel yields)
            yield_ddr, yield_seconds = cpu_ddr, cpu_seconds
            kv_ddr = 0.0 * cpu_ddr  # (a prefill's attention reads fresh K, V, not the cache)
        t_stream = stream_ddr / _stream_rate(costs, "ddr") + stream_cxl / _stream_rate(costs, "cxl")  # Eq. 5
        t_shared = shared_ddr_seconds(cpu_ddr, kv_ddr, stream_ddr, costs)  # Eq. 6
        t_beside = dma_beside_cpu_seconds(chain, cpu_seconds, beside, yield_ddr, stream_ddr, costs.h2d_gb_per_s,
                                          costs.ddr_shared_gb_per_s, yield_seconds,
                                          _yield_shared(yield_ddr, kv_ddr, costs))  # Eq. 18
        step_seconds = np.maximum(np.maximum(np.maximum(chain, t_beside), np.maximum(t_stream, t_shared)), store)  # Eq. 7
        if phase == "decode" and tiers is not None:
            tail = self._copy_queue(index, kv_tier, tiers, hbm_experts)
            if tail is not None:  # Eq. 26: the engine copies, then idles through the tail until the next release
                step_seconds = np.maximum(step_seconds, np.where(tail > 0, t_stream + tail, 0.0))
        staging = staged.max(axis=1)  # Eq. 9: per step (a micro-batch's routed experts pass through the slots)
        # Eq. 8, each sum over a full [P, steps] array, as layer_time always summed
        shape = (num, step_seconds.shape[1] if phase == "prefill" else self.steps)
        return LayerTime(_full(step_seconds, shape).sum(axis=1), staging, valid, _full(chain, shape).sum(axis=1))


def layer_time(costs: CostGraph, cls: ClassCosts, phase: str, tiers: tuple[str, ...], cpu_permille,
               hbm_experts: int = 0) -> LayerTime:
    """Time of one layer of `cls` in `phase`, summed over the phase's steps, for each placement (Eqs. 4-9, 18, 20).

    A decode step is one pass of Eq. 7. A prefill is one pass over its micro-batches (Eq. 20): their chains, CPU
    reads and K, V writes add up, the weights are staged once, and the K, V writes to a host cache run beside the
    compute.

    Args:
        costs: the cost graph (link rates of Eqs. 5-6, the split grid and sync).
        cls: the layer class.
        phase: 'prefill' or 'decode'.
        tiers: per unit, the tier of its operand (`operand_tiers`).
        cpu_permille: [P, U] placements: per unit the CPU's share of its output features in permille (1000 = CPU,
            0 = GPU, in between a split at one of `costs.split_permille`; an MoE experts unit: 1000 · c // E for c
            experts on the CPU).
        hbm_experts: of an MoE layer's experts, how many are resident in HBM.
    """
    return LayerPricer(costs, cls, phase, cpu_permille).price(tiers, cpu_permille, hbm_experts)


def unit_times(costs: CostGraph, cls: ClassCosts, phase: str, tiers: tuple[str, ...],
               cpu_permille: tuple[int, ...], hbm_experts: int = 0) -> tuple[UnitTime, ...]:
    """Per unit of one placement, its compute, transfer and stream seconds (decode: means over the steps; prefill:
    the pass, all its micro-batches).

    Transfers are charged to the unit that receives the activation (and KV writes to the unit that writes them);
    stream seconds are the unit's streamed bytes at the link rate, and in prefill its K, V writes to a host cache
    (both overlapped with compute, Eqs. 7, 20).
    """
    pc = cls.phase(phase)
    permille = np.asarray(cpu_permille, dtype=np.int64)
    priced = _with_apart(pc, permille[None, :])[0]  # Eq. 25
    shares = gpu_shares(permille)[None, :]
    kv_tier = _kv_tier(cls, tiers)
    kv_beside = _overlapped_kv_write(phase, kv_tier) and not _attention_waits_for_kv(cls, phase, kv_tier,
                                                                                     priced[None, :])[0]
    out = []
    for index, unit in enumerate(pc.units):
        value = int(permille[index])
        device = placement_of(value)
        if pc.steps == 0:
            out.append(UnitTime(unit.name, device, 0.0, 0.0, 0.0))
            continue
        options = _unit_options(costs, unit, tiers[index], np.array([int(priced[index])]), pc.steps, hbm_experts,
                                chain_ops(pc, phase), phase)
        transfer = np.zeros((1, pc.steps))
        stored = np.zeros((1, pc.steps))
        if kv_tier is not None:
            written = _kv_write_seconds(costs, unit, kv_tier, shares[:, index])
            if kv_beside:
                stored += written
            else:
                transfer += written
        for edge in pc.edges:
            if edge.dst == index:
                for seconds in _edge_seconds(costs, edge, shares, bool(pc.units[edge.src].experts)):
                    transfer += seconds
        stream = float(_per_pass(stored, pc, phase)[0])
        if value < 1000 and tiers[index] in HOST_TIERS:  # (routed experts: on the chain too)
            staged = float(np.max(options["stream"])) if phase == "prefill" else float(np.mean(options["stream"]))
            stream += staged / _stream_rate(costs, tiers[index])
        out.append(UnitTime(unit.name, device, float(_per_pass(options["compute"], pc, phase)[0]),
                            float(_per_pass(transfer, pc, phase)[0]), stream))
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# A plan


def price_groups(costs: CostGraph, layer_groups: tuple[LayerGroup, ...]) -> PlanPrice:
    """A plan's layer groups, each layer as its group places it, on `costs` (what `status.predicted` holds)."""
    groups = []
    totals = {"prefill": 0.0, "decode": 0.0}
    for group in layer_groups:
        cls = costs.layer_class(group.layer_class)
        tiers = operand_tiers(cls, tuple(s.weights for s in group.sublayers), group.kv_cache)
        hbm_experts = group_hbm_experts(cls, group)
        seconds, units = {}, {}
        for phase in PHASES:
            permille = _group_permille(group, phase)
            seconds[phase] = float(layer_time(costs, cls, phase, tiers, np.array([permille]), hbm_experts).seconds[0])
            totals[phase] += seconds[phase] * group.layer_count
            units[phase] = unit_times(costs, cls, phase, tiers, permille, hbm_experts)
        groups.append(GroupPrice(group, tiers, seconds, units, hbm_experts))
    return PlanPrice(costs, tuple(groups), totals["prefill"], totals["decode"])


def plan_profile(plan: OffloadPlan, hw: HardwareProfile | str | None = None) -> HardwareProfile:
    """The profile a plan was compiled for: the shipped one it names, unless `hw` (name, file or profile) is given.

    Raises:
        LiacError: the profile named by the plan has changed since (its sha256 differs) and no `hw` was given.
    """
    spec = plan.spec
    # The name a plan records resolves among the shipped profiles only (and this host's): a plan must not make liac
    # open, and quote in an error, an arbitrary file; a user's own profile comes through `hw` (--hw).
    profile = resolve_profile(spec.hardware.profile, source="spec.hardware.profile", shipped_only=True) \
        if hw is None else (hw if isinstance(hw, HardwareProfile) else resolve_profile(hw))
    if hw is None and profile.sha256() != spec.hardware.sha256:
        raise LiacError("spec.hardware.sha256", f"profile '{profile.name}' has changed since the plan was compiled "
                        "(sha256 differs): pass the profile file it was compiled with")
    return profile


def plan_costs(plan: OffloadPlan, hw: HardwareProfile | str | None = None, graph=None,
               microbatch: Microbatch | None = None) -> CostGraph:
    """The CostGraph a plan was compiled from, rebuilt from its spec (profile by name unless `hw` is given),
    pricing splits at the compiler's grid and at every share the plan uses, and the prefill at the plan's
    micro-batch.

    Args:
        graph: the model's traced SublayerGraph, when the caller has it (skips tracing).
        microbatch: price the prefill at this micro-batch instead of the plan's.

    Raises:
        LiacError: the profile named by the plan has changed since (its sha256 differs) and no `hw` was given.
    """
    spec = plan.spec
    profile = plan_profile(plan, hw)
    if graph is None:
        from liac.passes.trace import trace_model  # late import: tracing pulls in torch, pricing does not need it

        graph = trace_model(plan.model_config)
    depth = max(spec.execution.prefetch_depth, 1)
    budgets = TierBudgets(spec.budgets.gpu_bytes, spec.budgets.cpu_bytes, spec.budgets.cxl_bytes, depth)
    work = Workload(spec.workload.batch_size, spec.workload.prompt_len, spec.workload.gen_len)
    if microbatch is None:
        microbatch = Microbatch(spec.execution.prefill_microbatch_sequences, spec.execution.prefill_microbatch_tokens)
    return annotate_costs(graph, profile, work, budgets, split_permille=split_grid(plan), microbatches=(microbatch,))


def split_grid(plan: OffloadPlan) -> tuple[int, ...]:
    """The CPU shares (permille) to price a plan's split units at: the compiler's grid and every share it uses."""
    shares = {s.cpu_permille(phase) for g in plan.spec.layer_groups for s in g.sublayers for phase in PHASES
              if s.name != "experts"}  # an experts unit's permille counts experts (Eq. 21), not a grid share
    return tuple(sorted(set(SPLIT_PERMILLE) | {p for p in shares if 0 < p < 1000}))


def price_plan(plan: OffloadPlan, hw: HardwareProfile | str | None = None, graph=None,
               costs: CostGraph | None = None) -> PlanPrice:
    """A plan → its price, from its `spec` alone: the CostGraph rebuilt (`plan_costs`, unless `costs` is given) and
    every group priced as the plan places it. Equals the plan's `status.predicted` (tests/passes/test_price.py).

    Raises:
        LiacError: the profile named by the plan has changed since (its sha256 differs) and no `hw` was given.
    """
    costs = costs if costs is not None else plan_costs(plan, hw=hw, graph=graph)
    return price_groups(costs, plan.spec.layer_groups)


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def unit_prices(price: PlanPrice) -> list[UnitPrice]:
    """Per group, phase and unit: the unit's time wholly on each device and the transfers each choice implies,
    its neighbours as planned (what `liac explain` tabulates)."""
    costs = price.costs
    out = []
    for priced in price.groups:
        group = priced.group
        cls = costs.layer_class(group.layer_class)
        kv_tier = _kv_tier(cls, priced.tiers)
        for phase in PHASES:
            pc = cls.phase(phase)
            planned = gpu_shares(_group_permille(group, phase))
            for index, unit in enumerate(pc.units):
                tier = priced.tiers[index]
                on_cpu = np.array(_group_permille(group, phase), dtype=np.int64)
                on_cpu[index] = 1000
                on_cpu = int(_with_apart(pc, on_cpu[None, :])[0, index])  # the partner as planned (Eq. 25)
                whole = _unit_options(costs, unit, tier, np.array([on_cpu, 0]), pc.steps,  # wholly on the CPU, GPU
                                      priced.hbm_experts, chain_ops(pc, phase), phase)
                transfer = {}
                for share in (0.0, 1.0):  # this unit wholly on the CPU (0) or the GPU (1), neighbours as planned
                    moved = planned.copy()
                    moved[index] = share
                    transfer[share] = _unit_transfer_seconds(costs, pc, phase, index, moved[None, :], kv_tier)
                staged = _mean(whole["stream"][1]) if phase == "decode" else float(np.max(whole["stream"][1], initial=0))
                stream = staged / _stream_rate(costs, tier) if tier in HOST_TIERS else 0.0
                sub = group.sublayers[index]
                permille = sub.cpu_permille(phase)
                compute = _per_pass(whole["compute"], pc, phase) if pc.steps else np.zeros(2)
                out.append(UnitPrice(group=group.name, unit=unit.name, phase=phase, device=getattr(sub, phase),
                                     cpu_seconds=float(compute[0]) if whole["ok"][0] else None,
                                     gpu_seconds=float(compute[1]), transfer_seconds_on_cpu=transfer[0.0],
                                     transfer_seconds_on_gpu=transfer[1.0], stream_seconds_on_gpu=stream,
                                     cpu_permille=permille,
                                     split_seconds=(priced.units[phase][index].compute_seconds
                                                    if getattr(sub, phase) == "split" else None)))
    return out


def _unit_transfer_seconds(costs: CostGraph, pc: PhaseCosts, phase: str, index: int, shares: np.ndarray,
                           kv_tier: str | None) -> float:
    """PCIe seconds on the chain of the activations into and out of unit `index` and its KV writes (a decode
    step's mean; a prefill's pass), with every unit at its GPU share in `shares` [1, U] (Eqs. 2, 3, 17, 20)."""
    if pc.steps == 0:
        return 0.0
    total = np.zeros((1, pc.steps))
    if kv_tier is not None and not _overlapped_kv_write(phase, kv_tier):
        total += _kv_write_seconds(costs, pc.units[index], kv_tier, shares[:, index])
    for edge in pc.edges:
        if index in (edge.src, edge.dst):
            for seconds in _edge_seconds(costs, edge, shares, bool(pc.units[edge.src].experts)):
                total += seconds
    return float(_per_pass(total, pc, phase)[0])


def ddr_sharing(profile: HardwareProfile) -> DdrSharing:
    """The DDR-sharing numbers of a profile (Eqs. 6, 18)."""
    return DdrSharing(profile.cpu_ddr_read_gb_per_s, profile.pcie_h2d_gb_per_s, profile.ddr_shared_gb_per_s,
                      profile.split_sync_seconds)
