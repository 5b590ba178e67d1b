"""ModelConfig → SublayerGraph[traced]: export each layer class on the meta device and lower it to sublayer nodes.

The model is built from `liac.models` on the meta device (no weights, no memory), one layer of each class is
exported with `torch.export` (the embedding, one decoder layer, the LM head), and `trace_lower.lower_program` (on
`trace_ops`' values and ops) groups the aten ops into sublayer nodes and counts their FLOPs and bytes. Nothing here
knows a model family: costs come from the traced shapes and op kinds, so a new family that traces needs no new code.

Costs as polynomials. Each class is exported at the 8 corners B∈{2,3} × Q∈{3,4} × C∈{7,9} (the past length
C − Q is fed as k_past/v_past, which the layer's forward takes). Every count of every node is then solved exactly
(Fractions) as the multilinear polynomial through the 8 corners and checked at a 9th point (5, 6, 11); a count that
is not multilinear raises `TraceError` naming the node. Q ≥ 2 keeps the fit off the decode path (Q = 1 skips the
causal mask), which costs the same here because masks are auxiliary and not charged; the tests check Q = 1 apart.

The LM head is priced for Q query positions. Generation needs only the last position's logits in prefill, so the
cost model evaluates the head with Q = 1 in both phases; this pass only provides the polynomial.

Example:
    >>> from liac.models import resolve_model
    >>> g = trace_model(resolve_model("opt-1.3b"))
    >>> g.nodes["decoder.fc1"]["sublayer"].weight_bytes == 2 * (2048 * 8192 + 8192)   # bf16 weight + bias
    True
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Mapping, Sequence

import torch

from liac.ir import Poly, Sublayer, SublayerGraph, TensorSpec
from liac.models import SUBLAYERS, build_model
from liac.models.config import ModelConfig
from liac.passes.trace_lower import INPUT, LoweredLayer, LoweringError, lower_program
from liac.plan import LAYER_CLASSES

__all__ = ["trace_model", "trace_layer", "ClassTemplate", "TemplateEdge", "TraceError", "CORNERS", "CHECK_POINT",
           "symbolic_dim"]

CORNERS = tuple((b, q, c) for b in (2, 3) for q in (3, 4) for c in (7, 9))
CHECK_POINT = (5, 6, 11)
_COUNTS = ("flops", "bytes_read", "bytes_written", "kv_read", "kv_written")


class TraceError(RuntimeError):
    """A layer did not lower to a consistent sublayer graph (names the class, node and count concerned)."""


@dataclass(frozen=True)
class TemplateEdge:
    """An edge of a class template; `src` is trace_lower.INPUT for the class input."""

    src: str
    dst: str
    tensor: TensorSpec


@dataclass(frozen=True)
class ClassTemplate:
    """One layer class lowered to sublayers with symbolic costs: what `trace_layer` returns."""

    layer_class: str
    sublayers: tuple[Sublayer, ...]  # execution order
    edges: tuple[TemplateEdge, ...]
    units: tuple[str, ...]
    output_node: str


def symbolic_dim(values: Sequence[int], points: Sequence[tuple[int, int, int]]) -> int | str:
    """A dimension seen at `points` as an int, or a monomial in B, Q, C ('B', 'C', 'B*Q', '32*B*Q').

    Raises:
        TraceError: when no constant times a product of distinct variables fits every point.
    """
    for exps in ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1)):
        ratios = set()
        for value, point in zip(values, points):
            denominator = 1
            for e, x in zip(exps, point):
                denominator *= x if e else 1
            ratios.add(Fraction(value, denominator))
        if len(ratios) == 1:
            coeff = ratios.pop()
            if coeff.denominator != 1:
                break
            names = [v for v, e in zip("BQC", exps) if e]
            if not names:
                return int(coeff)
            return "*".join(([str(coeff)] if coeff != 1 else []) + names)
    raise TraceError(f"a tensor dimension takes values {list(values)} at points {list(points)}: it must be a "
                     f"constant times a product of B, Q and C")


def _fit(samples: Mapping[tuple[int, int, int], Fraction | int]) -> dict[tuple[int, int, int], Fraction]:
    """Exact multilinear interpolation through the 8 corners: {(b, q, c) exponents: coefficient}."""
    axes = [sorted({p[axis] for p in CORNERS}) for axis in range(3)]
    table = {tuple(axes[a].index(p[a]) for a in range(3)): Fraction(samples[p]) for p in CORNERS}
    for axis in range(3):  # along each axis, (value at x1, value at x2) → (constant term, slope)
        x1, x2 = axes[axis]
        new = {}
        for key, y1 in table.items():
            if key[axis] != 0:
                continue
            other = key[:axis] + (1,) + key[axis + 1:]
            slope = (table[other] - y1) / (x2 - x1)
            new[key] = y1 - slope * x1
            new[other] = slope
        table = new
    return table


def _evaluate(coeffs: Mapping[tuple[int, int, int], Fraction], point: tuple[int, int, int]) -> Fraction:
    total = Fraction(0)
    for exps, coeff in coeffs.items():
        term = coeff
        for e, x in zip(exps, point):
            term *= x if e else 1
        total += term
    return total


def _poly(layer_class: str, what: str, samples: Mapping[tuple[int, int, int], Fraction | int],
          check: Fraction | int, round_coefficients: bool = False) -> Poly:
    coeffs = _fit(samples)
    if _evaluate(coeffs, CHECK_POINT) != check:
        raise TraceError(f"{layer_class}: {what} is not multilinear in B, Q, C: the fit through the corners "
                         f"predicts {float(_evaluate(coeffs, CHECK_POINT)):.6g} at {CHECK_POINT}, the trace gives "
                         f"{float(check):.6g}")
    if round_coefficients:  # MoE FLOPs scaled by top_k / num_experts: whole FLOPs per coefficient
        coeffs = {exps: Fraction(round(c)) for exps, c in coeffs.items()}
    bad = [c for c in coeffs.values() if c.denominator != 1]
    if bad:
        raise TraceError(f"{layer_class}: {what} has a non-integer coefficient {bad[0]}")
    return Poly.of(coeffs)


def _structure(lowered: LoweredLayer):
    """What must not change between sample points: names, kinds, units, weights and edge endpoints."""
    nodes = tuple((n.name, n.kind, n.unit, n.weights, n.experts) for n in lowered.nodes)
    edges = tuple((e.src, e.dst, e.dtype, len(e.shape)) for e in lowered.edges)
    return nodes, edges, lowered.units, lowered.output_node


def trace_layer(module, make_inputs: Callable[[int, int, int], tuple], layer_class: str,
                input_roles: Sequence[str], output_roles: Sequence[str],
                weight_name: Callable[[str], str | None]) -> ClassTemplate:
    """Export `module` at the sample points, lower each export, and fit symbolic costs.

    Args:
        module: the layer class's module, on the meta device.
        make_inputs: (B, Q, C) → the positional inputs of `module.forward` at that point.
        layer_class: one of LAYER_CLASSES.
        input_roles, output_roles, weight_name: see `trace_lower.lower_program`.

    Returns:
        The class template: `Sublayer` records with Poly costs, edges with symbolic TensorSpecs, units in order.

    Raises:
        TraceError: when the structure changes between points or a count is not multilinear.
    """
    if layer_class not in LAYER_CLASSES:
        raise ValueError(f"layer_class must be one of {LAYER_CLASSES}, got {layer_class!r}")
    points = CORNERS + (CHECK_POINT,)
    lowered: dict[tuple[int, int, int], LoweredLayer] = {}
    by_shapes: dict[tuple, LoweredLayer] = {}  # points whose inputs have the same shapes share one export
    for point in points:
        inputs = make_inputs(*point)
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        if key not in by_shapes:
            try:
                ep = torch.export.export(module, inputs, strict=False)
                by_shapes[key] = lower_program(ep, module, layer_class, input_roles, output_roles, weight_name)
            except LoweringError as e:
                raise TraceError(f"{layer_class} at (B, Q, C) = {point}: {e}") from e
            except Exception as e:  # torch.export's own failures: name the class and the point
                raise TraceError(f"{layer_class}: torch.export failed at (B, Q, C) = {point}: "
                                 f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        lowered[point] = by_shapes[key]
        if _structure(lowered[point]) != _structure(lowered[points[0]]):
            raise TraceError(f"{layer_class}: the sublayer structure at {point} differs from the one at "
                             f"{points[0]} (shape-dependent control flow?)")
    first = lowered[points[0]]
    sublayers = []
    for index, node in enumerate(first.nodes):
        counts = {}
        for what in _COUNTS:
            samples = {p: getattr(lowered[p].nodes[index], what) for p in CORNERS}
            check = getattr(lowered[CHECK_POINT].nodes[index], what)
            counts[what] = _poly(layer_class, f"sublayer '{node.name}' {what}", samples, check,
                                 round_coefficients=what == "flops" and node.kind == "experts")
        sublayers.append(Sublayer(name=node.name, kind=node.kind, layer_class=layer_class, unit=node.unit,
                                  weights=node.weights, experts=node.experts, **counts))
    edges = []
    for index, edge in enumerate(first.edges):
        at = [lowered[p].edges[index] for p in points]
        shape = tuple(symbolic_dim([e.shape[d] for e in at], points) for d in range(len(edge.shape)))
        nbytes = _poly(layer_class, f"edge '{edge.src}' → '{edge.dst}' bytes",
                       {p: lowered[p].edges[index].nbytes for p in CORNERS}, at[-1].nbytes)
        edges.append(TemplateEdge(edge.src, edge.dst, TensorSpec(shape, edge.dtype, nbytes)))
    return ClassTemplate(layer_class, tuple(sublayers), tuple(edges), first.units, first.output_node)


# ---------------------------------------------------------------------------------------------------------------
# The model: three classes, one graph


def _class_templates(cfg: ModelConfig) -> tuple[dict[str, ClassTemplate], dict[str, str]]:
    dtype = getattr(torch, cfg.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise TraceError(f"model dtype must name a torch dtype, got {cfg.dtype!r}")
    with torch.device("meta"):
        model = build_model(cfg.with_layers(1)).to(dtype)
    prefixes = {"embed": "embed.", "decoder": "layers.{layer}.", "head": "lm_head."}
    modules = {"embed": model.embed, "decoder": model.layers[0], "head": model.lm_head}
    # A weight shared by two classes (tied embeddings) is listed once, on the head, which reads all of it every
    # step; the embedding only gathers rows of it.
    head_params = {id(p): name for name, p in model.lm_head.named_parameters()}
    tied = {f"lm_head.{head_params[id(p)]}": f"embed.{name}" for name, p in model.embed.named_parameters()
            if id(p) in head_params}

    def namer(layer_class: str) -> Callable[[str], str | None]:
        params = dict(modules[layer_class].named_parameters())

        def weight_name(target: str) -> str | None:
            if layer_class == "embed" and id(params[target]) in head_params:
                return None
            return prefixes[layer_class] + target
        return weight_name

    def meta(*shape, dtype=dtype):
        return torch.empty(*shape, dtype=dtype, device="meta")

    hidden, kv = cfg.hidden_size, (cfg.num_kv_heads, cfg.head_dim)
    inputs = {
        "embed": (lambda B, Q, C: (meta(B, Q, dtype=torch.long), meta(B, Q, dtype=torch.long)),
                  ("data", "aux"), ("data",)),
        "decoder": (lambda B, Q, C: (meta(B, Q, hidden), meta(B, Q, dtype=torch.long), meta(B, kv[0], C - Q, kv[1]),
                                     meta(B, kv[0], C - Q, kv[1])),
                    ("data", "aux", "k_past", "v_past"), ("data", "k", "v")),
        "head": (lambda B, Q, C: (meta(B, Q, hidden),), ("data",), ("data",)),
    }
    templates = {}
    for layer_class in LAYER_CLASSES:
        make, in_roles, out_roles = inputs[layer_class]
        templates[layer_class] = trace_layer(modules[layer_class], make, layer_class, in_roles, out_roles,
                                             namer(layer_class))
    return templates, tied


@functools.lru_cache(maxsize=32)
def _trace_cached(sha256: str, cfg_json: str) -> SublayerGraph:
    cfg = ModelConfig.from_dict(json.loads(cfg_json))
    templates, tied = _class_templates(cfg)
    units = templates["decoder"].units
    if units != SUBLAYERS.get(cfg.family, units):  # plans name these units: the trace must agree with them
        raise TraceError(f"decoder units {list(units)} differ from liac.models.SUBLAYERS['{cfg.family}'] "
                         f"{list(SUBLAYERS[cfg.family])}")
    graph = SublayerGraph()
    for layer_class, template in templates.items():
        for sub in template.sublayers:
            graph.add_node(f"{layer_class}.{sub.name}", sublayer=sub)
    previous = {"embed": None, "decoder": "embed", "head": "decoder"}
    for layer_class, template in templates.items():
        for edge in template.edges:
            if edge.src == INPUT:
                before = previous[layer_class]
                if before is None:
                    continue  # token ids come from the host
                src = f"{before}.{templates[before].output_node}"
            else:
                src = f"{layer_class}.{edge.src}"
            graph.add_edge(src, f"{layer_class}.{edge.dst}", tensor=edge.tensor)
    graph.graph.update(
        stage="traced",
        model=cfg.to_dict(),
        layer_counts={"embed": 1, "decoder": cfg.num_layers, "head": 1},
        units={c: list(t.units) for c, t in templates.items()},
        class_outputs={c: f"{c}.{t.output_node}" for c, t in templates.items()},
        tied_weights=dict(tied),
    )
    return graph


def trace_model(cfg: ModelConfig) -> SublayerGraph:
    """Trace `cfg` into a SublayerGraph at stage 'traced' (cached per architecture hash).

    Args:
        cfg: the model architecture (`liac.models.resolve_model`).

    Returns:
        A fresh graph: one template per layer class (nodes `embed.embed`, `decoder.<sublayer>`, `head.final_norm`,
        `head.lm_head`) with `Sublayer` records under "sublayer", `TensorSpec` edges under "tensor", and graph keys
        `stage`, `model`, `layer_counts`, `units`, `class_outputs` (the node producing each class's output) and
        `tied_weights` (head weight name → the embedding weight it shares storage with).

    Raises:
        TraceError: when the model does not lower to sublayers (a bug in a model family or in the rules).
    """
    body = json.dumps({**cfg.to_dict(), "name": "traced"}, sort_keys=True)  # the name does not change the trace
    graph = _trace_cached(cfg.sha256(), body).copy()
    graph.graph = copy.deepcopy(graph.graph)
    graph.graph["model"] = cfg.to_dict()
    return graph

