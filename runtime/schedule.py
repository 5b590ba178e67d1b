"""OffloadPlan → Schedule: per phase, the straight list of ops the executor runs, computed once.

Everything the plan decides is resolved here, so the executor's inner loop does no plan lookups:

  * ops       one per placement unit of every layer, in execution order, with its device; the two attention
              units fuse into one SDPA op when the plan puts them on the same device
  * moves     the activations each op first copies to its device: exactly where a value's consumer runs on the
              other device than its producer (the residual stream included); each value crosses at most once.
              Each op also records where its inputs are before its moves in a whole pass (`inputs_at`): a pass
              over only some layers (the warm-up) copies what the layers it skips would have left there
  * KV        where each layer's cache lives (its group's tier), whether the qkv op's K/V write crosses PCIe,
              and how attention reads it: the fresh K/V (prefill), the cache in place, or a streamed window
  * stream units: the layers whose GPU ops read weights (or, at decode, a KV cache) from a host tier; unit i
              is copied into staging buffer i mod (prefetch_depth + 1); a 'wait' op right before the layer's first
              op that reads the buffer and a 'release' op right after its last one bracket the readers only (after
              a split op too: after its join, whose crossing must not queue behind the next copy)
  * splits    (plan v2) a unit split by output features runs its CPU part from the weights' host tier and its
              GPU part from staging (only its rows [r, N) are streamed); a backward pass over the phase finds
              where later ops read its output, and the parts are joined there (and only there)
  * experts   an MoE layer's router, then its experts op (`ExpertRun`): experts [0, hbm) on the GPU from HBM,
              the next `cpu` on the CPU from the host tier, the rest streamed when routed through the expert
              slots of the layer's staging buffer; a split one adds its parts' partial sums where later ops read
              them. The stacked expert weights are held by rows: HBM holds experts [0, hbm), the host tier the
              others (`weight_rows`)
  * bytes     per tier, for the host checks and the arenas (runtime/memory.py), before anything is allocated
  * micro-batches  the prefill's (plan v3): it runs layer by layer over micro-batches of `prefill_microbatch`
              sequences × prompt tokens (the executor cuts the batch; the ops are the same for every micro-batch)

Values: 'ids' tokens, 'x' residual stream, 'q' 'k' 'v' from qkv, 'p' attention probabilities, 'o' attention
output, 'h' FFN hidden (MoE: the router's normalised input), 'ei' 'ew' each token's experts and routing weights,
'next' the greedy token for the following step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from liac.errors import LiacError
from liac.models import SUBLAYERS, build_model
from liac.models.config import ModelConfig
from liac.plan import EXPERT_SLOTS, HOST_TIERS, PHASES, TIERS, OffloadPlan, expert_placement
from liac.runtime.memory import HOME, aligned
from liac.sizes import numel

__all__ = ["Move", "Op", "Split", "ExpertRun", "Piece", "StreamUnit", "PhaseSchedule", "Schedule", "ParamInfo",
           "build_schedule", "MODULE_OF", "model_params", "part_rows"]

# Plan sublayer → attribute of its module in liac.models (layer modules, or the model for embed / lm_head).
MODULE_OF = {"qkv": "qkv", "attn_score": "attn", "attn_context": "attn", "out_proj": "out_proj", "fc1": "fc1",
             "gate_up": "gate_up", "fc2": "fc2", "down": "down", "embed": "embed", "lm_head": "lm_head",
             "router": "router", "experts": "experts"}
# Op kind of each decoder unit position: qkv, score, context, out_proj, up (fc1/gate_up), down (fc2/down).
_KINDS = ("qkv", "score", "context", "out_proj", "up", "down")
_MOE_KINDS = {"router": "router", "experts": "experts"}  # MoE units keep their own op kinds


@dataclass(frozen=True)
class ParamInfo:
    """One parameter a unit reads: its name inside the unit's module, its model-wide name, shape."""

    local: str      # 'proj.weight'
    canonical: str  # 'layers.3.qkv.proj.weight'; a tied LM head names 'embed.tokens.weight'
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return numel(self.shape)


@dataclass(frozen=True)
class Move:
    """Copy `value` from device `src` to `dst` before an op runs."""

    value: str
    src: str
    dst: str


