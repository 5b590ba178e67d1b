"""OpGraph → LoweredLayer: group one layer's ops into named sublayer nodes and count their work at one point.

`trace.py` exports a layer at several sample points (B, Q, C) and calls `lower_program` on each; this module knows
nothing of model families. `trace_ops.py` turns the export into values and categorised ops (steps 1 and 2); this
module does the rest:

3. **Element-wise components** (connected element-wise ops) join an anchor: ops on the scores between q·Kᵀ and
   softmax (scale, mask) fuse into q·Kᵀ at no FLOPs; a component holding top-k is the MoE router (with its gate
   GEMM); one that mixes q/k with auxiliary tensors and feeds attention or the cache is RoPE; one fed by the
   activation is the gated product (SiLU(gate)·up); any other joins its single producer (an epilogue such as
   OPT's q scaling, free after a GEMM).
4. **Roles by structure.** Sibling GEMMs reading the same input fuse (q/k/v → qkv, gate/up → gate_up); GEMMs
   feeding attention are `qkv`, the one reading attention's output `out_proj`, the one feeding the activation
   `fc1`/`gate_up` (gated), the one reading it `fc2`/`down`; norms and residual adds are named by what they feed
   or follow. The head class is final_norm + lm_head; the embedding class is one node.
5. **Work.** A node's FLOPs are its ops' FLOPs. Its bytes are the fused traffic: distinct tensors entering it from
   outside (activations, whole weights, gathered embedding rows, the KV cache) and tensors leaving it (edges,
   cache writes, the class output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

from torch import nn

from liac.ir import WeightTensor
from liac.passes.trace_ops import (GATHER_OPS, GEMM_OPS, INPUT_ROLES, OUTPUT_ROLES, ROUTING_OPS, LoweringError,
                                   Op, OpGraph, Value, dtype_name)

__all__ = ["LoweringError", "LoweredNode", "LoweredEdge", "LoweredLayer", "lower_program", "INPUT", "INPUT_ROLES",
           "OUTPUT_ROLES"]

INPUT = "@input"  # edge source standing for the class input (the previous class's output)


@dataclass(frozen=True)
class LoweredNode:
    """One sublayer node at one sample point: integer work counts (`flops` may be a Fraction for MoE)."""

    name: str
    kind: str
    unit: str
    weights: tuple[WeightTensor, ...]
    flops: int | Fraction
    bytes_read: int
    bytes_written: int
    kv_read: int
    kv_written: int
    experts: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class LoweredEdge:
    """An activation from node `src` (or INPUT) to node `dst`, at one sample point."""

    src: str
    dst: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class LoweredLayer:
    """A layer class lowered at one point: nodes in execution order, edges, units, and the node producing the output."""

    nodes: tuple[LoweredNode, ...]
    edges: tuple[LoweredEdge, ...]
    units: tuple[str, ...]
    output_node: str


# ---------------------------------------------------------------------------------------------------------------
# Step 3 (and step 4's sibling fusion): ops → groups, one per sublayer node


@dataclass(eq=False)
class _Group:
    ops: list[Op]
    kind: str  # OP_KINDS kind, or 'ew' before an element-wise component is merged
    role: str = ""  # attention parts: 'score' | 'softmax' | 'context'
    gated: bool = False  # an activation that multiplies by a second projection (SwiGLU)
    router: bool = False  # a gate GEMM whose output is routed by top-k
    name: str = ""
    unit: str = ""

    @property
    def first(self) -> int:
        return min(op.index for op in self.ops)

    def describe(self) -> str:
        return ", ".join(f"'{op.name}' ({op.target})" for op in sorted(self.ops, key=lambda o: o.index)[:6])


_ANCHOR_KIND = {"gemm_w": "linear", "score": "attention_score", "context": "attention_context", "softmax": "softmax",
                "act": "activation", "norm": "norm", "gather": "embedding", "residual": "add"}


class _Grouper:
    """Groups ops into sublayer nodes: anchors, then element-wise components, then sibling GEMMs (steps 2-4)."""

    def __init__(self, built: OpGraph, merge_elementwise: bool = True):
        self.built = built
        self.ops = built.ops
        self.by_name = {op.name: op for op in self.ops}
        self.readers: dict[str, list[Op]] = {}  # producer op name → ops reading any of its values
        for op in self.ops:
            for value in op.inputs:
                if value.producer is not None:
                    self.readers.setdefault(value.producer, []).append(op)
        self._classify_attention()
        self.group_of: dict[str, _Group] = {}
        self._initial_groups()
        if merge_elementwise:  # the embedding class is one node whatever its ops
            self._merge_elementwise()
            self._fuse_siblings()

    # -- groups

    def groups(self) -> list[_Group]:
        unique = {id(g): g for g in self.group_of.values()}
        return sorted(unique.values(), key=lambda g: g.first)

    def _merge(self, into: _Group, other: _Group) -> _Group:
        if into is other:
            return into
        into.ops += other.ops
        into.gated |= other.gated
        into.router |= other.router
        for op in other.ops:
            self.group_of[op.name] = into
        return into

    def producers(self, group: _Group) -> tuple[dict[int, _Group], bool]:
        """Groups feeding `group` (by id), and whether it reads the class input."""
        out, reads_input = {}, False
        for op in group.ops:
            for value in op.inputs:
                if value.kind != "data":
                    continue
                if value.producer is None:
                    reads_input = True
                elif self.group_of[value.producer] is not group:
                    out[id(self.group_of[value.producer])] = self.group_of[value.producer]
        return out, reads_input

    def consumers(self, group: _Group) -> dict[int, _Group]:
        """Groups reading `group`'s outputs (by id); cache writes and the class output are not groups."""
        out = {}
        for op in group.ops:
            for reader in self.readers.get(op.name, ()):
                if self.group_of[reader.name] is not group:
                    out[id(self.group_of[reader.name])] = self.group_of[reader.name]
        return out

    def writes_cache(self, group: _Group) -> bool:
        names = {op.name for op in group.ops}
        return any(value.producer in names for value, _ in self.built.kv_writes.values())

    # -- step 2: which softmax/GEMM is attention

    def _classify_attention(self):
        # A softmax is attention's when its output reaches a weightless GEMM through element-wise ops only (p·V);
        # any other softmax (an MoE router's) is element-wise. Weightless GEMMs fed by it are p·V, the rest q·Kᵀ.
        for op in self.ops:
            if op.category == "softmax" and op.target != "sdpa" and not self._reaches_gemm(op):
                op.category = "ew"
        for op in self.ops:
            if op.category == "gemm":
                op.category = "context" if self._fed_by_softmax(op) else "score"

    def _reaches_gemm(self, start: Op) -> bool:
        todo, seen = [start], set()
        while todo:
            for reader in self.readers.get(todo.pop().name, ()):
                if reader.category == "gemm":
                    return True
                if reader.category == "ew" and reader.name not in seen:
                    seen.add(reader.name)
                    todo.append(reader)
        return False

    def _fed_by_softmax(self, start: Op) -> bool:
        todo, seen = [start], set()
        while todo:
            for value in todo.pop().inputs:
                producer = self.by_name.get(value.producer or "")
                if producer is None or producer.name in seen:
                    continue
                if producer.category == "softmax":
                    return True
                if producer.category == "ew":
                    seen.add(producer.name)
                    todo.append(producer)
        return False

    def _initial_groups(self):
        leaves: dict[str, _Group] = {}
        for op in self.ops:
            if op.category == "leaf":
                group = leaves.setdefault(op.leaf, _Group([], op.leaf_kind))
                group.ops.append(op)
            else:
                group = _Group([op], _ANCHOR_KIND.get(op.category, "ew"))
                group.role = op.category if op.category in ("score", "softmax", "context") else ""
            self.group_of[op.name] = group
        for op in self.ops:  # connected element-wise ops form one component
            if op.category != "ew":
                continue
            for value in op.inputs:
                producer = self.by_name.get(value.producer or "")
                if producer is not None and producer.category == "ew":
                    self._merge(self.group_of[producer.name], self.group_of[op.name])

    # -- step 3: element-wise components join an anchor

    def _merge_elementwise(self):
        rope: _Group | None = None
        for group in [g for g in self.groups() if g.kind == "ew"]:
            producers, reads_input = self.producers(group)
            consumers = self.consumers(group)
            kinds = {g.kind for g in producers.values()}
            roles = {g.role for g in producers.values()}
            if any(op.target in ROUTING_OPS for op in group.ops):
                gates = [g for g in producers.values() if g.kind == "linear"]
                if len(gates) != 1:
                    raise LoweringError(f"top-k routing ops {group.describe()} must be fed by exactly one gate "
                                        f"projection, found {len(gates)}")
                router = self._merge(gates[0], group)
                router.router, router.kind = True, "router"
            elif roles == {"score"} and not reads_input:
                for op in group.ops:  # scale and mask fuse into q·Kᵀ's epilogue
                    op.flops = 0
                self._merge(next(iter(producers.values())), group)
            elif any(op.aux_tensor for op in group.ops) and kinds <= {"linear"} and producers and (
                    any(g.role == "score" for g in consumers.values()) or self.writes_cache(group)):
                group.kind = "rope"
                rope = group if rope is None else self._merge(rope, group)
            elif "activation" in kinds:
                act = next(g for g in producers.values() if g.kind == "activation")
                self._merge(act, group).gated = len(producers) > 1
            elif len(producers) == 1 and not reads_input:
                producer = next(iter(producers.values()))
                if producer.kind == "linear":  # a GEMM epilogue (OPT's q scaling, a cast): fused, no FLOPs
                    for op in group.ops:
                        op.flops = 0
                self._merge(producer, group)
            elif not producers and len(consumers) == 1:
                self._merge(next(iter(consumers.values())), group)
            else:
                raise LoweringError(f"cannot attach element-wise ops {group.describe()} to a sublayer: they read "
                                    f"{len(producers)} sublayers' outputs and feed {len(consumers)}")

    # -- step 4: sibling projections fuse

    def _fuse_siblings(self):
        by_input: dict[int, _Group] = {}
        for group in self.groups():
            if group.kind != "linear":
                continue
            gemm = next(op for op in group.ops if op.target in GEMM_OPS)
            data = [v for v in gemm.inputs if v.kind != "param"]
            if not data:
                continue
            key = id(data[0])  # views alias one value; two slices of a tensor are different inputs
            by_input[key] = self._merge(by_input[key], group) if key in by_input else group


