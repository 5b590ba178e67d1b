"""ExportedProgram → OpGraph: a layer's aten ops that touch activations or weights, views folded into values.

Steps 1 and 2 of the lowering (`trace_lower.py` does the rest):

1. **Values.** Placeholders are parameters, the class input ('data': hidden states or token ids), the past K/V
   ('k_past'/'v_past') or auxiliaries ('aux': positions, masks, RoPE cos/sin). Views, same-dtype casts and
   reshapes alias a value; splits and slices cut a new one from it; neither costs anything. Ops that touch neither
   data nor weights (position tables, masks) are auxiliary and are not charged: they are per-step constants shared
   by all layers. `cat(k_past, k_new)` is the KV cache: its output is read from the cache, `k_new` is a cache write.
2. **Categories.** Each remaining op gets a category: inside a leaf module (nn.Linear, *Norm, activation modules,
   nn.Embedding, a module holding stacked expert weights), a GEMM with or without a weight, softmax, activation,
   norm, gather, a residual add (an add of two activations, one of them the residual stream that starts at the
   class input), or element-wise. Fused `scaled_dot_product_attention` splits into q·Kᵀ, softmax and p·V with the
   scores/probabilities [B, H, Q, C] between them.

FLOPs per op come from its shapes: 2·M·N·K per GEMM, 5 per softmax element, 7 per LayerNorm element, 1 per element
of any other arithmetic op (reductions: per input element); gathers, casts and routing index ops 0.
"""


from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn
from torch.export.graph_signature import InputKind

from liac.sizes import numel

__all__ = ["LoweringError", "Value", "Op", "OpGraph", "INPUT_ROLES", "OUTPUT_ROLES", "GEMM_OPS", "GATHER_OPS",
           "ROUTING_OPS", "dtype_name"]

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
GEMM_OPS = {"linear", "matmul", "mm", "bmm", "addmm", "baddbmm"}
_SDPA = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
         "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}
_SOFTMAX = {"softmax", "_softmax", "_safe_softmax", "log_softmax", "_log_softmax"}
_ACTIVATIONS = {"relu", "relu_", "silu", "silu_", "gelu", "gelu_", "hardswish", "mish", "elu", "leaky_relu",
                "relu6"}
_NORMS = {"layer_norm", "native_layer_norm", "rms_norm"}
GATHER_OPS = {"embedding", "index_select"}
ROUTING_OPS = {"topk", "sort", "argsort", "argmax"}  # an element-wise component holding one of these is a router
_INDEXING = ROUTING_OPS | {"scatter", "scatter_add", "scatter_reduce", "one_hot", "index_add", "gather"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "var", "std", "prod", "logsumexp"}
_UNSUPPORTED = {"einsum"}

# FLOPs per output element of composite element-wise ops (everything else arithmetic: 1 per element).
_SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide
_LAYER_NORM_FLOPS_PER_ELEMENT = 7  # mean, subtract, square, sum, scale by rstd, affine multiply and add
_RMS_NORM_FLOPS_PER_ELEMENT = 4  # square, mean, scale by rsqrt, affine multiply


class LoweringError(Exception):
    """The exported graph has a structure the lowering rules do not cover; names the aten ops concerned."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------------------------------------------
# Step 1: values and ops


@dataclass(eq=False)
class Value:
    """A tensor as stored: views alias their source's Value; slices are new values of their own."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # 'data' | 'param' | 'aux' | 'kv_past' | 'kv_all'
    producer: str | None = None  # op producing it (slices inherit their source's producer)
    storage: int = 0  # elements stored; an expanded view keeps its source's storage
    param: str = ""  # root parameter (export target) of a 'param' value
    cache: str = ""  # 'k' or 'v' for cache values
    source: "Value | None" = None  # the value a slice was cut from (None: not a slice)

    @property
    def nbytes(self) -> int:
        return self.storage * self.dtype.itemsize


@dataclass(eq=False)
class Op:
    """One aten op that touches activations or weights (a fused SDPA contributes three)."""

    name: str
    target: str
    index: int  # position in execution order (set when appended)
    inputs: list[Value]  # data, param and cache operands, deduplicated, in order
    outputs: list[Value]
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


