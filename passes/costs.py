"""SublayerGraph[traced] + HardwareProfile → CostGraph: price every unit on both devices, per phase and step.

The CostGraph holds plain ids and numbers (Alpa's c/d/m vectors): per layer class and phase, each placement unit's
compute seconds on the CPU (per tier its operand lives in) and on the GPU, the bytes it would stream to the GPU,
the bytes the CPU reads from DDR for it, its KV-cache write cost in each direction, and each activation edge's
PCIe cost in each direction; plus memory per unit and the budgets. It serialises to JSON (`to_json`/`from_json`),
so any solve can be replayed without a model. Combining these numbers into the time of a placement (Eqs. 2-9, 15-18
of docs/cost-model.md: the chain, the stream, shared DDR, the DMA's reads fitted beside the CPU's) is passes/price.py's
alone; the ILP, the plan's predicted costs, `liac explain` and `liac calibrate` all call it there.

A weight GEMM unit may also be *split*: the CPU computes a share of its output features from the weights' tier
while the GPU computes the rest from streamed weights (Eqs. 15-17), paying the profile's `split_sync_seconds` to
hand the CPU part to the runtime's worker thread and join it. The CostGraph prices each such unit at every
CPU share of its grid (`split_permille`).

Every price is a small function of (op kind, bytes, FLOPs, profile) below; there are no per-model tables.
Decode is priced at each of the gen_len - 1 steps (C grows by one per step). The decoder's prefill runs in
*micro-batches* (Eq. 20): `sequences` sequences × `tokens` prompt tokens at a time, layer by layer, so its steps are
the distinct micro-batch points, each with how many micro-batches share it; the activations in the decoder's
whole-footprint GPU workspace (Eq. 14) are one micro-batch's, beside the batch's residual stream. The CostGraph prices the whole batch and the candidate micro-batches the solver chooses among
(`prefill_options`, `prefill_microbatches`).

    costs = annotate_costs(graph, resolve_profile("spr-h100"), Workload(1, 128, 32), budgets)
    costs.classes["decoder"].phases["decode"].units[0].gpu_seconds  # qkv on the GPU, each step
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from liac.ir import Sublayer, SublayerGraph, phase_point, require_stage
from liac.plan import PHASES, TIERS, expert_block_rows
from liac.profile import HardwareProfile
from liac.schema_tools import from_data, to_data
from liac.sizes import GB, MIB

__all__ = [
    "OPERANDS", "SPLIT_PERMILLE", "WORKSPACE_SHARE", "Workload", "Microbatch", "TierBudgets", "UnitCosts",
    "EdgeCosts", "PhaseCosts", "ClassCosts", "PrefillOption", "CostGraph", "annotate_costs", "node_seconds",
    "cpu_node_prices", "cpu_throughput_rows", "experts_touched", "transfer_seconds", "splittable",
    "microbatch_points", "prefill_microbatches", "activation_peak_bytes", "class_activation_peak",
    "gpu_workspace_bytes", "prefill_blocks_dma",
]

# What a unit's tier refers to: its weights, the KV cache (attention), or nothing (no operand in memory).
OPERANDS = ("weights", "kv", "none")
_ATTENTION = ("attention_score", "softmax", "attention_context")
# The default grid of CPU shares (permille of a unit's output features) a split unit is priced at (Eq. 15): steps of
# 1/20. The optimum of one split unit balances its CPU part against the stream (Eq. 17), so a step of 5 % of one
# unit's bytes is within a few percent of a layer's continuous optimum, at 19 prices per unit.
SPLIT_PERMILLE = tuple(range(50, 1000, 50))
# Node kinds a splittable unit may hold: its one weight GEMM and the element-wise ops around it.
_SPLIT_KINDS = ("linear", "norm", "activation", "rope", "add")
# Prefill micro-batches are offered while halving them still frees at least this share of the GPU budget (of the DDR
# budget on a CPU-only profile) of workspace (Eq. 20): past that, more micro-batches only add launches.
WORKSPACE_SHARE = 1 / 64


# ---------------------------------------------------------------------------------------------------------------
# Records (plain numbers; JSON via liac.schema_tools)


@dataclass(frozen=True)
class Workload:
    """The workload point being priced."""

    batch_size: int
    prompt_len: int
    gen_len: int


@dataclass(frozen=True)
class Microbatch:
    """How the decoder's prefill is cut (Eq. 20): `sequences` sequences × `tokens` prompt tokens at a time (the
    last micro-batch of a row or of a prompt may be smaller). The whole batch is (batch_size, prompt_len)."""

    sequences: int
    tokens: int

    def count(self, work: Workload) -> int:
        """Micro-batches per layer: row blocks × prompt chunks."""
        return -(-work.batch_size // self.sequences) * -(-work.prompt_len // self.tokens)


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
        cpu_beside_bytes: per tier (TIERS order), the DDR bytes PCIe DMA can read while the CPU computes it
            there (Eq. 18).
        cpu_allows_hbm: whether the CPU may compute it with its operand in HBM (no: weights, decode KV).
        gpu_seconds: GPU compute, operand read from HBM (resident or staged) (Eq. 1).
        stream_bytes: bytes copied to the GPU when it computes there with its operand off HBM (Eq. 5).
        cpu_read_bytes: bytes the CPU reads from the operand's tier when it computes there (Eq. 6).
        kv_to_gpu_seconds: writing its new K, V from the CPU into an HBM KV cache (Eq. 3).
        kv_to_host_seconds: writing its new K, V from the GPU into a DDR/CXL KV cache (Eq. 3).
        cpu_apart_seconds, cpu_apart_beside_bytes, cpu_apart_read_bytes: a decode attention unit (score or
            context) on the CPU while its partner runs on the GPU, per tier and step, as cpu_seconds,
            cpu_beside_bytes and cpu_read_bytes: the runtime runs it alone over the cache's whole capacity (Eq. 25);
            empty for every other unit and phase.
        split_cpu_seconds: [grid point][tier][step], the CPU part of a split at CPU share
            `CostGraph.split_permille[k]` / 1000 (Eq. 15); empty when the unit cannot split.
        split_cpu_beside_bytes: [grid point][tier][step], DDR bytes DMA can read beside the CPU part (Eq. 18).
        split_gpu_seconds: [grid point][step], the GPU part (the rest of the output features) (Eq. 15).
        split_stream_bytes: [grid point][step], bytes the GPU part streams when the weights are off HBM (Eq. 16).
        split_cpu_read_bytes: [grid point][step], bytes the CPU part reads from the weights' tier (Eq. 16).
        experts: an MoE experts unit's expert count E (0 for every other unit); then, per count n = 0 … E of its
            experts computed on one device (Eq. 21):
        expert_cpu_seconds: [n][tier][step], the CPU computing n experts' routed tokens, weights in that tier.
        expert_cpu_beside_bytes: [n][tier][step], DDR bytes DMA can read beside them (Eq. 18).
        expert_gpu_seconds: [n][step], the GPU computing n experts' routed tokens (weights in HBM or staged).
        expert_bytes: [step], one expert's weight bytes a step reads, expected under uniform routing: what streaming
            it (its routed copies only) or computing it on the CPU moves, E_hit / E of its weights.
        expert_slot_bytes: one expert's weights: a staging slot for a streamed expert.
    """

    name: str
    cpu_seconds: tuple[tuple[float, ...], ...]
    cpu_beside_bytes: tuple[tuple[float, ...], ...]
    cpu_allows_hbm: bool
    gpu_seconds: tuple[float, ...]
    stream_bytes: tuple[float, ...]
    cpu_read_bytes: tuple[float, ...]
    kv_to_gpu_seconds: tuple[float, ...]
    kv_to_host_seconds: tuple[float, ...]
    cpu_apart_seconds: tuple[tuple[float, ...], ...] = ()
    cpu_apart_beside_bytes: tuple[tuple[float, ...], ...] = ()
    cpu_apart_read_bytes: tuple[float, ...] = ()
    split_cpu_seconds: tuple[tuple[tuple[float, ...], ...], ...] = ()
    split_cpu_beside_bytes: tuple[tuple[tuple[float, ...], ...], ...] = ()
    split_gpu_seconds: tuple[tuple[float, ...], ...] = ()
    split_stream_bytes: tuple[tuple[float, ...], ...] = ()
    split_cpu_read_bytes: tuple[tuple[float, ...], ...] = ()
    experts: int = 0
    expert_cpu_seconds: tuple[tuple[tuple[float, ...], ...], ...] = ()
    expert_cpu_beside_bytes: tuple[tuple[tuple[float, ...], ...], ...] = ()
    expert_gpu_seconds: tuple[tuple[float, ...], ...] = ()
    expert_bytes: tuple[float, ...] = ()
    expert_slot_bytes: int = 0

    @property
    def can_split(self) -> bool:
        return bool(self.split_gpu_seconds)


