"""The one IR: the sublayer graph, and the records its nodes and edges carry.

A `SublayerGraph` is a `networkx.DiGraph` holding one *template* per layer class (the decoder layer once, not
N times; `graph.graph["layer_counts"]["decoder"] = N`), plus the embedding and LM-head classes. Nodes are named
`<class>.<sublayer>` (`decoder.qkv`, `decoder.attn_norm`, `head.lm_head`) and carry one `Sublayer` record under
the key `"sublayer"`; passes add their own keys (one key per pass, a frozen record), never rename others'.
Edges carry the activation crossing them as a `TensorSpec` under `"tensor"`.

Costs are functions of the workload point, kept symbolic as `Poly`: multilinear polynomials in
    B  batch size,   Q  query tokens this step,   C  context tokens (keys attended, including this step's).
Prefill of an L-token prompt is (B, Q=L, C=L); decode step t after it is (B, Q=1, C=L+t+1).

Stages (`graph.graph["stage"]`), in pipeline order, are listed in `STAGES`; a pass checks its input's stage and
names the pass that must run first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Mapping

import networkx as nx

from liac.plan import LAYER_CLASSES, PHASES

__all__ = [
    "STAGES", "OP_KINDS", "Poly", "WeightTensor", "TensorSpec", "Sublayer", "SublayerGraph", "require_stage",
    "phase_point",
]

STAGES = ("traced",)  # annotate_costs turns a traced graph into a CostGraph, a record of its own

# Op kinds a sublayer node can have. Placement units are the weight GEMMs, attention and MoE blocks; the rest are
# small element-wise ops that run on the device of the unit they are attached to (`Sublayer.unit`).
OP_KINDS = (
    "embedding",          # token (+ position) lookup
    "linear",             # GEMM with a weight: qkv, out_proj, fc1/gate_up, fc2/down, lm_head, router gate
    "attention_score",    # q·Kᵀ over the KV cache (plus scale and mask)
    "softmax",
    "attention_context",  # p·V over the KV cache
    "norm",               # LayerNorm / RMSNorm
    "rope",               # rotary position embedding of q and k
    "activation",         # ReLU, SiLU·up
    "add",                # residual add
    "router",             # MoE gate: logits, softmax, top-k
    "experts",            # MoE experts (routed GEMMs)
)

_VARS = ("B", "Q", "C")


@dataclass(frozen=True)
class Poly:
    """A multilinear polynomial in (B, Q, C) with integer coefficients, e.g. 2·B·Q·D² FLOPs.

    `terms` maps exponent triples (b, q, c), each 0 or 1, to coefficients. Evaluate with `poly(B, Q, C)`.
    """

    terms: tuple[tuple[tuple[int, int, int], int], ...] = ()

    @staticmethod
    def of(mapping: Mapping[tuple[int, int, int], int | Fraction]) -> "Poly":
        clean = []
        for exps, coeff in sorted(mapping.items()):
            coeff = Fraction(coeff)
            if coeff.denominator != 1:
                raise ValueError(f"Poly coefficients must be integers, got {coeff} for {exps}")
            if coeff:
                clean.append((tuple(exps), int(coeff)))
        return Poly(tuple(clean))

    @staticmethod
    def const(value: int) -> "Poly":
        return Poly.of({(0, 0, 0): value})

    def __call__(self, B: float, Q: float, C: float) -> float:
        total = 0
        for (b, q, c), coeff in self.terms:
            total += coeff * (B if b else 1) * (Q if q else 1) * (C if c else 1)
        return total

    def __add__(self, other: "Poly") -> "Poly":
        acc: dict[tuple[int, int, int], int] = dict(self.terms)
        for exps, coeff in other.terms:
            acc[exps] = acc.get(exps, 0) + coeff
        return Poly.of(acc)

    def scale(self, factor: int | Fraction) -> "Poly":
        return Poly.of({exps: coeff * Fraction(factor) for exps, coeff in self.terms})

    def __bool__(self) -> bool:
        return bool(self.terms)

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for exps, coeff in self.terms:
            names = "·".join(v for v, e in zip(_VARS, exps) if e)
            parts.append(f"{coeff}·{names}" if names else str(coeff))
        return " + ".join(parts)

    def to_json(self) -> list[list[int]]:
        return [[b, q, c, coeff] for (b, q, c), coeff in self.terms]

    @staticmethod
    def from_json(data: Iterable[Iterable[int]]) -> "Poly":
        return Poly.of({(b, q, c): coeff for b, q, c, coeff in data})


def phase_point(phase: str, batch: int, prompt_len: int, step: int = 0) -> tuple[int, int, int]:
    """(B, Q, C) of a phase: prefill of the prompt, or decode step `step` (0-based) after it."""
    if phase == "prefill":
        return batch, prompt_len, prompt_len
    if phase == "decode":
        return batch, 1, prompt_len + step + 1
    raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


@dataclass(frozen=True)
class WeightTensor:
    """A parameter a sublayer reads: its name in the model's state dict, shape, dtype and size."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class TensorSpec:
    """An activation on an edge: symbolic shape (ints and 'B'/'Q'/'C'), dtype, and size in bytes."""

    shape: tuple[int | str, ...]
    dtype: str
    nbytes: Poly