@dataclass(frozen=True)
class Op:
    """One step of a phase.

    kind: 'embed', 'qkv', 'attn' (fused score + context), 'score', 'context', 'out_proj', 'up', 'down',
        'router', 'experts', 'lm_head', or 'wait' / 'release' (of stream unit `stream_unit`).
    device: 'cpu', 'gpu', or 'split' (then `split` says how; its GPU part streams its rows when `streamed`).
    sublayers: plan sublayer names it covers (for metrics).
    weights: the tier of its weights ('none' for attention), `streamed` when it reads them from staging.
    kv_read: attention ops: 'fresh' (this step's K/V), 'stored' (a prefill's: this step's K/V read in the host
        cache the GPU's qkv just wrote them to), 'cache' (in place) or 'window' (streamed to the GPU).
    kv_write_crosses: qkv ops: the cache lives on the other device than `kv_writer`, the device whose K/V are
        written (the op's device; for a split qkv, the cache's side if the parts join there).
    gather: an embedding on the GPU whose table is in a host tier: the B×Q looked-up rows are gathered on the host
        and sent (what the cost model streams for an embedding), never the whole table.
    drops: the values (every device's copy) that no later op of the pass reads before they are produced again:
        the executor frees them right after this op, so a pass holds only live activations (what the cost model's
        activation workspace, Eq. 14, counts).
    inputs_at: (value, devices) for each value the op reads: the devices holding a copy right before its moves, in a
        pass over every layer. Where a split op joins depends on where the next layer reads its output, so the last
        layer of a group may leave a value on other devices than its first: a pass that runs only some layers
        (`Executor.warm_up`, the first of each group) first copies what is missing, then runs the op's moves.
    """

    kind: str
    group: str
    layer_class: str
    layer: int
    device: str = "cpu"
    sublayers: tuple[str, ...] = ()
    weights: str = "none"
    streamed: bool = False
    stream_unit: int = -1  # the StreamUnit whose staging buffer it reads (-1: none)
    moves: tuple[Move, ...] = ()
    kv_read: str = ""
    kv_write_crosses: bool = False
    kv_writer: str = ""
    gather: bool = False
    split: Split | None = None
    drops: tuple[str, ...] = ()  # values no later op of the pass reads: freed right after this op
    experts: ExpertRun | None = None
    inputs_at: tuple[tuple[str, tuple[str, ...]], ...] = ()  # where its inputs are before its moves (whole pass)


@dataclass(frozen=True)
class ExpertRun:
    """An MoE experts op: of `num_experts`, experts [0, hbm) compute on the GPU from HBM, [hbm, hbm + cpu) on the
    CPU from the host tier, and the rest on the GPU, each streamed (when routed) into one of the expert slots of
    the layer's staging buffer. The partial sums of the devices that compute experts are added, with the
    residual, on every device in `merge_on`."""

    num_experts: int
    hbm: int
    cpu: int
    merge_on: tuple[str, ...]

    @property
    def streamed(self) -> int:
        return self.num_experts - self.hbm - self.cpu

    def devices(self) -> tuple[str, ...]:
        """The devices that compute experts."""
        return (("cpu",) if self.cpu else ()) + (("gpu",) if self.hbm or self.streamed else ())

    def assign(self, counts: list[int], ratio: float | None = None) -> tuple[list[int], list[int]]:
        """One step's routed host experts (`counts[e]`: tokens routed to expert e): (those the CPU computes, those
        streamed to the GPU), each ascending. Without `ratio`, each where the plan puts it. With `ratio` (the CPU's
        seconds for one expert over PCIe's for one expert's copy, measured on this host) and a plan that has both CPU
        and streamed experts, the routed ones are shared so that the slower device finishes first: x of the r
        routed on the CPU, x minimising max(x · ratio, r − x), ties to the fewest moved from their planned device
        (the CPU's last ones go over PCIe, or the first streamed ones stay on the CPU); when every host expert is
        routed, as planned. Every host expert lies in the host tier and the expert slots take any of them, so only
        routed experts move, as planned; at batch 1 a layer's two routed experts then go one to each device instead
        of both to one while the other idles."""
        first, split = self.hbm, self.hbm + self.cpu
        cpu = [e for e in range(first, split) if counts[e]]
        streamed = [e for e in range(split, self.num_experts) if counts[e]]
        if ratio is None or not (self.cpu and self.streamed):
            return cpu, streamed
        routed, planned = len(cpu) + len(streamed), len(cpu)
        if routed == self.cpu + self.streamed:  # every host expert routed (prefills, larger batches): the ILP's own
            return cpu, streamed                # placement, priced for exactly this
        share = min(range(routed + 1), key=lambda x: (max(x * ratio, routed - x), abs(x - planned)))
        if share < planned:  # the CPU's last routed ones go over PCIe
            cpu, streamed = cpu[:share], sorted(cpu[share:] + streamed)
        elif share > planned:  # the first routed streamed ones stay on the CPU
            take = share - planned
            cpu, streamed = sorted(cpu + streamed[:take]), streamed[take:]
        return cpu, streamed