class OpGraph:
    """The ops of one exported layer with their values (steps 1 and 2).

    Built from an ExportedProgram and the module it exported (leaf modules are found from `nn_module_stack`).
    Attributes: `ops` in execution order, `params` (export target → Value), `kv_writes` (new cache entries),
    `class_input` and `class_output`.
    """

    def __init__(self, ep, root: nn.Module, input_roles: Sequence[str], output_roles: Sequence[str]):
        self.ep, self.root = ep, root
        self.values: dict[str, object] = {}  # fx node name → Value | ('tuple', [Value]) | ('split', Value) | None
        self.ops: list[Op] = []
        self.params: dict[str, Value] = {}  # export target → parameter value
        self.kv_writes: dict[int, tuple[Value, str]] = {}  # id(new cache entry) → (value, 'k' | 'v')
        self.class_input: Value | None = None
        self.class_output: Value | None = None
        self._leaf_cache: dict[str, str] = {}
        self._stream: set[int] = set()  # ids of values on the residual stream
        self._placeholders(input_roles)
        for node in ep.graph.nodes:
            if node.op == "call_function":
                self._call(node)
        self._outputs(output_roles)

    def _append(self, op: Op) -> None:
        op.index = len(self.ops)
        for value in op.outputs:
            value.producer = op.name
        self.ops.append(op)

    # -- placeholders and outputs

    def _placeholders(self, input_roles):
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
                value = Value(node.name, shape, val.dtype, "param", storage=numel(shape), param=spec.target)
                self.params[spec.target] = value
            elif spec.kind == InputKind.USER_INPUT:
                role = roles[node.name]
                if role not in INPUT_ROLES:
                    raise ValueError(f"input role must be one of {INPUT_ROLES}, got {role!r}")
                kind = {"data": "data", "aux": "aux"}.get(role, "kv_past")
                value = Value(node.name, shape, val.dtype, kind, storage=numel(shape),
                               cache=role[0] if kind == "kv_past" else "")
                if role == "data":
                    self.class_input = value
                    self._stream.add(id(value))
            else:  # buffers and constants: RoPE frequencies and the like
                value = Value(node.name, shape, val.dtype, "aux", storage=numel(shape))
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

    def _in_values(self, node) -> list[Value]:
        out = []
        for arg in _flat_nodes(node.args) + _flat_nodes(list(node.kwargs.values())):
            value = self.values.get(arg.name)
            if isinstance(value, Value) and all(value is not v for v in out):
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
        op = Op(node.name, target, 0, inputs, self._outputs_of(node, val), self._category(node, target, inputs),
                 self._flops(node, target, val), aux_tensor=self._reads_aux_tensor(node))
        if op.category == "leaf":
            op.leaf, op.leaf_kind = self._leaf(node)
        if target in GATHER_OPS:
            for value in inputs:
                if value.kind == "param":
                    op.gather_bytes[value.param] = sum(v.nbytes for v in op.outputs)
        if target == "topk":
            op.top_k = int(node.args[1])
        self._append(op)

    def _outputs_of(self, node, val) -> list[Value]:
        if isinstance(val, torch.Tensor):
            value = Value(node.name, _shape(val), val.dtype, "data", storage=val.numel())
            self.values[node.name] = value
            return [value]
        parts = [Value(f"{node.name}#{i}", _shape(t), t.dtype, "data", storage=t.numel())
                 for i, t in enumerate(val) if isinstance(t, torch.Tensor)]
        self.values[node.name] = ("tuple", parts)
        return parts

    def _aux(self, node, val):
        shape = _shape(val) if isinstance(val, torch.Tensor) else ()
        dtype = val.dtype if isinstance(val, torch.Tensor) else torch.float32
        self.values[node.name] = Value(node.name, shape, dtype, "aux", storage=numel(shape))

    @staticmethod
    def _slice(source: Value, name: str, val) -> Value:
        if source.kind == "param":
            return source  # any slice of a weight reads the weight (stacked experts: all of them over the loop)
        return Value(name, _shape(val), val.dtype, source.kind, producer=source.producer,
                      storage=min(val.numel(), source.storage), cache=source.cache, source=source)

    def _getitem(self, node):
        holder, position = self.values.get(node.args[0].name), node.args[1]
        val = node.meta.get("val")
        if isinstance(holder, tuple) and holder[0] == "split" and isinstance(val, torch.Tensor):
            self.values[node.name] = self._slice(holder[1], node.name, val)
        elif isinstance(holder, tuple) and holder[0] == "tuple":
            self.values[node.name] = holder[1][position] if position < len(holder[1]) else None
        elif isinstance(holder, Value) and isinstance(val, torch.Tensor):
            self.values[node.name] = self._slice(holder, node.name, val)
        else:
            self.values[node.name] = None

    def _kv_cat(self, node, inputs, val):
        past = next(v for v in inputs if v.kind == "kv_past")
        for value in inputs:
            if value.kind != "kv_past":
                self.kv_writes[id(value)] = (value, past.cache)
        self.values[node.name] = Value(node.name, _shape(val), val.dtype, "kv_all", storage=val.numel(),
                                        cache=past.cache)

    def _sdpa(self, node, inputs, val):
        # Split fused attention into its three sublayers, with the scores/probabilities [B, H, Q, C] between them.
        # q: [B, H, Q, E], k: [B, G, C, E], v: [B, G, C, Ev] (shapes of the views sdpa sees, not of their storage)
        q, k, v = (self.values[a.name] for a in node.args[:3])
        q_shape, k_shape, v_shape = (_shape(a.meta["val"]) for a in node.args[:3])
        scores_shape = q_shape[:-1] + (k_shape[-2],)
        count = numel(scores_shape)
        scores = Value(f"{node.name}#scores", scores_shape, q.dtype, "data", storage=count)
        probs = Value(f"{node.name}#probs", scores_shape, q.dtype, "data", storage=count)
        out = self._outputs_of(node, val)[0]
        self._append(Op(f"{node.name}#score", "sdpa", 0, [q, k], [scores], "score", 2 * count * q_shape[-1]))
        self._append(Op(f"{node.name}#softmax", "sdpa", 0, [scores], [probs], "softmax",
                         _SOFTMAX_FLOPS_PER_ELEMENT * count))
        self._append(Op(f"{node.name}#context", "sdpa", 0, [probs, v], [out], "context", 2 * count * v_shape[-1]))

    # -- classification helpers

    def _reads_aux_tensor(self, node) -> bool:
        for arg in _flat_nodes(node.args):
            value = self.values.get(arg.name)
            if isinstance(value, Value) and value.kind == "aux" and numel(value.shape) > 1:
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
        if target in GEMM_OPS:
            return "gemm_w" if any(v.kind == "param" for v in inputs) else "gemm"
        if target in _SOFTMAX:
            return "softmax"
        if target in _ACTIVATIONS:
            return "act"
        if target in _NORMS:
            return "norm"
        if target in GATHER_OPS:
            return "gather"
        return "ew"

    @staticmethod
    def _flops(node, target, val) -> int:
        if not isinstance(val, torch.Tensor):
            return 0
        out = val.numel()
        args = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
        if target in GEMM_OPS:
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
        if target in GATHER_OPS or target in _INDEXING or target in _VIEWS or target == "cat":
            return 0  # data movement, casts and routing indices
        return out
