"""OffloadPlan → Schedule: per phase, the straight list of ops the executor runs, computed once.

Everything the plan decides is resolved here, so the executor's inner loop does no plan lookups:

  * ops       one per placement unit of every layer, in execution order, with its device; the two attention
              units fuse into one SDPA op when the plan puts them on the same device
  * moves     the activations each op first copies to its device: exactly where a value's consumer runs on the
              other device than its producer (the residual stream included); each value crosses at most once
  * KV        where each layer's cache lives (its group's tier), whether the qkv op's K/V write crosses PCIe,
              and how attention reads it: the fresh K/V (prefill), the cache in place, or a streamed window
  * streaming units: the layers whose GPU ops read weights (or, at decode, a KV cache) from a host tier; unit i
              is copied into staging buffer i mod (prefetch_depth + 1), bracketed by 'wait' / 'release' ops
  * bytes     per tier, for the host checks and the arenas (runtime/memory.py), before anything is allocated

Values: 'ids' tokens, 'x' residual stream, 'q' 'k' 'v' from qkv, 'p' attention probabilities, 'o' attention
output, 'h' FFN hidden, 'next' the greedy token for the following step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from liac.errors import LiacError
from liac.models import SUBLAYERS
from liac.models.config import ModelConfig
from liac.plan import OffloadPlan
from liac.runtime.memory import HOME, aligned

__all__ = ["PHASES", "Move", "Op", "StreamUnit", "PhaseSchedule", "Schedule", "ParamInfo", "build_schedule",
           "MODULE_OF", "model_params"]

PHASES = ("prefill", "decode")

# Plan sublayer → attribute of its module in liac.models (layer modules, or the model for embed / lm_head).
MODULE_OF = {"qkv": "qkv", "attn_score": "attn", "attn_context": "attn", "out_proj": "out_proj", "fc1": "fc1",
             "gate_up": "gate_up", "fc2": "fc2", "down": "down", "embed": "embed", "lm_head": "lm_head"}
# Op kind of each decoder unit position: qkv, score, context, out_proj, up (fc1/gate_up), down (fc2/down).
_KINDS = ("qkv", "score", "context", "out_proj", "up", "down")


@dataclass(frozen=True)
class ParamInfo:
    """One parameter a unit reads: its name inside the unit's module, its model-wide name, shape."""

    local: str      # 'proj.weight'
    canonical: str  # 'layers.3.qkv.proj.weight'; a tied LM head names 'embed.tokens.weight'
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


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
        'lm_head', or 'wait' / 'release' (streaming unit `unit`).
    sublayers: plan sublayer names it covers (for metrics).
    weights: the tier of its weights ('none' for attention), `streamed` when it reads them from staging.
    kv_read: attention ops: 'fresh' (this step's K/V), 'cache' (in place) or 'window' (streamed to the GPU).
    kv_write_crosses: qkv ops: the cache lives on the other device.
    gather: an embedding on the GPU whose table is in a host tier: the B×Q looked-up rows are gathered on the host
        and sent (what the cost model streams for an embedding), never the whole table.
    """

    kind: str
    group: str
    layer_class: str
    layer: int
    device: str = "cpu"
    sublayers: tuple[str, ...] = ()
    weights: str = "none"
    streamed: bool = False
    unit: int = -1
    moves: tuple[Move, ...] = ()
    kv_tier: str = "none"
    kv_read: str = ""
    kv_write_crosses: bool = False
    gather: bool = False


@dataclass(frozen=True)
class StreamUnit:
    """What one layer copies into a staging buffer in one phase, and where each piece sits in the buffer."""

    index: int
    slot: int
    layer_class: str
    layer: int
    weights: tuple[tuple[ParamInfo, str, int], ...]  # (parameter, host tier, byte offset)
    kv: tuple[tuple[str, int], ...] = ()              # ('k' | 'v', byte offset of the [B, G, C, E] window)
    nbytes: int = 0                                   # exact payload (no alignment padding)
    padded_bytes: int = 0


@dataclass(frozen=True)
class PhaseSchedule:
    phase: str
    ops: tuple[Op, ...]
    units: tuple[StreamUnit, ...]


@dataclass(frozen=True)
class Schedule:
    """The plan resolved for execution (see the module docstring)."""

    phases: dict[str, PhaseSchedule]
    params: dict[tuple[str, int, str], tuple[ParamInfo, ...]]  # (class, layer, sublayer) → parameters
    weight_tiers: dict[str, tuple[str, ...]]  # canonical parameter → tiers holding a copy
    kv_tiers: tuple[str, ...]                 # per decoder layer
    kv_shape: tuple[int, int, int, int]       # [B, G, C, E] of one layer's K (and of V)
    itemsize: int
    buffers: int                              # staging buffers (0 when nothing is streamed)
    buffer_bytes: int
    tier_bytes: dict[str, int] = field(default_factory=dict)  # arena sizes: weights + KV (+ staging in 'hbm')

    @property
    def uses_gpu(self) -> bool:
        return any(op.device == "gpu" for phase in self.phases.values() for op in phase.ops)


def model_params(cfg: ModelConfig) -> dict[tuple[str, int, str], tuple[ParamInfo, ...]]:
    """(layer class, layer, sublayer) → the parameters its module reads, from a model built on 'meta'."""
    import torch

    from liac.models import build_model

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


def _phase(plan: OffloadPlan, cfg: ModelConfig, phase: str, params, nbuf: int, kv_window_bytes: int,
           itemsize: int, decode_embed_device: str) -> PhaseSchedule:
    ops: list[Op] = []
    units: list[StreamUnit] = []
    flow = _Flow()
    flow.produce("ids", "cpu" if phase == "prefill" else decode_embed_device)
    for group in plan.spec.layer_groups:
        devices = {s.name: getattr(s, phase) for s in group.sublayers}
        tiers = {s.name: s.weights for s in group.sublayers}
        for layer in range(group.first_layer, group.first_layer + group.layer_count):
            key = (group.layer_class, layer)
            streamed_params = []
            kv_stream: list[str] = []
            layer_ops: list[Op] = []

            def op(kind, sublayers, device, needs=(), produces=(), **extra):
                moves: list[Move] = []
                for value in needs:
                    flow.need(value, device, moves)
                for value in produces:
                    flow.produce(value, device)
                weights = tiers[sublayers[0]]
                streamed = device == "gpu" and weights in ("ddr", "cxl")
                if streamed:
                    for sub in sublayers:
                        streamed_params.extend((p, weights) for p in params[(group.layer_class, layer, sub)])
                layer_ops.append(Op(kind, group.name, group.layer_class, layer, device, tuple(sublayers), weights,
                                    streamed, moves=tuple(moves), kv_tier=group.kv_cache, **extra))

            if group.layer_class == "embed" and _gathers(group, phase):
                moves: list[Move] = []
                flow.need("ids", "cpu", moves)
                flow.produce("x", "gpu")
                layer_ops.append(Op("embed", group.name, "embed", layer, "gpu", ("embed",), tiers["embed"],
                                    moves=tuple(moves), gather=True))
            elif group.layer_class == "embed":
                op("embed", ("embed",), devices["embed"], needs=("ids",), produces=("x",))
            elif group.layer_class == "head":
                dev = devices["lm_head"]
                op("lm_head", ("lm_head",), dev, needs=("x",), produces=("next",))
                if decode_embed_device != dev:  # the greedy token goes where the next step embeds it
                    layer_ops[-1] = _with_moves(layer_ops[-1], (Move("next", dev, decode_embed_device),))
            else:
                names = SUBLAYERS[cfg.family]
                dev = dict(zip(_KINDS, (devices[n] for n in names)))
                home = HOME[group.kv_cache]
                op("qkv", (names[0],), dev["qkv"], needs=("x",), produces=("q", "k", "v"),
                   kv_write_crosses=home != dev["qkv"])
                read = {}
                for kind in ("score", "context"):
                    if phase == "prefill":
                        read[kind] = "fresh"
                    elif dev[kind] == home:
                        read[kind] = "cache"
                    elif dev[kind] == "gpu":
                        read[kind] = "window"
                    else:  # check_semantics refuses CPU decode attention over an 'hbm' cache
                        raise ValueError(f"group '{group.name}': decode {kind} on the CPU over an 'hbm' cache")
                kv_needs = {"score": ("k",), "context": ("v",)}
                for kind in ("score", "context"):
                    if read[kind] == "window":
                        kv_stream.extend(kv_needs[kind])

                def attn_needs(kind, first):
                    fresh = kv_needs[kind] if read[kind] in ("fresh", "window") else ()
                    return (first,) + fresh

                if dev["score"] == dev["context"]:
                    needs = attn_needs("score", "q") + attn_needs("context", "q")[1:]
                    op("attn", names[1:3], dev["score"], needs=needs, produces=("o",), kv_read=read["score"])
                else:
                    op("score", (names[1],), dev["score"], needs=attn_needs("score", "q"), produces=("p",),
                       kv_read=read["score"])
                    op("context", (names[2],), dev["context"], needs=attn_needs("context", "p"), produces=("o",),
                       kv_read=read["context"])
                op("out_proj", (names[3],), dev["out_proj"], needs=("o", "x"), produces=("x",))
                op("up", (names[4],), dev["up"], needs=("x",), produces=("h",))
                op("down", (names[5],), dev["down"], needs=("h", "x"), produces=("x",))
            if streamed_params or kv_stream:
                unit = _unit(len(units), nbuf, key, streamed_params, kv_stream, kv_window_bytes, itemsize)
                units.append(unit)
                layer_ops = [_with_unit(o, unit.index) if o.streamed or o.kv_read == "window" else o
                             for o in layer_ops]
                ops.append(Op("wait", group.name, key[0], key[1], "gpu", unit=unit.index))
                ops.extend(layer_ops)
                ops.append(Op("release", group.name, key[0], key[1], "gpu", unit=unit.index))
            else:
                ops.extend(layer_ops)
    return PhaseSchedule(phase, tuple(ops), tuple(units))


def _gathers(group, phase: str) -> bool:
    sub = group.sublayers[0]
    return getattr(sub, phase) == "gpu" and sub.weights in ("ddr", "cxl")


def _with_moves(op: Op, extra: tuple[Move, ...]) -> Op:
    return replace(op, moves=op.moves + extra)


def _with_unit(op: Op, unit: int) -> Op:
    return replace(op, unit=unit)


def _unit(index, nbuf, key, streamed_params, kv_stream, kv_window_bytes, itemsize) -> StreamUnit:
    offset, exact, placed = 0, 0, []
    seen = set()
    for param, tier in streamed_params:
        if param.canonical in seen:
            continue
        seen.add(param.canonical)
        placed.append((param, tier, offset))
        exact += param.numel * itemsize
        offset += aligned(param.numel * itemsize)
    kv = []
    for which in kv_stream:
        kv.append((which, offset))
        exact += kv_window_bytes
        offset += aligned(kv_window_bytes)
    return StreamUnit(index, index % nbuf, key[0], key[1], tuple(placed), tuple(kv), exact, offset)


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
    kv_window_bytes = kv_shape[0] * kv_shape[1] * kv_shape[2] * kv_shape[3] * itemsize
    nbuf = spec.execution.prefetch_depth + 1  # depth 0: one buffer, copy then compute (no overlap)
    embed = [g for g in spec.layer_groups if g.layer_class == "embed"][0]
    # where a decode step's token ids must be: on the embedding's device, on the host for a host-side gather
    decode_embed_device = "cpu" if _gathers(embed, "decode") else embed.sublayers[0].decode
    phases = {phase: _phase(plan, cfg, phase, params, nbuf, kv_window_bytes, itemsize, decode_embed_device)
              for phase in PHASES}

    units = [u for p in phases.values() for u in p.units]
    plan_itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}.get(cfg.dtype, 2)
    # A dtype override (tests run fp32) scales the plan's staging size with the element size.
    staging = spec.execution.staging_bytes * itemsize // plan_itemsize
    buffers, buffer_bytes = 0, 0
    if units:
        largest = max(units, key=lambda u: u.nbytes)
        if largest.nbytes > staging:
            raise LiacError(source, f"must be at least {largest.nbytes} bytes: {largest.layer_class} layer "
                                    f"{largest.layer} streams {largest.nbytes} bytes to the GPU per step, got "
                                    f"{spec.execution.staging_bytes}", path="spec.execution.staging_bytes")
        buffers = nbuf
        buffer_bytes = aligned(max(staging, max(u.padded_bytes for u in units)))

    weight_tiers: dict[str, list[str]] = {}
    tier_bytes = {"hbm": 0, "ddr": 0, "cxl": 0}
    for group in spec.layer_groups:
        for sub in group.sublayers:
            if sub.weights == "none":
                continue
            for layer in range(group.first_layer, group.first_layer + group.layer_count):
                for param in params[(group.layer_class, layer, sub.name)]:
                    tiers = weight_tiers.setdefault(param.canonical, [])
                    if sub.weights not in tiers:  # a tied matrix in two tiers is held twice
                        tiers.append(sub.weights)
                        tier_bytes[sub.weights] += aligned(param.numel * itemsize)
    kv_tiers = []
    for group in spec.layer_groups:
        if group.layer_class == "decoder":
            kv_tiers.extend([group.kv_cache] * group.layer_count)
            tier_bytes[group.kv_cache] += 2 * aligned(kv_window_bytes) * group.layer_count
    tier_bytes["hbm"] += buffers * buffer_bytes
    return Schedule(phases, params, {k: tuple(v) for k, v in weight_tiers.items()}, tuple(kv_tiers), kv_shape,
                    itemsize, buffers, buffer_bytes, tier_bytes)