# ---------------------------------------------------------------------------------------------------------------
# Step 4: names and units by structure

# FFN units by structure: a gated activation (SwiGLU), a plain one, or an MoE router + experts block.
_FFN_NAMES = {"gated": ("gate_up", "down"), "plain": ("fc1", "fc2"), "moe": ("router", "experts")}


def _name_decoder(grouper: _Grouper) -> None:
    groups = grouper.groups()
    preds = {id(g): grouper.producers(g)[0] for g in groups}
    succs = {id(g): grouper.consumers(g) for g in groups}

    def one(items: list[_Group], what: str) -> _Group:
        if len(items) != 1:
            raise LoweringError(f"a decoder layer must have exactly one {what}, found {len(items)}")
        return items[0]

    def fed_by(group: _Group, other: _Group) -> bool:
        return id(other) in preds[id(group)]

    score = one([g for g in groups if g.role == "score"], "attention score matmul (q·Kᵀ)")
    softmax = one([g for g in groups if g.role == "softmax"], "attention softmax")
    context = one([g for g in groups if g.role == "context"], "attention context matmul (p·V)")
    score.name, softmax.name, context.name = "attn_score", "softmax", "attn_context"
    score.unit = softmax.unit = "attn_score"
    context.unit = "attn_context"
    linears = [g for g in groups if g.kind == "linear"]
    rope = [g for g in groups if g.kind == "rope"]
    qkv = one([g for g in linears if not g.router and (fed_by(score, g) or grouper.writes_cache(g)
                                                       or any(fed_by(r, g) for r in rope))], "q/k/v projection")
    out_proj = one([g for g in linears if fed_by(g, context)], "output projection reading attention")
    qkv.name = qkv.unit = "qkv"
    out_proj.name = out_proj.unit = "out_proj"
    for group in rope:
        group.name, group.unit = "rope", "qkv"
    experts = [g for g in groups if g.kind == "experts"]
    if experts:
        ffn_in = one([g for g in groups if g.router], "MoE router gate (a projection feeding top-k)")
        ffn_out = one(experts, "MoE experts block")
        names = _FFN_NAMES["moe"]
    else:
        act = one([g for g in groups if g.kind == "activation"], "FFN activation")
        ffn_in = one([g for g in linears if fed_by(act, g)], "FFN input projection")
        ffn_out = one([g for g in linears if fed_by(g, act)], "FFN output projection")
        names = _FFN_NAMES["gated" if act.gated else "plain"]
        act.name, act.unit = "act", names[0]
    ffn_in.name = ffn_in.unit = names[0]
    ffn_out.name = ffn_out.unit = names[1]
    for group in groups:
        if group.kind == "norm":
            feeds = succs[id(group)]
            if id(qkv) in feeds:
                group.name, group.unit = "attn_norm", "qkv"
            elif id(ffn_in) in feeds:
                group.name, group.unit = "ffn_norm", ffn_in.unit
        elif group.kind == "add":
            if fed_by(group, out_proj):
                group.name, group.unit = "attn_residual", "out_proj"
            elif fed_by(group, ffn_out):
                group.name, group.unit = "ffn_residual", ffn_out.unit


