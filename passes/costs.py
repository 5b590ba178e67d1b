"""SublayerGraph[traced] + HardwareProfile → CostGraph: price every unit on both devices, per phase and step.

The CostGraph holds plain ids and numbers (Alpa's c/d/m vectors): per layer class and phase, each placement unit's
compute seconds on the CPU (per tier its operand lives in) and on the GPU, the bytes it would stream to the GPU,
the bytes the CPU reads from DDR for it, its KV-cache write cost in each direction, and each activation edge's
PCIe cost in each direction; plus memory per unit and the budgets. It serialises to JSON (`to_json`/`from_json`),
so any solve can be replayed without a model. `layer_seconds` combines the numbers into a layer's time for a
placement (Eqs. 4-8 of docs/cost-model.md); the ILP and the plan's predicted costs both call it, so a price has
exactly one home.

Every price is a small function of (op kind, bytes, FLOPs, profile) below; there are no per-model tables.
Decode is priced at each of the gen_len steps (C grows by one per step) and summed exactly.

    costs = annotate_costs(graph, resolve_profile("spr-h100"), Workload(1, 128, 32), budgets)
    costs.classes["decoder"].phases["decode"].units[0].gpu_seconds  # qkv on the GPU, each step
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import networkx as nx
import numpy as np

from liac.ir import PHASES, Sublayer, SublayerGraph, phase_point, require_stage
from liac.profile import GB, HardwareProfile
from liac.schema_tools import from_data, to_data

__all__ = [
    "TIERS", "DEVICES", "OPERANDS", "Workload", "TierBudgets", "UnitCosts", "EdgeCosts", "PhaseCosts",
    "ClassCosts", "CostGraph", "annotate_costs", "node_seconds", "cpu_throughput_rows", "experts_touched",
    "transfer_seconds", "layer_seconds", "placement_masks", "unit_breakdown",
]

TIERS = ("hbm", "ddr", "cxl")
DEVICES = ("cpu", "gpu")
# What a unit's tier refers to: its weights, the KV cache (attention), or nothing (no operand in memory).
OPERANDS = ("weights", "kv", "none")
_ATTENTION = ("attention_score", "softmax", "attention_context")


# ---------------------------------------------------------------------------------------------------------------
# Records (plain numbers; JSON via liac.schema_tools)


@dataclass(frozen=True)
class Workload:
    """The workload point being priced."""

    batch_size: int
    prompt_len: int
    gen_len: int


@dataclass(frozen=True)
class TierBudgets:
    """Capacity per memory tier, bytes, and how many layers' streamed bytes are staged ahead."""

    hbm_bytes: int
    ddr_bytes: int
    cxl_bytes: int
    prefetch_depth: int = 1  # staging buffers on the GPU = prefetch_depth + 1 (Eq. 11)


@dataclass(frozen=True)
class UnitCosts:
    """One placement unit of one layer, in one phase; every tuple has one entry per step.

    Attributes:
        name: unit name ('qkv', 'attn_score', 'fc1', 'lm_head').
        cpu_seconds: per tier (TIERS order), CPU compute when the operand lives there (Eq. 1).
        cpu_allows_hbm: whether the CPU may compute it with its operand in HBM (no: weights, decode KV).
        gpu_seconds: GPU compute, operand read from HBM (resident or staged) (Eq. 1).
        stream_bytes: bytes copied to the GPU when it computes there with its operand off HBM (Eq. 5).
        cpu_read_bytes: bytes the CPU reads from the operand's tier when it computes there (Eq. 6).
        kv_to_gpu_seconds: writing its new K, V from the CPU into an HBM KV cache (Eq. 3).
        kv_to_host_seconds: writing its new K, V from the GPU into a DDR/CXL KV cache (Eq. 3).
    """

    name: str
    cpu_seconds: tuple[tuple[float, ...], ...]
    cpu_allows_hbm: bool
    gpu_seconds: tuple[float, ...]
    stream_bytes: tuple[float, ...]
    cpu_read_bytes: tuple[float, ...]
    kv_to_gpu_seconds: tuple[float, ...]
    kv_to_host_seconds: tuple[float, ...]


