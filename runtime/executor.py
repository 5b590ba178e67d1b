"""Schedule → running code: each op bound once to its sublayer module on its device, then one loop per pass.

Binding (at load time, never per token): for every op the executor takes the op's module from a model built on the
`meta` device (liac.models: the attribute names are the plan's sublayer names), deep-copies it, points its
parameters at the tensors the plan placed (an 'hbm' or host arena, or a staging-buffer view when the op streams its
weights), and swaps its projections for the device's kernels (runtime/kernels.py). Ops that share a module, device
and weight source share the bound copy. Each op becomes a closure; a pass is

    for step in program: step(frame)

where `frame.vals[value][device]` holds the activations. The moves the schedule computed run at the start of an op,
so tensors cross PCIe only where the plan changes device. A split sublayer (one GEMM's output features partly on
the CPU from DDR, partly on the GPU) would be one more closure kind here that runs two bound halves, one in a worker
thread, and concatenates: the schedule, binding and loop do not change.
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from liac.models import build_model
from liac.models.config import ModelConfig
from liac.models.layers import rope_inv_freq
from liac.runtime.backend import Backend
from liac.runtime.kernels import prepare_module
from liac.runtime.kvcache import KVCache
from liac.runtime.schedule import MODULE_OF, Op, Schedule
from liac.runtime.staging import Streamer

__all__ = ["Frame", "Executor"]


class Frame:
    """The state of one forward pass: batch, first position, query length, activations per device, outputs."""

    __slots__ = ("batch", "start", "length", "vals", "pos", "logits")

    def __init__(self, batch: int, start: int, length: int):
        self.batch, self.start, self.length = batch, start, length
        self.vals: dict[str, dict[str, torch.Tensor]] = {}
        self.pos: dict[str, torch.Tensor] = {}
        self.logits: torch.Tensor | None = None


def _assign(module: nn.Module, local: str, tensor: torch.Tensor) -> None:
    *path, name = local.split(".")
    for attr in path:
        module = getattr(module, attr)
    module._parameters[name] = nn.Parameter(tensor, requires_grad=False)  # a view: no copy


class Executor:
    """Runs the passes of a Schedule (see the module docstring)."""

    def __init__(self, backend: Backend, schedule: Schedule, cfg: ModelConfig, dtype: torch.dtype,
                 tensors, kv: KVCache, streamer: Streamer, cpu_linear: str | None = None):
        self.backend, self.schedule, self.cfg, self.dtype = backend, schedule, cfg, dtype
        self.cpu_linear = cpu_linear  # the small-M CPU kernel the engine measured (runtime/kernels.py)
        self.tensors = tensors  # (canonical parameter, tier) → tensor
        self.kv, self.streamer = kv, streamer
        with torch.device("meta"):
            self.templates = build_model(cfg)
        self._bound: dict[tuple, nn.Module] = {}
        self.devices = [d for d in ("cpu", "gpu") if backend.devices[d] is not None]
        positions = schedule.kv_shape[2] + 1
        self.arange = {d: torch.arange(positions, device=backend.devices[d]) for d in self.devices}
        self.programs = {}
        for phase, sched in schedule.phases.items():
            units = {u.index: u for u in sched.units}
            self.programs[phase] = [(op, self._compile(op, units.get(op.unit))) for op in sched.ops]
        self.units = {phase: sched.units for phase, sched in schedule.phases.items()}
        embed = [op for op in schedule.phases["decode"].ops if op.kind == "embed"][0]
        self.decode_embed_device = "cpu" if embed.gather else embed.device  # where decode token ids go
        self.head_device = {phase: [op for op in sched.ops if op.kind == "lm_head"][0].device
                            for phase, sched in schedule.phases.items()}
        del self.templates  # bound copies hold everything they need

    # -- binding ------------------------------------------------------------------------------------------------
    def _template(self, op: Op, sublayer: str) -> nn.Module:
        if op.layer_class == "decoder":
            return getattr(self.templates.layers[op.layer], MODULE_OF[sublayer])
        return getattr(self.templates, MODULE_OF[sublayer])

    def _module(self, op: Op, unit) -> nn.Module:
        sublayer = op.sublayers[0]
        params = self.schedule.params[(op.layer_class, op.layer, sublayer)]
        offsets = {param.canonical: offset for param, _, offset in unit.weights} if op.streamed else {}
        # A streamed module is tied to where its weights sit in the buffer, which differs between phases.
        source = ("slot", unit.slot, tuple(offsets[p.canonical] for p in params)) if op.streamed \
            else ("tier", op.weights)
        compute = "cpu" if op.gather else op.device  # a host-side gather runs the embedding on the host table
        key = (op.layer_class, op.layer, MODULE_OF[sublayer], compute, source)
        if key in self._bound:
            return self._bound[key]
        module = copy.deepcopy(self._template(op, sublayer))
        for param in params:
            if op.streamed:
                tensor = self.streamer.view(unit.slot, offsets[param.canonical], param.shape)
            else:
                tensor = self.tensors(param.canonical, op.weights)
            _assign(module, param.local, tensor)
        device = self.backend.devices[compute]
        if getattr(module, "inv_freq", None) is not None:
            module.inv_freq = rope_inv_freq(self.cfg, device=device)
        module = prepare_module(module.eval(), compute, self.dtype, self.cpu_linear)
        self._bound[key] = module
        return module

    # -- ops → closures -----------------------------------------------------------------------------------------
    def _compile(self, op: Op, unit):
        kind, dev, layer = op.kind, op.device, op.layer
        streamer, kv, transfer = self.streamer, self.kv, self.backend.transfer
        if kind == "wait":
            return lambda frame: streamer.wait(op.unit)
        if kind == "release":
            return lambda frame: streamer.release(op.unit)
        module = self._module(op, unit)
        pre = tuple((m.value, m.src, m.dst) for m in op.moves if m.value != "next")
        post = tuple((m.value, m.src, m.dst) for m in op.moves if m.value == "next")

        def move(vals, moves):
            for value, src, dst in moves:
                vals[value][dst] = transfer(vals[value][src], dst, value)

        def kv_operand(frame, which):
            # attention's K or V [B, G, C, E] by the schedule's read mode
            if op.kv_read == "fresh":
                return frame.vals[which][dev]
            if op.kv_read == "cache":
                return kv.view(layer, which, frame.batch, frame.start + frame.length)
            return kv.write_window(windows[which], frame.vals[which][dev], frame.start)

        windows = {which: streamer.window(unit, which) for which, _ in unit.kv} if op.kv_read == "window" else {}

        if kind == "embed" and op.gather:
            transfers = self.backend.transfers

            def step(frame):
                move(frame.vals, pre)
                rows = module(frame.vals["ids"]["cpu"], frame.pos["cpu"])  # [B, Q, D] gathered from the host table
                transfers.streamed_bytes += rows.numel() * rows.element_size()
                frame.vals["x"] = {"gpu": transfer(rows, "gpu", "embed")}
        elif kind == "embed":
            def step(frame):
                move(frame.vals, pre)
                frame.vals["x"] = {dev: module(frame.vals["ids"][dev], frame.pos[dev])}
        elif kind == "qkv":
            crosses = op.kv_write_crosses

            def step(frame):
                vals = frame.vals
                move(vals, pre)
                q, k, v = module(vals["x"][dev], frame.pos[dev])  # [B, H, Q, E], [B, G, Q, E] ×2
                vals["q"], vals["k"], vals["v"] = {dev: q}, {dev: k}, {dev: v}
                kv.write(layer, k, v, frame.start, crosses)
        elif kind == "attn":
            def step(frame):
                vals = frame.vals
                move(vals, pre)
                vals["o"] = {dev: module(vals["q"][dev], kv_operand(frame, "k"), kv_operand(frame, "v"))}
        elif kind == "score":
            def step(frame):
                move(frame.vals, pre)
                frame.vals["p"] = {dev: module.score(frame.vals["q"][dev], kv_operand(frame, "k"))}
        elif kind == "context":
            def step(frame):
                move(frame.vals, pre)
                frame.vals["o"] = {dev: module.context(frame.vals["p"][dev], kv_operand(frame, "v"))}
        elif kind == "out_proj" or kind == "down":
            source = "o" if kind == "out_proj" else "h"

            def step(frame):
                vals = frame.vals
                move(vals, pre)
                vals["x"] = {dev: module(vals[source][dev], vals["x"][dev])}
        elif kind == "up":
            def step(frame):
                move(frame.vals, pre)
                frame.vals["h"] = {dev: module(frame.vals["x"][dev])}
        elif kind == "lm_head":
            def step(frame):
                vals = frame.vals
                move(vals, pre)
                logits = module(vals["x"][dev][:, -1:])[:, -1]  # only the last position picks the next token
                frame.logits = logits                            # [B, vocab]
                vals["next"] = {dev: logits.argmax(-1, keepdim=True)}  # greedy, [B, 1]
                move(vals, post)
        else:
            raise ValueError(f"unknown op kind '{kind}'")
        return step

    # -- passes -------------------------------------------------------------------------------------------------
    def forward(self, phase: str, ids: torch.Tensor, start: int, timings: dict | None = None) -> Frame:
        """One pass: `ids` [B, Q] (prefill: host tensor; decode: on the decode embed device), positions from
        `start`. With `timings`, synchronise after every op and add its seconds under (group, sublayers, phase)."""
        batch, length = ids.shape
        frame = Frame(batch, start, length)
        frame.vals["ids"] = {"cpu" if phase == "prefill" else self.decode_embed_device: ids}
        for d in self.devices:
            frame.pos[d] = self.arange[d][start:start + length].expand(batch, length)
        self.streamer.start(self.units[phase], batch, start)
        if timings is None:
            for _, step in self.programs[phase]:
                step(frame)
            return frame
        sync = self.backend.synchronize
        for op, step in self.programs[phase]:
            sync()
            begin = time.perf_counter()
            step(frame)
            sync()
            key = (op.group, op.sublayers, phase, op.device) if op.sublayers else (op.group, (op.kind,), phase, "gpu")
            timings.setdefault(key, []).append(time.perf_counter() - begin)
        return frame

    def prime_decode(self, batch: int, start: int) -> None:
        """Start copying the next decode pass's first streaming units now (overlaps the tail of this pass)."""
        self.streamer.prime(self.units["decode"], batch, start)