def _name_head(grouper: _Grouper) -> None:
    for group in grouper.groups():
        if group.kind == "linear":
            group.name = "lm_head"
        elif group.kind == "norm":
            group.name = "final_norm"
        group.unit = "lm_head"


def _merge_all(grouper: _Grouper, name: str, kind: str) -> None:
    groups = grouper.groups()
    whole = groups[0]
    for group in groups[1:]:
        grouper._merge(whole, group)
    whole.kind, whole.name, whole.unit = kind, name, name


# ---------------------------------------------------------------------------------------------------------------
# Step 5: work per node


def _combine(values: list[Value]) -> tuple[tuple[int, ...], str, int]:
    """Shape, dtype and bytes of the tensors on one edge (several slices of one output: their concatenation)."""
    nbytes = sum(v.nbytes for v in values)
    first = values[0]
    if len(values) == 1:
        return first.shape, dtype_name(first.dtype), nbytes
    same_lead = all(len(v.shape) == len(first.shape) and v.shape[:-1] == first.shape[:-1] for v in values)
    if same_lead and first.shape:
        return first.shape[:-1] + (sum(v.shape[-1] for v in values),), dtype_name(first.dtype), nbytes
    return (sum(math.prod(v.shape) for v in values),), dtype_name(first.dtype), nbytes


