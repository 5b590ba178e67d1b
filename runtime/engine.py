"""`Engine`: a plan and its weights → a model placed across CPU/GPU and HBM/DDR/CXL, and generation.

    engine = Engine.from_plan("plans/opt-30b.yaml", weights="ckpts/opt-30b")      # or RandomWeights(seed=0)
    out = engine.generate(input_ids, max_new_tokens=32)                           # out.token_ids [B, 32]
    out = engine.generate(["Hello", "Once upon a time"], 32, temperature=0.7, seed=0)
    print(out.text[1])                                                             # the checkpoint's tokenizer

A plan's batch, prompt length and generation length are maxima: any request within them runs (`check_request`).
Prompts of different lengths are left-padded and masked per sequence (runtime/sequences.py); tokens are chosen
greedily or sampled (runtime/sampling.py); with text in, each sequence stops at its EOS token.

`from_plan` checks everything it can before allocating a byte: the plan (schema, semantics, apiVersion), the
weights' architecture against `spec.model.config_sha256`, the checkpoint's tensors and shapes, the host (a GPU when
any sublayer is on 'gpu', free GPU memory, available host RAM). Every failure is one LiacError line.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import resource
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import torch

from liac.errors import LiacError
from liac.plan import API_VERSION, HOST_TIERS, PHASES, TIERS, OffloadPlan, batch_plan, check_semantics, load_plan
from liac.runtime.backend import Backend, CudaBackend, host_available_bytes, make_backend
from liac.runtime.executor import Executor, greedy
from liac.runtime.hostweights import HostWeights
from liac.runtime.kernels import choose_cpu_linear
from liac.runtime.kvcache import KVCache
from liac.runtime.memory import TierMemory, aligned
from liac.runtime.moe import ExpertShare
from liac.runtime.numa import libnuma, plan_cxl_placement, read_nodes
from liac.runtime.sampling import Sampler, SamplingParams
from liac.runtime.schedule import Schedule, build_schedule
from liac.runtime.sequences import HostTokens, PromptBatch, StopState
from liac.runtime.staging import Streamer
from liac.runtime.text import TokenizerSource, decode, encode_prompts, is_batch_encoding
from liac.runtime.weights import (Checkpoint, Progress, RandomWeights, WeightStore, fill_random, load_checkpoint)
from liac.sizes import GIB, numel

__all__ = ["Engine", "Generation", "GpuBudget", "RandomWeights", "HostWeights", "SUPPORTED_FAMILIES",
           "check_request", "gpu_budget", "resolve_plan", "request_limits", "DTYPES"]

SUPPORTED_FAMILIES = ("opt", "llama", "qwen2", "mixtral")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}  # = config.DTYPES


@dataclass(frozen=True)
class Generation:
    """The result of `Engine.generate`: token ids, text when a tokenizer is known, and timings."""

    token_ids: torch.Tensor        # [B, M] new tokens, int64, on the host; after its EOS a row holds padding
    logits: torch.Tensor | None    # [B, M, vocab] float32 on the host: the logits each token was picked from
    prefill_seconds: float         # prompt → first token
    decode_seconds: float          # the M - 1 decode steps
    prompt_len: int                # padded prompt width P (the longest prompt)
    transfers: dict | None = None  # what this call moved between the devices (TransferCounts.totals keys)
    lengths: tuple[int, ...] = ()  # new tokens per sequence, its EOS included (default: M each)
    finish_reasons: tuple[str, ...] = ()  # per sequence: 'eos' or 'length' (the token limit)
    prompt_lengths: tuple[int, ...] = ()  # real prompt tokens per sequence (default: P each)
    text: tuple[str, ...] | None = None   # per sequence, the new tokens decoded (special tokens left out)
    experts: dict | None = None  # MoE: what this call's experts ops did per phase (ExpertTally.totals keys)

    def __post_init__(self):
        batch, width = self.token_ids.shape
        if not self.lengths:
            object.__setattr__(self, "lengths", (width,) * batch)
        if not self.finish_reasons:
            object.__setattr__(self, "finish_reasons", ("length",) * batch)
        if not self.prompt_lengths:
            object.__setattr__(self, "prompt_lengths", (self.prompt_len,) * batch)

    @property
    def decode_steps(self) -> int:
        return self.token_ids.shape[1] - 1

    @property
    def sequences(self) -> list[list[int]]:
        """Each sequence's new tokens, up to and including its EOS."""
        return [row[:n] for row, n in zip(self.token_ids.tolist(), self.lengths)]

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def tokens_per_second(self) -> float:
        """New tokens (all sequences, up to their EOS) per second of prefill + decode."""
        return sum(self.lengths) / self.seconds if self.seconds > 0 else float("nan")


def resolve_plan(plan: OffloadPlan | str | os.PathLike) -> tuple[OffloadPlan, str]:
    """Load (or re-check) a plan and refuse what this runtime cannot run; returns (plan, its source name)."""
    if isinstance(plan, OffloadPlan):
        errors = check_semantics(plan)
        if errors:
            raise LiacError("plan", errors[0][1], path=errors[0][0])
        source = "plan"
    else:
        source = str(plan)
        plan = load_plan(plan)  # schema, semantics; older apiVersions are migrated
    if plan.apiVersion != API_VERSION:
        raise LiacError(source, f"must be '{API_VERSION}', got '{plan.apiVersion}'", path="apiVersion")
    if plan.spec.model.family not in SUPPORTED_FAMILIES:
        raise LiacError(source, f"unsupported family '{plan.spec.model.family}': the runtime executes "
                        + ", ".join(f"'{f}'" for f in SUPPORTED_FAMILIES), path="spec.model.family")
    return plan, source


@dataclass(frozen=True)
class _Options:
    """`Engine.from_plan`'s keyword arguments, as the constructor of each weight source takes them."""

    emulate_gpu: bool | None
    backend: Backend | None
    dtype: torch.dtype | None
    progress: bool
    stream_log: list | None
    cpu_kernel: str
    enforce_budget: bool
    warm_up: bool | tuple[int, int]
    expert_share: str | float = "load"
    cpu_wake: bool = False
    mapped_crossings: bool = True
    expert_split: bool = False
    expert_launcher: bool = False


