"""`OffloadPlan`: the only contract between the compiler and the runtime.

A plan is a Kubernetes-style document:

    apiVersion: liac/v4
    kind: OffloadPlan
    metadata:  name, liac version                       (identity; no timestamps)
    spec:      model, hardware, workload, budgets,      (what the runtime must do; it reads nothing else)
               memory to reserve, execution, layer_groups, serving
    status:    solver report, predicted costs, memory,  (what the compiler observed; the runtime never reads it)
               serving

`spec.layer_groups` lists contiguous ranges of layers sharing one configuration: for each sublayer its placement
in each phase ('cpu', 'gpu', or 'split' between them, with the CPU's share of its output features in permille) and
the tier of its weights, and the tier of the group's KV cache. The embedding and the LM head are groups of class
'embed' and 'head' with one layer each.

A *serving plan* (`liac compile --serve`, issue 15) keeps one memory placement (weight tiers, KV tiers, staging,
all sized for `spec.workload`, whose batch is the largest live batch) and gives, in `spec.serving.batches`, a compute
placement of every group for each live batch size: where each sublayer computes, and its split shares, when that
many sequences decode together. `batch_plan(plan, live)` is the plan of one live batch (what the runtime runs for
it); `spec.serving.batches` is empty for a plan of one workload point.

The frozen dataclasses below are the single source of truth: `load_plan` validates against them (each error names
the YAML path), `plan_json_schema()` generates the JSON Schema shipped in `liac/schema/`, and `dump_plan` writes
sorted keys, rounded floats and nothing else, atomically (liac/fileio.py). Same plan → byte-identical file.
Older apiVersions are migrated on load by the functions beside this module (liac/migrate.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from liac.errors import LiacError, brief
from liac.fileio import read_yaml, write_atomic, yaml_dump
from liac.migrate import LATEST, MIGRATIONS, migrate_document
from liac.models import SUBLAYERS
from liac.models.config import FAMILIES, ModelConfig
from liac.schema_tools import from_data, json_schema, spec_field, to_data

__all__ = [
    "API_VERSION", "KIND", "DEVICES", "PLACEMENTS", "SPLIT_UNITS", "TIERS", "HOST_TIERS", "NO_TIER", "OBJECTIVES",
    "LAYER_CLASSES", "PHASES", "MAX_BATCH", "MAX_TOKENS", "MAX_BYTES", "MAX_WEIGHT", "MAX_LAYERS",
    "MAX_PREFETCH_DEPTH",
    "ModelSpec", "HardwareSpec", "Workload", "Budgets", "TierBytes", "Execution", "ExpertPlacement",
    "SublayerPlacement", "LayerGroup", "EXPERT_SLOTS", "expert_block_rows", "expert_placement", "expert_tier_counts",
    "experts_permille", "experts_from_permille",
    "PlanSpec", "SolverReport", "SublayerTime", "TierUsage", "Predicted", "PlanStatus", "Metadata", "OffloadPlan",
    "ComputePlacement", "GroupPlacement", "ServingBatch", "Serving", "ServingBatchStatus", "ServingStatus",
    "load_plan", "parse_plan", "dump_plan", "plan_to_yaml", "plan_json_schema", "check_semantics", "placement_of",
    "batch_plan", "serving_batch_sizes",
]

API_VERSION = LATEST  # older versions load through liac/migrate.py
KIND = "OffloadPlan"
DEVICES = ("cpu", "gpu")
PLACEMENTS = DEVICES + ("split",)  # where a sublayer computes in one phase
# Sublayers that may split: the weight GEMM units and the LM head (not attention, the embedding, MoE router/experts).
SPLIT_UNITS = ("qkv", "out_proj", "fc1", "fc2", "gate_up", "down", "lm_head")
TIERS = ("hbm", "ddr", "cxl")
HOST_TIERS = ("ddr", "cxl")  # host memory: a GPU computing on an operand here streams it over PCIe
NO_TIER = "none"
OBJECTIVES = ("latency", "throughput")
LAYER_CLASSES = ("embed", "decoder", "head")
PHASES = ("prefill", "decode")
SOLVER_STATUSES = ("optimal", "feasible", "fixed")  # 'fixed': a hand-written or fixed-policy plan, not solved
# Physical ranges of the plan's integers (beyond them a number is a typo or an attack, and would overflow the
# int64 arithmetic of the cost model): `liac compile` checks its flags against the same limits.
MAX_BATCH = 2**20
MAX_TOKENS = 2**24  # prompt or generated tokens per sequence
MAX_BYTES = 2**60  # any byte count (1 EiB)
MAX_WEIGHT = 2**31 - 1  # a serving batch size's weight in the objective
MAX_LAYERS = 2**20
MAX_PREFETCH_DEPTH = 64
# Routed experts streamed to the GPU pass through this many slots of one expert each, in the staging buffer of their
# layer after its other streamed tensors: the copy of the next routed expert overlaps the compute of the current one.
EXPERT_SLOTS = 2


def expert_block_rows(tokens: int, top_k: int, num_experts: int) -> int:
    """The most tokens one expert computes at once where memory is budgeted (the GPU): a step's tokens·k assignments
    spread evenly over the experts, ⌈n·k / E⌉ rows, what the cost model prices an expert's intermediates at (Eq. 14,
    passes/costs.py `experts_transient_bytes`). The runtime computes an expert routed more tokens in blocks of this
    many (liac.models.mixtral `experts_partial`)."""
    return max(1, -(-tokens * top_k // num_experts))


@dataclass(frozen=True)
class ModelSpec:
    """The model the plan is for; `config` is the full architecture, `config_sha256` its hash."""

    name: str = spec_field("model name (zoo name or checkpoint directory name)")
    family: str = spec_field("model family", enum=FAMILIES)
    config_sha256: str = spec_field("sha256 of the architecture (ModelConfig.sha256())", pattern="[0-9a-f]{64}")
    config: dict = spec_field("the architecture, as ModelConfig.to_dict()")


@dataclass(frozen=True)
class HardwareSpec:
    """The hardware profile the plan was compiled for."""

    profile: str = spec_field("hardware profile name")
    sha256: str = spec_field("sha256 of the profile's canonical form", pattern="[0-9a-f]{64}")


@dataclass(frozen=True)
class Workload:
    """The workload point this plan is optimal for."""

    batch_size: int = spec_field("sequences decoded together", minimum=1, maximum=MAX_BATCH)
    prompt_len: int = spec_field("prompt tokens per sequence", minimum=1, maximum=MAX_TOKENS)
    gen_len: int = spec_field("new tokens generated per sequence", minimum=1, maximum=MAX_TOKENS)
    objective: str = spec_field("what the solver minimised: end-to-end latency, or time per token at this batch",
                                enum=OBJECTIVES)


@dataclass(frozen=True)
class Budgets:
    """Memory the compiler was allowed to use, per tier, in bytes."""

    gpu_bytes: int = spec_field("GPU memory budget (weights, KV cache, activations, staging buffers)", minimum=0,
                                maximum=MAX_BYTES)
    cpu_bytes: int = spec_field("host DDR budget", minimum=0, maximum=MAX_BYTES)
    cxl_bytes: int = spec_field("CXL memory budget (0 when the profile has none)", minimum=0, maximum=MAX_BYTES)


@dataclass(frozen=True)
class TierBytes:
    """Bytes per memory tier."""

    hbm_bytes: int = spec_field("GPU HBM bytes", minimum=0, maximum=MAX_BYTES)
    ddr_bytes: int = spec_field("host DDR bytes", minimum=0, maximum=MAX_BYTES)
    cxl_bytes: int = spec_field("CXL memory bytes", minimum=0, maximum=MAX_BYTES)


@dataclass(frozen=True)
class Execution:
    """How the runtime overlaps transfers with compute."""

    prefetch_depth: int = spec_field("layers whose streamed weights are copied ahead of compute (1 = double "
                                     "buffering, 0 = no streaming)", minimum=0,
                                     maximum=MAX_PREFETCH_DEPTH)
    staging_bytes: int = spec_field("GPU bytes of one staging buffer for streamed weights and KV of one layer",
                                    minimum=0, maximum=MAX_BYTES)
    prefill_microbatch_sequences: int = spec_field("the prefill runs layer by layer in micro-batches of this many "
                                                   "sequences (spec.workload.batch_size: the whole batch at once)",
                                                   minimum=1, maximum=MAX_BATCH)
    prefill_microbatch_tokens: int = spec_field("... and of this many prompt tokens, each chunk attending to the "
                                                "ones before it (spec.workload.prompt_len: whole prompts)",
                                                minimum=1, maximum=MAX_TOKENS)
    workspace_bytes: int = spec_field("GPU bytes the runtime's allocator may hold beyond its arena (weights, KV "
                                      "caches, staging buffers): activations and the GPU libraries' workspaces, "
                                      "reserved up front; the rest of memory.hbm_bytes beyond the arena is the "
                                      "CUDA context (docs/cost-model.md Eq. 14). 0: not recorded (plans written "
                                      "before it was)", minimum=0, maximum=MAX_BYTES, default=0)


@dataclass(frozen=True)
class ExpertPlacement:
    """Where the experts of an MoE `experts` sublayer live and compute, as counts: under uniform routing the experts
    of a layer are interchangeable, so a plan says how many, and the runtime takes them in index order.

    Experts [0, hbm) are resident in HBM and computed on the GPU. The others live in the sublayer's `weights` tier
    ('ddr' or 'cxl'); in each phase the first `<phase>_cpu` of them, experts [hbm, hbm + cpu), are computed on the
    CPU where they lie, and the rest are streamed to the GPU (only those the step's tokens are routed to) through
    `EXPERT_SLOTS` slots in their layer's staging buffer. The sublayer's placement in a phase follows: 'cpu' when
    the CPU computes every expert, 'gpu' when it computes none, else 'split', with `<phase>_cpu_permille` =
    1000 · cpu // num_experts.
    """

    hbm: int = spec_field("experts resident in HBM and computed on the GPU (experts [0, hbm) of each layer)",
                          minimum=0)
    prefill_cpu: int = spec_field("experts the CPU computes during prefill, from the `weights` tier (the next ones "
                                  "after the resident ones); the remaining ones are streamed to the GPU", minimum=0)
    decode_cpu: int = spec_field("experts the CPU computes during decode (as prefill_cpu)", minimum=0)

    def cpu(self, phase: str) -> int:
        return self.prefill_cpu if phase == "prefill" else self.decode_cpu

    def streamed(self, phase: str, num_experts: int) -> int:
        """Experts streamed to the GPU in `phase`: the ones neither resident nor computed on the CPU."""
        return num_experts - self.hbm - self.cpu(phase)


@dataclass(frozen=True)
class SublayerPlacement:
    """Where one sublayer computes in each phase, and where its weights live.

    A 'split' sublayer computes its output features [0, r) on the CPU, from its weights' tier ('ddr' or 'cxl'),
    and [r, N) on the GPU, from weights streamed to it, at the same time; r = N · cpu_permille // 1000. N is the
    unit's logical output features: qkv (H + 2G)·E rows of the fused [Q; K; V] output; out_proj, fc2, down D; fc1
    F; gate_up F of the activated output (gate rows [0, r) and up rows [0, r) go to the CPU, so silu(gate)·up
    stays on one device); lm_head the vocabulary. The parts are concatenated on the device of the consuming
    sublayer (each device that computes part of it); for out_proj, fc2 and down the residual add follows the merge
    there. Whole placements are the special cases: 'cpu' is 1000 permille, 'gpu' 0.
    """

    name: str = spec_field("sublayer name (qkv, attn_score, attn_context, out_proj, fc1, fc2, gate_up, down, "
                           "router, experts, embed, lm_head)")
    prefill: str = spec_field("compute placement during prefill: the CPU, the GPU, or split between them",
                              enum=PLACEMENTS)
    decode: str = spec_field("compute placement during decode", enum=PLACEMENTS)
    weights: str = spec_field("memory tier of the sublayer's weights ('none' when it has none)",
                              enum=TIERS + (NO_TIER,))
    prefill_cpu_permille: int = spec_field("share of the output features the CPU computes during prefill, in "
                                           "permille: 1000 for 'cpu', 0 for 'gpu', 1..999 for 'split'",
                                           minimum=0, maximum=1000)
    decode_cpu_permille: int = spec_field("share of the output features the CPU computes during decode, in "
                                          "permille (as prefill_cpu_permille)", minimum=0, maximum=1000)
    experts: ExpertPlacement | None = spec_field("MoE `experts` sublayers only: how many experts are resident in "
                                                 "HBM and how many the CPU computes in each phase (absent: every "
                                                 "expert in `weights`, computed where the phases say, as in plans "
                                                 "written before it)", default=None)

    @staticmethod
    def whole(name: str, prefill: str, decode: str, weights: str) -> "SublayerPlacement":
        """A placement without splits: each phase wholly on 'cpu' or 'gpu' (permille 1000 or 0)."""
        permille = {"cpu": 1000, "gpu": 0}
        return SublayerPlacement(name, prefill, decode, weights, permille.get(prefill, 0), permille.get(decode, 0))

    def cpu_permille(self, phase: str) -> int:
        return self.prefill_cpu_permille if phase == "prefill" else self.decode_cpu_permille


@dataclass(frozen=True)
class LayerGroup:
    """A contiguous range of layers of one class that share a configuration."""

    name: str = spec_field("group name, unique in the plan")
    layer_class: str = spec_field("layer class", enum=LAYER_CLASSES)
    first_layer: int = spec_field("index of the first layer of the range within its class", minimum=0,
                                  maximum=MAX_LAYERS)
    layer_count: int = spec_field("number of layers in the range", minimum=1, maximum=MAX_LAYERS)
    kv_cache: str = spec_field("memory tier of the group's KV cache ('none' for embed/head)",
                               enum=TIERS + (NO_TIER,))
    sublayers: tuple[SublayerPlacement, ...] = spec_field("placement units in execution order")


@dataclass(frozen=True)
class ComputePlacement:
    """Where one sublayer computes in each phase at one live batch size of a serving plan; its weights stay in the
    tier its entry in `spec.layer_groups` names (the fields mean what they mean there)."""

    name: str = spec_field("sublayer name, as in the group's spec.layer_groups entry (same order)")
    prefill: str = spec_field("compute placement during prefill", enum=PLACEMENTS)
    decode: str = spec_field("compute placement during decode", enum=PLACEMENTS)
    prefill_cpu_permille: int = spec_field("the CPU's share of the output features during prefill, in permille",
                                           minimum=0, maximum=1000)
    decode_cpu_permille: int = spec_field("the CPU's share of the output features during decode, in permille",
                                          minimum=0, maximum=1000)


@dataclass(frozen=True)
class GroupPlacement:
    """The compute placement of one layer group of `spec.layer_groups` at one live batch size."""

    name: str = spec_field("group name: the spec.layer_groups entry at the same position")
    sublayers: tuple[ComputePlacement, ...] = spec_field("placement units in execution order")


@dataclass(frozen=True)
class ServingBatch:
    """One live batch size of a serving plan: its weight in the objective and its compute placement."""

    batch_size: int = spec_field("sequences decoding together", minimum=1, maximum=MAX_BATCH)
    weight: int = spec_field("relative weight of this batch size in the objective (the batch distribution; each "
                             "share is weight / sum of weights)", minimum=0, maximum=MAX_WEIGHT)
    layer_groups: tuple[GroupPlacement, ...] = spec_field("one entry per spec.layer_groups entry, in the same order")


@dataclass(frozen=True)
class Serving:
    """Compute placements per live batch size over the plan's one memory placement (a serving plan)."""

    batches: tuple[ServingBatch, ...] = spec_field(
        "live batch sizes, ascending, the largest equal to spec.workload.batch_size (whose placement equals "
        "spec.layer_groups'); empty for a plan of one workload point")


@dataclass(frozen=True)
class PlanSpec:
    """Everything the runtime needs."""

    model: ModelSpec = spec_field("the model")
    hardware: HardwareSpec = spec_field("the hardware profile compiled for")
    workload: Workload = spec_field("the workload point")
    budgets: Budgets = spec_field("memory budgets given to the compiler")
    memory: TierBytes = spec_field("bytes the runtime reserves per tier (weights, KV, staging, workspace)")
    execution: Execution = spec_field("transfer/compute overlap")
    layer_groups: tuple[LayerGroup, ...] = spec_field("embed group, decoder groups in layer order, head group")
    serving: Serving = spec_field("per live batch size, its compute placement (serving plans; else empty)")


@dataclass(frozen=True)
class SolverReport:
    """How the placement was found."""

    name: str = spec_field("solver (e.g. 'PULP_CBC_CMD', 'HiGHS', 'fixed')")
    status: str = spec_field("solution status", enum=SOLVER_STATUSES)
    objective_seconds: float = spec_field("objective value in seconds", minimum=0)
    gap: float = spec_field("relative optimality gap proven by the solver (0 = optimal)", minimum=0)


@dataclass(frozen=True)
class SublayerTime:
    """Predicted time of one sublayer in one layer of a group, in one phase (decode: mean over the steps)."""

    group: str = spec_field("layer group name")
    name: str = spec_field("sublayer name")
    phase: str = spec_field("phase", enum=PHASES)
    device: str = spec_field("compute placement", enum=PLACEMENTS)
    compute_seconds: float = spec_field("roofline compute time (split: the slower of its two parts)", minimum=0)
    transfer_seconds: float = spec_field("activation / KV-write transfers charged to this sublayer", minimum=0)
    stream_seconds: float = spec_field("weights and KV streamed to the GPU for it (overlapped with compute)",
                                       minimum=0)


@dataclass(frozen=True)
class TierUsage:
    """Memory use of one tier against its capacity."""

    tier: str = spec_field("memory tier", enum=TIERS)
    used_bytes: int = spec_field("bytes the plan places in the tier", minimum=0, maximum=MAX_BYTES)
    capacity_bytes: int = spec_field("budget of the tier", minimum=0, maximum=MAX_BYTES)


@dataclass(frozen=True)
class Predicted:
    """The cost model's prediction for the plan."""

    prefill_seconds: float = spec_field("prefill of the whole batch", minimum=0)
    decode_seconds: float = spec_field("all decode steps", minimum=0)
    decode_seconds_per_token: float = spec_field("mean decode step", minimum=0)
    total_seconds: float = spec_field("prefill + decode", minimum=0)
    tokens_per_second: float = spec_field("generated tokens (batch × gen_len) per total second", minimum=0)
    sublayers: tuple[SublayerTime, ...] = spec_field("per-sublayer breakdown")


@dataclass(frozen=True)
class ServingBatchStatus:
    """The predicted cost of one live batch size of a serving plan, beside that batch size's own optimum."""

    batch_size: int = spec_field("sequences decoding together", minimum=1, maximum=MAX_BATCH)
    share: float = spec_field("its weight in the objective, as a fraction of all weights", minimum=0)
    prefill_seconds: float = spec_field("prefill of a batch this size, with its placement", minimum=0)
    decode_seconds_per_token: float = spec_field("mean decode step of a batch this size", minimum=0)
    step_seconds: float = spec_field("(prefill + all decode steps) / gen_len: its time per generated token with the "
                                     "prefill amortised, what the objective weighs", minimum=0)
    own_step_seconds: float = spec_field("the same for this batch size's own optimum (a plan compiled for it alone, "
                                         "memory placement free, KV cache for this batch): sharing one memory "
                                         "placement costs step_seconds / own_step_seconds - 1", minimum=0)


@dataclass(frozen=True)
class ServingStatus:
    """What sharing one memory placement costs each live batch size (serving plans; else empty)."""

    batches: tuple[ServingBatchStatus, ...] = spec_field("per live batch size, ascending")


@dataclass(frozen=True)
class PlanStatus:
    """What the compiler observed."""

    solver: SolverReport = spec_field("solver report")
    predicted: Predicted = spec_field("predicted costs")
    memory: tuple[TierUsage, ...] = spec_field("peak memory per tier against its budget")
    serving: ServingStatus = spec_field("per live batch size of a serving plan, its predicted cost and its own "
                                        "optimum's")


@dataclass(frozen=True)
class Metadata:
    """Identity of the plan."""

    name: str = spec_field("plan name: <model>.<profile>.b<batch>-p<prompt>-g<gen>")
    liac_version: str = spec_field("liac version that wrote the plan")


@dataclass(frozen=True)
class OffloadPlan:
    """An offload plan (see the module docstring)."""

    apiVersion: str = spec_field("schema version", enum=(API_VERSION,))
    kind: str = spec_field("document kind", enum=(KIND,))
    metadata: Metadata = spec_field("identity")
    spec: PlanSpec = spec_field("desired execution")
    status: PlanStatus = spec_field("compiler's observations")

    @property
    def model_config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.spec.model.config, source="spec.model.config")


