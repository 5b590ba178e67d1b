"""ExportedProgram → LoweredLayer: group one layer's aten ops into sublayer nodes and count their work at one point.

`trace.py` exports a layer at several sample points (B, Q, C) and calls `lower_program` on each; this module knows
nothing of model families. It works on any exported graph whose `nn_module_stack` names the modules, in five steps:

1. **Values.** Placeholders are parameters, the class input ('data': hidden states or token ids), the past K/V
   ('k_past'/'v_past') or auxiliaries ('aux': positions, masks, RoPE cos/sin). Views, casts-free reshapes and
   splits are *free*: they alias or slice a value and cost nothing. Ops that touch neither data nor weights
   (position tables, masks) are auxiliary and are not charged: they are per-step constants shared by all layers.
   `cat(k_past, k_new)` is the KV cache: its output is read from the cache, `k_new` is a cache write.
2. **Anchors.** Leaf modules (nn.Linear, *Norm, activation modules, nn.Embedding, and modules holding stacked
   expert weights) become one primitive each; so do weight GEMMs, GEMMs without weights (attention), softmax,
   activation functions and residual adds (an add of two activations, one of them the residual stream that starts
   at the class input). Fused `scaled_dot_product_attention` splits into q·Kᵀ, softmax and p·V.
3. **Element-wise components** (connected element-wise ops) join an anchor: ops on the scores between q·Kᵀ and
   softmax (scale, mask) fuse into q·Kᵀ at no FLOPs; a component holding top-k is the MoE router (with its gate
   GEMM); one that mixes q/k with auxiliary tensors is RoPE; one fed by the activation is the gated product
   (SiLU(gate)·up); any other joins its single producer (an epilogue such as OPT's q scaling, free after a GEMM).
4. **Roles by structure.** Sibling GEMMs reading the same input fuse (q/k/v → qkv, gate/up → gate_up); GEMMs
   feeding attention are `qkv`, the one reading attention's output `out_proj`, the one feeding the activation
   `fc1`/`gate_up` (gated), the one reading it `fc2`/`down`; norms and residual adds are named by what they feed
   or follow.
5. **Work.** FLOPs per aten op from its shapes (2·M·N·K per GEMM, 5 per softmax element, 7 per LayerNorm
   element, 1 per element of any other arithmetic op; gathers, casts and routing index ops 0). Bytes are the
   fused traffic of a node: distinct tensors entering it from outside (activations, whole weights, gathered
   embedding rows, the KV cache) and tensors leaving it (edges, cache writes, the class output).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from liac.ir import WeightTensor

__all__ = ["LoweringError", "LoweredNode", "LoweredEdge", "LoweredLayer", "lower_program", "INPUT", "INPUT_ROLES",
           "OUTPUT_ROLES", "dtype_name"]

INPUT = "@input"  # edge source standing for the class input (the previous class's output)
INPUT_ROLES = ("data", "k_past", "v_past", "aux")
OUTPUT_ROLES = ("data", "k", "v")

# Ops that only alias or reshape a value (no traffic, no FLOPs). `contiguous`/`clone` after a transpose do copy in
# eager mode, but a fused kernel reads the strided tensor directly, so they are free here too.
_VIEWS = {"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "unsqueeze", "squeeze", "expand",
          "expand_as", "contiguous", "clone", "alias", "detach", "flatten", "unflatten", "view_as", "movedim",
          "swapaxes", "dropout", "lift_fresh_copy", "_assert_tensor_metadata", "to", "_to_copy", "type_as"}
_SLICES = {"slice", "select", "narrow", "getitem"}
_SPLITS = {"split", "split_with_sizes", "chunk", "unbind", "tensor_split"}
_FACTORIES = {"ones", "zeros", "full", "empty", "arange", "ones_like", "zeros_like", "empty_like", "full_like",
              "new_zeros", "new_ones", "new_empty", "new_full", "scalar_tensor", "rand", "randn", "rand_like"}
_GEMMS = {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm"}
_SDPA = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
         "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}
_SOFTMAX = {"softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax"}
_ACTIVATIONS = {"relu", "relu_", "silu", "silu_", "gelu", "gelu_", "hardswish", "mish", "elu", "leaky_relu",
                "relu6"}
_NORMS = {"layer_norm", "native_layer_norm", "rms_norm"}
_GATHERS = {"embedding", "index_select"}
_ROUTING = {"topk", "sort", "argsort", "argmax"}  # an element-wise component holding one of these is a router
_INDEXING = _ROUTING | {"scatter", "scatter_add", "scatter_reduce", "one_hot", "index_add", "gather"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "var", "std", "prod", "logsumexp"}
_UNSUPPORTED = {"einsum"}

# FLOPs per output element of composite element-wise ops (everything else arithmetic: 1 per element).
_SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide
_LAYER_NORM_FLOPS_PER_ELEMENT = 7  # mean, subtract, square, sum, scale by rstd, affine multiply and add
_RMS_NORM_FLOPS_PER_ELEMENT = 4  # square, mean, scale by rsqrt, affine multiply


class LoweringError(Exception):
    """The exported graph has a structure the lowering rules do not cover; names the aten ops concerned."""


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


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------------------------------------------
# Step 1: values and ops


@dataclass(eq=False)
class _Value:
    """A tensor as stored: views alias their source's _Value; slices are new values of their own."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # 'data' | 'param' | 'aux' | 'kv_past' | 'kv_all'
    producer: str | None = None  # op producing it (slices inherit their source's producer)
    storage: int = 0  # elements stored; an expanded view keeps its source's storage
    param: str = ""  # root parameter (export target) of a 'param' value
    cache: str = ""  # 'k' or 'v' for cache values
    source: "_Value | None" = None  # the value a slice was cut from (None: not a slice)

    @property
    def nbytes(self) -> int:
        return self.storage * self.dtype.itemsize