@dataclass(frozen=True)
class Split:
    """A unit split by output features: the CPU computes features [0, cpu_features) of each logical output from the
    weights' host tier, the GPU the other `features - cpu_features` from streamed weights; the parts are joined
    (and the unit's epilogue runs: heads and RoPE, the residual add) on every device in `merge_on`."""

    cpu_features: int
    features: int
    merge_on: tuple[str, ...]


@dataclass(frozen=True)
class Piece:
    """One parameter (or, for a split unit's GPU part, its row blocks) in a staging buffer: the blocks are packed
    one after another at `offset`, so the staged tensor is contiguous."""

    param: ParamInfo
    tier: str
    offset: int
    rows: tuple[tuple[int, int], ...]  # (first row, count) of the host tensor, in staging order

    @property
    def shape(self) -> tuple[int, ...]:
        return (sum(count for _, count in self.rows),) + tuple(self.param.shape[1:])

    @property
    def numel(self) -> int:
        return numel(self.shape)


@dataclass(frozen=True)
class StreamUnit:
    """What one layer copies into a staging buffer in one phase, and where each piece sits in the buffer."""

    index: int
    slot: int
    layer_class: str
    layer: int
    weights: tuple[Piece, ...]
    kv: tuple[tuple[str, int], ...] = ()              # ('k' | 'v', byte offset of the [B, G, C, E] window)
    nbytes: int = 0                                   # exact payload (no alignment padding)
    padded_bytes: int = 0
    expert_slots: tuple[int, ...] = ()                # byte offset of each routed-expert slot (its gate_up, down)
    kv_shape: tuple[int, ...] = ()                    # [B, G, C, E] of its windows: B is this plan's batch, which
                                                      # may be below the cache's (a serving plan's smaller batches)


@dataclass(frozen=True)
class PhaseSchedule:
    phase: str
    ops: tuple[Op, ...]
    stream_units: tuple[StreamUnit, ...]


@dataclass(frozen=True)
class Schedule:
    """The plan resolved for execution (see the module docstring)."""

    phases: dict[str, PhaseSchedule]
    params: dict[tuple[str, int, str], tuple[ParamInfo, ...]]  # (class, layer, sublayer) → parameters
    weight_tiers: dict[str, tuple[str, ...]]  # canonical parameter → tiers holding a copy (or rows of it)
    kv_tiers: tuple[str, ...]                 # per decoder layer
    kv_shape: tuple[int, int, int, int]       # [B, G, C, E] of one layer's K (and of V)
    itemsize: int
    buffers: int                              # staging buffers (0 when nothing is streamed)
    buffer_bytes: int
    tier_bytes: dict[str, int] = field(default_factory=dict)  # arena sizes: weights + KV (+ staging in 'hbm')
    prefill_microbatch: tuple[int, int] = (0, 0)  # (sequences, prompt tokens) per prefill micro-batch
    # (canonical parameter, tier) → (first row, rows) of a copy holding only some rows of a stacked parameter (MoE
    # experts: HBM holds experts [0, hbm), the host tier the others); absent: the whole parameter
    weight_rows: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    def rows_of(self, canonical: str, tier: str, shape: tuple[int, ...]) -> tuple[int, int]:
        """(first row, rows) of the parameter that its copy in `tier` holds."""
        return self.weight_rows.get((canonical, tier), (0, shape[0] if shape else 1))

    @property
    def uses_gpu(self) -> bool:
        return any(op.device in ("gpu", "split") for phase in self.phases.values() for op in phase.ops)


