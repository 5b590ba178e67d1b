"""The placement ILP's records, shared by its modules: how to solve (`SolverOptions`), one column of the master
problem, a layer's configuration (`LayerConfig`), the choice (`LayerChoice`, `Assignment`) and what proves it
optimal (`Certificate`).

passes/ilp.py generates the configurations, passes/ilp_master.py and passes/ilp_knapsack.py choose among them,
passes/ilp_check.py re-verifies the choice; all of them import these records from here, so none of them imports
another one back.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from liac.passes.costs import Microbatch

__all__ = ["SolverOptions", "LayerConfig", "ConfigList", "config_arrays", "LayerChoice", "Assignment",
           "Certificate"]


@dataclass(frozen=True)
class SolverOptions:
    """How to solve; nothing about the problem itself (that is the CostGraph)."""

    solver: str = "auto"  # 'auto' (HiGHS when highspy is installed, else CBC), 'cbc' or 'highs'
    threads: int = 1  # one thread keeps runs deterministic
    # Work limits, never time limits, so a result never depends on the machine's load: states one level's exact
    # enumeration may generate before the ILP solver takes the level, and branch-and-bound nodes the ILP solver
    # may explore there (past them the plan is reported 'feasible' with its proven gap).
    max_states: int = 200_000
    node_limit: int = 100_000
    policy: str | None = None  # None (free), a POLICIES name or 'whole' for both phases, or 'PREFILL/DECODE'
    max_split_units: int = 1  # split units per layer and phase (docs/cost-model.md §3: why one is enough)
    resident_layers: bool = True  # LIA's Optimization-1: a decoder layer may keep all its weights in HBM


@dataclass(frozen=True)
class LayerConfig:
    """One configuration of one layer of a class: tiers, placements and what it costs.

    Attributes:
        weights: per unit, the tier of its weights ('none' for units without weights).
        kv_cache: tier of the layer's KV cache ('none' for embed/head).
        prefill_cpu_permille: per unit, the CPU's share of its output features during prefill, in permille:
            1000 = CPU, 0 = GPU, in between a split.
        decode_cpu_permille: per unit, during decode.
        prefill_seconds: this layer's prefill time.
        decode_seconds: this layer's time summed over all decode steps.
        hbm_bytes, ddr_bytes, cxl_bytes: bytes this layer keeps in each tier (weights and KV cache).
        staging_bytes: the most bytes it streams to the GPU in one step (Eq. 9).
        uses_gpu: whether any unit computes on the GPU (then the class's workspace is reserved in HBM).
        hbm_experts: an MoE layer's experts resident in HBM (the others are in its experts unit's `weights` tier).
    """

    weights: tuple[str, ...]
    kv_cache: str
    prefill_cpu_permille: tuple[int, ...]
    decode_cpu_permille: tuple[int, ...]
    prefill_seconds: float
    decode_seconds: float
    hbm_bytes: int
    ddr_bytes: int
    cxl_bytes: int
    staging_bytes: int
    uses_gpu: bool
    hbm_experts: int = 0

    @classmethod
    def from_fields(cls, fields: dict, new=object.__new__) -> "LayerConfig":
        """`LayerConfig(**fields)` with every field given (in field order), without the frozen dataclass's
        `object.__setattr__` per field: column generation makes hundreds of thousands. An equal object, hashing
        alike (the class has no `__post_init__`; one added here must be called here too)."""
        config = new(cls)
        config.__dict__.update(fields)
        return config

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    def cpu_permille(self, phase: str) -> tuple[int, ...]:
        return self.prefill_cpu_permille if phase == "prefill" else self.decode_cpu_permille

    @property
    def splits(self) -> bool:
        return any(0 < p < 1000 for p in self.prefill_cpu_permille + self.decode_cpu_permille)

    def tier_bytes(self, tier: str) -> int:
        return {"hbm": self.hbm_bytes, "ddr": self.ddr_bytes, "cxl": self.cxl_bytes}[tier]

    @property
    def weights_tier(self) -> str:
        """The tier of an embed/head configuration's weights (their one unit)."""
        return next((t for t in self.weights if t != "none"), "none")