@dataclass(frozen=True)
class EdgeCosts:
    """An activation from unit `src` to unit `dst` (indices into the class's units), PCIe seconds per step."""

    src: int
    dst: int
    h2d_seconds: tuple[float, ...]  # src on the CPU, dst on the GPU
    d2h_seconds: tuple[float, ...]  # src on the GPU, dst on the CPU


@dataclass(frozen=True)
class PhaseCosts:
    """One phase of one layer class: `steps` steps (prefill 1, decode gen_len)."""

    steps: int
    units: tuple[UnitCosts, ...]
    edges: tuple[EdgeCosts, ...]


@dataclass(frozen=True)
class ClassCosts:
    """One layer class (embed, decoder, head): its units, memory, and both phases."""

    layer_class: str
    count: int
    units: tuple[str, ...]
    operands: tuple[str, ...]  # per unit, one of OPERANDS
    weight_bytes: tuple[int, ...]  # per unit, bytes resident in its weight tier
    kv_cache_bytes: int  # one layer's KV cache for the whole generation (0 for embed/head)
    workspace_bytes: int  # activations live at once on a device that computes any unit of the class
    prefill: PhaseCosts
    decode: PhaseCosts

    def phase(self, phase: str) -> PhaseCosts:
        return self.prefill if phase == "prefill" else self.decode