@dataclass(frozen=True)
class EdgeCosts:
    """An activation from unit `src` to unit `dst` (indices into the class's units), PCIe seconds per step."""

    src: int
    dst: int
    h2d_seconds: tuple[float, ...]  # src on the CPU, dst on the GPU
    d2h_seconds: tuple[float, ...]  # src on the GPU, dst on the CPU


@dataclass(frozen=True)
class PhaseCosts:
    """One phase of one layer class: `steps` steps (decode gen_len - 1; prefill one per distinct micro-batch).

    `repeats[k]` is how many micro-batches of the prefill share step k's point (() = one each; decode steps are
    one pass each). A prefill's steps form one pass (Eq. 20)."""

    steps: int
    units: tuple[UnitCosts, ...]
    edges: tuple[EdgeCosts, ...]
    repeats: tuple[int, ...] = ()

    @property
    def step_repeats(self) -> tuple[int, ...]:
        return self.repeats or (1,) * self.steps


@dataclass(frozen=True)
class ClassCosts:
    """One layer class (embed, decoder, head): its units, memory, and both phases."""

    layer_class: str
    count: int
    units: tuple[str, ...]
    operands: tuple[str, ...]  # per unit, one of OPERANDS
    weight_bytes: tuple[int, ...]  # per unit, bytes resident in its weight tier
    kv_cache_bytes: int  # one layer's KV cache for the whole generation (0 for embed/head)
    workspace_bytes: int  # Eq. 14: GPU bytes beyond weights, KV and staging while a unit of the class computes there
    prefill: PhaseCosts
    decode: PhaseCosts
    host_workspace_bytes: int = 0  # Eq. 14: activations live at once on the host (reserved in DDR)

    def phase(self, phase: str) -> PhaseCosts:
        return self.prefill if phase == "prefill" else self.decode


@dataclass(frozen=True)
class PrefillOption:
    """The decoder's prefill priced at another micro-batch (Eq. 20), and its workspaces there (Eq. 14: on the GPU,
    the whole footprint beyond the arena; on the host, the activations)."""

    microbatch: Microbatch
    prefill: PhaseCosts
    workspace_bytes: int
    host_workspace_bytes: int = 0


@dataclass(frozen=True)
class CostGraph:
    """Everything the placement ILP needs, as numbers (see the module docstring).

    The decoder class is priced at `prefill_microbatch`; `prefill_options` holds the other micro-batches the solver
    may choose (`with_prefill` gives the CostGraph priced at one of them)."""

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
    split_permille: tuple[int, ...] = ()  # CPU shares (permille) split units are priced at; () = no splits
    pcie_latency_seconds: float = 0.0  # the fixed part of every transfer in EdgeCosts and the KV writes (Eq. 2)
    split_sync_seconds: float = 0.0  # Eq. 15: a split unit's join beyond its slower part
    runtime_op_seconds: float = 0.0  # Eq. 24: the runtime's host time per unit it runs (SPLIT_OPS for a split)
    # Eq. 24b: a prefill GPU unit's host time hides under its own kernels; only where the profile measures the GPU's
    # GEMM rate by rows (Eq. 1c), which prices those kernels as the pass runs them (without it, Eq. 24 in full)
    prefill_op_hidden: bool = False
    runtime_op_seconds_beside_cpu: float = 0.0  # Eq. 21d: per host op of a decode MoE layer beside a CPU part; 0: off
    split_cpu_start_seconds: float = 0.0  # Eq. 15b: a decode split's CPU part beyond its roofline; 0: unpriced
    cpu_ddr_read_gb_per_s: float = 0.0  # Eq. 21c: the CPU's weight read alone (the profile's GEMV rate)
    cpu_expert_beside_copy_gb_per_s: float = 0.0  # Eq. 21c: the CPU's expert read beside an expert's copy; 0: unpriced
    ddr_shared_kv_gb_per_s: float = 0.0  # Eqs. 6, 18: DDR's total beside the fused decode attention; 0: as the GEMV's
    ddr_shared_experts_gb_per_s: float = 0.0  # Eq. 21b: DDR's total in a split experts unit; 0: ddr_shared_gb_per_s
    gpu_context_bytes: int = 0  # Eq. 14: the part of every class's GPU workspace outside the runtime's allocator
    prefill_microbatch: Microbatch = Microbatch(0, 0)  # the decoder's prefill micro-batch priced (0, 0: whole batch)
    prefill_options: tuple[PrefillOption, ...] = ()  # other micro-batches the solver may choose (Eq. 20)

    def layer_class(self, name: str) -> ClassCosts:
        for costs in self.classes:
            if costs.layer_class == name:
                return costs
        raise KeyError(name)

    @property
    def tiers(self) -> tuple[str, ...]:
        """Tiers a tensor may be placed in: CXL only when it has a budget."""
        return TIERS if self.budgets.cxl_bytes > 0 else TIERS[:2]

    @property
    def microbatch(self) -> Microbatch:
        """The decoder's prefill micro-batch this CostGraph prices (the whole batch when not set)."""
        if self.prefill_microbatch.sequences:
            return self.prefill_microbatch
        return Microbatch(self.workload.batch_size, self.workload.prompt_len)

    @property
    def microbatches(self) -> tuple[Microbatch, ...]:
        """The micro-batch priced here, then the other candidates (`prefill_options`)."""
        return (self.microbatch,) + tuple(option.microbatch for option in self.prefill_options)

    def with_prefill(self, microbatch: Microbatch) -> "CostGraph":
        """This CostGraph with the decoder's prefill and workspace priced at `microbatch` (one of `microbatches`),
        and no other options."""
        if microbatch == self.microbatch:
            return dataclasses.replace(self, prefill_options=())
        option = next((o for o in self.prefill_options if o.microbatch == microbatch), None)
        if option is None:
            raise KeyError(f"micro-batch {microbatch} is not priced (candidates: {self.microbatches})")
        classes = tuple(dataclasses.replace(c, prefill=option.prefill, workspace_bytes=option.workspace_bytes,
                                            host_workspace_bytes=option.host_workspace_bytes)
                        if c.layer_class == "decoder" else c for c in self.classes)
        return dataclasses.replace(self, classes=classes, prefill_microbatch=microbatch, prefill_options=())

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


