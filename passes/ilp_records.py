"""The placement ILP's records, shared by its modules: how to solve (`SolverOptions`) and one column of the master
problem, a layer's configuration (`LayerConfig`).

passes/ilp.py generates the configurations, passes/ilp_master.py and passes/ilp_knapsack.py choose among them; all
three import these records from here, so none of them imports another one back.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SolverOptions", "LayerConfig"]


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