@dataclass(frozen=True)
class GpuBudget:
    """How a run keeps the plan's GPU budget (`spec.budgets.gpu_bytes`): the whole footprint of the process on the
    GPU, as the cost model counts it (docs/cost-model.md Eq. 14).

    The arena (weights, KV caches, staging buffers) and the workspace (activations and the libraries' workspaces,
    `spec.execution.workspace_bytes`) live in torch's caching allocator; the CUDA context lives outside it. The
    runtime checks the workspace can be had up front and caps the allocator at `cap_bytes` = budget − context, so the
    allocator's reserved bytes plus the context never pass the budget: an activation peak beyond the plan's is an
    out-of-memory error, never a silent overshoot. `enforced` is False for plans that do not record their workspace
    (written before it was) and for runs without a real GPU.
    """

    budget_bytes: int
    arena_bytes: int
    workspace_bytes: int
    context_bytes: int  # the larger of the context measured at start and the plan's (hbm − arena − workspace)
    enforced: bool

    @property
    def cap_bytes(self) -> int:
        return self.budget_bytes - self.context_bytes


def gpu_budget(plan: OffloadPlan, source: str, arena_bytes: int, context_bytes: int | None,
               uses_gpu: bool) -> GpuBudget:
    """The run's GPU budget (see `GpuBudget`); `context_bytes` is what this GPU's context takes now (None: no real
    GPU). Raises a one-line LiacError when the arena and the workspace do not fit the budget beside the context."""
    spec = plan.spec
    workspace = spec.execution.workspace_bytes
    if not uses_gpu or context_bytes is None or workspace == 0:
        legacy = max(0, spec.memory.hbm_bytes - arena_bytes) if uses_gpu else 0
        return GpuBudget(spec.budgets.gpu_bytes, arena_bytes, workspace or legacy, context_bytes or 0, False)
    planned_context = max(0, spec.memory.hbm_bytes - arena_bytes - workspace)
    context = max(context_bytes, planned_context)
    budget = GpuBudget(spec.budgets.gpu_bytes, arena_bytes, workspace, context, True)
    need = arena_bytes + workspace + context
    if need > budget.budget_bytes:
        raise LiacError(source, f"needs {need / GIB:.2f} GiB of GPU memory within its budget of "
                                f"{budget.budget_bytes / GIB:.2f} GiB: weights, KV and staging {arena_bytes / GIB:.2f}"
                                f", workspace {workspace / GIB:.2f}, CUDA context {context / GIB:.2f} here (the "
                                f"plan's profile expected {planned_context / GIB:.2f}; short by "
                                f"{(need - budget.budget_bytes) / GIB:.2f} GiB): recompile with a profile of this "
                                f"host ('liac profile') or a smaller --gpu-mem", path="spec.budgets.gpu_bytes")
    return budget


def _plan_dtype(plan: OffloadPlan) -> torch.dtype:
    """The dtype the plan's model is stored and computed in (its config's; ModelConfig admits only `DTYPES`'
    keys, liac.models.config.DTYPES)."""
    return DTYPES[plan.model_config.dtype]


def _scheduled(plan: OffloadPlan, source: str, backend: Backend, dtype: torch.dtype) -> Schedule:
    """The plan resolved for a run in `dtype` on `backend`, which must have a GPU if any sublayer is on one."""
    schedule = build_schedule(plan, torch.empty((), dtype=dtype).element_size(), source)
    if schedule.uses_gpu and backend.devices["gpu"] is None:
        raise LiacError(source, "must be 'cpu' on this host: no CUDA device is available (run it on a GPU "
                                "machine, or use the CPU-backed test mode: --emulate-gpu / LIAC_EMULATE_GPU=1)",
                        path=_first_gpu_sublayer(plan))
    return schedule


def _first_gpu_sublayer(plan: OffloadPlan) -> str:
    for g_index, group in enumerate(plan.spec.layer_groups):
        for s_index, sub in enumerate(group.sublayers):
            for phase in PHASES:
                if getattr(sub, phase) in ("gpu", "split"):
                    return f"spec.layer_groups[{g_index}].sublayers[{s_index}].{phase}"
    return "spec.layer_groups"