def _activation_bytes(sub: Sublayer, point: tuple[int, int, int], weights_touched: float) -> tuple[float, float]:
    """(input, output) activation bytes of a node: its fused reads less weights and KV, and its writes (an
    embedding's `bytes_read` counts the rows it looks up, every other node's counts its whole weights)."""
    weights_read = weights_touched if sub.kind == "embedding" else sub.weight_bytes
    return max(0.0, sub.bytes_read(*point) - weights_read - sub.kv_read(*point)), float(sub.bytes_written(*point))


class _Part(NamedTuple):
    """A node's work on one device: FLOPs, weight bytes, activation bytes in and out (arrays over shares)."""

    flops: float
    weights: float
    a_in: float
    a_out: float


class _NodeTerms(NamedTuple):
    """What one node (one kernel) does in one step: the numbers Eq. 1 prices."""

    flops: float
    weight_bytes: float
    kv_bytes: float
    activation_bytes: float  # in and out


def _shared_terms(sub: Sublayer, share, flops: float, weights: float, a_in: float, a_out: float) -> _Part:
    """What part of a node one device does when it computes `share` of its unit's output features (Eq. 15).

    The weight GEMM: that share of its FLOPs, weights and output, all of its input. A norm before it: all of it
    (each device normalises the whole input it multiplies). Element-wise ops on the output (activation, RoPE, the
    residual add): that share of everything.
    """
    if sub.kind == "linear":
        return _Part(flops * share, weights * share, a_in, a_out * share)
    if sub.kind == "experts":  # a share of the experts: their FLOPs and weights; all tokens in, a whole partial sum out
        return _Part(flops * share, weights * share, a_in, a_out)
    if sub.kind == "norm":
        return _Part(flops, weights, a_in, a_out)
    return _Part(flops * share, weights * share, a_in * share, a_out * share)


def node_seconds(sub: Sublayer, device: str, tier: str, phase: str, point: tuple[int, int, int],
                 hw: HardwareProfile, share=1.0):
    """Roofline time of one node (one kernel) on `device`, its operand in `tier` (Eq. 1).

    max(FLOPs / throughput, Σ bytes / bandwidth of where they are read from) + launch overhead. With `share` < 1
    (a float or an array of them), the node's part in a split unit that computes that share of the output features
    on `device` (Eq. 15).
    """
    if device == "cpu":
        return cpu_node_prices(sub, tier, phase, point, hw, share)[0]
    flops, weights, kv, activations = _node_terms(sub, point, share)
    # Eq. 1c: a weight GEMM's FLOPs at the profile's measured GPU GEMM rate at its rows M = B·Q (the 8192³ probe's
    # rate where the profile has no curve); every other node at the probe's rate
    tflops = hw.gpu_gemm_tflops_at(point[0] * point[1]) if sub.kind == "linear" else hw.gpu_bf16_tflops
    # Streamed operands are staged into HBM first (Eq. 5), so the kernel always reads HBM.
    return np.maximum(flops / (tflops * 1e12),
                      (weights + kv + activations) / (hw.gpu_hbm_gb_per_s * GB)) + hw.gpu_launch_seconds


def _node_terms(sub: Sublayer, point: tuple[int, int, int], share) -> _NodeTerms:
    """What a node does in one step, or its part at `share` of its unit's output features (Eq. 15)."""
    batch, query, _ = point
    flops = float(sub.flops(*point))
    weights = _weights_touched(sub, batch, query)
    kv = float(sub.kv_read(*point))
    a_in, a_out = _activation_bytes(sub, point, weights)
    if not (np.isscalar(share) and share == 1.0):
        flops, weights, a_in, a_out = _shared_terms(sub, np.asarray(share, dtype=np.float64), flops, weights,
                                                    a_in, a_out)
    return _NodeTerms(flops, weights, kv, a_in + a_out)