def model_params(cfg: ModelConfig) -> dict[tuple[str, int, str], tuple[ParamInfo, ...]]:
    """(layer class, layer, sublayer) → the parameters its module reads, from a model built on 'meta'."""
    with torch.device("meta"):
        model = build_model(cfg)
    canonical: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(param), name)  # a tied LM head maps to the embedding's matrix

    def infos(module) -> tuple[ParamInfo, ...]:
        return tuple(ParamInfo(local, canonical[id(p)], tuple(p.shape))
                     for local, p in module.named_parameters(remove_duplicate=False))

    out = {("embed", 0, "embed"): infos(model.embed), ("head", 0, "lm_head"): infos(model.lm_head)}
    for layer, block in enumerate(model.layers):
        for unit in SUBLAYERS[cfg.family]:
            out[("decoder", layer, unit)] = infos(getattr(block, MODULE_OF[unit]))
    return out


class _Flow:
    """Where each value currently has a copy; `need` emits the move that brings it to a device."""

    def __init__(self):
        self.where: dict[str, list[str]] = {}

    def produce(self, value: str, device: str) -> None:
        self.where[value] = [device]

    def need(self, value: str, device: str, moves: list[Move]) -> None:
        have = self.where[value]
        if device not in have:
            moves.append(Move(value, have[0], device))
            have.append(device)


@dataclass
class _Spec:
    """An op while the phase is being built (mutable): its values, its device(s), and for a split where it merges."""

    kind: str
    group: object
    layer: int
    sublayers: tuple[str, ...]
    device: str                            # 'cpu', 'gpu' or 'split'
    gemm_in: str = ""                      # the value its projection reads (on both devices when split)
    residual: str = ""                     # the residual stream it adds to (on its merge devices when split)
    needs: tuple[str, ...] = ()            # other inputs (attention)
    produces: tuple[str, ...] = ()
    cpu_features: int = 0                  # split: features [0, r) of each logical output on the CPU
    features: int = 0                      # split: N
    merge_on: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    def inputs(self) -> tuple[str, ...]:
        return tuple(v for v in (self.gemm_in, self.residual) if v) + self.needs


def _placement(sub, phase: str) -> tuple[str, int]:
    """(device, CPU permille) of a unit in a phase; v1 placements (no permille fields) are whole."""
    device = getattr(sub, phase)
    return device, int(getattr(sub, f"{phase}_cpu_permille", 1000 if device == "cpu" else 0))


def _features(unit: str, params: tuple[ParamInfo, ...]) -> int:
    """N, the unit's logical output features (gate_up: F, its activated output; its projection has 2F rows)."""
    rows = next(p.shape[0] for p in params if p.local == "proj.weight")
    return rows // 2 if unit == "gate_up" else rows


def part_rows(unit: str, param: ParamInfo, device: str, cpu_features: int, features: int
              ) -> tuple[tuple[int, int], ...]:
    """Row blocks (first, count) of `param` that the `device` part of a split unit reads: norms whole; the
    projection's rows [0, r) on the CPU and [r, N) on the GPU, for gate_up in both its gate and its up half."""
    if not param.local.startswith("proj."):
        return ((0, param.shape[0]),)
    r, n = cpu_features, features
    halves = (0, n) if unit == "gate_up" else (0,)
    if device == "cpu":
        return tuple((h, r) for h in halves)
    return tuple((h + r, n - r) for h in halves)