def _distinct(values: list[Value]) -> list[Value]:
    """Drop duplicates, and slices whose whole value is also in the list."""
    ids = {id(v) for v in values}
    out, seen = [], set()
    for value in values:
        ancestor, covered = value.source, False
        while ancestor is not None and not covered:
            covered, ancestor = id(ancestor) in ids, ancestor.source
        if id(value) in seen or covered:
            continue
        seen.add(id(value))
        out.append(value)
    return out


def _node_work(grouper: _Grouper, group: _Group, weight_name: Callable[[str], str | None]):
    built = grouper.built
    names = {op.name for op in group.ops}
    reads: list[Value] = []
    param_reads: dict[str, int] = {}
    full_read: set[str] = set()
    kv_read = 0
    for op in sorted(group.ops, key=lambda o: o.index):
        for value in op.inputs:
            if value.kind == "param":
                if op.target in GATHER_OPS:
                    param_reads[value.param] = param_reads.get(value.param, 0) + op.gather_bytes[value.param]
                else:
                    full_read.add(value.param)
                    param_reads.setdefault(value.param, 0)
            elif value.producer not in names and value.kind != "aux":
                reads.append(value)
    reads = _distinct(reads)
    for value in reads:
        if value.kind in ("kv_all", "kv_past"):
            kv_read += value.nbytes
    weight_bytes = {p: built.params[p].nbytes if p in full_read else b for p, b in param_reads.items()}
    written = [v for op in group.ops for reader in grouper.readers.get(op.name, ())
               if grouper.group_of[reader.name] is not group for v in reader.inputs if v.producer in names]
    cache = [v for v, _ in built.kv_writes.values() if v is not None and v.producer in names]
    if built.class_output is not None and built.class_output.producer in names:
        written.append(built.class_output)
    written = _distinct(written + cache)
    weights = []
    for param in param_reads:
        full = weight_name(param)
        if full is not None:
            value = built.params[param]
            weights.append(WeightTensor(full, value.shape, dtype_name(value.dtype), value.nbytes))
    flops = sum(op.flops for op in group.ops)
    return dict(weights=tuple(weights), flops=flops,
                bytes_read=sum(v.nbytes for v in reads) + sum(weight_bytes.values()),
                bytes_written=sum(v.nbytes for v in written), kv_read=kv_read,
                kv_written=sum(v.nbytes for v in _distinct(cache)))