def cpu_node_prices(sub: Sublayer, tier: str, phase: str, point: tuple[int, int, int], hw: HardwareProfile,
                    share=1.0, capacity: int | None = None):
    """(seconds, beside bytes) of one node on the CPU, its operand in `tier` (Eqs. 1, 18).

    Seconds: Eq. 1. Beside bytes: what PCIe DMA can read from DDR while this kernel runs (Eq. 18): during its
    roofline part, whatever the shared DDR rate leaves beside the kernel's own reads of DDR (its weights in DDR, its
    decode KV cache in DDR), at most the PCIe rate; during its launch overhead, the DMA alone. A prefill kernel over
    Q > 1 tokens leaves DMA its launch overhead only (`prefill_blocks_dma`).

    `capacity` (decode attention run apart from its partner, Eq. 25): the node, if it reads the KV cache, is one
    matmul over the cache's whole capacity of `capacity` tokens (the runtime's q·Kᵀ or p·V, not the fused kernel
    `cpu_kv_read_gb_per_s` measures): its FLOPs and KV bytes at that context, the KV read at the GEMV rate of its
    tier (`cpu_ddr_read_gb_per_s`, or `cxl_gb_per_s`).
    """
    apart = capacity is not None and phase == "decode" and sub.kv_read(*point) > 0
    if apart:
        point = (point[0], point[1], capacity)
    flops, weights, kv, activations = _node_terms(sub, point, share)
    if tier == "cxl" and hw.cxl_gb_per_s <= 0:
        tier = "ddr"  # a profile without CXL never offers the tier (CostGraph.tiers); keep the row finite
    weight_rate = hw.cxl_gb_per_s if tier == "cxl" else hw.cpu_ddr_read_gb_per_s
    # Prefill attention reads the K, V it just produced, not the cache; decode reads the cache's tier.
    kv_rate = hw.cpu_kv_read_gb_per_s
    if phase == "decode" and tier == "cxl":
        kv_rate = min(hw.cxl_gb_per_s, hw.cpu_kv_read_gb_per_s)
    if apart:  # Eq. 25: a matmul over the cache, read at its tier's GEMV rate
        kv_rate = weight_rate
    memory_seconds = weights / (weight_rate * GB) + kv / (kv_rate * GB) + activations / (hw.cpu_ddr_read_gb_per_s * GB)
    rows = cpu_throughput_rows(sub, batch=point[0], query=point[1])
    # Attention in prefill runs as its own kernel (SDPA), at the profile's measured attention curve over Q
    tflops = hw.cpu_attention_tflops_at(rows) if sub.kind in _ATTENTION and point[1] > 1 else hw.cpu_tflops_at(rows)
    if fused_decode_attention(sub, phase, point) and not apart:
        # Eq. 1b: the fused decode kernel over the cache is what `cpu_kv_read_gb_per_s` times, its FLOPs included;
        # the GEMM curve at M = Q = 1 is a weight GEMV's read rate, not a bound on this kernel
        busy = memory_seconds
    else:
        busy = np.maximum(flops / (tflops * 1e12), memory_seconds)
    # The DDR bytes Eq. 6 counts for it (R_cpu,ddr): its weights, and a decode KV cache, when they are in DDR.
    ddr_bytes = (weights + (kv if phase == "decode" else 0.0)) if tier == "ddr" else 0.0 * weights
    h, s = hw.pcie_h2d_gb_per_s * GB, hw.ddr_shared_gb_per_s * GB
    if fused_decode_attention(sub, phase, point) and not apart:
        s = hw.ddr_shared_kv * GB  # Eq. 18a: beside the fused attention, DDR serves its own measured total
    if prefill_blocks_dma(phase, point):
        # Eq. 18a, prefill: DMA reads DDR only in the kernel's launch overhead, not beside its many-row GEMM
        # (measured on the H200 in whole prefills; not DDR contention, which the DMA-beside-GEMM probe rules out: the
        # runtime's lost overlap, priced until it is fixed; docs/cost-model.md §2b)
        beside = 0.0 * busy + min(h, s) * hw.cpu_launch_seconds
    else:
        beside = np.minimum(h * busy, np.maximum(s * busy - ddr_bytes, 0.0)) + min(h, s) * hw.cpu_launch_seconds
    return busy + hw.cpu_launch_seconds, beside


def fused_decode_attention(sub: Sublayer, phase: str, point: tuple[int, int, int]) -> bool:
    """Eq. 1b: whether a CPU node is decode attention reading the KV cache (one query token, the cache read): the
    fused kernel (scaled_dot_product_attention) whose rate the profile measures as `cpu_kv_read_gb_per_s`, so it is
    priced by its bytes at that rate alone, not also by its FLOPs at the GEMM curve's M = 1 point."""
    return phase == "decode" and point[1] == 1 and sub.kind in _ATTENTION and sub.kv_read(*point) > 0


def prefill_blocks_dma(phase: str, point: tuple[int, int, int]) -> bool:
    """Eq. 18a's prefill case: whether a CPU kernel at `point` (B, Q, C) leaves PCIe DMA no DDR beside it. True
    for a prefill over more than one query token (its GEMMs run at M = B·Q rows); the LM head's prefill (Q = 1) and
    decode steps keep the fluid model."""
    return phase == "prefill" and point[1] > 1


def splittable(subs: list[Sublayer]) -> bool:
    """Whether a unit may split its output features between the CPU and the GPU: it has exactly one weight GEMM
    (kind 'linear') and otherwise only the element-wise ops around it (not embeddings, attention, MoE)."""
    return (sum(s.kind == "linear" for s in subs) == 1 and all(s.kind in _SPLIT_KINDS for s in subs))