@dataclass(frozen=True)
class CostGraph:
    """Everything the placement ILP needs, as numbers (see the module docstring)."""

    model: str
    profile: str
    profile_sha256: str
    workload: Workload
    budgets: TierBudgets
    h2d_gb_per_s: float  # Eq. 5: weights/KV streamed from DDR
    cxl_stream_gb_per_s: float  # Eq. 5: streamed from CXL (min of the CXL and PCIe rates)
    ddr_shared_gb_per_s: float  # Eq. 6
    classes: tuple[ClassCosts, ...]
    tied_weight_bytes: int = 0  # weights the embed and head units share (a tied LM head): stored once per tier

    def layer_class(self, name: str) -> ClassCosts:
        for costs in self.classes:
            if costs.layer_class == name:
                return costs
        raise KeyError(name)

    @property
    def tiers(self) -> tuple[str, ...]:
        """Tiers a tensor may be placed in: CXL only when it has a budget."""
        return TIERS if self.budgets.cxl_bytes > 0 else TIERS[:2]

    def to_json(self) -> str:
        return json.dumps(to_data(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "CostGraph":
        return from_data(CostGraph, json.loads(text), "cost graph")


# ---------------------------------------------------------------------------------------------------------------
# Prices: one small function per term


def experts_touched(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts hit by `tokens` tokens routed top-k of E uniformly: E·(1 − (1 − k/E)^tokens)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def cpu_throughput_rows(sub: Sublayer, batch: int, query: int) -> float:
    """GEMM rows M that set the AMX rate (Eq. 1): B·Q tokens for weight GEMMs, Q for attention (per head)."""
    if sub.kind in _ATTENTION:
        return float(query)
    if sub.kind == "experts":
        num_experts, top_k = sub.experts
        return batch * query * top_k / max(experts_touched(num_experts, top_k, batch * query), 1e-9)
    return float(batch * query)


def _weights_touched(sub: Sublayer, batch: int, query: int) -> float:
    """Weight bytes one step reads: all of them, the looked-up rows of an embedding, or the experts hit."""
    if sub.kind == "embedding":
        total = 0.0
        for weight in sub.weights:
            row_bytes = weight.nbytes / weight.shape[0]
            total += min(weight.nbytes, batch * query * row_bytes)
        return total
    if sub.kind == "experts" and sub.experts[0]:
        num_experts, top_k = sub.experts
        return sub.weight_bytes * experts_touched(num_experts, top_k, batch * query) / num_experts
    return float(sub.weight_bytes)


def _activation_bytes(sub: Sublayer, point: tuple[int, int, int], weights_touched: float) -> float:
    """Activation bytes a node reads and writes: its fused traffic less weights and KV (an embedding's
    `bytes_read` counts the rows it looks up, every other node's counts its whole weights)."""
    weights_read = weights_touched if sub.kind == "embedding" else sub.weight_bytes
    return max(0.0, sub.bytes_read(*point) - weights_read - sub.kv_read(*point)) + sub.bytes_written(*point)


def node_seconds(sub: Sublayer, device: str, tier: str, phase: str, point: tuple[int, int, int],
                 hw: HardwareProfile) -> float:
    """Roofline time of one node (one kernel) on `device`, its operand in `tier` (Eq. 1).

    max(FLOPs / throughput, Σ bytes / bandwidth of where they are read from) + launch overhead.
    """
    batch, query, context = point
    flops = sub.flops(*point)
    weights = _weights_touched(sub, batch, query)
    kv = sub.kv_read(*point)
    activations = _activation_bytes(sub, point, weights)
    if device == "gpu":
        # Streamed operands are staged into HBM first (Eq. 5), so the kernel always reads HBM.
        return max(flops / (hw.gpu_bf16_tflops * 1e12),
                   (weights + kv + activations) / (hw.gpu_hbm_gb_per_s * GB)) + hw.gpu_launch_seconds
    if tier == "cxl" and hw.cxl_gb_per_s <= 0:
        tier = "ddr"  # a profile without CXL never offers the tier (CostGraph.tiers); keep the row finite
    weight_rate = hw.cxl_gb_per_s if tier == "cxl" else hw.cpu_ddr_read_gb_per_s
    # Prefill attention reads the K, V it just produced, not the cache; decode reads the cache's tier.
    kv_rate = hw.cpu_kv_read_gb_per_s
    if phase == "decode" and tier == "cxl":
        kv_rate = min(hw.cxl_gb_per_s, hw.cpu_kv_read_gb_per_s)
    memory_seconds = (weights / (weight_rate * GB) if weights else 0.0) + kv / (kv_rate * GB) \
        + activations / (hw.cpu_ddr_read_gb_per_s * GB)
    rows = cpu_throughput_rows(sub, batch, query)
    return max(flops / (hw.cpu_tflops_at(rows) * 1e12), memory_seconds) + hw.cpu_launch_seconds


def transfer_seconds(nbytes: float, rate_gb_per_s: float, hw: HardwareProfile) -> float:
    """One PCIe copy (Eqs. 2, 3): bytes / rate + a fixed latency; nothing to copy costs nothing."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (rate_gb_per_s * GB) + hw.pcie_latency_seconds


# ---------------------------------------------------------------------------------------------------------------
# The pass


def _points(layer_class: str, phase: str, work: Workload) -> list[tuple[int, int, int]]:
    if phase == "prefill":
        batch, query, context = phase_point("prefill", work.batch_size, work.prompt_len)
        if layer_class == "head":  # the LM head needs only the last position's logits in prefill
            query = 1
        return [(batch, query, context)]
    # gen_len tokens: the prefill's LM head gives the first, then gen_len - 1 decode steps give one each, step t
    # reading C = prompt_len + t + 1 keys (the last token is never fed back, so its K, V are never cached).
    return [phase_point("decode", work.batch_size, work.prompt_len, step) for step in range(work.gen_len - 1)]


def _operand(subs: list[Sublayer]) -> str:
    if any(s.weights for s in subs):
        return "weights"
    if any(s.kind in _ATTENTION for s in subs):
        return "kv"
    return "none"


def _unit_costs(name: str, subs: list[Sublayer], operand: str, phase: str, points, hw: HardwareProfile) -> UnitCosts:
    cpu = []
    for tier in TIERS:
        row = []
        for point in points:
            row.append(sum(node_seconds(s, "cpu", tier, phase, point, hw) for s in subs))
        cpu.append(tuple(row))
    gpu = tuple(sum(node_seconds(s, "gpu", "hbm", phase, p, hw) for s in subs) for p in points)
    stream, cpu_read, kv_up, kv_down = [], [], [], []
    for batch, query, context in points:
        point = (batch, query, context)
        weights = sum(_weights_touched(s, batch, query) for s in subs)
        kv = sum(s.kv_read(*point) for s in subs)
        if operand == "weights":
            operand_bytes = weights
        elif operand == "kv" and phase == "decode":
            operand_bytes = kv  # decode attention reads the cache where it lives; prefill reads fresh K, V
        else:
            operand_bytes = 0.0
        stream.append(operand_bytes)
        cpu_read.append(operand_bytes)
        written = sum(s.kv_written(*point) for s in subs)
        kv_up.append(transfer_seconds(written, hw.pcie_h2d_gb_per_s, hw))
        kv_down.append(transfer_seconds(written, hw.pcie_d2h_gb_per_s, hw))
    allows_hbm = operand == "none" or (operand == "kv" and phase == "prefill")
    return UnitCosts(name=name, cpu_seconds=tuple(cpu), cpu_allows_hbm=allows_hbm, gpu_seconds=gpu,
                     stream_bytes=tuple(stream), cpu_read_bytes=tuple(cpu_read), kv_to_gpu_seconds=tuple(kv_up),
                     kv_to_host_seconds=tuple(kv_down))


def _class_edges(graph: SublayerGraph, layer_class: str, units: list[str]) -> list[tuple[int, int, object]]:
    """(src unit, dst unit, bytes Poly) of activations crossing between units of one layer of the class.

    Decoder layers also feed the next layer: the tensors the embedding hands the decoder are, in steady state,
    handed by the previous decoder layer's output unit (the layer priced as if its neighbours share its
    placement: docs/cost-model.md, approximation A1).
    """
    index = {u: i for i, u in enumerate(units)}
    edges = []
    out_units = set()
    inputs = []
    for src, dst, data in sorted(graph.edges(data=True)):
        a, b = graph.nodes[src]["sublayer"], graph.nodes[dst]["sublayer"]
        nbytes = data["tensor"].nbytes
        if a.layer_class == layer_class and b.layer_class == layer_class and a.unit != b.unit:
            edges.append((index[a.unit], index[b.unit], nbytes))
        elif layer_class == "decoder" and a.layer_class != "decoder" and b.layer_class == "decoder":
            inputs.append((index[b.unit], nbytes))
        elif layer_class == "decoder" and a.layer_class == "decoder" and b.layer_class != "decoder":
            out_units.add(index[a.unit])
    for out in sorted(out_units):
        for dst, nbytes in inputs:
            if dst != out:
                edges.append((out, dst, nbytes))
    return edges


def annotate_costs(graph: SublayerGraph, hw: HardwareProfile, workload: Workload,
                   budgets: TierBudgets) -> CostGraph:
    """SublayerGraph[traced] + HardwareProfile → CostGraph.

    Args:
        graph: the traced sublayer graph (stage 'traced').
        hw: the hardware profile.
        workload: batch size, prompt and generation lengths.
        budgets: bytes per tier the plan may use, and the prefetch depth.

    Returns:
        The CostGraph (stage 'costed'): prices for every unit, device, tier, phase and step.

    Raises:
        ValueError: the graph is not at stage 'traced'.
    """
    require_stage(graph, "traced", "annotate_costs")
    embed_weights = {w.name for s in graph.sublayers("embed") for w in s.weights}
    shares = graph.graph.get("tied_weights", {})  # head weight name → the embedding weight it shares storage with
    tied = {w.name: w.nbytes for s in graph.sublayers("head") for w in s.weights
            if w.name in embed_weights or w.name in shares}
    # A tied matrix the tracer lists only under the head is still the embedding's: the lookup reads it too.
    embed_extra = tuple(w for s in graph.sublayers("head") for w in s.weights
                        if w.name in shares and shares[w.name] not in embed_weights)
    classes = []
    for layer_class in ("embed", "decoder", "head"):
        units = graph.units(layer_class)
        subs = graph.sublayers(layer_class)
        if layer_class == "embed" and embed_extra:
            subs = [dataclasses.replace(s, weights=s.weights + embed_extra) if s.kind == "embedding" else s
                    for s in subs]
        by_unit = {u: [s for s in subs if s.unit == u] for u in units}
        operands = tuple(_operand(by_unit[u]) for u in units)
        weight_bytes = tuple(sum(s.weight_bytes for s in by_unit[u]) for u in units)
        edges = _class_edges(graph, layer_class, units)
        phases = {}
        workspace = 0.0
        for phase in PHASES:
            points = _points(layer_class, phase, workload)
            unit_costs = tuple(_unit_costs(u, by_unit[u], operands[i], phase, points, hw)
                               for i, u in enumerate(units))
            edge_costs = tuple(
                EdgeCosts(src=src, dst=dst,
                          h2d_seconds=tuple(transfer_seconds(nbytes(*p), hw.pcie_h2d_gb_per_s, hw) for p in points),
                          d2h_seconds=tuple(transfer_seconds(nbytes(*p), hw.pcie_d2h_gb_per_s, hw) for p in points))
                for src, dst, nbytes in edges)
            phases[phase] = PhaseCosts(steps=len(points), units=unit_costs, edges=edge_costs)
            workspace = max(workspace, _workspace_bytes(subs, points))
        kv_cache = 0
        if layer_class == "decoder":
            prefill_point = _points("decoder", "prefill", workload)[0]
            kv_cache = int(sum(s.kv_written(*prefill_point) for s in subs)
                           + sum(s.kv_written(*p) for s in subs for p in _points("decoder", "decode", workload)))
        classes.append(ClassCosts(layer_class=layer_class, count=int(graph.graph["layer_counts"][layer_class]),
                                  units=tuple(units), operands=operands, weight_bytes=weight_bytes,
                                  kv_cache_bytes=kv_cache, workspace_bytes=int(workspace),
                                  prefill=phases["prefill"], decode=phases["decode"]))
    cxl_stream = min(hw.cxl_gb_per_s, hw.pcie_h2d_gb_per_s) if hw.cxl_gb_per_s > 0 else hw.pcie_h2d_gb_per_s
    return CostGraph(model=str(graph.graph.get("model", {}).get("name", "model")), profile=hw.name,
                     profile_sha256=hw.sha256(), workload=workload, budgets=budgets,
                     h2d_gb_per_s=hw.pcie_h2d_gb_per_s, cxl_stream_gb_per_s=cxl_stream,
                     ddr_shared_gb_per_s=hw.ddr_shared_gb_per_s, classes=tuple(classes), tied_weight_bytes=sum(tied.values()))


def _workspace_bytes(subs: list[Sublayer], points) -> float:
    """Activation bytes live at once (Eq. 14): the largest node's activation inputs plus outputs."""
    peak = 0.0
    for point in points:
        for s in subs:
            peak = max(peak, _activation_bytes(s, point, _weights_touched(s, point[0], point[1])))
    return peak


# ---------------------------------------------------------------------------------------------------------------
# Combining prices into a layer's time (Eqs. 4-8), vectorised over placements


def placement_masks(num_units: int) -> np.ndarray:
    """All 2^U placements as a [P, U] 0/1 array; 1 means the GPU. Row p is the binary of p, unit 0 first."""
    codes = np.arange(2 ** num_units)
    return ((codes[:, None] >> np.arange(num_units)[None, :]) & 1).astype(np.int8)


def layer_seconds(costs: CostGraph, cls: ClassCosts, phase: str, tiers: tuple[str, ...],
                  masks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time of one layer of `cls` in `phase`, summed over the phase's steps, for each placement in `masks`.

    Args:
        costs: the cost graph (for the link rates of Eqs. 5-6).
        cls: the layer class.
        phase: 'prefill' or 'decode'.
        tiers: per unit, the tier of its operand (weights tier, or the KV tier for attention units).
        masks: [P, U] placements, 1 = GPU.

    Returns:
        (seconds [P], staging bytes [P] = most bytes streamed in one step (Eq. 9), valid [P] bool,
        chain seconds [P] (the sequential part alone: breaks ties between placements the max() makes equal)).
    """
    pc = cls.phase(phase)
    masks = np.asarray(masks, dtype=np.float64)
    num = masks.shape[0]
    if pc.steps == 0:  # gen_len 1: no decode step
        valid = np.ones(num, dtype=bool)
        for index, unit in enumerate(pc.units):
            if tiers[index] == "hbm" and not unit.cpu_allows_hbm:
                valid &= masks[:, index] == 1
        return np.zeros(num), np.zeros(num), valid, np.zeros(num)
    chain = np.zeros((num, pc.steps))
    stream_ddr = np.zeros((num, pc.steps))
    stream_cxl = np.zeros((num, pc.steps))
    cpu_ddr = np.zeros((num, pc.steps))
    valid = np.ones(num, dtype=bool)
    kv_tier = next((t for t, op in zip(tiers, cls.operands) if op == "kv"), None)
    for index, unit in enumerate(pc.units):
        on_gpu = masks[:, index:index + 1]
        tier = tiers[index]
        tier_index = TIERS.index(tier)
        if tier == "hbm" and not unit.cpu_allows_hbm:
            valid &= masks[:, index] == 1
        cpu = np.asarray(unit.cpu_seconds[tier_index])[None, :]
        chain += on_gpu * np.asarray(unit.gpu_seconds)[None, :] + (1 - on_gpu) * cpu  # Eq. 1
        sb = np.asarray(unit.stream_bytes)[None, :]
        if tier == "ddr":
            stream_ddr += on_gpu * sb
            cpu_ddr += (1 - on_gpu) * np.asarray(unit.cpu_read_bytes)[None, :]
        elif tier == "cxl":
            stream_cxl += on_gpu * sb
        if kv_tier is not None:  # Eq. 3: new K, V go to the KV tier's side of PCIe
            if kv_tier == "hbm":
                chain += (1 - on_gpu) * np.asarray(unit.kv_to_gpu_seconds)[None, :]
            else:
                chain += on_gpu * np.asarray(unit.kv_to_host_seconds)[None, :]
    for edge in pc.edges:  # Eq. 2: an activation crosses PCIe when its two units sit on different devices
        src, dst = masks[:, edge.src:edge.src + 1], masks[:, edge.dst:edge.dst + 1]
        chain += (1 - src) * dst * np.asarray(edge.h2d_seconds)[None, :]
        chain += src * (1 - dst) * np.asarray(edge.d2h_seconds)[None, :]
    t_stream = stream_ddr / (costs.h2d_gb_per_s * GB) + stream_cxl / (costs.cxl_stream_gb_per_s * GB)  # Eq. 5
    t_shared = (cpu_ddr + stream_ddr) / (costs.ddr_shared_gb_per_s * GB)  # Eq. 6
    step_seconds = np.maximum(chain, np.maximum(t_stream, t_shared))  # Eq. 7
    staging = (stream_ddr + stream_cxl).max(axis=1)  # Eq. 9
    return step_seconds.sum(axis=1), staging, valid, chain.sum(axis=1)  # Eq. 8


def unit_breakdown(costs: CostGraph, cls: ClassCosts, phase: str, tiers: tuple[str, ...],
                   placement: tuple[int, ...]) -> list[tuple[str, str, float, float, float]]:
    """Per unit: (name, device, compute s, transfer s, stream s), each the mean over the phase's steps.

    Transfers are charged to the unit that receives the activation (and KV writes to the unit that writes them);
    stream seconds are the unit's streamed bytes at the link rate (overlapped with compute, Eq. 7).
    """
    pc = cls.phase(phase)
    kv_tier = next((t for t, op in zip(tiers, cls.operands) if op == "kv"), None)
    out = []
    for index, unit in enumerate(pc.units):
        on_gpu = placement[index] == 1
        tier = tiers[index]
        if pc.steps == 0:
            out.append((unit.name, "gpu" if on_gpu else "cpu", 0.0, 0.0, 0.0))
            continue
        compute = np.mean(unit.gpu_seconds if on_gpu else unit.cpu_seconds[TIERS.index(tier)])
        transfer = 0.0
        if kv_tier == "hbm" and not on_gpu:
            transfer += float(np.mean(unit.kv_to_gpu_seconds))
        elif kv_tier not in (None, "hbm") and on_gpu:
            transfer += float(np.mean(unit.kv_to_host_seconds))
        for edge in pc.edges:
            if edge.dst == index and placement[edge.src] != placement[index]:
                transfer += float(np.mean(edge.h2d_seconds if on_gpu else edge.d2h_seconds))
        stream = 0.0
        if on_gpu and tier in ("ddr", "cxl"):
            rate = costs.h2d_gb_per_s if tier == "ddr" else costs.cxl_stream_gb_per_s
            stream = float(np.mean(unit.stream_bytes)) / (rate * GB)
        out.append((unit.name, "gpu" if on_gpu else "cpu", float(compute), transfer, stream))
    return out