def _experts_shape(grouper: _Grouper, group: _Group) -> tuple[int, int]:
    stacked = {v.param: v.shape[0] for op in group.ops for v in op.inputs if v.kind == "param" and len(v.shape) >= 3}
    counts = set(stacked.values())
    top_k = {op.top_k for op in grouper.ops if op.top_k}
    if len(counts) != 1 or len(top_k) != 1:
        raise LoweringError(f"an experts block needs one expert count and one top-k, found {sorted(counts)} and "
                            f"{sorted(top_k)}")
    return counts.pop(), top_k.pop()


def lower_program(ep, root: nn.Module, layer_class: str, input_roles: Sequence[str], output_roles: Sequence[str],
                  weight_name: Callable[[str], str | None]) -> LoweredLayer:
    """Lower one exported layer class at the sample point it was exported at.

    Args:
        ep: `torch.export.ExportedProgram` of the class's module (`root`), exported at one (B, Q, C).
        root: the module exported (to find leaf modules from `nn_module_stack` paths).
        layer_class: 'embed' (one node), 'decoder' (named sublayers) or 'head' (final_norm, lm_head).
        input_roles: per user input, one of INPUT_ROLES.
        output_roles: per returned tensor, one of OUTPUT_ROLES.
        weight_name: export parameter target → state-dict name, or None for a weight listed by another class
            (a tied embedding): it is still read, but not listed among the node's weights.

    Returns:
        The nodes (execution order), edges (INPUT as source for the class input), units and output node.

    Raises:
        LoweringError: naming the aten ops that no rule covers.
    """
    built = OpGraph(ep, root, input_roles, output_roles)
    grouper = _Grouper(built, merge_elementwise=layer_class != "embed")
    if layer_class == "embed":
        _merge_all(grouper, "embed", "embedding")
    elif layer_class == "head":
        _name_head(grouper)
    else:
        _name_decoder(grouper)
    groups = grouper.groups()
    for group in groups:
        if not group.name:
            raise LoweringError(f"ops {group.describe()} (kind '{group.kind}') match no sublayer role in a "
                                f"{layer_class} layer")
    if len({g.name for g in groups}) != len(groups):
        raise LoweringError(f"two sublayers got the same name: {sorted(g.name for g in groups)}")
    by_name = {g.name: g for g in groups}
    work = {g.name: _node_work(grouper, g, weight_name) for g in groups}
    for group in groups:  # the unit records the cache entries its nodes write (RoPE rotates k before it is cached)
        if group.unit != group.name and work[group.name]["kv_written"]:
            work[group.unit]["kv_written"] += work[group.name]["kv_written"]
            work[group.name]["kv_written"] = 0
    nodes = []
    for group in groups:
        counts = work[group.name]
        experts = (0, 0)
        if group.kind == "experts":
            experts = _experts_shape(grouper, group)
            counts["flops"] = counts["flops"] * Fraction(experts[1], experts[0])  # routed tokens only
        nodes.append(LoweredNode(group.name, group.kind, group.unit, experts=experts, **counts))
    edges = []
    for group in groups:
        incoming: dict[str, list[Value]] = {}
        for op in group.ops:
            for value in op.inputs:
                if value.kind != "data":
                    continue
                source = INPUT if value.producer is None else grouper.group_of[value.producer]
                if source is not group:
                    incoming.setdefault(INPUT if source == INPUT else source.name, []).append(value)
        for src in sorted(incoming, key=lambda s: -1 if s == INPUT else by_name[s].first):
            edges.append(LoweredEdge(src, group.name, *_combine(_distinct(incoming[src]))))
    units = tuple(g.name for g in groups if g.unit == g.name)
    output = built.class_output
    if output is None or output.producer is None:
        raise LoweringError("the layer's output is not computed by any sublayer")
    return LoweredLayer(tuple(nodes), tuple(edges), units, grouper.group_of[output.producer].name)