class ConfigList(Sequence):
    """A class's configurations (`ilp.layer_configs`), a read-only sequence of LayerConfig whose numbers are also
    arrays in sequence order (`seconds`, `tier_bytes`, `staging`, `uses_gpu`; `config_arrays` reads them), so the
    master problem and the solution check need no loop over thousands of objects. Each LayerConfig is made when
    first asked for (the master problem offers a few hundred of tens of thousands), equal to the one a list would
    have held.

    Made from `parts`, per tier vector (weights, kv_cache, memory {tier: bytes}, prefill front, decode front,
    experts in HBM), and per configuration its part and its rows in the two fronts (`_PhaseFront` arrays)."""

    def __init__(self, parts: list, part: np.ndarray, prefill_row: np.ndarray, decode_row: np.ndarray,
                 seconds: np.ndarray, tier_bytes: np.ndarray, staging: np.ndarray, uses_gpu: np.ndarray):
        self._parts, self._part, self._pre, self._dec = parts, part, prefill_row, decode_row
        self.seconds, self.tier_bytes, self.staging, self.uses_gpu = seconds, tier_bytes, staging, uses_gpu
        for array in (seconds, tier_bytes, staging, uses_gpu):
            array.flags.writeable = False
        self._made: dict[int, LayerConfig] = {}

    def __len__(self) -> int:
        return int(self._part.size)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("configuration index out of range")
        config = self._made.get(index)
        if config is None:
            weights, kv, memory, pre, dec, hbm_experts = self._parts[int(self._part[index])]
            first, second = int(self._pre[index]), int(self._dec[index])
            config = self._made[index] = LayerConfig.from_fields({
                "weights": weights, "kv_cache": kv, "prefill_cpu_permille": tuple(pre.permille[first].tolist()),
                "decode_cpu_permille": tuple(dec.permille[second].tolist()),
                "prefill_seconds": float(pre.seconds[first]), "decode_seconds": float(dec.seconds[second]),
                "hbm_bytes": memory["hbm"], "ddr_bytes": memory["ddr"], "cxl_bytes": memory["cxl"],
                "staging_bytes": int(self.staging[index]), "uses_gpu": bool(self.uses_gpu[index]),
                "hbm_experts": hbm_experts})
        return config

    def __iter__(self):
        for index in range(len(self)):
            yield self[index]

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, tuple, Sequence)) and list(self) == list(other)

    __hash__ = None


def config_arrays(options: list) -> tuple:
    """(seconds [K] float64 (prefill + decode, as `LayerConfig.seconds`), bytes [K, 3] int64 (HBM, DDR, CXL),
    staging bytes [K] int64, uses the GPU [K] bool) of a list of configurations: a ConfigList's own arrays, else
    read from each object."""
    if isinstance(options, ConfigList):
        return options.seconds, options.tier_bytes, options.staging, options.uses_gpu
    return (np.array([c.seconds for c in options], dtype=np.float64),
            np.array([(c.hbm_bytes, c.ddr_bytes, c.cxl_bytes) for c in options], dtype=np.int64).reshape(-1, 3),
            np.array([c.staging_bytes for c in options], dtype=np.int64),
            np.array([c.uses_gpu for c in options], dtype=bool))


class LayerChoice(NamedTuple):
    """`count` layers of `layer_class` take `config`."""

    layer_class: str
    config: LayerConfig
    count: int


@dataclass(frozen=True)
class Assignment:
    """The solver's choice: its layer choices in class order, and the shared buffers."""

    choices: tuple[LayerChoice, ...]
    staging_bytes: int  # one staging buffer; the GPU holds prefetch_depth + 1 of them
    workspace_bytes: int  # GPU activation workspace
    host_workspace_bytes: int  # DDR activation workspace
    objective_seconds: float
    tied_tier: str = "none"  # the tier holding a tied embedding/LM-head matrix once, when both units chose it
    tied_bytes: int = 0
    prefill_microbatch: Microbatch = Microbatch(0, 0)  # the decoder's prefill micro-batch (Eq. 20)

    def tier_used_bytes(self, tier: str, prefetch_depth: int) -> int:
        used = sum(config.tier_bytes(tier) * count for _, config, count in self.choices)
        if tier == self.tied_tier:
            used -= self.tied_bytes
        if tier == "hbm":
            used += (prefetch_depth + 1) * self.staging_bytes + self.workspace_bytes
        if tier == "ddr":
            used += self.host_workspace_bytes
        return used


@dataclass(frozen=True)
class Certificate:
    """What closed each staging level of the search: its exact optimum, a lower bound the ILP solver proved, or
    the Lagrangian bound (Eq. 12') under one of `multipliers`. passes/ilp_check.py re-derives the bounds."""

    levels: np.ndarray  # [L] staging bytes
    solved: np.ndarray  # [L] the level's optimum, or its proven lower bound, where a solve closed it; nan elsewhere
    multipliers: np.ndarray  # [P, 3] λ per GiB (HBM, DDR, CXL) of every LP solved