@dataclass(frozen=True)
class Sublayer:
    """What the tracer knows about one sublayer node. All byte counts are per layer of the class.

    Attributes:
        name: sublayer name inside its class ('qkv', 'attn_norm', 'lm_head').
        kind: one of OP_KINDS.
        layer_class: one of LAYER_CLASSES.
        unit: the placement unit this node runs with (its own name for units; e.g. 'qkv' for 'attn_norm').
        weights: parameters read.
        flops: floating-point operations.
        bytes_read: bytes of inputs read (activations, weights, KV cache).
        bytes_written: bytes of outputs written (activations, new KV entries).
        kv_read: bytes of KV cache read (attention over the context).
        kv_written: bytes of KV cache appended (this step's K and V).
        experts: (num_experts, top_k) for MoE nodes, else (0, 0): FLOPs above count routed tokens only; weight
            bytes touched per step depend on how many experts the step's tokens hit.
    """

    name: str
    kind: str
    layer_class: str
    unit: str
    weights: tuple[WeightTensor, ...] = ()
    flops: Poly = field(default_factory=Poly)
    bytes_read: Poly = field(default_factory=Poly)
    bytes_written: Poly = field(default_factory=Poly)
    kv_read: Poly = field(default_factory=Poly)
    kv_written: Poly = field(default_factory=Poly)
    experts: tuple[int, int] = (0, 0)

    def __post_init__(self):
        if self.kind not in OP_KINDS:
            raise ValueError(f"kind must be one of {OP_KINDS}, got {self.kind!r}")
        if self.layer_class not in LAYER_CLASSES:
            raise ValueError(f"layer_class must be one of {LAYER_CLASSES}, got {self.layer_class!r}")

    @property
    def weight_bytes(self) -> int:
        return sum(w.nbytes for w in self.weights)

    @property
    def is_unit(self) -> bool:
        return self.unit == self.name


class SublayerGraph(nx.DiGraph):
    """networkx DiGraph of sublayers; see the module docstring for the node, edge and graph keys.

    Graph keys: `stage` (one of STAGES), `model` (ModelConfig.to_dict()), `layer_counts` ({class: count}),
    `units` ({class: [unit names in execution order]}).
    """

    def sublayers(self, layer_class: str | None = None) -> list[Sublayer]:
        """Sublayer records in topological order (optionally of one class)."""
        out = []
        for node in nx.lexicographical_topological_sort(self):
            sub = self.nodes[node]["sublayer"]
            if layer_class is None or sub.layer_class == layer_class:
                out.append(sub)
        return out

    def units(self, layer_class: str) -> list[str]:
        return list(self.graph["units"][layer_class])


def require_stage(graph: nx.DiGraph, stage: str, pass_name: str) -> None:
    """Raise when `graph` is not at `stage`, naming the pass that produces it."""
    have = graph.graph.get("stage")
    if have != stage:
        producer = {"traced": "trace_model (liac.passes.trace)"}
        raise ValueError(f"{pass_name} needs a graph at stage '{stage}', got '{have}': run "
                         f"{producer.get(stage, stage)} first")