def _layer_specs(cfg, phase, params, group, layer, decode_embed_device) -> list[_Spec]:
    """One layer's ops with devices and values (no moves yet)."""
    placement = {s.name: _placement(s, phase) for s in group.sublayers}
    key = group.layer_class

    def spec(kind, unit, **kw) -> _Spec:
        device, permille = placement[unit]
        out = _Spec(kind, group, layer, (unit,), device, **kw)
        if device == "split":
            out.features = _features(unit, params[(key, layer, unit)])
            out.cpu_features = out.features * permille // 1000
            if out.cpu_features == 0:  # the CPU's share rounds to no feature: the GPU alone computes the same
                out.device = "gpu"
        return out

    if key == "embed":
        if _gathers(group, phase):
            return [_Spec("embed", group, layer, ("embed",), "gpu", needs=("ids",), produces=("x",),
                          extra={"gather": True})]
        return [spec("embed", "embed", needs=("ids",), produces=("x",))]
    if key == "head":
        head = spec("lm_head", "lm_head", gemm_in="x", produces=("next",))
        if head.device == "split":  # the logits join where the next step embeds the greedy token
            head.merge_on = (decode_embed_device,)
        return [head]
    names = SUBLAYERS[cfg.family]
    home = HOME[group.kv_cache]
    dev = {kind: placement[n][0] for kind, n in zip(_KINDS, names)}
    read = {}
    for kind in ("score", "context"):
        if phase == "prefill" and dev[kind] == home == "cpu" and dev["qkv"] == "gpu":
            # the GPU's qkv writes this step's K, V into the host cache (one crossing, priced as the KV write):
            # the CPU's attention reads them there, after those writes, not from a second copy of K and V
            read[kind] = "stored"
        elif phase == "prefill":
            read[kind] = "fresh"
        elif dev[kind] == home:
            read[kind] = "cache"
        elif dev[kind] == "gpu":
            read[kind] = "window"
        else:  # check_semantics refuses CPU decode attention over an 'hbm' cache
            raise ValueError(f"group '{group.name}': decode {kind} on the CPU over an 'hbm' cache")
    kv_needs = {"score": ("k",), "context": ("v",)}

    def attn_needs(kind, first):
        fresh = kv_needs[kind] if read[kind] in ("fresh", "window") else ()
        return (first,) + fresh

    specs = [spec("qkv", names[0], gemm_in="x", produces=("q", "k", "v"))]
    if dev["score"] == dev["context"]:
        needs = attn_needs("score", "q") + attn_needs("context", "q")[1:]
        specs.append(_Spec("attn", group, layer, names[1:3], dev["score"], needs=needs, produces=("o",),
                           extra={"kv_read": read["score"]}))
    else:
        specs.append(_Spec("score", group, layer, (names[1],), dev["score"], needs=attn_needs("score", "q"),
                           produces=("p",), extra={"kv_read": read["score"]}))
        specs.append(_Spec("context", group, layer, (names[2],), dev["context"],
                           needs=attn_needs("context", "p"), produces=("o",), extra={"kv_read": read["context"]}))
    specs.append(spec("out_proj", names[3], gemm_in="o", residual="x", produces=("x",)))
    if names[4] in _MOE_KINDS:  # the router, then the experts split by count (not by features)
        specs.append(_Spec("router", group, layer, (names[4],), placement[names[4]][0], gemm_in="x",
                           produces=("h", "ei", "ew")))
        specs.append(_experts_spec(cfg, group, layer, phase))
        return specs
    specs.append(spec("up", names[4], gemm_in="x", produces=("h",)))
    specs.append(spec("down", names[5], gemm_in="h", residual="x", produces=("x",)))
    return specs


def _experts_spec(cfg, group, layer: int, phase: str) -> _Spec:
    """An MoE layer's experts op: its counts per device from the plan (`liac.plan.expert_placement`)."""
    sub = next(s for s in group.sublayers if s.name == "experts")
    placed = expert_placement(sub, cfg.num_experts)
    run = ExpertRun(cfg.num_experts, placed.hbm, placed.cpu(phase), ())
    devices = run.devices()
    device = devices[0] if len(devices) == 1 else "split"
    return _Spec("experts", group, layer, ("experts",), device, gemm_in="h", residual="x", needs=("ei", "ew"),
                 produces=("x",), extra={"experts": run})


def _parts(spec: _Spec) -> tuple[str, ...]:
    return ("cpu", "gpu") if spec.device == "split" else (spec.device,)


def _merge_devices(specs: list[_Spec]) -> None:
    """Backward over the phase: a split op joins its parts on every device a later op reads its output on (its
    projection input on both devices of a split consumer; a residual where that consumer joins)."""
    needed: dict[str, set[str]] = {}
    for spec in reversed(specs):
        if spec.device == "split" and not spec.merge_on:
            readers = set().union(*(needed.get(value, set()) for value in spec.produces))
            spec.merge_on = tuple(sorted(readers)) or ("gpu",)
        for value in spec.produces:
            needed[value] = set()
        if spec.gemm_in:
            needed.setdefault(spec.gemm_in, set()).update(_parts(spec))
        if spec.residual:
            needed.setdefault(spec.residual, set()).update(spec.merge_on or _parts(spec))
        for value in spec.needs:
            needed.setdefault(value, set()).update(("cpu",) if spec.extra.get("gather") else _parts(spec))


