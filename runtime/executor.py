"""Schedule → running code: each op bound once to its sublayer module on its device, then one loop per pass.

Binding (at load time, never per token): for every op the executor takes the op's module from a model built on the
`meta` device (liac.models: the attribute names are the plan's sublayer names), deep-copies it, points its
parameters at the tensors the plan placed (an 'hbm' or host arena, or a staging-buffer view when the op streams its
weights), and swaps its projections for the device's kernels (runtime/kernels.py). Ops that share a module, device
and weight source share the bound copy. Each op becomes a closure, built by one small function per op kind
(`STEPS[op.kind]`: embed, qkv, attention fused or score and context apart, the residual projections, up, the LM
head, and the stream unit's wait and release); a pass is

    for step in program: step(frame)

where `frame.vals[value][device]` holds the activations. The moves the schedule computed run at the start of an op,
so tensors cross PCIe only where the plan changes device.

A split op (plan v2: one unit's output features partly on the CPU from DDR, partly on the GPU from staging) binds
two parts, each the unit's module over its rows of the projection (`_part`), and per join device the unit's
epilogue (`_post`); its closure (`_split_step`, with what differs per kind in `SPLIT_KINDS`) launches the GPU part
(CUDA launches return at once), computes the CPU part on the main thread's own OpenMP team meanwhile, and joins the
parts where the schedule says (docs/runtime.md, "Split sublayers"). No second CPU thread: a worker thread with a
team of its own competed with the main thread's for the same cores (/work/shared/hw/split-trace-2026-12-01).

An MoE layer runs its router (`Router.route`: the normalised input, each token's experts and routing weights), then
its experts op (`_experts_step`): the tokens are grouped by expert once per device (`group_by_expert`, the routing
counts read on the host), the GPU's experts are launched first (the routed ones' first copies issued, then the
resident ones from HBM, then the routed streamed ones as their copies land in the expert slots:
`Streamer.routed_experts`), the CPU computes its experts from the host tier on the main thread meanwhile (or, with
`expert_launcher`, the GPU part is launched from a second host thread while the main thread starts the CPU part at
once: `_Launcher`), and the partial sums are added to the residual on each device that reads the result
(liac.models.mixtral's `experts_partial`: HF's math, expert by expert).
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

import torch
from torch import nn

from liac.models import build_model
from liac.models.config import ModelConfig
from liac.models.layers import (padded_causal_mask, padded_positions, ragged_decode_mask, ragged_positions,
                               rope_inv_freq, rope_tables)
from liac.models.mixtral import expert_block_rows, experts_partial, group_by_expert
from liac.runtime.backend import Backend
from liac.runtime.kernels import BlocksLinear, KernelLinear, linear_kernel, prepare_module
from liac.runtime.kvcache import KVCache
from liac.runtime.moe import ExpertShare, ExpertSplit, ExpertTally
from liac.runtime.schedule import MODULE_OF, Move, Op, Schedule, StreamUnit, part_rows
from liac.runtime.staging import Streamer

__all__ = ["Frame", "Segment", "PromptKV", "Executor", "STEPS", "SPLIT_KINDS", "greedy", "SCORE_BLOCK_BYTES",
           "microbatch_parts"]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The default token choice: argmax of logits [B, vocab] → [B, 1]."""
    return logits.argmax(-1, keepdim=True)