def transfer_seconds(nbytes: float, rate_gb_per_s: float, hw: HardwareProfile) -> float:
    """One PCIe copy (Eqs. 2, 3): bytes / rate + a fixed latency; nothing to copy costs nothing."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (rate_gb_per_s * GB) + hw.pcie_latency_seconds


# ---------------------------------------------------------------------------------------------------------------
# The pass


def _points(layer_class: str, phase: str, work: Workload) -> list[tuple[int, int, int]]:
    """The whole-batch points of a phase: prefill one (the decoder's micro-batches: `microbatch_points`), decode one
    per step."""
    if phase == "prefill":
        batch, query, context = phase_point("prefill", work.batch_size, work.prompt_len)
        if layer_class == "head":  # the LM head needs only the last position's logits in prefill
            query = 1
        return [(batch, query, context)]
    # gen_len tokens: the prefill's LM head gives the first, then gen_len - 1 decode steps give one each, step t
    # reading C = prompt_len + t + 1 keys (the last token is never fed back, so its K, V are never cached).
    return [phase_point("decode", work.batch_size, work.prompt_len, step) for step in range(work.gen_len - 1)]


def microbatch_points(work: Workload, microbatch: Microbatch) -> tuple[list[tuple[int, int, int]], list[int]]:
    """The distinct (B, Q, C) points of a prefill cut into `microbatch`es, and how many micro-batches share each
    (Eq. 20): row blocks of `sequences` (the last may be smaller) × prompt chunks of `tokens`, chunk j of a row
    block attending to the K, V of every chunk up to it (C = its end)."""
    rows = min(microbatch.sequences, work.batch_size)
    tokens = min(microbatch.tokens, work.prompt_len)
    blocks = {rows: work.batch_size // rows}
    if work.batch_size % rows:
        blocks[work.batch_size % rows] = blocks.get(work.batch_size % rows, 0) + 1
    counts: dict[tuple[int, int, int], int] = {}
    for batch, blocks_of_it in blocks.items():
        for start in range(0, work.prompt_len, tokens):
            query = min(tokens, work.prompt_len - start)
            point = (batch, query, start + query)
            counts[point] = counts.get(point, 0) + blocks_of_it
    points = sorted(counts)
    return points, [counts[p] for p in points]


def _operand(subs: list[Sublayer]) -> str:
    if any(s.weights for s in subs):
        return "weights"
    if any(s.kind in _ATTENTION for s in subs):
        return "kv"
    return "none"


def _unit_costs(name: str, subs: list[Sublayer], operand: str, phase: str, points, hw: HardwareProfile,
                split_permille: tuple[int, ...], whole: tuple[int, int, int] | None = None) -> UnitCosts:
    """One unit's prices at each of `points`. A prefill's micro-batches stage the weights once for all of them
    (Eq. 20): their stream is what the whole batch `whole` touches (an MoE layer: the experts any token hits)."""
    cpu, beside = [], []
    for tier in TIERS:
        row, room = [], []
        for point in points:
            prices = [cpu_node_prices(s, tier, phase, point, hw) for s in subs]
            row.append(float(sum(seconds for seconds, _ in prices)))
            room.append(float(sum(nbytes for _, nbytes in prices)))
        cpu.append(tuple(row))
        beside.append(tuple(room))
    gpu = tuple(float(sum(node_seconds(s, "gpu", "hbm", phase, p, hw) for s in subs)) for p in points)
    stream, cpu_read, kv_up, kv_down = [], [], [], []
    for batch, query, context in points:
        point = (batch, query, context)
        weights = sum(_weights_touched(s, batch, query) for s in subs)
        kv = sum(s.kv_read(*point) for s in subs)
        if operand == "weights":
            operand_bytes = float(weights)
            staged = float(sum(_weights_touched(s, whole[0], whole[1]) for s in subs)) if whole else operand_bytes
        elif operand == "kv" and phase == "decode":
            operand_bytes = staged = float(kv)  # decode attention reads the cache where it lives; prefill, fresh K, V
        else:
            operand_bytes = staged = 0.0
        stream.append(staged)
        cpu_read.append(operand_bytes)
        written = sum(s.kv_written(*point) for s in subs)
        kv_up.append(transfer_seconds(written, hw.pcie_h2d_gb_per_s, hw))
        kv_down.append(transfer_seconds(written, hw.pcie_d2h_gb_per_s, hw))
    allows_hbm = operand == "none" or (operand == "kv" and phase == "prefill")
    apart = {}
    if operand == "kv" and phase == "decode" and points:
        apart = _apart_costs(subs, points, hw)
    split = {}
    if split_permille and operand == "weights" and splittable(subs):
        split = _split_costs(subs, phase, points, hw, split_permille)
    if any(s.kind == "experts" and s.experts[0] for s in subs):
        split = _expert_costs(subs, phase, points, hw)
    return UnitCosts(name=name, cpu_seconds=tuple(cpu), cpu_beside_bytes=tuple(beside), cpu_allows_hbm=allows_hbm,
                     gpu_seconds=gpu,
                     stream_bytes=tuple(stream), cpu_read_bytes=tuple(cpu_read), kv_to_gpu_seconds=tuple(kv_up),
                     kv_to_host_seconds=tuple(kv_down), **apart, **split)


def _apart_costs(subs: list[Sublayer], points, hw: HardwareProfile) -> dict:
    """A decode attention unit's CPU prices when its partner (score's context, context's score) runs on the other
    device (Eq. 25), as UnitCosts fields: the runtime then runs it alone over the cache's whole capacity, the
    context of the last decode step (the KV tokens the cache holds), as one matmul read at the GEMV rate."""
    capacity = max(context for _, _, context in points)
    cpu, beside = [], []
    for tier in TIERS:
        prices = [[cpu_node_prices(s, tier, "decode", point, hw, capacity=capacity) for s in subs] for point in points]
        cpu.append(tuple(float(sum(seconds for seconds, _ in row)) for row in prices))
        beside.append(tuple(float(sum(nbytes for _, nbytes in row)) for row in prices))
    read = tuple(float(sum(s.kv_read(batch, query, capacity) for s in subs)) for batch, query, _ in points)
    return {"cpu_apart_seconds": tuple(cpu), "cpu_apart_beside_bytes": tuple(beside), "cpu_apart_read_bytes": read}


def _split_costs(subs: list[Sublayer], phase: str, points, hw: HardwareProfile,
                 split_permille: tuple[int, ...]) -> dict:
    """The split prices of a splittable unit at every CPU share of the grid (Eqs. 15-16), as UnitCosts fields.

    Bytes: the GPU part streams the GEMM weights' GPU share and the whole of the other (norm) weights; the CPU
    computes features [0, r) with r = N·permille // 1000, which leaves the GPU less than one feature more than its
    share: two weight rows (a fused gate/up projection moves a gate row and an up row per feature) bound it, so
    the staging buffer never comes out short. The CPU part reads its share of the GEMM weights and the norm's.
    """
    cpu_share = np.asarray(split_permille, dtype=np.float64) / 1000.0
    gemm = next(s for s in subs if s.kind == "linear")
    gemm_bytes = float(gemm.weight_bytes)
    rows = gemm.weights[0].shape[0] if gemm.weights else 1
    other_bytes = float(sum(s.weight_bytes for s in subs if s.kind != "linear"))
    stream = (1.0 - cpu_share) * gemm_bytes + 2.0 * gemm_bytes / rows + other_bytes
    read = cpu_share * gemm_bytes + other_bytes
    cpu = np.zeros((len(split_permille), len(TIERS), len(points)))
    beside = np.zeros_like(cpu)
    gpu = np.zeros((len(split_permille), len(points)))
    for step, point in enumerate(points):
        for tier_index, tier in enumerate(TIERS):
            for sub in subs:
                seconds, nbytes = cpu_node_prices(sub, tier, phase, point, hw, cpu_share)
                cpu[:, tier_index, step] += seconds
                beside[:, tier_index, step] += nbytes
        gpu[:, step] = sum(node_seconds(s, "gpu", "hbm", phase, point, hw, 1.0 - cpu_share) for s in subs)

    def nested(array):
        return tuple(nested(a) for a in array) if array.ndim > 1 else tuple(float(v) for v in array)

    steps = len(points)
    return {"split_cpu_seconds": nested(cpu), "split_cpu_beside_bytes": nested(beside),
            "split_gpu_seconds": nested(gpu),
            "split_stream_bytes": nested(np.repeat(stream[:, None], steps, axis=1)),
            "split_cpu_read_bytes": nested(np.repeat(read[:, None], steps, axis=1))}


def _expert_costs(subs: list[Sublayer], phase: str, points, hw: HardwareProfile) -> dict:
    """An MoE experts unit's prices per count of its experts on one device (Eq. 21), as UnitCosts fields.

    Experts are interchangeable under uniform routing, so n of E experts do n / E of the unit's routed work: its
    FLOPs and the weight bytes its tokens hit (E_hit / E of each expert's), with every token's hidden state in and
    a whole partial sum out (Eq. 15's parts, shared by expert count instead of output features).
    """
    (node,) = [s for s in subs if s.kind == "experts"]
    num_experts = node.experts[0]
    share = np.arange(num_experts + 1, dtype=np.float64) / num_experts
    cpu = np.zeros((num_experts + 1, len(TIERS), len(points)))
    beside = np.zeros_like(cpu)
    gpu = np.zeros((num_experts + 1, len(points)))
    for step, point in enumerate(points):
        for tier_index, tier in enumerate(TIERS):
            for sub in subs:
                seconds, nbytes = cpu_node_prices(sub, tier, phase, point, hw, share)
                cpu[:, tier_index, step] += seconds
                beside[:, tier_index, step] += nbytes
        gpu[:, step] = sum(node_seconds(s, "gpu", "hbm", phase, point, hw, share) for s in subs)
    cpu[0], beside[0], gpu[0] = 0.0, 0.0, 0.0  # no expert on the device: no part there

    def nested(array):
        return tuple(nested(a) for a in array) if array.ndim > 1 else tuple(float(v) for v in array)

    return {"experts": num_experts, "expert_cpu_seconds": nested(cpu), "expert_cpu_beside_bytes": nested(beside),
            "expert_gpu_seconds": nested(gpu),
            "expert_bytes": tuple(float(_weights_touched(node, p[0], p[1])) / num_experts for p in points),
            "expert_slot_bytes": node.weight_bytes // num_experts}


class _Edge(NamedTuple):
    """An activation crossing from unit `src` to unit `dst` (indices into the class's units), `nbytes` a Poly."""

    src: int
    dst: int
    nbytes: object


def _class_edges(graph: SublayerGraph, layer_class: str, units: list[str]) -> list[_Edge]:
    """The activations crossing between units of one layer of the class.

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
            edges.append(_Edge(index[a.unit], index[b.unit], nbytes))
        elif layer_class == "decoder" and a.layer_class != "decoder" and b.layer_class == "decoder":
            inputs.append((index[b.unit], nbytes))
        elif layer_class == "decoder" and a.layer_class == "decoder" and b.layer_class != "decoder":
            out_units.add(index[a.unit])
    for out in sorted(out_units):
        for dst, nbytes in inputs:
            if dst != out:
                edges.append(_Edge(out, dst, nbytes))
    return edges


def annotate_costs(graph: SublayerGraph, hw: HardwareProfile, workload: Workload, budgets: TierBudgets,
                   split_permille: tuple[int, ...] = SPLIT_PERMILLE,
                   microbatches: tuple[Microbatch, ...] | None = None) -> CostGraph:
    """SublayerGraph[traced] + HardwareProfile → CostGraph.

    Args:
        graph: the traced sublayer graph (stage 'traced').
        hw: the hardware profile.
        workload: batch size, prompt and generation lengths.
        budgets: bytes per tier the plan may use, and the prefetch depth.
        split_permille: CPU shares (permille, each 1..999) to price split units at; () prices no splits.
        microbatches: the decoder's prefill micro-batches to price (Eq. 20): the first into the decoder class, the
            others as `prefill_options` for the solver to choose among; None: `prefill_microbatches`' candidates.

    Returns:
        The CostGraph: prices for every unit, device, tier, phase and step.

    Raises:
        ValueError: the graph is not at stage 'traced', a split share is outside 1..999, or a micro-batch is not
            positive.
    """
    require_stage(graph, "traced", "annotate_costs")
    split_permille = tuple(sorted({int(p) for p in split_permille}))
    if any(not 0 < p < 1000 for p in split_permille):
        raise ValueError(f"split shares must be permille in 1..999, got {split_permille}")
    if microbatches is not None and (not microbatches or any(m.sequences < 1 or m.tokens < 1 for m in microbatches)):
        raise ValueError(f"prefill micro-batches must have at least one sequence and token, got {microbatches}")
    embed_weights = {w.name for s in graph.sublayers("embed") for w in s.weights}
    shares = graph.graph.get("tied_weights", {})  # head weight name → the embedding weight it shares storage with
    tied = {w.name: w.nbytes for s in graph.sublayers("head") for w in s.weights
            if w.name in embed_weights or w.name in shares}
    # A tied matrix the tracer lists only under the head is still the embedding's: the lookup reads it too.
    embed_extra = tuple(w for s in graph.sublayers("head") for w in s.weights
                        if w.name in shares and shares[w.name] not in embed_weights)
    layers = {}
    for layer_class in ("embed", "decoder", "head"):
        units = graph.units(layer_class)
        subs = graph.sublayers(layer_class)
        if layer_class == "embed" and embed_extra:
            subs = [dataclasses.replace(s, weights=s.weights + embed_extra) if s.kind == "embedding" else s
                    for s in subs]
        layers[layer_class] = _Layer(units, subs, {u: [s for s in subs if s.unit == u] for u in units},
                                     _class_edges(graph, layer_class, units))
    decoder = layers["decoder"]
    residual = _residual_bytes(graph)

    def peak(name: str, phase: str) -> float:
        layer = layers[name]
        return activation_peak_bytes(layer.subs, layer.units, layer.edges, phase, _points(name, phase, workload))

    decoding = peak("decoder", "decode")

    def decoder_activations(microbatch: Microbatch) -> float:
        """The decoder's activation peak (Eq. 14) with its prefill in `microbatch`es (Eq. 20)."""
        return max(decoding, _prefill_activations(decoder, residual, workload, microbatch))

    if microbatches is None:
        # Candidates halve while the decoder's own workspace shrinks (the embedding's may sit on the CPU, so it does
        # not stop the halving).
        microbatches = prefill_microbatches(workload, lambda m: gpu_workspace_bytes(decoder_activations(m), hw),
                                            budgets.hbm_bytes or budgets.ddr_bytes)
    classes = []
    for layer_class, layer in layers.items():
        phases = {}
        for phase in PHASES:
            if layer_class == "decoder" and phase == "prefill":
                phases[phase] = _prefill_costs(layer, workload, microbatches[0], hw, split_permille)
            else:
                phases[phase] = _phase_costs(layer, phase, _points(layer_class, phase, workload), hw, split_permille)
        activations = decoder_activations(microbatches[0]) if layer_class == "decoder" \
            else max(peak(layer_class, phase) for phase in PHASES)
        kv_cache = 0
        if layer_class == "decoder":
            prefill_point = _points("decoder", "prefill", workload)[0]
            kv_cache = int(sum(s.kv_written(*prefill_point) for s in layer.subs)
                           + sum(s.kv_written(*p) for s in layer.subs for p in _points("decoder", "decode", workload)))
        classes.append(ClassCosts(layer_class=layer_class, count=int(graph.graph["layer_counts"][layer_class]),
                                  units=tuple(layer.units), operands=layer.operands, weight_bytes=layer.weight_bytes,
                                  kv_cache_bytes=kv_cache, workspace_bytes=gpu_workspace_bytes(activations, hw),
                                  prefill=phases["prefill"], decode=phases["decode"],
                                  host_workspace_bytes=int(activations)))
    options = tuple(PrefillOption(m, _prefill_costs(decoder, workload, m, hw, split_permille),
                                  gpu_workspace_bytes(decoder_activations(m), hw), int(decoder_activations(m)))
                    for m in microbatches[1:])
    cxl_stream = min(hw.cxl_gb_per_s, hw.pcie_h2d_gb_per_s) if hw.cxl_gb_per_s > 0 else hw.pcie_h2d_gb_per_s
    return CostGraph(model=str(graph.graph.get("model", {}).get("name", "model")), profile=hw.name,
                     profile_sha256=hw.sha256(), workload=workload, budgets=budgets,
                     h2d_gb_per_s=hw.pcie_h2d_gb_per_s, cxl_stream_gb_per_s=cxl_stream,
                     ddr_shared_gb_per_s=hw.ddr_shared_gb_per_s, classes=tuple(classes),
                     tied_weight_bytes=sum(tied.values()), split_permille=split_permille,
                     pcie_latency_seconds=hw.pcie_latency_seconds, split_sync_seconds=hw.split_sync_seconds,
                     runtime_op_seconds=hw.runtime_op_seconds, prefill_op_hidden=bool(hw.gpu_gemm_bf16_tflops),
                     runtime_op_seconds_beside_cpu=hw.runtime_op_seconds_beside_cpu,
                     split_cpu_start_seconds=hw.split_cpu_start_seconds,
                     cpu_ddr_read_gb_per_s=hw.cpu_ddr_read_gb_per_s,
                     cpu_expert_beside_copy_gb_per_s=hw.cpu_expert_beside_copy_gb_per_s,
                     ddr_shared_kv_gb_per_s=hw.ddr_shared_kv_gb_per_s,
                     ddr_shared_experts_gb_per_s=hw.ddr_shared_experts_gb_per_s,
                     gpu_context_bytes=hw.gpu_context_bytes, prefill_microbatch=microbatches[0],
                     prefill_options=options)


class _Layer(NamedTuple):
    """One layer class as the pass prices it: its units, its nodes, its nodes per unit, its activation edges."""

    units: list[str]
    subs: list[Sublayer]
    by_unit: dict[str, list[Sublayer]]
    edges: list[_Edge]

    @property
    def operands(self) -> tuple[str, ...]:
        return tuple(_operand(self.by_unit[u]) for u in self.units)

    @property
    def weight_bytes(self) -> tuple[int, ...]:
        return tuple(sum(s.weight_bytes for s in self.by_unit[u]) for u in self.units)


def _phase_costs(layer: _Layer, phase: str, points, hw: HardwareProfile, split_permille: tuple[int, ...],
                 repeats: tuple[int, ...] = (), whole: tuple[int, int, int] | None = None) -> PhaseCosts:
    operands = layer.operands
    unit_costs = tuple(_unit_costs(u, layer.by_unit[u], operands[i], phase, points, hw, split_permille, whole)
                       for i, u in enumerate(layer.units))
    edge_costs = tuple(
        EdgeCosts(src=src, dst=dst,
                  h2d_seconds=tuple(transfer_seconds(nbytes(*p), hw.pcie_h2d_gb_per_s, hw) for p in points),
                  d2h_seconds=tuple(transfer_seconds(nbytes(*p), hw.pcie_d2h_gb_per_s, hw) for p in points))
        for src, dst, nbytes in layer.edges)
    return PhaseCosts(steps=len(points), units=unit_costs, edges=edge_costs, repeats=repeats)


def _prefill_costs(layer: _Layer, work: Workload, microbatch: Microbatch, hw: HardwareProfile,
                   split_permille: tuple[int, ...]) -> PhaseCosts:
    """The decoder's prefill in `microbatch`es (Eq. 20): one step per distinct micro-batch point; the weights are
    staged once for all of them (priced at the whole batch)."""
    points, counts = microbatch_points(work, microbatch)
    whole = _points("decoder", "prefill", work)[0]
    if points == [whole]:
        return _phase_costs(layer, "prefill", points, hw, split_permille)
    return _phase_costs(layer, "prefill", points, hw, split_permille, tuple(counts), whole)


def prefill_microbatches(work: Workload, workspace, budget_bytes: int) -> tuple[Microbatch, ...]:
    """The prefill micro-batches offered to the solver (Eq. 20): the whole batch, then halving it, by sequences first
    (LIA's mini-batches) and, once one sequence is left, by prompt tokens (chunks), for as long as a halving frees at
    least `WORKSPACE_SHARE` of `budget_bytes` of workspace (`workspace(microbatch)`, Eq. 14)."""
    out = [Microbatch(work.batch_size, work.prompt_len)]
    current = workspace(out[0])
    sequences, tokens = out[0].sequences, out[0].tokens
    while sequences > 1 or tokens > 1:
        if sequences > 1:
            sequences = -(-sequences // 2)
        else:
            tokens = -(-tokens // 2)
        candidate = Microbatch(sequences, tokens)
        smaller = workspace(candidate)
        if current - smaller < WORKSPACE_SHARE * budget_bytes:
            break
        out.append(candidate)
        current = smaller
    return tuple(out)


def experts_transient_bytes(sub: Sublayer, point: tuple[int, int, int]) -> float:
    """Eq. 14's term for an MoE experts node beyond its traced inputs and output, from its stacked weights' traced
    shapes (E, I, D) and (E, D, F) (I = 2F for SwiGLU) and the step's n = B·Q tokens, top-k of E (the runtime's
    `experts_partial` on the GPU, runtime/executor.py `_experts_step`):

    * the routing grouped by expert: each assignment's token index (int64) and weight (fp32), 12·n·k bytes;
    * the device's partial sum, n·D·s (s the weights' element size: the model's dtype);
    * the larger of one expert's intermediates on a block of R = ⌈n·k / E⌉ tokens (`expert_block_rows`: the
      runtime computes a more-routed expert in blocks of R) — its gathered input R·D, the first GEMM's R·I, the
      activation's R·F and the gated product's R·F, all of size s — and, at the merge, the other device's partial
      sum copied beside it (n·D·s).
    0 for every other node."""
    if sub.kind != "experts" or not sub.experts[0]:
        return 0.0
    num_experts, top_k = sub.experts
    stacked = [w for w in sub.weights if len(w.shape) == 3]
    if len(stacked) != 2:
        return 0.0
    first, second = stacked if stacked[0].shape[2] == stacked[1].shape[1] else stacked[::-1]
    hidden, inner, gated = first.shape[2], first.shape[1], second.shape[2]
    size = first.nbytes / math.prod(first.shape)
    tokens = point[0] * point[1]
    rows = expert_block_rows(tokens, top_k, num_experts)
    block = rows * size * max(hidden + inner + 2 * gated, 2 * hidden + inner + gated)
    partial = tokens * hidden * size
    return 12.0 * tokens * top_k + partial + max(block, partial)


def _node_live_bytes(sub: Sublayer, point: tuple[int, int, int], fresh_kv: float) -> float:
    """What one node holds at once while it runs: its activation inputs and outputs; an attention node in prefill
    also this step's K and V (`fresh_kv`: activations until attention has read them); a gated activation
    (silu(gate)·up: its input is twice its output) also its act(gate). Attention is counted as traced, its
    probabilities materialised (a fused kernel holds less; run apart, the runtime computes them in query blocks
    into one output, so the block's fp32 softmax adds little)."""
    a_in, a_out = _activation_bytes(sub, point, _weights_touched(sub, point[0], point[1]))
    live = a_in + a_out + experts_transient_bytes(sub, point)
    if sub.kind in _ATTENTION:
        live += fresh_kv
    if sub.kind == "activation" and a_in > a_out:
        live += a_out
    return live


def activation_peak_bytes(subs: list[Sublayer], units: list[str], edges, phase: str, points) -> float:
    """Eq. 14: the most activation bytes one layer of a class holds at once, over the phase's steps.

    The runtime frees each value after its last reader (runtime/schedule.py, `Op.drops`), so while unit u runs it
    holds the values crossing u (the class's activation edges from a unit before u to one after it; the cross-layer
    edges, handed from this layer's output unit to the next layer's, are held from the layer's start to their
    reader: the residual stream) and what the node of u that needs most holds itself (`_node_live_bytes`).
    """
    peak = 0.0
    for point in points:
        fresh_kv = sum(float(s.kv_read(*point)) for s in subs) if phase == "prefill" else 0.0
        for index, unit in enumerate(units):
            held = sum(float(e.nbytes(*point)) for e in edges
                       if (e.src < index < e.dst) or (e.src > e.dst and (index < e.dst or index > e.src)))
            nodes = max((_node_live_bytes(s, point, fresh_kv) for s in subs if s.unit == unit), default=0.0)
            peak = max(peak, held + nodes)
    return peak


def class_activation_peak(graph: SublayerGraph, layer_class: str, workload: Workload,
                          microbatch: Microbatch | None = None) -> float:
    """Eq. 14's activation peak A of one class at a workload, over both phases (what `annotate_costs` records as
    the class's `host_workspace_bytes`), straight from the traced graph; the decoder's prefill in `microbatch`es
    (None: the whole batch at once)."""
    units, subs = graph.units(layer_class), graph.sublayers(layer_class)
    edges = _class_edges(graph, layer_class, units)
    if layer_class == "decoder" and microbatch is not None:
        return max(activation_peak_bytes(subs, units, edges, "decode", _points("decoder", "decode", workload)),
                   _prefill_activations(_Layer(units, subs, {}, edges), _residual_bytes(graph), workload,
                                        microbatch))
    return max(activation_peak_bytes(subs, units, edges, phase, _points(layer_class, phase, workload))
               for phase in PHASES)


# torch's caching allocator takes GPU memory in segments: a request of 1-10 MiB gets a 20 MiB segment, one under
# 1 MiB a 2 MiB one, each stream its own. Beside a small live set the last segment it needs is mostly empty: on the
# H200 (2026-12-02, bench/results/h200-2026-12-02/probe) OPT-30B at batch 1 held 38 MiB of activations and 12 MiB
# of free fragments and then asked for one more 20 MiB segment, past a 70 MiB workspace. Two such segments (the
# compute stream's and a side stream's) are Eq. 14's constant term beside the scaled activations.
ALLOCATOR_SEGMENTS_BYTES = 2 * 20 * MIB


def gpu_workspace_bytes(activation_bytes: float, hw: HardwareProfile) -> int:
    """Eq. 14: what the process holds on the GPU beyond weights, KV caches and staging buffers while it computes a
    class there: the CUDA context (outside the caching allocator), the libraries' workspaces, the activation
    peak scaled by the profile's measured `gpu_activation_factor` (the allocator's reserved bytes over the model),
    and the allocator's last partly used segments (`ALLOCATOR_SEGMENTS_BYTES`)."""
    return int(hw.gpu_context_bytes + hw.gpu_library_workspace_bytes + hw.gpu_activation_factor * activation_bytes
               + ALLOCATOR_SEGMENTS_BYTES)


def _residual_bytes(graph: SublayerGraph):
    """Bytes of the residual stream at a point (B, Q, C): the largest activation the embedding hands the decoder
    (a Poly; a function returning 0 for a graph without one)."""
    tensors = [data["tensor"].nbytes for src, dst, data in graph.edges(data=True)
               if graph.nodes[src]["sublayer"].layer_class == "embed"
               and graph.nodes[dst]["sublayer"].layer_class == "decoder"]
    return lambda *point: max((float(t(*point)) for t in tensors), default=0.0)


def _prefill_activations(layer: _Layer, residual, work: Workload, microbatch: Microbatch) -> float:
    """The decoder's prefill activation peak in `microbatch`es (Eqs. 14, 20): one micro-batch's peak
    (`activation_peak_bytes` at its points), plus the rest of the batch's residual stream (held between layers: the
    prefill runs layer by layer) and, when the prompt is chunked, the layer's K and V of the prompt so far for one
    row block (the buffer chunked attention reads; counted beside the chunk's own K, V, which is conservative)."""
    points, _ = microbatch_points(work, microbatch)
    rows = min(microbatch.sequences, work.batch_size)
    tokens = min(microbatch.tokens, work.prompt_len)
    whole = (work.batch_size, work.prompt_len, work.prompt_len)
    held = residual(*whole) - residual(rows, tokens, tokens)
    prompt_kv = 0.0
    if tokens < work.prompt_len:
        prompt_kv = float(sum(s.kv_written(rows, work.prompt_len, work.prompt_len) for s in layer.subs))
    return activation_peak_bytes(layer.subs, layer.units, layer.edges, "prefill", points) + held + prompt_kv