class _Streamed(NamedTuple):
    """A parameter the GPU reads from staging: its host tier and the row blocks (first, count) it copies."""

    param: ParamInfo
    tier: str
    rows: tuple[tuple[int, int], ...]


def _phase(plan: OffloadPlan, cfg: ModelConfig, phase: str, params, nbuf: int, kv_shape: tuple[int, ...],
           itemsize: int, decode_embed_device: str) -> PhaseSchedule:
    layers = []  # (group, layer, specs)
    for group in plan.spec.layer_groups:
        for layer in range(group.first_layer, group.first_layer + group.layer_count):
            layers.append((group, layer, _layer_specs(cfg, phase, params, group, layer, decode_embed_device)))
    _merge_devices([spec for _, _, specs in layers for spec in specs])

    ops: list[Op] = []
    stream_units: list[StreamUnit] = []
    flow = _Flow()
    flow.produce("ids", "cpu" if phase == "prefill" else decode_embed_device)
    drops = _drops([spec for _, _, specs in layers for spec in specs])
    for group, layer, specs in layers:
        streamed: list[_Streamed] = []
        layer_ops = [replace(_op(spec, group, layer, params, flow, streamed, decode_embed_device),
                             drops=drops[id(spec)]) for spec in specs]
        kv_stream = [which for spec in specs if spec.extra.get("kv_read") == "window"  # GPU attention over a
                     for which in {"attn": "kv", "score": "k", "context": "v"}[spec.kind]]  # host-tier cache
        slots = [min(op.experts.streamed, EXPERT_SLOTS) for op in layer_ops if op.experts is not None]
        expert_slots = (slots[0], params[(group.layer_class, layer, "experts")]) if slots and slots[0] else None
        if not (streamed or kv_stream or expert_slots):
            ops.extend(layer_ops)
            continue
        stream = _stream_unit(len(stream_units), nbuf, (group.layer_class, layer), streamed, kv_stream,
                              kv_shape, itemsize, expert_slots)
        stream_units.append(stream)
        ops.extend(_bracketed(layer_ops, stream, group.name))
    return PhaseSchedule(phase, tuple(ops), tuple(stream_units))


def _drops(specs: list[_Spec]) -> dict[int, tuple[str, ...]]:
    """Liveness over one pass, backward: per op (by id of its spec), the values it reads or produces that no later
    op reads before producing them again ('next', the pass's result, is never dropped). A value an op both reads
    and produces (the residual 'x') is replaced by its new copy, not dropped."""
    live: set[str] = {"next"}
    out = {}
    for spec in reversed(specs):
        reads, writes = set(spec.inputs()), set(spec.produces)
        out[id(spec)] = tuple(sorted(((reads - writes) | writes) - live))
        live = (live - writes) | reads
    return out


def _op(spec: _Spec, group, layer: int, params, flow: _Flow, streamed: list[_Streamed],
        decode_embed_device: str) -> Op:
    """One op: the moves that bring its inputs to its device(s), where its outputs now are, the parameters it reads
    from staging (added to `streamed`), and where its K, V are written."""
    moves: list[Move] = []
    gather = spec.extra.get("gather", False)
    inputs_at = tuple((value, tuple(flow.where[value])) for value in dict.fromkeys(spec.inputs()))
    if spec.device == "split":
        for device in ("cpu", "gpu"):
            for value in (spec.gemm_in,) + spec.needs:
                flow.need(value, device, moves)
        for device in spec.merge_on:
            if spec.residual:
                flow.need(spec.residual, device, moves)
        targets = spec.merge_on
    else:
        for value in spec.inputs():
            flow.need(value, "cpu" if gather else spec.device, moves)
        targets = (spec.device,)
    for value in spec.produces:
        flow.produce(value, targets[0])
        flow.where[value].extend(targets[1:])
    weights = {s.name: s.weights for s in group.sublayers}[spec.sublayers[0]]
    host_weights = weights in HOST_TIERS and not gather
    split = None
    if spec.kind == "experts":  # routed experts are copied by the op itself, into the layer's expert slots
        run = replace(spec.extra["experts"], merge_on=targets)
        return Op(spec.kind, group.name, group.layer_class, layer, spec.device, spec.sublayers, weights,
                  streamed=run.streamed > 0, moves=tuple(moves), experts=run, inputs_at=inputs_at)
    if spec.device == "split":
        split = Split(spec.cpu_features, spec.features, spec.merge_on)
        streamed.extend(_Streamed(p, weights, part_rows(spec.sublayers[0], p, "gpu", spec.cpu_features, spec.features))
                        for p in params[(group.layer_class, layer, spec.sublayers[0])])
    elif spec.device == "gpu" and host_weights:
        for sub in spec.sublayers:
            streamed.extend(_Streamed(p, weights, ((0, p.shape[0]),)) for p in params[(group.layer_class, layer, sub)])
    kv_writer = ""
    if spec.kind == "qkv":
        home = HOME[group.kv_cache]
        kv_writer = home if home in targets else targets[0]
    op = Op(spec.kind, group.name, group.layer_class, layer, "gpu" if gather else spec.device, spec.sublayers,
            weights, streamed=(spec.device in ("gpu", "split") and host_weights), moves=tuple(moves),
            kv_read=spec.extra.get("kv_read", ""),
            kv_write_crosses=bool(kv_writer) and kv_writer != HOME[group.kv_cache], kv_writer=kv_writer,
            gather=gather, split=split, inputs_at=inputs_at)
    if spec.kind == "lm_head" and spec.device != "split" and decode_embed_device != spec.device:
        op = replace(op, moves=op.moves + (Move("next", spec.device, decode_embed_device),))  # to the next embedding
    return op