class Engine:
    """A loaded plan: use `Engine.from_plan`, then `generate`."""

    def __init__(self, plan: OffloadPlan, source: str, backend: Backend, schedule: Schedule, memory: TierMemory,
                 store: WeightStore, executor: Executor, dtype: torch.dtype, notes: list[str],
                 shared: HostWeights | None = None, shared_bytes: dict[str, int] | None = None,
                 cpu_linear: tuple[str, dict | None] = ("linear", None), build_seconds: float = 0.0,
                 budget: GpuBudget | None = None):
        self.plan, self.source, self.backend, self.schedule = plan, source, backend, schedule
        self.memory, self.store, self.executor, self.dtype = memory, store, executor, dtype
        self.notes = notes
        self.cfg = plan.model_config
        self.shared = shared                            # the HostWeights this engine's host tensors view
        self.shared_bytes = shared_bytes or {tier: 0 for tier in TIERS}  # per planned tier, served by `shared`
        self.cpu_linear = cpu_linear                    # (small-M CPU kernel, measured GB/s or None)
        self.build_seconds = build_seconds  # checks, allocation, weights, binding: `load_seconds` in the metrics
        self.warmup_seconds = 0.0
        self.warmup_request: tuple[int, int] | None = None
        self.budget = budget or GpuBudget(plan.spec.budgets.gpu_bytes, 0, 0, 0, False)
        self.closed = False
        self.text = TokenizerSource()  # the tokenizer, for text prompts (from_plan sets it)
        # A serving plan (spec.serving): one executor per planned batch size, over the same weights, KV cache and
        # staging buffers (built on first use); the largest batch's placement is the plan's own (`executor`).
        self._executors: dict[int, Executor] = {plan.spec.workload.batch_size: executor}

    @classmethod
    def from_plan(cls, plan: OffloadPlan | str | os.PathLike,
                  weights: str | os.PathLike | RandomWeights | HostWeights, *, emulate_gpu: bool | None = None,
                  backend: Backend | None = None, dtype: torch.dtype | None = None, progress: bool = False,
                  stream_log: list | None = None, cpu_kernel: str = "auto", tokenizer=None,
                  enforce_budget: bool = True, warm_up: bool | tuple[int, int] = True,
                  expert_share: str | float = "load", cpu_wake: bool = False,
                  mapped_crossings: bool = True, expert_split: bool = False,
                  expert_launcher: bool = False) -> "Engine":
        """Check, allocate, load.

        Args:
            plan: an OffloadPlan or the path of its YAML.
            weights: a HF checkpoint directory, RandomWeights(seed), or HostWeights shared with other engines (its
                host copies serve the plan's 'ddr' tensors in place; only the rest is copied).
            emulate_gpu: run 'gpu' sublayers on the CPU behind the GPU interface (test mode); None reads
                LIAC_EMULATE_GPU. Ignored when `backend` is given (or for HostWeights, which bring theirs).
            dtype: compute/storage dtype; default the plan's (bf16), or the HostWeights'. Tests use float32 for
                exact token parity.
            progress: print a loading progress line on stderr.
            stream_log: a list to receive the streamer's issue/wait/release calls (tests).
            cpu_kernel: the small-M CPU projection kernel: 'auto' (measure F.linear and torch.mv on this plan's CPU
                weights, runtime/kernels.py), 'linear' or 'mv'.
            tokenizer: for text prompts: a transformers tokenizer or the directory it is saved in; default the
                checkpoint directory `weights` (loaded on first use).
            enforce_budget: on a GPU, check the plan's workspace can be had and cap torch's allocator at the budget less the
                CUDA context (`GpuBudget`); False only to measure the footprint (runtime/footprint.py).
            warm_up: after loading, run the first layer of every group once at the request's shapes (prefill and
                one decode step), then a whole two-token request (`Engine.warm_up`): True at the plan's workload,
                (batch, prompt_len) at those, or False. Timed apart from loading (`load_seconds`, `warmup_seconds`).
            expert_share: MoE layers with both CPU and streamed experts share a step's routed host experts between
                the two by the ratio of their times per expert (`ExpertRun.assign`): 'load' (default) measures it at
                load (the CPU kernel's rate over one expert's pinned copy; only on a GPU, with the CPU rate measured)
                and keeps it, 'auto' measures it at load and then follows the CPU parts' own host times
                (runtime/moe.py `ExpertShare`; measured on the H200: not better than 'load', docs/benchmarks.md),
                a number gives it (CPU seconds per expert over PCIe's, fixed), 'off' keeps each expert where the
                plan puts it.
            cpu_wake: True: an experts op that computes experts on the CPU first wakes the CPU's thread team,
                while the GPU still computes the router (runtime/executor.py `_CpuTeamWake`); off by default: on
                the H200 machine the expert kernel after an idle pause kept its back-to-back rate, and the A/B
                showed no gain (docs/benchmarks.md, moe-wake).
            mapped_crossings: on a CUDA GPU, a crossing to the GPU of at most 1 MiB (a decode step's activations
                and K, V writes) is read from its page-locked block by a kernel on the compute stream, not copied by
                the copy engine, where it would queue behind the staging copies (runtime/backend.py
                `CudaBackend.transfer`); False: every crossing is copied (the engine sets this on its backend).
            expert_split: True: at decode, in MoE layers with both CPU and streamed experts, the CPU's last routed
                expert of a step is cut by its intermediate features between the CPU and PCIe so that the CPU part
                plus the host's launches after it and the copies finish together (runtime/moe.py `ExpertSplit`;
                needs the share's measured copy time: `expert_share` 'load' or 'auto' on a GPU). Off by default
                until a device run measures it.
            expert_launcher: True: an MoE experts op with both a CPU and a GPU part hands the GPU part's launches
                to a second host thread and computes the CPU part at once, instead of launching first
                (runtime/executor.py `_Launcher`). Off by default until a device run measures it.

        Raises:
            LiacError: anything wrong with the plan, the weights or the host, before or instead of a crash.
        """
        if not (expert_share in ("auto", "load", "off") or (isinstance(expert_share, (int, float))
                                                            and not isinstance(expert_share, bool)
                                                            and expert_share > 0)):
            raise ValueError(f"expert_share must be 'auto', 'load', 'off' or a positive number, got {expert_share!r}")
        options = _Options(emulate_gpu, backend, dtype, progress, stream_log, cpu_kernel, enforce_budget, warm_up,
                           expert_share, bool(cpu_wake), bool(mapped_crossings), bool(expert_split),
                           bool(expert_launcher))
        began = time.perf_counter()
        plan, source = resolve_plan(plan)
        if isinstance(weights, HostWeights):
            engine = cls._from_host_weights(plan, source, weights, options, began)
        elif isinstance(weights, RandomWeights):
            engine = cls._from_random(plan, source, weights, options, began)
        else:
            engine = cls._from_checkpoint(plan, source, weights, options, began)
        # text prompts: the given tokenizer, else the checkpoint's own (loaded on first use)
        engine.text = TokenizerSource(tokenizer, Path(weights) if isinstance(weights, (str, os.PathLike)) else None)
        return engine

    # -- one constructor per weight source: each checks what it must, then `_assemble` places the model ------------
    @classmethod
    def _from_checkpoint(cls, plan: OffloadPlan, source: str, path: str | os.PathLike, options: _Options,
                         began: float) -> "Engine":
        """A HF checkpoint directory: its architecture must be the plan's, and every tensor the schedule needs must
        be there with its shape (headers only) before anything is allocated; then read into the tiers."""
        ckpt = Checkpoint.open(path)
        found = ckpt.config()
        if found.sha256() != plan.spec.model.config_sha256:
            raise LiacError(str(Path(path) / "config.json"), f"architecture hashes to '{found.sha256()[:12]}…'"
                            f": must be '{plan.spec.model.config_sha256[:12]}…', the model the plan was compiled "
                            f"for ('{plan.spec.model.name}')")
        dtype = options.dtype or _plan_dtype(plan)
        backend = options.backend or make_backend(options.emulate_gpu)
        schedule = _scheduled(plan, source, backend, dtype)
        expected = {p.canonical: p.shape for params in schedule.params.values() for p in params}
        sources = ckpt.check(expected, plan.model_config)

        def fill(store: WeightStore, own: list[tuple[str, str]], own_bytes: int) -> None:
            load_checkpoint(ckpt, sources, store, Progress("loading weights", own_bytes, options.progress))
        return cls._assemble(plan, source, backend, dtype, schedule, options, fill, None, began)

    @classmethod
    def _from_random(cls, plan: OffloadPlan, source: str, weights: RandomWeights, options: _Options,
                     began: float) -> "Engine":
        """Seeded random weights, the same for a model whatever the plan (generated where they are placed)."""
        dtype = options.dtype or _plan_dtype(plan)
        backend = options.backend or make_backend(options.emulate_gpu)
        schedule = _scheduled(plan, source, backend, dtype)

        def fill(store: WeightStore, own: list[tuple[str, str]], own_bytes: int) -> None:
            device = backend.devices["gpu"] if backend.name == "cuda" else torch.device("cpu")
            fill_random(store, weights.seed, device, Progress("random weights", own_bytes, options.progress))
        return cls._assemble(plan, source, backend, dtype, schedule, options, fill, None, began)

    @classmethod
    def _from_host_weights(cls, plan: OffloadPlan, source: str, shared: HostWeights, options: _Options,
                           began: float) -> "Engine":
        """HostWeights shared with other engines: the same model and dtype; their host copies serve this plan's host
        tiers in place, their backend runs it, and only the other copies ('hbm', 'cxl' on a CXL node) are made."""
        if shared.cfg.sha256() != plan.spec.model.config_sha256:
            raise LiacError(source, f"must be a plan for the shared weights' model '{shared.cfg.name}' (its "
                            f"architecture hashes to '{shared.cfg.sha256()[:12]}…'), got one for "
                            f"'{plan.spec.model.name}'", path="spec.model.config_sha256")
        if options.dtype is not None and options.dtype != shared.dtype:
            raise LiacError("dtype", f"must be the shared weights' {shared.dtype}, got {options.dtype}")
        backend = options.backend or shared.backend
        schedule = _scheduled(plan, source, backend, shared.dtype)

        def fill(store: WeightStore, own: list[tuple[str, str]], own_bytes: int) -> None:
            _copy_from_shared(shared, store, own, Progress("copying weights", own_bytes, options.progress))
        return cls._assemble(plan, source, backend, shared.dtype, schedule, options, fill, shared, began)

    @classmethod
    def _assemble(cls, plan: OffloadPlan, source: str, backend: Backend, dtype: torch.dtype, schedule: Schedule,
                  options: _Options, fill: Callable[[WeightStore, list[tuple[str, str]], int], None],
                  shared: HostWeights | None, began: float) -> "Engine":
        """The weights checked: place CXL, check the host, allocate the arenas, put every weight in its tier (`fill`
        writes the ones this engine owns), then the KV cache, the staging buffers and the executor."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        cxl = plan_cxl_placement(read_nodes(), schedule.tier_bytes["cxl"], libnuma() is not None)
        notes = [cxl.note] if cxl.note and cxl.node is None else []
        if backend.emulated:
            notes.append(backend.describe())
        if isinstance(backend, CudaBackend):
            backend.mapped_crossings = options.mapped_crossings and backend.mapped_note is None
            if backend.mapped_note is not None:
                notes.append(backend.mapped_note)
        shapes = {p.canonical: p.shape for params in schedule.params.values() for p in params}

        def copy_shape(canonical: str, tier: str) -> tuple[int, ...]:  # the rows of it this tier holds
            _, rows = schedule.rows_of(canonical, tier, shapes[canonical])
            return (rows,) + tuple(shapes[canonical][1:]) if shapes[canonical] else ()

        # With shared HostWeights, the tiers that are host memory here ('ddr', and 'cxl' without a CXL node) are
        # views of the shared arena: this engine allocates and fills only the other copies.
        in_shared = {"hbm": False, "ddr": shared is not None, "cxl": shared is not None and cxl.node is None}
        shared_bytes = {tier: 0 for tier in TIERS}
        for canonical, tiers in schedule.weight_tiers.items():
            for tier in tiers:
                if in_shared[tier]:
                    shared_bytes[tier] += aligned(numel(copy_shape(canonical, tier)) * itemsize)
        arena_bytes = {tier: nbytes - shared_bytes[tier] for tier, nbytes in schedule.tier_bytes.items()}
        budget = gpu_budget(plan, source, arena_bytes["hbm"], backend.gpu_context_bytes(), schedule.uses_gpu)
        if not options.enforce_budget:
            budget = dataclasses.replace(budget, enforced=False)
        _check_host(plan, source, backend, schedule, cxl.node is not None, arena_bytes,
                    sum(shared_bytes.values()), budget)
        if schedule.uses_gpu and not budget.enforced and not backend.emulated and backend.devices["gpu"]:
            notes.append("the plan does not record its GPU workspace (compiled before it was): its GPU budget is "
                         "not enforced")

        memory = TierMemory.allocate(backend, arena_bytes, cxl)
        notes.extend(memory.notes)
        try:
            store = WeightStore()
            for canonical, tiers in sorted(schedule.weight_tiers.items()):
                for tier in tiers:
                    first, rows = schedule.rows_of(canonical, tier, shapes[canonical])
                    tensor = shared.tensor(canonical)[first:first + rows] if in_shared[tier] and \
                        (canonical, tier) in schedule.weight_rows else shared.tensor(canonical) if in_shared[tier] \
                        else memory.take(tier, copy_shape(canonical, tier), dtype)
                    store.add(canonical, tier, tensor, first, shapes[canonical][0] if shapes[canonical] else None)
            own = [(c, t) for c, tiers in sorted(schedule.weight_tiers.items()) for t in tiers if not in_shared[t]]
            fill(store, own, sum(store(c, t).numel() * itemsize for c, t in own))
            cpu_linear = choose_cpu_linear(_cpu_weights(schedule, store), options.cpu_kernel)
            kv = KVCache(backend, memory, schedule.kv_tiers, schedule.kv_shape, dtype)
            buffers = [memory.take("hbm", (schedule.buffer_bytes,), torch.uint8) for _ in range(schedule.buffers)]
            streamer = Streamer(backend, buffers, store, kv, dtype, options.stream_log)
            share = _expert_share(options.expert_share, backend, schedule, store, cpu_linear, buffers)
            executor = Executor(backend, schedule, plan.model_config, dtype, store, kv, streamer, cpu_linear[0],
                                share, options.cpu_wake, options.expert_split, options.expert_launcher)
            backend.synchronize()
            if budget.enforced:  # loading's temporaries are gone: check the workspace, then cap the allocator
                backend.release_cached()
                backend.reserve(budget.workspace_bytes)
                backend.cap(budget.cap_bytes)
                backend.reset_peak()  # the run's peak from here (loading random weights used GPU scratch)
        except torch.cuda.OutOfMemoryError as e:
            store = kv = buffers = streamer = executor = memory = None  # noqa: F841 (what the arena held goes)
            _give_back(backend)
            raise LiacError("host", "CUDA out of memory while placing the model: the plan does not fit this GPU "
                                    "(free memory is below spec.memory.hbm_bytes)") from _bare(e)
        except BaseException:
            store = kv = buffers = streamer = executor = memory = None  # noqa: F841
            _give_back(backend)
            raise
        engine = cls(plan, source, backend, schedule, memory, store, executor, dtype, notes, shared, shared_bytes,
                     cpu_linear, time.perf_counter() - began, budget)
        if options.warm_up:
            work = plan.spec.workload
            try:
                engine.warm_up(*((work.batch_size, work.prompt_len) if options.warm_up is True else options.warm_up))
            except BaseException:
                engine.close()  # its arena and the allocator cap go before the error reaches the caller
                raise
        return engine

    # ------------------------------------------------------------------------------------------------------------
    def executor_for(self, live: int) -> Executor:
        """The executor of the compute placement the plan has for a live batch of `live` sequences: a serving
        plan's smallest batch size that holds it (`liac.plan.batch_plan`), over this engine's weights, KV cache and
        staging buffers; any other plan's one placement."""
        self._open()
        planned = batch_plan(self.plan, live).spec.workload.batch_size
        if planned not in self._executors:
            schedule = build_schedule(batch_plan(self.plan, live), self.schedule.itemsize, self.source)
            main = self.executor
            self._executors[planned] = Executor(self.backend, schedule, self.cfg, self.dtype, self.store, main.kv,
                                                main.streamer, self.cpu_linear[0], main.expert_share,
                                                main.cpu_wake is not None, main.expert_split is not None,
                                                main.expert_launcher is not None)
        return self._executors[planned]

    def close(self) -> None:
        """Free what this engine allocated (GPU arena, host arenas) and hand cached GPU memory back, so the next
        engine gets it; shared HostWeights stay. The engine cannot generate afterwards."""
        if self.closed:
            return
        self.closed = True
        for executor in self._executors.values():
            executor.close()
        self._executors = {}
        self.executor = self.store = self.memory = None  # type: ignore[assignment]
        gc.collect()  # the bound modules and closures form cycles; the arenas go with them
        if self.budget.enforced:
            self.backend.cap(None)
        self.backend.release_cached()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------------------
    def check_request(self, batch: int, prompt_len: int, max_new_tokens: int) -> None:
        check_request(self.plan, batch, prompt_len, max_new_tokens)

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer (transformers), loaded on first use; LiacError when there is none."""
        return self.text.tokenizer()

    def prompts(self, prompt, attention_mask=None, chat: bool = False) -> tuple[PromptBatch, bool]:
        """Any prompt form `generate` takes → (left-padded PromptBatch, whether it is text or a tokenizer's
        output: then EOS stops it and its output is decoded, when a tokenizer is known)."""
        if isinstance(prompt, str) or (isinstance(prompt, (list, tuple)) and prompt
                                       and all(isinstance(p, str) for p in prompt)):
            rows = encode_prompts(self.tokenizer, [prompt] if isinstance(prompt, str) else list(prompt), chat)
            return self._checked(PromptBatch.from_lists(rows, self.text.pad_id())), True
        if chat:
            raise LiacError("chat", "applies to text prompts only, got token ids")
        if isinstance(prompt, PromptBatch):
            return self._checked(prompt), False
        if is_batch_encoding(prompt):
            ids = self._ids(prompt["input_ids"])
            mask = prompt.get("attention_mask") if attention_mask is None else attention_mask
            return self._checked(PromptBatch.from_tensor(ids, mask, self.text.pad_id())), True
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(r, (list, tuple)) for r in prompt) \
                and len({len(r) for r in prompt}) > 1:  # token id lists of different lengths: pad them
            rows = [self._ids(r)[0].tolist() for r in prompt]
            return self._checked(PromptBatch.from_lists(rows, self.text.pad_id(), "input_ids")), False
        ids = self._ids(prompt)
        return self._checked(PromptBatch.from_tensor(ids, attention_mask, self.text.pad_id())), False

    def _checked(self, batch: PromptBatch) -> PromptBatch:
        if batch.ids.numel() and int(batch.ids.max()) >= self.cfg.vocab_size:
            raise LiacError("input_ids", f"token ids must be in 0..{self.cfg.vocab_size - 1}")
        return batch

    def _ids(self, input_ids) -> torch.Tensor:
        try:
            ids = torch.as_tensor(input_ids, dtype=torch.long, device="cpu")
        except (TypeError, ValueError, RuntimeError) as e:
            raise LiacError("input_ids", "must be a string, a list of strings, token ids ([prompt_len] or [batch, "
                                         "prompt_len]) or a tokenizer's BatchEncoding") from e
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2:
            raise LiacError("input_ids", f"must be [batch, prompt_len] token ids, got shape {list(ids.shape)}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size):
            raise LiacError("input_ids", f"token ids must be in 0..{self.cfg.vocab_size - 1}")
        return ids

    def _open(self) -> None:
        if self.closed:
            raise LiacError("engine", f"is closed (plan '{self.plan.metadata.name}'): build a new one")

    @torch.inference_mode()
    def generate(self, prompt, max_new_tokens: int | None = None, return_logits: bool = False, *,
                 attention_mask=None, chat: bool = False, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, seed: int | None = None, sampling: Sequence[SamplingParams] | None = None,
                 eos_token_id: int | Sequence[int] | None | str = "auto", streamer=None,
                 on_step: Callable[[int, list[int]], None] | None = None) -> Generation:
        """Generate up to `max_new_tokens` tokens per prompt.

        Args:
            prompt: a string or a list of strings (tokenized with the checkpoint's tokenizer; `chat` applies its
                chat template), token ids ([P] or [B, P], a tensor or lists, lists of different lengths allowed), or
                a tokenizer's BatchEncoding (`input_ids` and `attention_mask`, padded on either side). Prompts of
                different lengths are left-padded and masked.
            max_new_tokens: at most this many new tokens per sequence (default: the plan's gen_len).
            return_logits: keep the logits each token was chosen from (`Generation.logits`).
            attention_mask: [B, P] for token-id prompts with padding (1: token, 0: padding).
            temperature, top_p, top_k, seed: sampling (runtime/sampling.py); temperature 0 (default) is greedy.
            sampling: one SamplingParams per sequence instead (they may differ).
            eos_token_id: the token id(s) that end a sequence; 'auto' (default): the tokenizer's EOS (and the
                checkpoint's generation_config.json) for text and BatchEncoding prompts, none for token ids (they
                run to `max_new_tokens`); None: never stop early.
            streamer: an object with HF's streamer protocol (`put`, `end`; e.g. transformers.TextStreamer), for
                a batch of one: it gets the prompt, then each new token as soon as the host has it.
            on_step: called as `on_step(step, token_ids)` with each step's new token per sequence (the host's
                copy; a step late when the tokens are chosen on the GPU, so the GPU never waits for it).

        Returns:
            Generation: token ids [B, M] (M the most any sequence produced), per sequence its length, finish reason
            ('eos' or 'length') and, for text prompts, the decoded text; prefill and decode seconds.
        """
        self._open()
        batch, textual = self.prompts(prompt, attention_mask, chat)
        if max_new_tokens is None:
            max_new_tokens = self.plan.spec.workload.gen_len
        self.check_request(batch.size, batch.width, max_new_tokens)
        if sampling is None:
            sampling = [SamplingParams(temperature, top_p, top_k, seed)] * batch.size
        elif len(sampling) != batch.size:
            raise LiacError("sampling", f"must hold one SamplingParams per sequence ({batch.size}), got "
                                        f"{len(sampling)}")
        if eos_token_id == "auto":
            eos = self.text.eos_ids() if textual and self.text.available() else ()
        elif eos_token_id is None:
            eos = ()
        else:
            eos = (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)
        if streamer is not None:
            if batch.size != 1:
                raise LiacError("streamer", f"streams one sequence, got a batch of {batch.size}")
            streamer.put(batch.ids[:, int(batch.pad[0]):])
        stops = StopState(batch.size, eos, self.text.pad_id() if eos else 0)
        try:
            out = self._generate(batch, max_new_tokens, return_logits, Sampler(sampling), stops, streamer, on_step)
        except torch.cuda.OutOfMemoryError as e:
            within = (f"the plan's GPU budget of {self.budget.budget_bytes / GIB:.2f} GiB (its activation workspace "
                      f"of {self.budget.workspace_bytes / GIB:.2f} GiB is too small for this request: recompile "
                      f"with a profile whose gpu_activation_factor this host measured, 'liac profile')"
                      if self.budget.enforced else "what the plan reserved (spec.memory.hbm_bytes leaves too "
                                                   "little free)")
            raise LiacError("host", f"CUDA out of memory during generation: the activations do not fit within "
                                    f"{within}") from e
        if streamer is not None:
            streamer.end()
        if textual and self.text.available():
            tokenizer = self.tokenizer
            out = _with_text(out, tuple(decode(tokenizer, row) for row in out.sequences))
        return out

    def _generate(self, batch: PromptBatch, max_new_tokens: int, return_logits: bool, sampler: Sampler,
                  stops: StopState, streamer=None, on_step=None, guard: bool = True) -> Generation:
        """`generate` after its checks. `guard` False (the warm-up's request of zeros): non-finite logits are not
        an error (a bad weight is named by the first request that reads it)."""
        ids = batch.ids
        size, prompt_len = ids.shape
        executor, sync = self.executor_for(size), self.backend.synchronize
        moved = self.backend.transfers.totals()
        tallied = executor.expert_tally.totals()
        prefill_head = executor.head_device["prefill"]
        decode_head = executor.head_device["decode"]
        feed = executor.decode_embed_device
        pad = executor.padding(batch.pad)
        pick = (lambda logits: stops.apply(sampler(logits))) if (stops.eos_ids or not sampler.greedy) else greedy
        watch = HostTokens(self.backend, streamer, on_step, stops) \
            if (stops.eos_ids or streamer is not None or on_step is not None) else None
        sync()
        began = time.perf_counter()
        frame = executor.forward("prefill", ids, 0, pad=pad, pick=pick)
        if max_new_tokens > 1:
            executor.prime_decode(size, prompt_len)
        tokens = [frame.vals["next"][prefill_head]]
        logits = [frame.logits] if return_logits else []
        # The guard against NaN/inf: one tiny reduction per pass, queued with it (no synchronisation), read at the
        # two synchronisation points the loop already has; only when it fires is the pass re-run op by op.
        finite = [torch.isfinite(frame.logits).all()]
        inputs = [ids]
        sync()
        prefilled = time.perf_counter()
        if guard and not bool(finite[0]):
            self._nonfinite(0, inputs, prompt_len, pad, pick)
        if watch is not None:
            watch.push(tokens[0])
            watch.observe(0)
        for step in range(1, max_new_tokens):
            if watch is not None and watch.done:
                break
            start = prompt_len + step - 1
            inputs.append(frame.vals["next"][feed])
            frame = executor.forward("decode", inputs[-1], start, pad=pad, pick=pick)
            if step < max_new_tokens - 1:
                executor.prime_decode(size, start + 1)
            tokens.append(frame.vals["next"][decode_head])
            finite.append(torch.isfinite(frame.logits).all())
            if return_logits:
                logits.append(frame.logits)
            if watch is not None:
                watch.push(tokens[-1])
                watch.observe(step if tokens[-1].device.type == "cpu" else step - 1)  # the GPU runs a step ahead
        sync()
        done = time.perf_counter()
        flags = torch.stack([flag.to("cpu") for flag in finite])  # after the timed loop
        if guard and not bool(flags.all()):
            self._nonfinite(int((~flags).nonzero()[0, 0]), inputs, prompt_len, pad, pick)
        token_ids = torch.cat([t.to("cpu") for t in tokens], dim=1)
        stacked = torch.stack([l.float().to("cpu") for l in logits], dim=1) if return_logits else None
        if watch is not None:
            watch.observe(len(tokens) - 1)
        lengths = stops.lengths(token_ids)
        width = max(lengths)  # a step run after every sequence had finished adds only padding
        token_ids = token_ids[:, :width]
        stacked = stacked[:, :width] if stacked is not None else None
        reasons = tuple("eos" if token_ids[b, n - 1].item() in stops.eos_ids else "length"
                        for b, n in enumerate(lengths))
        after = self.backend.transfers.totals()
        experts = {key: value - tallied.get(key, 0) for key, value in executor.expert_tally.totals().items()}
        return Generation(token_ids, stacked, prefilled - began, done - prefilled, prompt_len,
                          {key: after[key] - moved[key] for key in after}, tuple(lengths), reasons,
                          tuple(batch.lengths), experts=experts or None)

    def _nonfinite(self, step: int, inputs: list[torch.Tensor], prompt_len: int, pad, pick) -> None:
        """Raise the error for non-finite logits at pass `step` (0 = prefill), naming the first sublayer whose
        output is not finite (found by re-running that pass op by op)."""
        phase = "prefill" if step == 0 else "decode"
        start = 0 if step == 0 else prompt_len + step - 1
        op = self.executor.first_nonfinite(phase, inputs[step], start, pad=pad, pick=pick)
        when = "in the prefill" if step == 0 else f"at decode step {step}"
        if op is None:
            where = "re-running that pass gave finite values everywhere (the fault did not repeat)"
        else:
            name = ".".join(("layers", str(op.layer), *op.sublayers[:1])) if op.layer_class == "decoder" \
                else (op.sublayers[0] if op.sublayers else op.kind)
            where = (f"the first sublayer whose output is not finite is '{name}' (group '{op.group}', on "
                     f"{op.device})")
        raise LiacError("generate", f"the logits are not finite (NaN or infinity) {when}: {where}; check the "
                                    "weights (a NaN or infinity in the checkpoint) and the dtype's range")

    @torch.inference_mode()
    def warm_up(self, batch: int, prompt_len: int) -> float:
        """Run every distinct op placement once at a request's shapes (`Executor.warm_up`), then one whole request
        of two tokens, so that the first request's prefill costs what the plan predicts: cuBLAS handles and
        workspaces, the kernels the libraries pick for these shapes (and their modules, loaded on first use),
        oneDNN's primitives, the allocator's blocks and the pinned host blocks of PCIe crossings are made here.
        Returns (and keeps) its seconds."""
        self._open()
        check_request(self.plan, batch, prompt_len, 2)
        began = time.perf_counter()
        counts = self.backend.transfers
        before = dataclasses.replace(counts, by_value=dict(counts.by_value))
        log = self.executor.streamer.log
        logged = len(log) if log is not None else 0
        try:
            self.executor.warm_up(batch, prompt_len)
            # Then one whole request of two tokens: the pipelined pass keeps more crossings and staging copies in
            # flight than the layer-at-a-time pass above, and the pinned host and allocator blocks they need are
            # made here, not in the first request (measured on the H200: the first timed run of each point was
            # 12-37 % slower without it; bench/results/h200-2026-12-02/README.md, i12-abba).
            self._generate(self.prompts(torch.zeros(batch, prompt_len, dtype=torch.long), None, False)[0], 2,
                           False, Sampler([SamplingParams()] * batch), StopState(batch, (), 0), guard=False)
        except torch.cuda.OutOfMemoryError as e:
            e = _bare(e)
            raise LiacError("host", f"CUDA out of memory while warming up at batch {batch}, prompt {prompt_len}: the "
                                    f"activations do not fit within the plan's GPU budget of "
                                    f"{self.budget.budget_bytes / GIB:.2f} GiB") from e
        finally:  # the transfer counters and stream log are the requests': the warm-up's are dropped (in place:
            for counter in dataclasses.fields(counts):  # steps hold them)
                setattr(counts, counter.name, getattr(before, counter.name))
            if log is not None:
                del log[logged:]
        self.warmup_seconds = time.perf_counter() - began
        self.warmup_request = (batch, prompt_len)
        return self.warmup_seconds

    @torch.inference_mode()
    def profile(self, input_ids, decode_steps: int, attention_mask=None) -> dict[tuple, float]:
        """Per-op mean seconds (per layer, per pass) from a separate synchronised pass: prefill + decode steps.

        Returns (group, sublayers, phase, device) → mean seconds. Not timed with `generate`, so it never slows it.
        """
        self._open()
        batch, _ = self.prompts(input_ids, attention_mask)
        ids = batch.ids
        size, prompt_len = ids.shape
        self.check_request(size, prompt_len, decode_steps + 1)
        executor = self.executor_for(size)
        pad = executor.padding(batch.pad)
        timings: dict[tuple, list[float]] = {}
        frame = executor.forward("prefill", ids, 0, timings, pad=pad)
        feed = executor.decode_embed_device
        for step in range(decode_steps):
            frame = executor.forward("decode", frame.vals["next"][feed], prompt_len + step, timings, pad=pad)
        return {key: sum(values) / len(values) for key, values in timings.items()}

    def memory_report(self) -> dict[str, dict[str, int | bool | None]]:
        """Per tier: bytes the plan reserves (spec.memory), what this run holds (its arenas plus the shared
        HostWeights it uses there), of which shared, the peak seen, and whether the host tiers are page-locked."""
        self._open()
        reserved = self.memory.reserved_bytes()
        placed = {tier: self.memory.placed_in(tier) for tier in TIERS}
        shared = {tier: 0 for tier in TIERS}
        for tier, nbytes in self.shared_bytes.items():
            shared[placed[tier]] += nbytes  # 'cxl' served from DDR counts where it really is
        planned = self.plan.spec.memory
        host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        gpu_peak = self.backend.gpu_peak_bytes()

        def pinned(tier: str) -> bool | None:
            parts = ([self.memory.pinned[tier]] if tier in self.memory.pinned else []) + \
                ([self.shared.pinned] if shared[tier] else [])
            return all(parts) if parts else None  # None: nothing of the run sits there

        budget = self.budget
        context = self.backend.gpu_context_bytes()
        peak_reserved = self.backend.gpu_peak_reserved_bytes()
        return {
            "hbm": {"planned_bytes": planned.hbm_bytes, "reserved_bytes": reserved["hbm"], "shared_bytes": 0,
                    "peak_bytes": gpu_peak, "pinned": None, "budget_bytes": budget.budget_bytes,
                    "workspace_bytes": budget.workspace_bytes, "context_bytes": context,
                    "peak_reserved_bytes": peak_reserved, "budget_enforced": budget.enforced,
                    "peak_footprint_bytes": None if context is None or peak_reserved is None
                    else context + peak_reserved},
            "ddr": {"planned_bytes": planned.ddr_bytes, "reserved_bytes": reserved["ddr"] + shared["ddr"],
                    "shared_bytes": shared["ddr"], "peak_bytes": host_peak, "pinned": pinned("ddr")},
            "cxl": {"planned_bytes": planned.cxl_bytes, "reserved_bytes": reserved["cxl"] + shared["cxl"],
                    "shared_bytes": shared["cxl"], "peak_bytes": reserved["cxl"] + shared["cxl"],
                    "pinned": pinned("cxl")},
        }


def request_limits(plan: OffloadPlan) -> tuple[int, int, int]:
    """(batch, prompt tokens, prompt + new tokens) a plan holds at most: its KV cache is sized for its context."""
    work = plan.spec.workload
    return work.batch_size, work.prompt_len, work.prompt_len + work.gen_len


def check_request(plan: OffloadPlan, batch: int, prompt_len: int, max_new_tokens: int, flags: bool = False) -> None:
    """Refuse a request the plan cannot hold. The plan's workload is a maximum: any batch up to its batch_size and
    any prompt up to its prompt_len run, with as many new tokens as its context (prompt_len + gen_len) leaves, so a
    shorter prompt may generate more than gen_len. (The KV cache and the staging buffers are sized for the plan's
    workload, the activations for its prompt.)

    Args:
        flags: name the lia-run flags ('--prompt-len') in the error instead of the API's arguments.
    """
    work = plan.spec.workload
    name = plan.metadata.name
    for flag, arg, value, limit, what, key in (
            ("--batch", "input_ids", batch, work.batch_size, "batch", "batch_size"),
            ("--prompt-len", "input_ids", prompt_len, work.prompt_len, "prompt length", "prompt_len")):
        if value < 1 or value > limit:
            raise LiacError(flag if flags else arg, f"{what} must be between 1 and {limit} "
                            f"(spec.workload.{key} of plan '{name}'), got {value}")
    context = work.prompt_len + work.gen_len
    most = context - prompt_len
    if max_new_tokens < 1 or max_new_tokens > most:
        raise LiacError("--gen-len" if flags else "max_new_tokens",
                        f"new tokens must be between 1 and {most} (the context of plan '{name}' is "
                        f"spec.workload.prompt_len + gen_len = {context} tokens, the prompt takes {prompt_len}), "
                        f"got {max_new_tokens}")


def _copy_from_shared(shared: HostWeights, store: WeightStore, own: list[tuple[str, str]],
                      progress: Progress) -> None:
    """Fill this engine's own copies ('hbm', or 'cxl' on a CXL node) from the shared host arena."""
    for canonical, tier in own:
        target = store(canonical, tier)
        first = store.first_row(canonical, tier)
        source = shared.tensor(canonical)
        source = source[first:first + target.shape[0]] if target.shape != source.shape else source
        target.copy_(source, non_blocking=True)  # from pinned memory: queued, one sync at the end
        progress.advance(target.numel() * target.element_size())


def _cpu_weights(schedule: Schedule, store: WeightStore) -> list[torch.Tensor]:
    """The distinct 2-D weights CPU ops read (what the small-M kernel choice is measured on)."""
    seen, out = set(), []
    for phase in schedule.phases.values():
        for op in phase.ops:
            if op.device not in ("cpu", "split") or op.weights not in HOST_TIERS or op.kind == "embed":
                continue
            for sublayer in op.sublayers:
                for param in schedule.params[(op.layer_class, op.layer, sublayer)]:
                    if (param.canonical, op.weights) in seen:
                        continue
                    seen.add((param.canonical, op.weights))
                    if len(param.shape) == 2:
                        out.append(store(param.canonical, op.weights))
                    elif op.experts is not None and op.experts.cpu:  # the experts the CPU computes, one by one
                        out.extend(store(param.canonical, op.weights)[:op.experts.cpu])
    return out


def _expert_share(request: str | float, backend: Backend, schedule: Schedule, store: WeightStore,
                  cpu_linear: tuple[str, dict | None], buffers: list[torch.Tensor]) -> ExpertShare | None:
    """The CPU's seconds per expert over PCIe's (`ExpertRun.assign`) for `Engine.from_plan(expert_share=...)`: a
    given number, fixed; None for 'off' or a plan without MoE layers that both compute experts on the CPU and stream
    them; for 'auto' and 'load', the CPU kernel's measured rate (`choose_cpu_linear`) over the rate of copying one host
    expert's weights (pinned) into a staging buffer, timed here (~10 ms), with 'auto' then following the CPU parts'
    host times (runtime/moe.py); None without a GPU or a measured CPU rate."""
    runs = [op for phase in schedule.phases.values() for op in phase.ops
            if op.experts is not None and op.experts.cpu and op.experts.streamed]
    if request == "off" or not runs:
        return None
    if request not in ("auto", "load"):
        return ExpertShare(float(request))
    name, rates = cpu_linear
    if backend.name != "cuda" or not rates or not rates.get(name):
        return None
    op = runs[0]
    param = schedule.params[(op.layer_class, op.layer, "experts")][0]
    host = store(param.canonical, op.weights)[0]  # one expert's gate_up rows, in the host tier
    nbytes = host.numel() * host.element_size()
    if not host.is_pinned() or not buffers or buffers[0].numel() < nbytes:
        return None
    staged = buffers[0][:nbytes].view(host.dtype).view(host.shape)  # an expert slot's room: nothing allocated
    start, end = backend.timing_event(), backend.timing_event()
    staged.copy_(host, non_blocking=True)  # first copy: driver and allocator start-up, not timed
    start.record()
    staged.copy_(host, non_blocking=True)
    end.record()
    end.synchronize()
    h2d = nbytes / max(start.elapsed_time(end) / 1e3, 1e-9) / 1e9
    one_expert = sum(t.numel() * t.element_size() for t in (store(p.canonical, op.weights)[0]
                                                           for p in schedule.params[(op.layer_class, op.layer,
                                                                                     "experts")]))
    return ExpertShare(h2d / rates[name], pcie_seconds=one_expert / (h2d * 1e9), adapt=request == "auto")


def _check_host(plan: OffloadPlan, source: str, backend: Backend, schedule: Schedule, cxl_node: bool,
                arena_bytes: dict[str, int], shared_bytes: int, budget: GpuBudget) -> None:
    """Free GPU memory and available host RAM must cover what the plan reserves and what this run allocates
    (`arena_bytes` per tier; `shared_bytes` of the plan's host tensors already sit in shared HostWeights).

    The GPU's workspace is the compiler's (docs/cost-model.md Eq. 14), inside `spec.memory.hbm_bytes`: the runtime
    keeps no model of its own. The context already exists, so free memory must hold the arena and the workspace."""
    need = arena_bytes
    memory = plan.spec.memory
    gpu_need = 0
    if budget.enforced:
        gpu_need = need["hbm"] + budget.workspace_bytes
    elif schedule.uses_gpu or need["hbm"]:
        gpu_need = max(memory.hbm_bytes, need["hbm"])
    free = backend.gpu_free_bytes()
    if free is not None and gpu_need > free:
        raise LiacError(source, f"needs {gpu_need / GIB:.2f} GiB of GPU memory, {free / GIB:.2f} GiB are free on "
                                f"{backend.describe()} (short by {(gpu_need - free) / GIB:.2f} GiB)",
                        path="spec.memory.hbm_bytes")
    planned_host = memory.ddr_bytes + (0 if cxl_node else memory.cxl_bytes)
    host_need = max(planned_host - shared_bytes, need["ddr"] + (0 if cxl_node else need["cxl"]))
    if free is None:  # emulated: the 'gpu' tier is host memory too
        host_need += gpu_need
    available = host_available_bytes()
    if host_need > available:
        raise LiacError(source, f"needs {host_need / GIB:.2f} GiB of host memory, {available / GIB:.2f} GiB are "
                                f"available (short by {(host_need - available) / GIB:.2f} GiB)",
                        path="spec.memory.ddr_bytes")


def _with_text(out: Generation, text: tuple[str, ...]) -> Generation:
    return replace(out, text=text)


def _bare(error: BaseException) -> BaseException:
    """`error` without its traceback: the frames it holds keep GPU tensors (the arena, activations) alive for as long
    as the caller keeps the error."""
    return error.with_traceback(None)


def _give_back(backend) -> None:
    """After a failed start: collect what the failed engine allocated, lift the cap, hand cached memory back."""
    gc.collect()
    backend.cap(None)
    backend.release_cached()