# ---------------------------------------------------------------------------------------------------------------
# Reading: an older document is migrated step by step to API_VERSION (liac/migrate.py) before validation.


def parse_plan(doc: Any, source: str = "plan") -> OffloadPlan:
    """Plain data (from YAML) → validated OffloadPlan; older apiVersions are migrated first."""
    if not isinstance(doc, dict):
        raise LiacError(source, "must be a YAML mapping with apiVersion, kind, metadata, spec, status")
    version = doc.get("apiVersion")
    known = sorted({API_VERSION, *MIGRATIONS})
    if version not in known:
        raise LiacError(source, f"unsupported value {brief(version)}: must be one of "
                        + ", ".join(f"'{v}'" for v in known), path="apiVersion")
    doc = migrate_document(doc, source)
    plan = from_data(OffloadPlan, doc, source)
    errors = check_semantics(plan)
    if errors:
        path, message = errors[0]
        raise LiacError(source, message, path=path)
    return plan


def load_plan(path: str | os.PathLike) -> OffloadPlan:
    """Read and validate a plan file (YAML: safe types, no aliases, bounded size; `liac.fileio.read_yaml`)."""
    return parse_plan(read_yaml(path), str(path))


def _layer_span(first: int, last: int) -> str:
    return f"layer {first} is" if first == last else f"layers {first}..{last} are"