def _bracketed(layer_ops: list[Op], stream: StreamUnit, group: str) -> list[Op]:
    """A streaming layer's ops with the readers of its staging buffer tagged with its stream unit and bracketed by
    'wait' and 'release'. Only the readers: a CPU op before them need not wait for the layer's copy (it overlaps
    it), and the buffer is handed back to the copy stream as soon as its last reader is done."""
    ops = [replace(o, stream_unit=stream.index) if o.streamed or o.kv_read == "window" else o for o in layer_ops]
    readers = [at for at, o in enumerate(ops) if o.stream_unit == stream.index]
    first, last = readers[0], readers[-1]
    wait = Op("wait", group, stream.layer_class, stream.layer, "gpu", stream_unit=stream.index)
    # After a split op too, once it has joined: its release queues the next layer's copy, and host → GPU copies of
    # all streams run one at a time on the copy engine, so a copy queued right after the GPU part's launch held the
    # join's crossing back until a whole layer's weights had landed (H200, bench/results/h200-2026-12-02).
    release = Op("release", group, stream.layer_class, stream.layer, "gpu", stream_unit=stream.index)
    return ops[:first] + [wait] + ops[first:last + 1] + [release] + ops[last + 1:]


def _gathers(group, phase: str) -> bool:
    sub = group.sublayers[0]
    return getattr(sub, phase) == "gpu" and sub.weights in HOST_TIERS


def _stream_unit(index: int, nbuf: int, key: tuple[str, int], streamed: list[_Streamed], kv_stream: list[str],
                 kv_shape: tuple[int, ...], itemsize: int, expert_slots=None) -> StreamUnit:
    """What one layer copies into staging buffer `index` mod `nbuf`: each parameter once, then its KV windows (of
    shape `kv_shape`), then (`expert_slots` = (slots, the experts' parameters)) room for its routed experts, one
    expert's parameters per slot, each parameter at an aligned offset."""
    offset, exact, placed = 0, 0, []
    seen = set()
    for param, tier, rows in streamed:
        if param.canonical in seen:
            continue
        seen.add(param.canonical)
        piece = Piece(param, tier, offset, rows)
        placed.append(piece)
        exact += piece.numel * itemsize
        offset += aligned(piece.numel * itemsize)
    kv = []
    kv_window_bytes = numel(kv_shape) * itemsize
    for which in kv_stream:
        kv.append((which, offset))
        exact += kv_window_bytes
        offset += aligned(kv_window_bytes)
    slot_offsets = []
    if expert_slots:
        count, expert_params = expert_slots
        for _ in range(count):
            slot_offsets.append(offset)
            for param in expert_params:  # one expert: [rows of one expert...] of each stacked parameter
                nbytes = numel(param.shape[1:]) * itemsize
                exact += nbytes
                offset += aligned(nbytes)
    return StreamUnit(index, index % nbuf, key[0], key[1], tuple(placed), tuple(kv), exact, offset,
                      tuple(slot_offsets), tuple(kv_shape) if kv else ())