@dataclass(eq=False)
class _Op:
    name: str
    target: str
    index: int  # position in execution order (set when appended)
    inputs: list[_Value]  # data, param and cache operands, deduplicated, in order
    outputs: list[_Value]
    category: str  # 'leaf' | 'gemm_w' | 'gemm' | 'score' | 'softmax' | 'context' | 'act' | 'norm' | 'gather'
    #                  | 'residual' | 'ew'
    flops: int
    leaf: str = ""  # module path of the leaf module holding it
    leaf_kind: str = ""  # OP_KINDS kind of that leaf
    aux_tensor: bool = False  # reads a non-scalar auxiliary tensor (RoPE tables, masks)
    gather_bytes: dict = field(default_factory=dict)  # param name → bytes of rows gathered
    top_k: int = 0  # k of a top-k op


def _target(node) -> str:
    if node.target is operator.getitem:
        return "getitem"
    packet = getattr(node.target, "_overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(node.target, "__name__", str(node.target))


def _flat_nodes(args) -> list:
    out = []
    for arg in args:
        if isinstance(arg, torch.fx.Node):
            out.append(arg)
        elif isinstance(arg, (list, tuple)):
            out.extend(_flat_nodes(arg))
    return out


def _shape(t) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _numel(shape: Sequence[int]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def _leaf_kind(module: nn.Module) -> str:
    """OP_KINDS kind of a module lowered as one primitive, or '' when its ops are lowered one by one."""
    name = type(module).__name__
    if any(p.dim() >= 3 for p in module.parameters(recurse=False)):
        return "experts"  # stacked per-expert weights [E, ...]
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) or name.endswith(("RMSNorm", "LayerNorm")):
        return "norm"
    if type(module).__module__ in ("torch.nn.modules.activation", "transformers.activations"):
        return "activation"
    return ""


class _Builder:
    """Turns the fx graph into _Values and _Ops (step 1) and marks anchors (step 2)."""

    def __init__(self, ep, root: nn.Module, input_roles: Sequence[str], output_roles: Sequence[str]):
        self.ep, self.root = ep, root
        self.values: dict[str, object] = {}  # fx node name → _Value | ('tuple', [_Value]) | ('split', _Value) | None
        self.ops: list[_Op] = []
        self.params: dict[str, _Value] = {}  # export target → parameter value
        self.kv_writes: dict[int, tuple[_Value, str]] = {}  # id(new cache entry) → (value, 'k' | 'v')
        self.class_input: _Value | None = None
        self.class_output: _Value | None = None
        self._leaf_cache: dict[str, str] = {}
        self._stream: set[int] = set()  # ids of values on the residual stream
        self._placeholders(input_roles)
        for node in ep.graph.nodes:
            if node.op == "call_function":
                self._call(node)
        self._outputs(output_roles)

    def _append(self, op: _Op) -> None:
        op.index = len(self.ops)
        for value in op.outputs:
            value.producer = op.name
        self.ops.append(op)

    # -- placeholders and outputs

    def _placeholders(self, input_roles):
        from torch.export.graph_signature import InputKind
        specs = {spec.arg.name: spec for spec in self.ep.graph_signature.input_specs}
        users = [spec.arg.name for spec in self.ep.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
        if len(users) != len(input_roles):
            raise ValueError(f"the layer takes {len(users)} tensor inputs but {len(input_roles)} roles were given")
        roles = dict(zip(users, input_roles))
        for node in self.ep.graph.nodes:
            if node.op != "placeholder":
                continue
            val, spec = node.meta.get("val"), specs[node.name]
            if not isinstance(val, torch.Tensor):
                self.values[node.name] = None
                continue
            shape = _shape(val)
            if spec.kind == InputKind.PARAMETER:
                value = _Value(node.name, shape, val.dtype, "param", storage=_numel(shape), param=spec.target)
                self.params[spec.target] = value
            elif spec.kind == InputKind.USER_INPUT:
                role = roles[node.name]
                if role not in INPUT_ROLES:
                    raise ValueError(f"input role must be one of {INPUT_ROLES}, got {role!r}")
                kind = {"data": "data", "aux": "aux"}.get(role, "kv_past")
                value = _Value(node.name, shape, val.dtype, kind, storage=_numel(shape),
                               cache=role[0] if kind == "kv_past" else "")
                if role == "data":
                    self.class_input = value
                    self._stream.add(id(value))
            else:  # buffers and constants: RoPE frequencies and the like
                value = _Value(node.name, shape, val.dtype, "aux", storage=_numel(shape))
            self.values[node.name] = value

    def _outputs(self, output_roles):
        out_node = next(n for n in self.ep.graph.nodes if n.op == "output")
        outs = _flat_nodes(out_node.args)
        if len(outs) != len(output_roles):
            raise ValueError(f"the layer returns {len(outs)} tensors but {len(output_roles)} roles were given")
        for node, role in zip(outs, output_roles):
            value = self.values.get(node.name)
            if role == "data":
                self.class_output = value
            elif role in ("k", "v"):
                self.kv_writes[id(value)] = (value, role)
            else:
                raise ValueError(f"output role must be one of {OUTPUT_ROLES}, got {role!r}")

    # -- one call_function node

    def _in_values(self, node) -> list[_Value]:
        out = []
        for arg in _flat_nodes(node.args) + _flat_nodes(list(node.kwargs.values())):
            value = self.values.get(arg.name)
            if isinstance(value, _Value) and all(value is not v for v in out):
                out.append(value)
        return out

    def _call(self, node):
        target = _target(node)
        val = node.meta.get("val")
        inputs = self._in_values(node)
        kinds = {v.kind for v in inputs}
        if target in _UNSUPPORTED:
            raise LoweringError(f"op '{node.name}' ({target}) is not supported: write it as matmul or linear")
        if target in _SPLITS:
            self.values[node.name] = ("split", inputs[0]) if inputs else None
            return
        if target == "getitem":
            self._getitem(node)
            return
        if not isinstance(val, (torch.Tensor, list, tuple)):
            self.values[node.name] = None  # shape asserts, symbolic sizes
            return
        if target in _VIEWS and inputs and (kinds == {"param"} or val.dtype == inputs[0].dtype):
            self.values[node.name] = inputs[0]  # an alias: same storage (a weight cast stays the weight)
            return
        if target in _SLICES and inputs:
            self.values[node.name] = self._slice(inputs[0], node.name, val)
            return
        if target == "cat" and "kv_past" in kinds:
            self._kv_cat(node, inputs, val)
            return
        if target in _FACTORIES or not (kinds & {"data", "kv_past", "kv_all"} or "param" in kinds):
            self._aux(node, val)  # touches neither activations nor weights: a per-step constant
            return
        if target in _SDPA:
            self._sdpa(node, inputs, val)
            return
        op = _Op(node.name, target, 0, inputs, self._outputs_of(node, val), self._category(node, target, inputs),
                 self._flops(node, target, val), aux_tensor=self._reads_aux_tensor(node))
        if op.category == "leaf":
            op.leaf, op.leaf_kind = self._leaf(node)
        if target in _GATHERS:
            for value in inputs:
                if value.kind == "param":
                    op.gather_bytes[value.param] = sum(v.nbytes for v in op.outputs)
        if target == "topk":
            op.top_k = int(node.args[1])
        self._append(op)

    def _outputs_of(self, node, val) -> list[_Value]:
        if isinstance(val, torch.Tensor):
            value = _Value(node.name, _shape(val), val.dtype, "data", storage=val.numel())
            self.values[node.name] = value
            return [value]
        parts = [_Value(f"{node.name}#{i}", _shape(t), t.dtype, "data", storage=t.numel())
                 for i, t in enumerate(val) if isinstance(t, torch.Tensor)]
        self.values[node.name] = ("tuple", parts)
        return parts

    def _aux(self, node, val):
        shape = _shape(val) if isinstance(val, torch.Tensor) else ()
        dtype = val.dtype if isinstance(val, torch.Tensor) else torch.float32
        self.values[node.name] = _Value(node.name, shape, dtype, "aux", storage=_numel(shape))

    @staticmethod
    def _slice(source: _Value, name: str, val) -> _Value:
        if source.kind == "param":
            return source  # any slice of a weight reads the weight (stacked experts: all of them over the loop)
        return _Value(name, _shape(val), val.dtype, source.kind, producer=source.producer,
                      storage=min(val.numel(), source.storage), cache=source.cache, source=source)

    def _getitem(self, node):
        holder, position = self.values.get(node.args[0].name), node.args[1]
        val = node.meta.get("val")
        if isinstance(holder, tuple) and holder[0] == "split" and isinstance(val, torch.Tensor):
            self.values[node.name] = self._slice(holder[1], node.name, val)
        elif isinstance(holder, tuple) and holder[0] == "tuple":
            self.values[node.name] = holder[1][position] if position < len(holder[1]) else None
        elif isinstance(holder, _Value) and isinstance(val, torch.Tensor):
            self.values[node.name] = self._slice(holder, node.name, val)
        else:
            self.values[node.name] = None

    def _kv_cat(self, node, inputs, val):
        past = next(v for v in inputs if v.kind == "kv_past")
        for value in inputs:
            if value.kind != "kv_past":
                self.kv_writes[id(value)] = (value, past.cache)
        self.values[node.name] = _Value(node.name, _shape(val), val.dtype, "kv_all", storage=val.numel(),
                                        cache=past.cache)

    def _sdpa(self, node, inputs, val):
        # Split fused attention into its three sublayers, with the scores/probabilities [B, H, Q, C] between them.
        # q: [B, H, Q, E], k: [B, G, C, E], v: [B, G, C, Ev] (shapes of the views sdpa sees, not of their storage)
        q, k, v = (self.values[a.name] for a in node.args[:3])
        q_shape, k_shape, v_shape = (_shape(a.meta["val"]) for a in node.args[:3])
        scores_shape = q_shape[:-1] + (k_shape[-2],)
        count = _numel(scores_shape)
        scores = _Value(f"{node.name}#scores", scores_shape, q.dtype, "data", storage=count)
        probs = _Value(f"{node.name}#probs", scores_shape, q.dtype, "data", storage=count)
        out = self._outputs_of(node, val)[0]
        self._append(_Op(f"{node.name}#score", "sdpa", 0, [q, k], [scores], "score", 2 * count * q_shape[-1]))
        self._append(_Op(f"{node.name}#softmax", "sdpa", 0, [scores], [probs], "softmax",
                         _SOFTMAX_FLOPS_PER_ELEMENT * count))
        self._append(_Op(f"{node.name}#context", "sdpa", 0, [probs, v], [out], "context", 2 * count * v_shape[-1]))

    # -- classification helpers

    def _reads_aux_tensor(self, node) -> bool:
        for arg in _flat_nodes(node.args):
            value = self.values.get(arg.name)
            if isinstance(value, _Value) and value.kind == "aux" and _numel(value.shape) > 1:
                return True
        return False

    def _leaf(self, node) -> tuple[str, str]:
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            if path not in self._leaf_cache:
                try:
                    module = self.root.get_submodule(path) if path else self.root
                except AttributeError:
                    module = None
                self._leaf_cache[path] = _leaf_kind(module) if module is not None else ""
            if self._leaf_cache[path]:
                return path, self._leaf_cache[path]
        return "", ""

    def _category(self, node, target, inputs) -> str:
        data = [v for v in inputs if v.kind != "param"]
        if target in ("add", "add_") and len(data) == 2 and any(id(v) in self._stream for v in data):
            self._stream.add(id(self.values[node.name]))
            return "residual"
        if self._leaf(node)[0]:
            return "leaf"
        if target in _GEMMS:
            return "gemm_w" if any(v.kind == "param" for v in inputs) else "gemm"
        if target in _SOFTMAX:
            return "softmax"
        if target in _ACTIVATIONS:
            return "act"
        if target in _NORMS:
            return "norm"
        if target in _GATHERS:
            return "gather"
        return "ew"

    @staticmethod
    def _flops(node, target, val) -> int:
        if not isinstance(val, torch.Tensor):
            return 0
        out = val.numel()
        args = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
        if target in _GEMMS:
            lhs = args[1] if target in ("addmm", "baddbmm") else args[0]
            return 2 * out * int(lhs.shape[-1])
        if target in _SOFTMAX:
            return _SOFTMAX_FLOPS_PER_ELEMENT * out
        if target in ("layer_norm", "native_layer_norm"):
            return _LAYER_NORM_FLOPS_PER_ELEMENT * out
        if target == "rms_norm":
            return _RMS_NORM_FLOPS_PER_ELEMENT * out
        if target in _REDUCTIONS:
            return max((a.numel() for a in args if isinstance(a, torch.Tensor)), default=out)
        if target in _GATHERS or target in _INDEXING or target in _VIEWS or target == "cat":
            return 0  # data movement, casts and routing indices
        return out


# ---------------------------------------------------------------------------------------------------------------
# Steps 3 and 4: groups of ops → named sublayer nodes


@dataclass(eq=False)
class _Group:
    ops: list[_Op]
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

    def __init__(self, built: _Builder, merge_elementwise: bool = True):
        self.built = built
        self.ops = built.ops
        self.by_name = {op.name: op for op in self.ops}
        self.readers: dict[str, list[_Op]] = {}  # producer op name → ops reading any of its values
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

    def _reaches_gemm(self, start: _Op) -> bool:
        todo, seen = [start], set()
        while todo:
            for reader in self.readers.get(todo.pop().name, ()):
                if reader.category == "gemm":
                    return True
                if reader.category == "ew" and reader.name not in seen:
                    seen.add(reader.name)
                    todo.append(reader)
        return False

    def _fed_by_softmax(self, start: _Op) -> bool:
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
            if any(op.target in _ROUTING for op in group.ops):
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
            gemm = next(op for op in group.ops if op.target in _GEMMS)
            data = [v for v in gemm.inputs if v.kind != "param"]
            if not data:
                continue
            key = id(data[0])  # views alias one value; two slices of a tensor are different inputs
            by_input[key] = self._merge(by_input[key], group) if key in by_input else group


# ---------------------------------------------------------------------------------------------------------------
# Step 4: names and units by structure

# Small nodes run with the unit they feed or follow.
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


def _combine(values: list[_Value]) -> tuple[tuple[int, ...], str, int]:
    """Shape, dtype and bytes of the tensors on one edge (several slices of one output: their concatenation)."""
    nbytes = sum(v.nbytes for v in values)
    first = values[0]
    if len(values) == 1:
        return first.shape, dtype_name(first.dtype), nbytes
    same_lead = all(len(v.shape) == len(first.shape) and v.shape[:-1] == first.shape[:-1] for v in values)
    if same_lead and first.shape:
        return first.shape[:-1] + (sum(v.shape[-1] for v in values),), dtype_name(first.dtype), nbytes
    return (sum(_numel(v.shape) for v in values),), dtype_name(first.dtype), nbytes


def _distinct(values: list[_Value]) -> list[_Value]:
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
    reads: list[_Value] = []
    param_reads: dict[str, int] = {}
    full_read: set[str] = set()
    kv_read = 0
    for op in sorted(group.ops, key=lambda o: o.index):
        for value in op.inputs:
            if value.kind == "param":
                if op.target in _GATHERS:
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
    built = _Builder(ep, root, input_roles, output_roles)
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
        incoming: dict[str, list[_Value]] = {}
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