_WHOLE_PERMILLE = {"cpu": 1000, "gpu": 0}  # the CPU's share of a unit placed wholly on one device


def placement_of(cpu_permille: int) -> str:
    """The placement of a unit whose CPU share is `cpu_permille`: 'cpu' (1000), 'gpu' (0) or 'split'."""
    return {1000: "cpu", 0: "gpu"}.get(cpu_permille, "split")


def expert_placement(sub: SublayerPlacement, num_experts: int) -> ExpertPlacement:
    """The expert counts of an `experts` sublayer: its `experts` record, or for a plan without one (written before
    the record existed) the whole-unit reading: every expert in `weights`, computed where each phase says."""
    if sub.experts is not None:
        return sub.experts
    whole = {"cpu": num_experts, "gpu": 0}
    return ExpertPlacement(num_experts if sub.weights == "hbm" else 0, whole.get(sub.prefill, 0),
                           whole.get(sub.decode, 0))


def expert_tier_counts(sub: SublayerPlacement, num_experts: int) -> dict[str, int]:
    """Experts per tier of an `experts` sublayer: the resident ones in 'hbm', the others in its `weights` tier."""
    placed = expert_placement(sub, num_experts)
    out = {"hbm": placed.hbm} if placed.hbm else {}
    if num_experts - placed.hbm:
        out[sub.weights] = out.get(sub.weights, 0) + num_experts - placed.hbm
    return out