def build_schedule(plan: OffloadPlan, itemsize: int = 2, source: str = "plan") -> Schedule:
    """Resolve `plan` (already validated by liac.plan) for a run whose tensors take `itemsize` bytes per element.

    Raises:
        LiacError: the staging buffers the plan sizes cannot hold what one layer streams.
    """
    cfg = plan.model_config
    spec = plan.spec
    params = model_params(cfg)
    work = spec.workload
    tokens = work.prompt_len + work.gen_len - 1  # the last generated token is never attended to
    kv_shape = (work.batch_size, cfg.num_kv_heads, tokens, cfg.head_dim)
    kv_window_bytes = numel(kv_shape) * itemsize
    nbuf = spec.execution.prefetch_depth + 1  # depth 0: one buffer, copy then compute (no overlap)
    embed = [g for g in spec.layer_groups if g.layer_class == "embed"][0]
    # where a decode step's token ids must be: on the embedding's device, on the host for a host-side gather
    decode_embed_device = "cpu" if _gathers(embed, "decode") else embed.sublayers[0].decode
    phases = {phase: _phase(plan, cfg, phase, params, nbuf, kv_shape, itemsize, decode_embed_device)
              for phase in PHASES}

    stream_units = [u for p in phases.values() for u in p.stream_units]
    plan_itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}.get(cfg.dtype, 2)
    # A dtype override (tests run fp32) scales the plan's staging size with the element size.
    staging = spec.execution.staging_bytes * itemsize // plan_itemsize
    buffers, buffer_bytes = 0, 0
    if stream_units:
        largest = max(stream_units, key=lambda u: u.nbytes)
        if largest.nbytes > staging:
            raise LiacError(source, f"must be at least {largest.nbytes} bytes: {largest.layer_class} layer "
                                    f"{largest.layer} streams {largest.nbytes} bytes to the GPU per step, got "
                                    f"{spec.execution.staging_bytes}", path="spec.execution.staging_bytes")
        buffers = nbuf
        buffer_bytes = aligned(max(staging, max(u.padded_bytes for u in stream_units)))

    weight_tiers: dict[str, list[str]] = {}
    weight_rows: dict[tuple[str, str], tuple[int, int]] = {}
    tier_bytes = {tier: 0 for tier in TIERS}
    for group in spec.layer_groups:
        for sub in group.sublayers:
            if sub.weights == "none":
                continue
            rows = _expert_rows(cfg, sub)
            for layer in range(group.first_layer, group.first_layer + group.layer_count):
                for param in params[(group.layer_class, layer, sub.name)]:
                    tiers = weight_tiers.setdefault(param.canonical, [])
                    for tier, (first, count) in (rows or {sub.weights: (0, param.shape[0])}).items():
                        if tier in tiers:  # a tied matrix in two tiers is held twice, once per tier
                            continue
                        tiers.append(tier)
                        if rows:
                            weight_rows[(param.canonical, tier)] = (first, count)
                        tier_bytes[tier] += aligned(numel((count,) + param.shape[1:]) * itemsize)
    kv_tiers = []
    for group in spec.layer_groups:
        if group.layer_class == "decoder":
            kv_tiers.extend([group.kv_cache] * group.layer_count)
            tier_bytes[group.kv_cache] += 2 * aligned(kv_window_bytes) * group.layer_count
    tier_bytes["hbm"] += buffers * buffer_bytes
    microbatch = (spec.execution.prefill_microbatch_sequences, spec.execution.prefill_microbatch_tokens)
    return Schedule(phases, params, {k: tuple(v) for k, v in weight_tiers.items()}, tuple(kv_tiers), kv_shape,
                    itemsize, buffers, buffer_bytes, tier_bytes, microbatch, weight_rows)


def _expert_rows(cfg: ModelConfig, sub) -> dict[str, tuple[int, int]] | None:
    """An MoE experts unit's stacked parameters by rows (experts) per tier: {'hbm': (0, hbm), tier: (hbm, rest)};
    None for every other unit (whole parameters)."""
    if sub.name != "experts" or not cfg.num_experts:
        return None
    placed = expert_placement(sub, cfg.num_experts)
    out = {"hbm": (0, placed.hbm)} if placed.hbm else {}
    if placed.hbm < cfg.num_experts:
        out[sub.weights] = (placed.hbm, cfg.num_experts - placed.hbm)
    return out