class Frame:
    """The state of one forward pass (or of one prefill micro-batch of it): batch, first position (cache slot), query
    length, activations per device, positions and (for left-padded sequences) attention masks per device, how the
    next token is chosen, outputs.

    A micro-batch (`part`) covers sequences row .. row + batch - 1 and prompt slots start .. start + length - 1 of
    a prefill whose prompts are `prompt` slots long; `beside`: its K, V writes to a host cache may run beside the
    compute that follows (a prefill's)."""

    __slots__ = ("batch", "start", "length", "vals", "pos", "mask", "pick", "logits", "row", "prompt", "beside",
                 "_rope", "experts_end")

    def __init__(self, batch: int, start: int, length: int, pick=greedy, row: int = 0, prompt: int | None = None,
                 beside: bool = False):
        self.batch, self.start, self.length = batch, start, length
        self.row, self.prompt, self.beside = row, length if prompt is None else prompt, beside
        self.vals: dict[str, dict[str, torch.Tensor]] = {}
        self.pos: dict[str, torch.Tensor] = {}
        self.mask: dict[str, torch.Tensor | None] = {}  # device → [B, 1, Q, C] bool, None: plain causal
        self.pick = pick  # logits [B, vocab] → token ids [B, 1] on the same device
        self.logits: torch.Tensor | None = None
        self._rope: dict[str, tuple] = {}  # device → (its positions, dtype, rope_tables of them)
        self.experts_end: float | None = None  # host clock at the end of the pass's last experts op (ExpertTally)

    def rope(self, device: str, module: nn.Module, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """At decode (one query token), the RoPE tables (cos, sin) of this frame's positions on `device`, made by the
        pass's first qkv there and shared by every layer after it (all layers rotate by the same positions and
        frequencies): a dozen host launches a layer fewer, where the host's launches are the step's chain. None for
        a module without RoPE, and for a prefill, whose qkv makes its own (the tables of a whole prompt, kept over
        the pass, and q and k rotated at once would add to the activation peak Eq. 14 prices)."""
        inv_freq = getattr(module, "inv_freq", None)
        if inv_freq is None or self.length != 1:
            return None
        positions, cached = self.pos[device], self._rope.get(device)
        if cached is None or cached[0] is not positions or cached[1] != dtype:
            cached = self._rope[device] = (positions, dtype, rope_tables(positions, inv_freq, dtype))
        return cached[2]

    @property
    def chunked(self) -> bool:
        """A chunk of the prompt: its attention also reads the K, V of the chunks before it."""
        return self.length < self.prompt

    def part(self, rows: tuple[int, int], tokens: tuple[int, int]) -> "Frame":
        """The micro-batch of sequences rows[0] .. rows[1] - 1 and prompt slots tokens[0] .. tokens[1] - 1: views
        of this frame's residual stream, positions and masks (its queries against the slots up to its end)."""
        (r0, r1), (t0, t1) = rows, tokens
        sub = Frame(r1 - r0, self.start + t0, t1 - t0, self.pick, r0, self.prompt, self.beside)
        sub.vals["x"] = {dev: x[r0:r1, t0:t1] for dev, x in self.vals["x"].items()}  # [b, c, D]
        sub.pos = {dev: pos[r0:r1, t0:t1] for dev, pos in self.pos.items()}
        sub.mask = {dev: None if mask is None else mask[r0:r1, :, t0:t1, :t1]  # [b, 1, c, end]
                    for dev, mask in self.mask.items()}
        return sub


class Segment(NamedTuple):
    """The ops of one layer (the embedding, one decoder layer, the head) in a phase, in order, with their steps."""

    layer_class: str
    layer: int
    program: list


class PromptKV:
    """Per device, the K and V a prefill's chunked attention reads: the prompt so far of the current layer and row
    block, [B, G, P, E], filled chunk by chunk (activations of the micro-batch: the workspace Eq. 14 counts them),
    so that it never waits for the asynchronous writes into the KV cache."""

    def __init__(self):
        self.buffers: dict[tuple[str, str], torch.Tensor] = {}

    def extend(self, device: str, which: str, frame: Frame, new: torch.Tensor) -> torch.Tensor:
        """Put this chunk's k or v [b, G, c, E] at its positions; return the prompt's so far [b, G, end, E]."""
        b, groups, _, width = new.shape
        buffer = self.buffers.get((device, which))
        if buffer is None or buffer.shape[0] < b or buffer.shape[2] < frame.prompt:
            buffer = self.buffers[(device, which)] = new.new_empty((b, groups, frame.prompt, width))
        end = frame.start + frame.length
        buffer[:b, :, frame.start:end].copy_(new)
        return buffer[:b, :, :end]

    def clear(self) -> None:
        self.buffers.clear()


def _projected(part: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A split part of qkv / out_proj / fc2 / down / lm_head: its norm (if any) and its rows of the projection."""
    norm = getattr(part, "norm", None)
    return part.proj(norm(x) if norm is not None else x)


def _activated(part: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A split part of fc1 / gate_up / lm_head: the whole module over its features (ReLU or silu(g)·u included)."""
    return part(x)


def _assign(module: nn.Module, local: str, tensor: torch.Tensor) -> None:
    *path, name = local.split(".")
    for attr in path:
        module = getattr(module, attr)
    module._parameters[name] = nn.Parameter(tensor, requires_grad=False)  # a view: no copy


class Executor:
    """Runs the passes of a Schedule (see the module docstring)."""

    def __init__(self, backend: Backend, schedule: Schedule, cfg: ModelConfig, dtype: torch.dtype,
                 tensors, kv: KVCache, streamer: Streamer, cpu_linear: str | None = None,
                 expert_share: ExpertShare | None = None, cpu_wake: bool = False, expert_split: bool = False,
                 expert_launcher: bool = False):
        self.backend, self.schedule, self.cfg, self.dtype = backend, schedule, cfg, dtype
        # a split experts op's GPU part launched from a second host thread while this one computes the CPU part
        # (`_Launcher`); None: launched here first (`Engine.from_plan(expert_launcher=False)`)
        self.expert_launcher = _Launcher(backend) if expert_launcher else None
        self.expert_tally = ExpertTally()  # per phase: CPU experts, their bytes and host seconds, experts streamed
        # a decode step's last CPU expert cut by features so that the CPU (with the host's chain) and PCIe finish
        # together (runtime/moe.py ExpertSplit); None: experts whole (`Engine.from_plan(expert_split=False)`)
        self.expert_split = (ExpertSplit(expert_share, self.expert_tally, cfg.ffn_dim)
                             if expert_split and expert_share is not None and expert_share.pcie_seconds else None)
        # Wake the CPU's OpenMP team at the start of an experts op with a CPU part, while the GPU still computes the
        # router (`_CpuTeamWake`); None: off (`Engine.from_plan(cpu_wake=False)`)
        self.cpu_wake = _CpuTeamWake() if cpu_wake else None
        self.cpu_linear = cpu_linear  # the small-M CPU kernel the engine measured (runtime/kernels.py)
        self.expert_share = expert_share  # CPU seconds per expert over PCIe's (ExpertRun.assign); None: as planned
        self.tensors = tensors  # (canonical parameter, tier) → tensor
        self.kv, self.streamer = kv, streamer
        with torch.device("meta"):
            self.templates = build_model(cfg)
        self._bound: dict[tuple, nn.Module] = {}
        self.devices = [d for d in ("cpu", "gpu") if backend.devices[d] is not None]
        positions = schedule.kv_shape[2] + 1
        self.arange = {d: torch.arange(positions, device=backend.devices[d]) for d in self.devices}
        self._part_seconds: list[_PartTiming] | None = None  # profiling: one record per split op
        self.prompt_kv = PromptKV()
        self.programs, self.segments = {}, {}
        self.crossing_outputs = {id(op) for sched in schedule.phases.values() for op in _crossing_outputs(sched.ops)}
        for phase, sched in schedule.phases.items():
            streams = {s.index: s for s in sched.stream_units}
            self._phase = phase  # the phase whose steps `_compile` builds now (an experts step tallies by phase)
            self.programs[phase] = [(op, self._compile(op, streams.get(op.stream_unit))) for op in sched.ops]
            self.segments[phase] = _segments(self.programs[phase])
        self.stream_units = {phase: sched.stream_units for phase, sched in schedule.phases.items()}
        embed = [op for op in schedule.phases["decode"].ops if op.kind == "embed"][0]
        self.decode_embed_device = "cpu" if embed.gather else embed.device  # where decode token ids go
        heads = {phase: [op for op in sched.ops if op.kind == "lm_head"][0] for phase, sched in schedule.phases.items()}
        self.head_device = {phase: op.split.merge_on[0] if op.split else op.device  # where the greedy token is
                            for phase, op in heads.items()}
        del self.templates  # bound copies hold everything they need

    @property
    def expert_ratio(self) -> float | None:
        """The share's current ratio (CPU seconds per expert over PCIe's), None when experts stay as planned."""
        return self.expert_share.current if self.expert_share is not None else None

    # -- binding ------------------------------------------------------------------------------------------------
    def _template(self, op: Op, sublayer: str) -> nn.Module:
        if op.layer_class == "decoder":
            return getattr(self.templates.layers[op.layer], MODULE_OF[sublayer])
        return getattr(self.templates, MODULE_OF[sublayer])

    def _module(self, op: Op, stream_unit: StreamUnit | None) -> nn.Module:
        sublayer = op.sublayers[0]
        params = self.schedule.params[(op.layer_class, op.layer, sublayer)]
        pieces = {piece.param.canonical: piece for piece in stream_unit.weights} if op.streamed else {}
        # A streamed module is tied to where its weights sit in the buffer, which differs between phases.
        source = ("slot", stream_unit.slot, tuple(pieces[p.canonical].offset for p in params)) if op.streamed \
            else ("tier", op.weights)
        compute = "cpu" if op.gather else op.device  # a host-side gather runs the embedding on the host table
        key = (op.layer_class, op.layer, MODULE_OF[sublayer], compute, source)
        if key in self._bound:
            return self._bound[key]
        module = copy.deepcopy(self._template(op, sublayer))
        for param in params:
            if op.streamed:
                tensor = self.streamer.view(stream_unit.slot, pieces[param.canonical].offset, param.shape)
            else:
                tensor = self.tensors(param.canonical, op.weights)
            _assign(module, param.local, tensor)
        device = self.backend.devices[compute]
        if getattr(module, "inv_freq", None) is not None:
            module.inv_freq = rope_inv_freq(self.cfg, device=device)
        module = prepare_module(module.eval(), compute, self.dtype, self.cpu_linear)
        self._bound[key] = module
        return module

    def _part(self, op: Op, stream_unit: StreamUnit | None, device: str) -> nn.Module:
        """The `device` part of a split op: the unit's module over its rows of the projection (norms whole).

        The CPU part reads its rows in place in the weights' host tier (contiguous row ranges of the tensor; two
        ranges for gate_up, gate and up); the GPU part reads its packed rows from the staging buffer. Neither
        copies weights per token."""
        sublayer, split = op.sublayers[0], op.split
        params = self.schedule.params[(op.layer_class, op.layer, sublayer)]
        pieces = {piece.param.canonical: piece for piece in stream_unit.weights} if device == "gpu" else {}
        source = ("slot", stream_unit.slot, tuple(pieces[p.canonical].offset for p in params)) if device == "gpu" \
            else ("tier", op.weights)
        key = (op.layer_class, op.layer, MODULE_OF[sublayer], device, source, "part", split.cpu_features)
        if key in self._bound:
            return self._bound[key]
        module = copy.deepcopy(self._template(op, sublayer))
        blocks: dict[str, list[torch.Tensor]] = {}
        for param in params:
            if device == "gpu":
                piece = pieces[param.canonical]
                parts = [self.streamer.view(stream_unit.slot, piece.offset, piece.shape)]
            else:
                host = self.tensors(param.canonical, op.weights)
                parts = [host[first:first + count]
                         for first, count in part_rows(sublayer, param, "cpu", split.cpu_features, split.features)]
            if param.local.startswith("proj."):
                blocks[param.local] = parts
            else:
                _assign(module, param.local, parts[0])
        weights, biases = blocks["proj.weight"], blocks.get("proj.bias", [None] * len(blocks["proj.weight"]))
        kernel = linear_kernel(device, self.cpu_linear)
        module.proj = KernelLinear(weights[0], biases[0], kernel) if len(weights) == 1 \
            else BlocksLinear(list(zip(weights, biases)), kernel)
        if sublayer == "gate_up":  # silu(gate) · up over this part's features only
            module.ffn_dim = weights[0].shape[0] if len(weights) > 1 else weights[0].shape[0] // 2
        self._bound[key] = module.eval()
        return self._bound[key]

    def _post(self, op: Op, device: str) -> nn.Module | None:
        """What a split op runs on a merge device after joining the parts, as the unit's own module with its norm
        and projection taken out: qkv's heads and RoPE, the residual add of out_proj / fc2 / down. fc1, gate_up
        and the LM head have none (their parts' outputs are already activated / logits)."""
        if op.kind in ("up", "lm_head"):
            return None
        module = copy.deepcopy(self._template(op, op.sublayers[0]))
        module.proj = nn.Identity()
        if hasattr(module, "norm"):
            module.norm = nn.Identity()
        if getattr(module, "inv_freq", None) is not None:
            module.inv_freq = rope_inv_freq(self.cfg, device=self.backend.devices[device])
        return module.eval()

    # -- ops → steps: one small function per op kind (STEPS, below the class) ----------------------------------------
    def _compile(self, op: Op, stream_unit: StreamUnit | None) -> Step:
        if op.split is not None:
            step = _split_step(self, op, stream_unit)
        elif op.kind in STEPS:
            step = STEPS[op.kind](self, op, stream_unit)
        else:
            raise ValueError(f"unknown op kind '{op.kind}'")
        return _dropping(step, op.drops) if op.drops else step

    def close(self) -> None:
        """Drop the bound modules (the engine is closing; they hold views of its arenas)."""
        self._bound.clear()
        self.programs = {}
        if self.expert_launcher is not None:
            self.expert_launcher.close()

    # -- passes -------------------------------------------------------------------------------------------------
    def forward(self, phase: str, ids: torch.Tensor, start: int, timings: dict | None = None, *,
                pad: dict[str, torch.Tensor] | None = None, pick=greedy, first_row: int = 0,
                columns: dict[str, torch.Tensor] | None = None) -> Frame:
        """One pass: `ids` [B, Q] (prefill: host tensor; decode: on the decode embed device) at cache slots
        `start` .. `start` + Q - 1. `pad` (from `padding`): per device, each sequence's leading pad slots [B]; its
        positions then start after them and its attention skips them. `pick` chooses the next token from the
        logits (greedy by default; liac.runtime.sampling). A prefill cut into micro-batches (the plan's
        `spec.execution`) runs layer by layer, each decoder layer over every micro-batch in turn. With `timings`,
        synchronise after every op and add its seconds under (group, sublayers, phase) (a layer's micro-batches
        summed: one entry per layer and pass).

        Continuous batching (runtime/batching.py) places a pass in the KV cache: `first_row`, the cache row of
        sequence 0 (a newcomer's prefill behind the running rows); `columns`, per device each row's own write
        slot [B] for a decode pass over sequences of different lengths (then `start` is the largest, and `pad`
        is required)."""
        frame = self._begin(phase, ids, start, pad, pick, first_row, columns)
        prefill = phase == "prefill"
        parts = self._parts(phase, ids)
        try:
            if len(parts) > 1:
                for segment in self.segments[phase]:
                    if segment.layer_class != "decoder":
                        self._run(segment.program, frame, phase, timings)
                        continue
                    layer_timings: dict | None = {} if timings is not None else None
                    self._microbatched(segment.program, frame, parts, lambda program, sub, skip: self._run(
                        program, sub, phase, timings, skip, layer_timings))
                    for key, seconds in (layer_timings or {}).items():
                        timings.setdefault(key, []).append(seconds)
            elif timings is None:
                for _, step in self.programs[phase]:
                    step(frame)
            else:
                self._run(self.programs[phase], frame, phase, timings)
        finally:
            self.prompt_kv.clear()
        if prefill:
            self.backend.join_stores()  # the cache's writes land before anything reads it (the next pass)
        return frame

    def _run(self, program, frame: Frame, phase: str, timings: dict | None, skip: tuple[str, ...] = (),
             into: dict | None = None) -> None:
        """Run `program`'s steps on `frame`, but ops of a kind in `skip`. With `timings`, time each op (each call its
        own entry, or added up per key in `into`)."""
        if timings is None:
            for op, step in program:
                if op.kind not in skip:
                    step(frame)
            return
        sync = self.backend.synchronize
        for op, step in program:
            if op.kind in skip:
                continue
            sync()
            begin = time.perf_counter()
            if op.split is not None or op.device == "split":  # a split unit, or experts on both devices
                self._part_seconds = []
            step(frame)
            sync()
            key = (op.group, op.sublayers, phase, op.device) if op.sublayers else (op.group, (op.kind,), phase, "gpu")
            entries = [(key, time.perf_counter() - begin)]
            if self._part_seconds is not None:
                (part,) = self._part_seconds
                self._part_seconds = None
                # CUDA: the GPU part's own time from events; emulated: it ran synchronously in the launch
                gpu_seconds = part.start.elapsed_time(part.end) / 1e3 if self.backend.name == "cuda" else part.launched
                entries += [(key[:3] + ("split:cpu",), part.cpu_seconds), (key[:3] + ("split:gpu",), gpu_seconds)]
                if part.route is not None:  # an experts op: the routing read on the host, before either part
                    entries.append((key[:3] + ("split:route",), part.route))
            for name, seconds in entries:
                if into is None:
                    timings.setdefault(name, []).append(seconds)
                else:
                    into[name] = into.get(name, 0.0) + seconds

    @staticmethod
    def _microbatched(program: list, frame: Frame, parts, run) -> None:
        """One decoder layer's `program` over every micro-batch of the prefill (docs/runtime.md, "Prefill
        micro-batches"), each through `run(program, sub_frame, kinds_to_skip)`: its staging buffer is waited for
        before the first and released after the last; each micro-batch's new residual stream is written back into
        the batch's (in place where it stays on its device: the slice it overwrites has been read)."""
        carried = frame.vals["x"]
        out: dict[str, torch.Tensor] = {}
        last = len(parts) - 1
        for index, (rows, tokens) in enumerate(parts):
            sub = frame.part(rows, tokens)
            skip = ("release",) if index < last else ()
            run(program, sub, skip + (("wait",) if index else ()))
            for dev, x in sub.vals["x"].items():
                if dev not in out:
                    out[dev] = carried[dev] if dev in carried else x.new_empty(carried[next(iter(carried))].shape)
                out[dev][rows[0]:rows[1], tokens[0]:tokens[1]].copy_(x)
        frame.vals["x"] = out

    def padding(self, pad: torch.Tensor | None) -> dict[str, torch.Tensor] | None:
        """Each sequence's leading pad slots [B] (host) on every device, for `forward`; None when none has any."""
        if pad is None or not bool(pad.any()):
            return None
        return {d: pad.to(self.backend.devices[d]) for d in self.devices}

    def warm_up(self, batch: int, prompt_len: int) -> int:
        """One prefill pass of `batch` × `prompt_len` tokens and one decode step through the first layer of every
        layer group, the embedding and the LM head: each distinct placement runs once at the request's shapes, so
        the first request finds the libraries' handles, the kernels they chose, their first allocations and the
        pinned host blocks of its crossings already made. The layers' KV caches keep what it wrote (attention
        reads only positions a request wrote). Returns the number of decoder layers it ran."""
        firsts, decoder_groups = {}, set()
        for op, _ in self.programs["prefill"]:
            firsts.setdefault(op.group, op.layer)
            if op.layer_class == "decoder":
                decoder_groups.add(op.group)
        ids = torch.zeros(batch, prompt_len, dtype=torch.long)
        frame = self._forward_alone("prefill", ids, 0, firsts)
        feed = self.decode_embed_device
        self._forward_alone("decode", frame.vals["next"][feed], prompt_len, firsts)
        self.backend.synchronize()
        return len(decoder_groups)

    def _forward_alone(self, phase: str, ids: torch.Tensor, start: int, firsts: dict[str, int]) -> Frame:
        """A pass over only the ops of the layers in `firsts` (group → its first layer); each of their stream units
        is copied when its layer is reached, nothing ahead (Streamer.begin_alone). Before each op, its inputs are
        copied to the devices a whole pass would hold them on (`Op.inputs_at`): a split op joins where the next layer
        reads its output, so the layers skipped here may have left a value where the ones run did not (a group's last
        layer on both devices for a split LM head, its first on the GPU alone for the next layer)."""
        batch, length = ids.shape
        frame = Frame(batch, start, length)
        frame.vals["ids"] = {"cpu" if phase == "prefill" else self.decode_embed_device: ids}
        for d in self.devices:
            frame.pos[d] = self.arange[d][start:start + length].expand(batch, length)
            frame.mask[d] = None
        streamer, transfer = self.streamer, self.backend.transfer
        streamer.begin_alone(self.stream_units[phase], batch, start)

        def run(program, sub: Frame, skip: tuple[str, ...] = ()) -> None:
            for op, step in program:
                if firsts.get(op.group) != op.layer or op.kind in skip:
                    continue
                if op.kind == "wait":
                    streamer.issue(op.stream_unit)
                    streamer.wait(op.stream_unit)
                elif op.kind == "release":
                    streamer.release(op.stream_unit)
                else:
                    _bring(transfer, sub.vals, op.inputs_at)
                    step(sub)

        # A prefill runs its decoder layers over the plan's micro-batches, as `forward` does: the workspace the
        # budget reserves is one micro-batch's (docs/cost-model.md Eq. 14).
        parts = microbatch_parts(batch, length, self.schedule.prefill_microbatch) if phase == "prefill" else [None]
        try:
            self._each_segment(phase, frame, parts, run)
        finally:
            self.prompt_kv.clear()
        return frame

    def _each_segment(self, phase: str, frame: Frame, parts: list, run, stop=lambda: False) -> None:
        """`run(program, frame)` over every segment of `phase` until `stop()`, a prefill's decoder layers over its
        micro-batches (`parts`)."""
        for segment in self.segments[phase]:
            if stop():
                break
            if len(parts) > 1 and segment.layer_class == "decoder":
                self._microbatched(segment.program, frame, parts, run)
            else:
                run(segment.program, frame)

    def _begin(self, phase: str, ids: torch.Tensor, start: int, pad: dict[str, torch.Tensor] | None,
               pick, first_row: int = 0, columns: dict[str, torch.Tensor] | None = None) -> Frame:
        batch, length = ids.shape
        frame = Frame(batch, start, length, pick, beside=phase == "prefill")
        frame.vals["ids"] = {"cpu" if phase == "prefill" else self.decode_embed_device: ids}
        for d in self.devices:
            if columns is not None:
                frame.pos[d] = ragged_positions(pad[d], columns[d])
                frame.mask[d] = ragged_decode_mask(pad[d], columns[d], start + 1, self.arange[d])
            elif pad is None:
                frame.pos[d] = self.arange[d][start:start + length].expand(batch, length)
                frame.mask[d] = None
            else:
                frame.pos[d] = padded_positions(pad[d], start, length, self.arange[d])
                frame.mask[d] = padded_causal_mask(pad[d], start, length, self.arange[d])
        self.kv.set_cursor(first_row, columns)
        self.streamer.start(self.stream_units[phase], batch, start)
        return frame

    def _parts(self, phase: str, ids: torch.Tensor) -> list:
        """The micro-batches a pass runs its decoder layers over (`microbatch_parts`; one for decode)."""
        if phase != "prefill":
            return [None]
        return microbatch_parts(ids.shape[0], ids.shape[1], self.schedule.prefill_microbatch)

    def first_nonfinite(self, phase: str, ids: torch.Tensor, start: int, *,
                        pad: dict[str, torch.Tensor] | None = None, pick=greedy) -> Op | None:
        """Re-run one pass op by op and return the first op that produced a non-finite value (None if none did).

        The diagnosis behind `Engine.generate`'s non-finite-logits error: it synchronises after every op, so it
        runs only after the cheap check at the logits has fired, never in the generation loop. Re-running a pass
        rewrites the same KV-cache positions with the same values; a prefill runs over the plan's micro-batches,
        as `forward` does. (Pad slots never yield NaN: a pad query attends at least to itself,
        liac.models.layers.padded_causal_mask.)"""
        frame = self._begin(phase, ids, start, pad, pick)
        parts = self._parts(phase, ids)
        found: list[Op] = []

        def run(program, sub: Frame, skip: tuple[str, ...] = ()) -> None:
            for op, step in program:
                if found:
                    return
                if op.kind in skip:
                    continue
                before = {value: dict(per_device) for value, per_device in sub.vals.items()}
                step(sub)
                for value, per_device in sub.vals.items():
                    for device, tensor in per_device.items():
                        if before.get(value, {}).get(device) is tensor or not tensor.is_floating_point():
                            continue
                        if not bool(torch.isfinite(tensor).all()):
                            found.append(op)
                            return
                if op.kind == "lm_head" and sub.logits is not None and not bool(torch.isfinite(sub.logits).all()):
                    found.append(op)
                    return

        try:
            self._each_segment(phase, frame, parts, run, stop=lambda: bool(found))
        finally:
            self.prompt_kv.clear()
            if phase == "prefill":
                self.backend.join_stores()
        return found[0] if found else None

    def prime_decode(self, batch: int, start: int) -> None:
        """Start copying the next decode pass's first streaming units now (overlaps the tail of this pass)."""
        self.streamer.prime(self.stream_units["decode"], batch, start)


def microbatch_parts(batch: int, length: int, microbatch: tuple[int, int]) -> list:
    """((first, end) sequences, (first, end) prompt tokens) of each prefill micro-batch, in execution order: row
    blocks of `microbatch[0]` sequences, each over prompt chunks of `microbatch[1]` tokens in order (a chunk attends
    to the ones before it). A request smaller than the plan's workload is cut the same way."""
    rows = min(microbatch[0], batch) if microbatch[0] else batch
    tokens = min(microbatch[1], length) if microbatch[1] else length
    return [((r, min(r + rows, batch)), (t, min(t + tokens, length)))
            for r in range(0, batch, rows) for t in range(0, length, tokens)]


def _segments(program: list) -> list[Segment]:
    """A phase's program cut into its layers' ops (the wait and release ops belong to their layer)."""
    out: list[Segment] = []
    for op, step in program:
        if not out or (out[-1].layer_class, out[-1].layer) != (op.layer_class, op.layer):
            out.append(Segment(op.layer_class, op.layer, []))
        out[-1].program.append((op, step))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Steps: for each op kind, a function (executor, op, its stream unit) → the closure the pass loop calls. Each
# closure first runs the op's moves (the activations it reads that sit on the other device), then computes.

Step = Callable[[Frame], None]


def _dropping(step: Step, drops: tuple[str, ...]) -> Step:
    """`step`, then free the values no later op of the pass reads (the schedule's liveness, `Op.drops`)."""
    def run(frame: Frame) -> None:
        step(frame)
        vals = frame.vals
        for value in drops:
            vals.pop(value, None)
    return run


def _moves_before(op: Op) -> tuple[Move, ...]:
    return tuple(m for m in op.moves if m.value != "next")


def _moves_after(op: Op) -> tuple[Move, ...]:
    """The greedy token's move to the next step's embedding device (the LM head's only)."""
    return tuple(m for m in op.moves if m.value == "next")


def _run_moves(transfer, vals: dict, moves: tuple[Move, ...]) -> None:
    for move in moves:
        vals[move.value][move.dst] = transfer(vals[move.value][move.src], move.dst, move.value)


def _run_moves_together(backend, vals: dict, moves: tuple[Move, ...]) -> None:
    """`_run_moves`, with every move to the host made at once (`Backend.transfer_many`: one wait for all)."""
    to_host = [m for m in moves if m.dst == "cpu"]
    if len(to_host) < 2:
        _run_moves(backend.transfer, vals, moves)
        return
    _run_moves(backend.transfer, vals, tuple(m for m in moves if m.dst != "cpu"))
    copies = backend.transfer_many([vals[m.value][m.src] for m in to_host], "cpu", [m.value for m in to_host])
    for move, copy in zip(to_host, copies):
        vals[move.value]["cpu"] = copy


def _bring(transfer, vals: dict, inputs_at: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
    """Copy each value to the devices in `inputs_at` that lack it (from a device that has it): where a pass over every
    layer holds it before the op (a pass over some layers only, `Executor._forward_alone`)."""
    for value, devices in inputs_at:
        have = vals[value]
        for device in devices:
            if device not in have:
                have[device] = transfer(next(iter(have.values())), device, value)


def _kv_reader(ex: Executor, op: Op, stream_unit: StreamUnit | None, which: str) -> Callable[[Frame], torch.Tensor]:
    """Attention's K or V ('k' | 'v') [B, G, C, E] by the schedule's read mode: this step's (prefill), the host cache
    the GPU's qkv just wrote them to (prefill: once those writes have landed), the cache in place, or the cache's
    window in the staging buffer with this step's K or V written into it."""
    dev, layer, kv = op.device, op.layer, ex.kv
    if op.kv_read == "fresh":  # a prefill: this step's K, V; a chunk of the prompt, with those of the chunks before
        prompt_kv = ex.prompt_kv
        return lambda frame: (prompt_kv.extend(dev, which, frame, frame.vals[which][dev]) if frame.chunked
                              else frame.vals[which][dev])
    if op.kv_read == "stored":  # a prefill: this step's K, V (and earlier chunks') where the GPU wrote them
        landed = ex.backend.wait_stores
        return lambda frame: (landed(), kv.written(layer, which, frame.row, frame.batch, frame.start + frame.length))[1]
    if op.kv_read == "cache":
        return lambda frame: kv.view(layer, which, frame.batch, frame.start + frame.length)
    window = ex.streamer.window(stream_unit, which)
    return lambda frame: kv.write_window(window, frame.vals[which][dev], frame.start)


def _wait_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    streamer = ex.streamer
    return lambda frame: streamer.wait(op.stream_unit)


def _release_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    streamer = ex.streamer
    return lambda frame: streamer.release(op.stream_unit)


def _embed_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    module, pre, transfer, dev = ex._module(op, stream_unit), _moves_before(op), ex.backend.transfer, op.device
    if op.gather:
        transfers = ex.backend.transfers

        def gather(frame: Frame) -> None:
            _run_moves(transfer, frame.vals, pre)
            rows = module(frame.vals["ids"]["cpu"], frame.pos["cpu"])  # [B, Q, D] gathered from the host table
            transfers.streamed_bytes += rows.numel() * rows.element_size()
            frame.vals["x"] = {"gpu": transfer(rows, "gpu", "embed")}
        return gather

    def step(frame: Frame) -> None:
        _run_moves(transfer, frame.vals, pre)
        frame.vals["x"] = {dev: module(frame.vals["ids"][dev], frame.pos[dev])}
    return step


def _qkv_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    module, pre, transfer, kv = ex._module(op, stream_unit), _moves_before(op), ex.backend.transfer, ex.kv
    dev, layer, crosses = op.device, op.layer, op.kv_write_crosses

    def step(frame: Frame) -> None:
        vals = frame.vals
        _run_moves(transfer, vals, pre)
        x = vals["x"][dev]
        q, k, v = module(x, frame.pos[dev], frame.rope(dev, module, x.dtype))  # [B, H, Q, E], [B, G, Q, E] ×2
        vals["q"], vals["k"], vals["v"] = {dev: q}, {dev: k}, {dev: v}
        kv.write(layer, k, v, frame.start, crosses, frame.row, frame.beside)
    return step


def _crossing_outputs(ops: list[Op]) -> list[Op]:
    """The CPU attention ops ('attn', 'context') of a phase whose output 'o' crosses to the GPU next."""
    out, producer = [], None
    for op in ops:
        if producer is not None and any(m.value == "o" and m.src == "cpu" and m.dst == "gpu" for m in op.moves):
            out.append(producer)
        if op.kind in ("attn", "context"):
            producer = op if op.device == "cpu" else None
    return out


def _output_buffer(ex: Executor, op: Op) -> Callable[[torch.Tensor], torch.Tensor | None]:
    """For a CPU attention op whose output crosses to the GPU: its input q or p [B, H, Q, ·] → a [B, Q, H·E] host
    buffer, page-locked where the backend pins, that the op writes its output into, so the crossing copies it as it
    is (not a pageable copy first staged into page-locked memory by one more host copy). Else None (the module
    allocates its output)."""
    if id(op) not in ex.crossing_outputs:
        return lambda x: None
    host_empty, width = ex.backend.host_empty, ex.cfg.num_heads * ex.cfg.head_dim
    return lambda x: host_empty((x.shape[0], x.shape[2], width), x.dtype)


def _attention_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    """Score and context fused (SDPA) on one device."""
    module, pre, transfer, dev = ex._module(op, stream_unit), _moves_before(op), ex.backend.transfer, op.device
    keys, values = _kv_reader(ex, op, stream_unit, "k"), _kv_reader(ex, op, stream_unit, "v")
    buffer = _output_buffer(ex, op)

    def step(frame: Frame) -> None:
        vals = frame.vals
        _run_moves(transfer, vals, pre)
        q = vals["q"][dev]
        vals["o"] = {dev: module(q, keys(frame), values(frame), frame.mask[dev], out=buffer(q))}
    return step


def _over_cpu_cache(op: Op) -> bool:
    """Score and context apart on the CPU over the cache: batched matmuls over a strided slice of the cache run ~5x
    slower than over its whole (contiguous) capacity, which score cuts and context zero-weights."""
    return op.device == "cpu" and op.kv_read == "cache"


SCORE_BLOCK_BYTES = 64 * 2**20  # the fp32 scores of one block of query rows (attention run apart, in prefill)


def _score_in_blocks(module: nn.Module, q: torch.Tensor, keys: torch.Tensor, context: int,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """The unit's own `score` (q·Kᵀ, mask, softmax) over blocks of query rows, written into one [B, H, Q, C] output:
    the whole probabilities (which cross to the context's device) and one block's fp32 temporaries are all it
    holds, where one call would hold the scores three times over (bf16 product, fp32 softmax, its bf16 copy): the
    memory the cost model counts for it (Eq. 14). Query row i sees keys up to C − Q + i (a padding `mask`
    [B, 1, Q, C] only takes more away), so the block of rows [r0, r1) is the unit's score at context C − Q + r1
    with its rows of the mask, its columns beyond that zero: the same probabilities."""
    B, H, Q, E = q.shape
    rows = max(1, SCORE_BLOCK_BYTES // max(1, B * H * context * 4))
    if Q <= rows:
        return module.score(q, keys, context, mask)
    p = torch.zeros(B, H, Q, context, dtype=q.dtype, device=q.device)
    for first in range(0, Q, rows):
        last = min(Q, first + rows)
        seen = context - Q + last
        block = None if mask is None else mask[:, :, first:last, :seen]
        p[:, :, first:last, :seen] = module.score(q[:, :, first:last], keys, seen, block)
    return p


def _score_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    module, pre, transfer, dev = ex._module(op, stream_unit), _moves_before(op), ex.backend.transfer, op.device
    if _over_cpu_cache(op):
        kv, layer = ex.kv, op.layer

        def over_capacity(frame: Frame) -> None:
            _run_moves(transfer, frame.vals, pre)
            keys = kv.capacity(layer, "k", frame.batch)
            frame.vals["p"] = {dev: _score_in_blocks(module, frame.vals["q"][dev], keys, frame.start + frame.length,
                                                     frame.mask[dev])}
        return over_capacity
    keys = _kv_reader(ex, op, stream_unit, "k")

    def step(frame: Frame) -> None:
        _run_moves(transfer, frame.vals, pre)
        k = keys(frame)
        frame.vals["p"] = {dev: _score_in_blocks(module, frame.vals["q"][dev], k, k.shape[2], frame.mask[dev])}
    return step


def _context_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    module, pre, transfer, dev = ex._module(op, stream_unit), _moves_before(op), ex.backend.transfer, op.device
    buffer = _output_buffer(ex, op)
    if _over_cpu_cache(op):
        kv, layer = ex.kv, op.layer

        def over_capacity(frame: Frame) -> None:
            _run_moves(transfer, frame.vals, pre)
            p = frame.vals["p"][dev]
            frame.vals["o"] = {dev: module.context(p, kv.capacity(layer, "v", frame.batch), out=buffer(p))}
        return over_capacity
    values = _kv_reader(ex, op, stream_unit, "v")

    def step(frame: Frame) -> None:
        _run_moves(transfer, frame.vals, pre)
        p = frame.vals["p"][dev]
        frame.vals["o"] = {dev: module.context(p, values(frame), out=buffer(p))}
    return step


def _residual_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    """out_proj (reads the attention output 'o') and down (the FFN hidden 'h'): projection plus the residual."""
    module, pre, transfer, dev = ex._module(op, stream_unit), _moves_before(op), ex.backend.transfer, op.device
    source = "o" if op.kind == "out_proj" else "h"

    def step(frame: Frame) -> None:
        vals = frame.vals
        _run_moves(transfer, vals, pre)
        vals["x"] = {dev: module(vals[source][dev], vals["x"][dev])}
    return step


def _up_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    module, pre, transfer, dev = ex._module(op, stream_unit), _moves_before(op), ex.backend.transfer, op.device

    def step(frame: Frame) -> None:
        _run_moves(transfer, frame.vals, pre)
        frame.vals["h"] = {dev: module(frame.vals["x"][dev])}
    return step


def _lm_head_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    module, transfer, dev = ex._module(op, stream_unit), ex.backend.transfer, op.device
    pre, post = _moves_before(op), _moves_after(op)

    def step(frame: Frame) -> None:
        vals = frame.vals
        _run_moves(transfer, vals, pre)
        logits = module(vals["x"][dev][:, -1:])[:, -1]  # only the last position picks the next token
        frame.logits = logits                            # [B, vocab]
        vals["next"] = {dev: frame.pick(logits)}               # [B, 1]
        _run_moves(transfer, vals, post)
    return step


def _router_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    """An MoE router: the FFN's normalised input 'h', each token's experts 'ei' [B, Q, k] and weights 'ew'."""
    module, pre, transfer, dev = ex._module(op, stream_unit), _moves_before(op), ex.backend.transfer, op.device

    def step(frame: Frame) -> None:
        vals = frame.vals
        _run_moves(transfer, vals, pre)
        h, index, weights = module.route(vals["x"][dev])
        vals["h"], vals["ei"], vals["ew"] = {dev: h}, {dev: index}, {dev: weights}
    return step


def _experts_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    """An MoE experts op (`ExpertRun`): experts [0, hbm) on the GPU from HBM, the next `cpu` on the CPU from the host
    tier (on the main thread, after the GPU's experts are launched), the rest on the GPU from the expert slots, only
    the routed ones copied; the devices' partial sums are added to the residual on each merge device."""
    run, pre, transfer = op.experts, _moves_before(op), ex.backend.transfer
    names = [p.canonical for p in ex.schedule.params[(op.layer_class, op.layer, "experts")]]  # gate_up, down
    resident = [ex.tensors(name, "hbm") for name in names] if run.hbm else []
    host = [ex.tensors(name, op.weights) for name in names] if run.hbm < run.num_experts else []
    kernels = {device: linear_kernel(device, ex.cpu_linear) for device in ("cpu", "gpu")}
    streamer = ex.streamer

    def host_expert(expert: int, cut: tuple[int, int] | None = None, device: str = "cpu") -> list:
        """Its host matrices [gate_up, down] (the host copy's row 0 is expert `hbm`); for the expert `cut`
        (expert, c) cuts by features (ExpertSplit), `device`'s share: the CPU's features [0, c), the GPU's [c, F),
        as (gate rows, up rows) and down's columns."""
        gate_up, down = (t[expert - run.hbm] for t in host)
        if cut is None or cut[0] != expert:
            return [gate_up, down]
        F, c = down.shape[1], cut[1]
        first, last = (0, c) if device == "cpu" else (c, F)
        return [(gate_up[first:last], gate_up[F + first:F + last]), down[:, first:last]]

    def gpu_experts(routed: list[int], cut: tuple[int, int] | None):
        # the routed experts' first copies are issued before the resident experts' launches: DDR and PCIe serve
        # them while the host launches, and the CPU part, after both, has fewer copy bytes beside its reads
        staged = streamer.routed_experts(stream_unit, routed, lambda e: host_expert(e, cut, "gpu")) if routed else ()
        for expert in range(run.hbm):
            yield expert, resident[0][expert], resident[1][expert]
        for expert, (gate_up, down) in staged:
            yield expert, gate_up, down

    def part(device: str, vals: dict, counts: list[int], routed: list[int],
             cut: tuple[int, int] | None = None) -> torch.Tensor:
        """`routed`: this step's host experts of `device` (ExpertRun.assign), the GPU's resident ones besides;
        `cut`: (expert, c), an expert both devices compute, each its share of the features (ExpertSplit)."""
        h, index = vals["h"][device], vals["ei"][device]
        routing = group_by_expert(index, vals["ew"][device], counts)
        flat = h.reshape(-1, h.shape[-1])
        if device == "gpu":  # an expert's intermediates within what the plan's workspace prices (Eq. 14)
            block = expert_block_rows(flat.shape[0], index.shape[-1], run.num_experts)
            return experts_partial(flat, routing, gpu_experts(routed, cut), kernels[device], block)
        return experts_partial(flat, routing, ((e, *host_expert(e, cut)) for e in routed), kernels[device])

    devices = sorted(run.devices(), key=("gpu", "cpu").index)  # GPU launches return at once: the CPU works meanwhile
    backend, tally, phase, launcher = ex.backend, ex.expert_tally, ex._phase, ex.expert_launcher
    expert_bytes = sum(t[0].numel() * t.element_size() for t in host) if host else 0  # one host expert's weights
    wake = ex.cpu_wake if run.cpu else None
    # a decode step's CPU expert cut by features between the CPU and PCIe (runtime/moe.py ExpertSplit), in a layer
    # whose host experts can go either way
    may_cut = bool(run.cpu and run.streamed and phase == "decode")

    def step(frame: Frame) -> None:
        vals = frame.vals
        timed = ex._part_seconds if len(devices) == 2 else None  # a list only in a split op's profiling pass
        if wake is not None:
            wake()  # the CPU's team wakes while the GPU computes the router, not in the CPU part's first GEMV
        began = entered = time.perf_counter()
        previous, frame.experts_end = frame.experts_end, None
        _run_moves_together(backend, vals, pre)  # the routing read on the host: one wait for h, ei and ew
        index = vals["ei"].get("cpu", vals["ei"].get("gpu"))
        counts = torch.bincount(index.reshape(-1), minlength=run.num_experts).tolist()  # the routing, on the host
        share = ex.expert_share if run.cpu and run.streamed else None
        on = dict(zip(("cpu", "gpu"), run.assign(counts, share.ratio() if share is not None else None)))
        if share is not None and on["gpu"] and not on["cpu"]:
            share.idle()  # every routed host expert went over PCIe: nothing measures the CPU
        cut, cpu_share = None, float(len(on["cpu"]))  # cpu_share: the CPU's experts, a cut one by its features' share
        splitter = ex.expert_split if may_cut else None
        if splitter is not None and on["cpu"]:
            features = splitter.features(len(on["cpu"]), len(on["gpu"]), expert_bytes)
            if features is not None:
                cut = (on["cpu"][-1], features)
                on["gpu"] = sorted(on["gpu"] + [cut[0]])
                cpu_share += features / splitter.ffn_dim - 1
        partial, cpu_seconds, host = {}, 0.0, None
        if timed is None:
            # the host thread's seconds around the CPU part (ExpertTally 'host'): only the split's host clock is read
            host = {"route": time.perf_counter() - entered, "dispatch": 0.0,
                    "between": entered - previous if previous is not None else None}
            # a device none of whose experts is routed this step adds nothing: no part, no zeros to merge (at batch 1
            # with the share, one device in a quarter of the steps of a layer with 5 CPU and 2 streamed experts)
            busy = [d for d in devices if on[d] or (d == "gpu" and any(counts[:run.hbm]))] or devices[:1]
            launched = None
            if launcher is not None and len(busy) == 2:
                # the GPU part's launches on the launcher thread, beside the CPU part here; joined before the merge
                began = time.perf_counter()
                launched = launcher.submit(part, "gpu", vals, counts, on["gpu"], cut)
                host["dispatch"] = time.perf_counter() - began
                busy = ["cpu"]
            for device in busy:
                if device == "cpu":
                    began = time.perf_counter()
                    partial[device] = part(device, vals, counts, on[device], cut)
                    cpu_seconds = time.perf_counter() - began
                    host["cpu_end"] = began + cpu_seconds
                    if share is not None:  # the CPU part's host seconds: the share follows the CPU's rate
                        share.observe(cpu_seconds, cpu_share)
                else:
                    began = time.perf_counter()
                    partial[device] = part(device, vals, counts, on[device], cut)
                    host["dispatch"] = time.perf_counter() - began
            if launched is not None:
                partial["gpu"] = launched.result()  # the launches done (not the GPU's work): the merge waits here
        else:  # the profiling pass: the routing's host time, the GPU part's events, the CPU part's time
            routed = time.perf_counter() - began
            start = backend.timing_event()
            start.record()
            began = time.perf_counter()
            partial["gpu"] = part("gpu", vals, counts, on["gpu"], cut)
            end = backend.timing_event()
            end.record()
            launched = time.perf_counter() - began
            began = time.perf_counter()
            partial["cpu"] = part("cpu", vals, counts, on["cpu"], cut)
            cpu_seconds = time.perf_counter() - began
            if share is not None:
                share.observe(cpu_seconds, cpu_share)
            timed.append(_PartTiming(cpu_seconds, start, end, launched, routed))
        out = {}
        for position, device in enumerate(run.merge_on):
            # the partial sums meet here, then the residual (HF: residual + experts' sum). A partial no later merge
            # device reads takes the others' in place (one copy at a time beside it: what Eq. 14 prices).
            total = partial.get(device)
            if total is not None and position < len(run.merge_on) - 1:  # a later merge device still reads it
                total = total.clone()
            for source in [s for s in partial if s != device]:
                values = transfer(partial[source], device, "merge")
                total = values if total is None else total.add_(values)
                del values
            residual = vals["x"][device]
            out[device] = residual + total.view_as(residual)
            del total
        partial.clear()
        vals["x"] = out
        ended = time.perf_counter()
        if host is not None and "cpu_end" in host:
            host["merge"] = ended - host["cpu_end"]
        if "cpu" in devices:  # a cut expert counts on both devices, its bytes by the CPU's share of its features
            tally.add(phase, len(on["cpu"]), round(cpu_share * expert_bytes), cpu_seconds,
                      len(on["gpu"]) if "gpu" in devices else 0, host, cut is not None)
        frame.experts_end = ended  # the next experts op of this pass times the host's work between them
    return step


class _Launcher:
    """A second host thread that launches a split experts op's GPU part while the main thread computes its CPU
    part (`Engine.from_plan(expert_launcher=True)`).

    At decode the GPU part's launches (a dozen torch calls per routed or resident expert, the routed copies'
    issues) take the one host thread 0.5-2 ms per layer on the H200 before the CPU part may start, and the CPU part
    binds there (docs/benchmarks.md, the Mixtral calls: 'dispatch'). Here the main thread hands them over and starts
    the CPU part at once; the merge waits for the launches (`result`), not for the GPU. The launcher only enqueues
    CUDA work, so it never opens an OpenMP team of its own beside the main thread's (two teams on the same cores
    slowed a split's CPU GEMMs: /work/shared/hw/split-trace-2026-12-01); it runs in the submitting thread's
    current stream and grad / inference mode (both are per thread). The torch calls release the GIL while they run,
    as do the CPU part's GEMMs. Same ops in the same order on the compute stream: the same values."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="liac-gpu-launch")

    def submit(self, fn: Callable, *args):
        stream, inference, grad = (self.backend.compute_stream(), torch.is_inference_mode_enabled(),
                                   torch.is_grad_enabled())

        def launch():
            with self.backend.on_stream(stream), torch.inference_mode(inference), torch.set_grad_enabled(grad):
                return fn(*args)
        return self.pool.submit(launch)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class _CpuTeamWake:
    """Wakes the CPU's intra-op (OpenMP) team: one parallel fill of a small buffer, a chunk per thread.

    At batch 1 an experts op's CPU part (two GEMVs, ~10 ms) follows the layer's attention and router on the GPU, a
    few ms in which the team's threads may fall asleep; a GEMV's parallel region then starts only once every thread
    is scheduled again, and it ends with its slowest thread. The experts step calls this first, while the GPU still
    computes the router that the routing read waits for, so the wake-up overlaps GPU time (~10 µs when the threads
    are awake). Sized by the thread count at the first call (torch's grain: 32768 elements per chunk)."""

    GRAIN = 32768  # at::internal::GRAIN_SIZE: a parallel op gives each thread at least this many elements

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def __call__(self) -> None:
        threads = torch.get_num_threads()
        if threads < 2:
            return
        if self.buffer is None or self.buffer.numel() != threads * self.GRAIN:
            self.buffer = torch.empty(threads * self.GRAIN, dtype=torch.float32)
        self.buffer.zero_()


STEPS: dict[str, Callable[[Executor, Op, StreamUnit | None], Step]] = {
    "wait": _wait_step, "release": _release_step, "embed": _embed_step, "qkv": _qkv_step, "attn": _attention_step,
    "score": _score_step, "context": _context_step, "out_proj": _residual_step, "up": _up_step,
    "down": _residual_step, "lm_head": _lm_head_step, "router": _router_step, "experts": _experts_step,
}


# ---------------------------------------------------------------------------------------------------------------
# Split ops: the GPU part launched, the CPU part computed on the main thread meanwhile, then on each merge device the parts
# joined (the other device's part crosses PCIe) and the unit's epilogue run.


def _join_qkv(post: nn.Module, merged: torch.Tensor, frame: Frame, device: str, out: dict) -> None:
    for value, tensor in zip("qkv", post(merged, frame.pos[device], frame.rope(device, post, merged.dtype))):
        out.setdefault(value, {})[device] = tensor


def _join_residual(post: nn.Module, merged: torch.Tensor, frame: Frame, device: str, out: dict) -> None:
    out.setdefault("x", {})[device] = post(merged, frame.vals["x"][device])


def _join_up(post: None, merged: torch.Tensor, frame: Frame, device: str, out: dict) -> None:
    out.setdefault("h", {})[device] = merged  # the parts are already activated


def _join_head(post: None, merged: torch.Tensor, frame: Frame, device: str, out: dict) -> None:
    logits = merged[:, -1]
    frame.logits = logits
    out.setdefault("next", {})[device] = frame.pick(logits)


class _SplitKind(NamedTuple):
    """How one kind of split op runs: the value its parts read, how a part computes, how the parts join."""

    source: str
    part: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    join: Callable[..., None]


SPLIT_KINDS: dict[str, _SplitKind] = {
    "qkv": _SplitKind("x", _projected, _join_qkv), "out_proj": _SplitKind("o", _projected, _join_residual),
    "up": _SplitKind("x", _activated, _join_up), "down": _SplitKind("h", _projected, _join_residual),
    "lm_head": _SplitKind("x", _activated, _join_head),
}


class _PartTiming(NamedTuple):
    """The profiling pass's record of one split op: the CPU part's seconds, the GPU part's events, and the seconds
    its launch took on the main thread."""

    cpu_seconds: float
    start: object
    end: object
    launched: float
    route: float | None = None  # an experts op: the seconds its routing took on the host (moves, counts)


def _split_step(ex: Executor, op: Op, stream_unit: StreamUnit | None) -> Step:
    """Launch the GPU part (asynchronous on CUDA: it waits on the compute stream for its staging copy, which the
    'wait' op before it queued), compute the CPU part on this thread's OpenMP team while the GPU runs its part, then
    join: the parts meet on each merge device, the other device's part crossing PCIe (a copy to the host waits for
    the GPU part; one to the GPU is queued behind it)."""
    kind, layer, split = SPLIT_KINDS[op.kind], op.layer, op.split
    cpu_part, gpu_part = ex._part(op, stream_unit, "cpu"), ex._part(op, stream_unit, "gpu")
    posts = {device: ex._post(op, device) for device in split.merge_on}
    pre, transfer, kv, backend = _moves_before(op), ex.backend.transfer, ex.kv, ex.backend
    merge_on, writer, crosses, last_only = split.merge_on, op.kv_writer, op.kv_write_crosses, op.kind == "lm_head"

    def step(frame: Frame) -> None:
        vals = frame.vals
        _run_moves(transfer, vals, pre)
        x_cpu, x_gpu = vals[kind.source]["cpu"], vals[kind.source]["gpu"]
        if last_only:  # only the last position picks the next token
            x_cpu, x_gpu = x_cpu[:, -1:], x_gpu[:, -1:]
        timed = ex._part_seconds  # a list only in the profiling pass
        if timed is not None:
            began, start = time.perf_counter(), backend.timing_event()
            start.record()
        y_gpu = kind.part(gpu_part, x_gpu)  # on CUDA: launched, runs while the CPU part computes
        if timed is not None:
            end = backend.timing_event()
            end.record()
            launched = time.perf_counter() - began
            began = time.perf_counter()
        y_cpu = kind.part(cpu_part, x_cpu)
        if timed is not None:
            timed.append(_PartTiming(time.perf_counter() - began, start, end, launched))
        out: dict[str, dict[str, torch.Tensor]] = {}
        for device in merge_on:
            merged = torch.cat((y_cpu if device == "cpu" else transfer(y_cpu, device, "merge"),
                                y_gpu if device == "gpu" else transfer(y_gpu, device, "merge")), dim=-1)
            kind.join(posts[device], merged, frame, device, out)
        vals.update(out)
        if op.kind == "qkv":
            kv.write(layer, out["k"][writer], out["v"][writer], frame.start, crosses, frame.row, frame.beside)
    return step