def experts_permille(cpu_experts: int, num_experts: int) -> int:
    """The CPU's share, in permille, of an `experts` sublayer whose CPU computes `cpu_experts` experts."""
    return 1000 * cpu_experts // num_experts


def experts_from_permille(permille: int, num_experts: int) -> int:
    """The inverse of `experts_permille` (exact for up to 1000 experts): the CPU's expert count at a share."""
    return -(-permille * num_experts // 1000)


def _expert_errors(sub: SublayerPlacement, num_experts: int, where: str) -> list[tuple[str, str]]:
    """An `experts` record must fit the layer's experts and agree with the sublayer's tier, placements, permille."""
    placed = sub.experts
    if num_experts == 0:
        return [(f"{where}.experts", "must be absent: the model has no experts")]
    errors = []
    for field, value in (("hbm", placed.hbm), ("prefill_cpu", placed.hbm + placed.prefill_cpu),
                         ("decode_cpu", placed.hbm + placed.decode_cpu)):
        if value > num_experts:
            what = "must be at most" if field == "hbm" else "plus hbm must be at most"
            errors.append((f"{where}.experts.{field}", f"{what} the layer's {num_experts} experts, got "
                                                       f"{getattr(placed, field)}"))
    if errors:
        return errors
    want_tier = "'hbm'" if placed.hbm == num_experts else "'ddr' or 'cxl'"
    if (placed.hbm == num_experts) != (sub.weights == "hbm") or sub.weights == NO_TIER:
        errors.append((f"{where}.weights", f"must be {want_tier} with {placed.hbm} of {num_experts} experts in "
                                           f"HBM, got '{sub.weights}'"))
    for phase in PHASES:
        cpu = placed.cpu(phase)
        want = "cpu" if cpu == num_experts else "gpu" if cpu == 0 else "split"
        if getattr(sub, phase) != want:
            errors.append((f"{where}.{phase}", f"must be '{want}' with {cpu} of {num_experts} experts on the CPU in "
                                               f"{phase}, got '{getattr(sub, phase)}'"))
        elif sub.cpu_permille(phase) != experts_permille(cpu, num_experts):
            errors.append((f"{where}.{phase}_cpu_permille", f"must be {experts_permille(cpu, num_experts)} "
                                                            f"(1000 · {cpu} // {num_experts}), got "
                                                            f"{sub.cpu_permille(phase)}"))
    return errors


def _split_errors(sub: SublayerPlacement, where: str, weights_where: str = "") -> list[tuple[str, str]]:
    """A sublayer's permille must match its placement; only weight GEMM units split, and from DDR or CXL."""
    errors = []
    for phase in PHASES:
        placement, permille = getattr(sub, phase), sub.cpu_permille(phase)
        if placement in _WHOLE_PERMILLE and permille != _WHOLE_PERMILLE[placement]:
            errors.append((f"{where}.{phase}_cpu_permille", f"must be {_WHOLE_PERMILLE[placement]} for '{placement}' "
                                                            f"in {phase}, got {permille}"))
        if placement == "split":
            if not 0 < permille < 1000:
                errors.append((f"{where}.{phase}_cpu_permille", f"must be 1..999 for 'split' in {phase}, got "
                                                                f"{permille}"))
            if sub.name not in SPLIT_UNITS:
                errors.append((f"{where}.{phase}", "must not be 'split': only "
                                                   + ", ".join(f"'{u}'" for u in SPLIT_UNITS) + " may split"))
    if "split" in (sub.prefill, sub.decode) and sub.name in SPLIT_UNITS and sub.weights not in HOST_TIERS:
        if not weights_where or weights_where.startswith(where):
            errors.append((f"{where}.weights", f"must be 'ddr' or 'cxl' for a split sublayer, got '{sub.weights}'"))
        else:
            phase = "prefill" if sub.prefill == "split" else "decode"
            errors.append((f"{where}.{phase}", f"must not be 'split': the sublayer's weights are in "
                                               f"'{sub.weights}' ({weights_where}); only 'ddr' or 'cxl' weights split"))
    return errors


def _microbatch_errors(spec: PlanSpec) -> list[tuple[str, str]]:
    """A prefill micro-batch is at most the whole batch and the whole prompt."""
    errors = []
    for name, limit, what in (("sequences", spec.workload.batch_size, "spec.workload.batch_size"),
                              ("tokens", spec.workload.prompt_len, "spec.workload.prompt_len")):
        value = getattr(spec.execution, f"prefill_microbatch_{name}")
        if value > limit:
            errors.append((f"spec.execution.prefill_microbatch_{name}", f"must be at most {what} ({limit}), got "
                                                                         f"{value}"))
    return errors


def check_semantics(plan: OffloadPlan) -> list[tuple[str, str]]:
    """Checks the schema cannot express. Returns (yaml path, message) pairs; empty when the plan is sound."""
    errors: list[tuple[str, str]] = []
    spec = plan.spec
    try:
        cfg = plan.model_config
    except LiacError as e:
        return [(f"spec.model.config.{e.path}" if e.path else "spec.model.config", e.message)]
    if cfg.sha256() != spec.model.config_sha256:
        errors.append(("spec.model.config_sha256", f"must be the sha256 of spec.model.config ('{cfg.sha256()[:12]}"
                                                   f"…'), got '{spec.model.config_sha256[:12]}…'"))
    if cfg.family != spec.model.family:
        errors.append(("spec.model.family", f"must equal spec.model.config.family '{cfg.family}'"))
    expected_units = {"embed": ("embed",), "decoder": SUBLAYERS[cfg.family], "head": ("lm_head",)}
    next_layer = {"embed": 0, "decoder": 0, "head": 0}
    previous: dict[str, int] = {}  # layer class → index of its latest group, to name it in an overlap
    names = set()
    for index, group in enumerate(spec.layer_groups):
        where = f"spec.layer_groups[{index}]"
        if group.name in names:
            errors.append((f"{where}.name", f"duplicate group name '{group.name}'"))
        names.add(group.name)
        want_first = next_layer[group.layer_class]
        if group.first_layer != want_first:
            if group.first_layer < want_first:  # only possible after an earlier group of the class
                why = (f"{_layer_span(group.first_layer, want_first - 1)} also in "
                       f"spec.layer_groups[{previous[group.layer_class]}]")
            else:
                why = f"{_layer_span(want_first, group.first_layer - 1)} not covered"
            errors.append((f"{where}.first_layer", f"must be {want_first} (layer ranges of class "
                                                   f"'{group.layer_class}' must be contiguous, in order: {why})"))
        next_layer[group.layer_class] = group.first_layer + group.layer_count
        previous[group.layer_class] = index
        got = tuple(s.name for s in group.sublayers)
        want = expected_units[group.layer_class]
        if got != want:
            errors.append((f"{where}.sublayers", f"must name {', '.join(want)} in this order, got "
                                                 f"{', '.join(got) or 'none'}"))
        decoder = group.layer_class == "decoder"
        if decoder == (group.kv_cache == NO_TIER):
            errors.append((f"{where}.kv_cache", "must be one of 'hbm', 'ddr', 'cxl' for decoder groups and 'none' "
                                                "otherwise"))
        for position, sub in enumerate(group.sublayers):
            sub_where = f"{where}.sublayers[{position}]"
            has_weights = sub.name not in ("attn_score", "attn_context")
            if has_weights and sub.weights == NO_TIER:
                errors.append((f"{sub_where}.weights", "must be one of 'hbm', 'ddr', 'cxl': the sublayer has weights"))
            if not has_weights and sub.weights != NO_TIER:
                errors.append((f"{sub_where}.weights", "must be 'none': the sublayer has no weights"))
            if sub.experts is not None:
                if sub.name != "experts" or not decoder:
                    errors.append((f"{sub_where}.experts", "must be absent: only a decoder's 'experts' sublayer "
                                                           "places experts"))
                else:
                    errors.extend(_expert_errors(sub, cfg.num_experts, sub_where))
                continue
            errors.extend(_placement_errors(sub, group, sub_where, f"{sub_where}.weights"))
    errors.extend(_microbatch_errors(spec))
    want_layers = {"embed": 1, "decoder": cfg.num_layers, "head": 1}
    for layer_class, count in want_layers.items():
        if next_layer[layer_class] != count:
            errors.append(("spec.layer_groups", f"layers of class '{layer_class}' must cover 0..{count - 1}, "
                                                f"covered 0..{next_layer[layer_class] - 1}"))
    errors.extend(_serving_errors(spec, cfg.num_experts))
    return errors


def _placement_errors(sub: SublayerPlacement, group: LayerGroup, where: str,
                      weights_where: str) -> list[tuple[str, str]]:
    """A sublayer's compute placement against its weights' tier and its group's KV tier (`weights_where` is the path
    of the tier it is checked against: its own field, or the group's in spec.layer_groups for a serving batch)."""
    errors = []
    if sub.weights == "hbm" and "cpu" in (sub.prefill, sub.decode):
        if weights_where.startswith(where):
            errors.append((weights_where, "must not be 'hbm' for a sublayer computed on the CPU"))
        else:
            phase = "prefill" if sub.prefill == "cpu" else "decode"
            errors.append((f"{where}.{phase}", f"must not be 'cpu': the sublayer's weights are in 'hbm' "
                                               f"({weights_where})"))
    errors.extend(_split_errors(sub, where, weights_where))
    if group.layer_class == "decoder" and sub.name in ("attn_score", "attn_context") and group.kv_cache == "hbm" \
            and sub.decode == "cpu":
        errors.append((f"{where}.decode", "must be 'gpu': the group's KV cache is in 'hbm'"))
    return errors


def _serving_errors(spec: PlanSpec, num_experts: int = 0) -> list[tuple[str, str]]:
    """A serving plan's batches: ascending sizes ending at the workload's batch, weights that sum above 0, and per
    batch a placement of every group and sublayer of spec.layer_groups that its tiers allow. A mixture-of-experts
    model has none (its experts are placed by count, which a serving batch does not record)."""
    errors: list[tuple[str, str]] = []
    batches = spec.serving.batches
    if not batches:
        return errors
    if num_experts:
        return [("spec.serving.batches", f"must be empty: the model is a mixture of experts ({num_experts} experts), "
                                         "which serving plans do not place")]
    sizes = [b.batch_size for b in batches]
    for index in range(1, len(sizes)):
        if sizes[index] <= sizes[index - 1]:
            errors.append((f"spec.serving.batches[{index}].batch_size", f"must be greater than "
                                                                        f"{sizes[index - 1]}: batch sizes ascend"))
    if sizes[-1] != spec.workload.batch_size:
        errors.append((f"spec.serving.batches[{len(sizes) - 1}].batch_size", f"must equal spec.workload.batch_size "
                                                                              f"({spec.workload.batch_size}), got "
                                                                              f"{sizes[-1]}"))
    if sum(b.weight for b in batches) <= 0:
        errors.append(("spec.serving.batches", "weights must not all be 0"))
    for b_index, batch in enumerate(batches):
        b_where = f"spec.serving.batches[{b_index}]"
        if len(batch.layer_groups) != len(spec.layer_groups):
            errors.append((f"{b_where}.layer_groups", f"must hold one entry per spec.layer_groups entry "
                                                      f"({len(spec.layer_groups)}), got {len(batch.layer_groups)}"))
            continue
        for g_index, (placed, group) in enumerate(zip(batch.layer_groups, spec.layer_groups)):
            g_where = f"{b_where}.layer_groups[{g_index}]"
            if placed.name != group.name:
                errors.append((f"{g_where}.name", f"must be '{group.name}', the name of spec.layer_groups[{g_index}]"))
            got = tuple(s.name for s in placed.sublayers)
            want = tuple(s.name for s in group.sublayers)
            if got != want:
                errors.append((f"{g_where}.sublayers", f"must name {', '.join(want)} in this order, got "
                                                       f"{', '.join(got) or 'none'}"))
                continue
            for s_index, (compute, sub) in enumerate(zip(placed.sublayers, group.sublayers)):
                whole = _with_compute(sub, compute)
                errors.extend(_placement_errors(whole, group, f"{g_where}.sublayers[{s_index}]",
                                                f"spec.layer_groups[{g_index}].sublayers[{s_index}].weights"))
                if batch.batch_size == spec.workload.batch_size and whole != sub:
                    errors.append((f"{g_where}.sublayers[{s_index}]", "must equal spec.layer_groups[{}]."
                                   "sublayers[{}]'s placement: it is the placement at spec.workload.batch_size"
                                   .format(g_index, s_index)))
    return errors


def _with_compute(sub: SublayerPlacement, compute: ComputePlacement) -> SublayerPlacement:
    """`sub` (its name and weights' tier) computed as `compute` says."""
    return SublayerPlacement(sub.name, compute.prefill, compute.decode, sub.weights, compute.prefill_cpu_permille,
                             compute.decode_cpu_permille)


def serving_batch_sizes(plan: OffloadPlan) -> tuple[int, ...]:
    """The live batch sizes a plan has a compute placement for: a serving plan's, else its one workload batch."""
    batches = plan.spec.serving.batches
    return tuple(b.batch_size for b in batches) if batches else (plan.spec.workload.batch_size,)


def batch_plan(plan: OffloadPlan, live: int) -> OffloadPlan:
    """The plan a live batch of `live` sequences runs: the serving batch with the smallest size that holds it, its
    compute placement over the plan's memory placement (weight and KV tiers, staging, reservations unchanged), with
    `spec.workload.batch_size` that size (and the prefill micro-batch at most that many sequences) and no serving
    batches. A plan without serving batches is returned as is.

    Raises:
        LiacError: `live` is not between 1 and spec.workload.batch_size.
    """
    if not 1 <= live <= plan.spec.workload.batch_size:
        raise LiacError("batch", f"live batch must be between 1 and {plan.spec.workload.batch_size} "
                        f"(spec.workload.batch_size of plan '{plan.metadata.name}'), got {live}")
    batches = plan.spec.serving.batches
    if not batches:
        return plan
    chosen = next(b for b in batches if b.batch_size >= live)
    groups = tuple(dataclasses.replace(group, sublayers=tuple(_with_compute(sub, compute) for sub, compute in
                                                               zip(group.sublayers, placed.sublayers)))
                   for group, placed in zip(plan.spec.layer_groups, chosen.layer_groups))
    execution = plan.spec.execution  # its prefill micro-batch: at most the live batch's sequences
    execution = dataclasses.replace(execution, prefill_microbatch_sequences=min(
        execution.prefill_microbatch_sequences, chosen.batch_size))
    spec = dataclasses.replace(plan.spec, workload=dataclasses.replace(plan.spec.workload,
                                                                       batch_size=chosen.batch_size),
                               execution=execution, layer_groups=groups, serving=Serving(batches=()))
    return dataclasses.replace(plan, spec=spec)


# ---------------------------------------------------------------------------------------------------------------
# Writing


def plan_to_yaml(plan: OffloadPlan) -> str:
    return yaml_dump(to_data(plan))


def dump_plan(plan: OffloadPlan, path: str | os.PathLike) -> None:
    errors = check_semantics(plan)
    if errors:  # the compiler must never write a plan the runtime would refuse
        raise ValueError(f"refusing to write an invalid plan: {errors[0][0]}: {errors[0][1]}")
    write_atomic(path, plan_to_yaml(plan))


def plan_json_schema() -> dict[str, Any]:
    return json_schema(OffloadPlan, title=f"liac OffloadPlan ({API_VERSION})")


def schema_text() -> str:
    return json.dumps(plan_json_schema(), indent=2, sort_keys=True) + "\n"
