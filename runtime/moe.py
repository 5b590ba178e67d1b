"""The ratio by which an MoE step's routed host experts are shared between the CPU and PCIe, kept up to date.

`ExpertRun.assign` (runtime/schedule.py) shares a step's routed host experts so that the slower device finishes
first, given the CPU's seconds per expert over PCIe's. The engine measures both at load: the CPU kernel's rate on
expert weights and one expert's pinned copy. On the H200 machine the CPU's rate on the experts then varied by ~1.5x
between runs seconds apart and by ~2x between machine starts (docs/benchmarks.md, the Mixtral calls), while the
copy's rate held within a few per cent. So with `adapt`, `ExpertShare` follows the CPU: every CPU part of an experts
op reports its host seconds (`observe`, timed on the host thread, which computes it: no synchronisation), and the
ratio is the running mean (exponentially weighted) of those seconds per expert over the copy's seconds per expert,
measured at load. A CPU that reads an expert in more than twice a copy's time then gets no routed expert at batch 1
(both go over PCIe); one that recovers gets them back. While the CPU gets none, nothing measures it: after
`probe_every` experts ops in a row that sent every routed host expert over PCIe, one op shares them at a ratio of 1
(`PROBE_RATIO`: about half of them on the CPU, one of two at batch 1, rather than the plan's placement, which may
give a slow CPU both), which measures the CPU again.
"""

from __future__ import annotations

__all__ = ["ExpertShare", "ExpertTally", "ExpertSplit", "PROBE_RATIO"]

PROBE_RATIO = 1.0  # the ratio of an op that measures a CPU the share has left idle: an even share


class ExpertShare:
    """CPU seconds per expert over PCIe's, for `ExpertRun.assign`: fixed, or (`adapt`) following the CPU parts."""

    def __init__(self, ratio: float, pcie_seconds: float | None = None, adapt: bool = False, weight: float = 0.25,
                 probe_every: int = 64):
        if ratio <= 0 or (adapt and not (pcie_seconds and pcie_seconds > 0)) or not 0 < weight <= 1:
            raise ValueError("ExpertShare needs a positive ratio, and to adapt a positive pcie_seconds and a weight "
                             "in (0, 1]")
        self.at_load = float(ratio)
        self.pcie_seconds = pcie_seconds  # one expert's copy (all its matrices), measured at load
        self.adapt = adapt
        self.weight = weight
        self.probe_every = probe_every
        self.current = float(ratio)
        self.observed = 0  # CPU parts observed
        self.probes = 0  # experts ops run as planned to measure a CPU that the share had left idle
        self._idle = 0  # experts ops in a row that sent every routed host expert over PCIe

    def ratio(self) -> float:
        """The ratio for this experts op: `PROBE_RATIO` when it is time to measure an idle CPU again."""
        if self.adapt and self._idle >= self.probe_every:
            self._idle = 0
            self.probes += 1
            return PROBE_RATIO
        return self.current

    def observe(self, seconds: float, experts: int) -> None:
        """A CPU part computed `experts` routed experts in `seconds` of host time."""
        if not self.adapt or experts <= 0 or not seconds > 0:
            return
        self._idle = 0
        self.observed += 1
        measured = seconds / experts / self.pcie_seconds
        self.current += self.weight * (measured - self.current)

    def idle(self) -> None:
        """An experts op sent every one of its routed host experts over PCIe (some were routed)."""
        if self.adapt:
            self._idle += 1


class ExpertTally:
    """Per phase, what an executor's experts ops did: the experts the CPU computed, their weight bytes and the host
    seconds of the CPU parts that computed them (each timed on the host thread that computes it, so a timed run
    needs no synchronisation), and the routed experts streamed to the GPU. `totals()` is flat and additive: a
    caller takes the difference around one call (`Engine.generate` → Generation.experts), and bytes over seconds is
    the rate the CPU's expert kernel reached in that call's own steps, not only in a profiled one.

    The host thread's other work in an experts op with a CPU part, summed over those parts (`host`): 'route' (the
    routing read, its wait for the GPU included, and the counts), 'dispatch' (the GPU part's launches, before the
    CPU part), 'merge' (after the CPU part: the partial sums' crossing and adds); and 'between', the host seconds
    from the previous experts op's end in the same pass to this one's start (the layer's other units: a release,
    attention, the router), counted in 'betweens'. 'cut_experts': experts ops whose last CPU expert both devices
    computed, each its share of the features (`ExpertSplit`; its bytes count on the CPU by the CPU's share). At batch 1 the CPU part holds the one host thread, so these are
    the step's chain beside it: nothing else launches the GPU's next work meanwhile."""

    FIELDS = ("cpu_experts", "cpu_bytes", "cpu_seconds", "cpu_parts", "streamed_experts", "route_seconds",
              "dispatch_seconds", "merge_seconds", "between_seconds", "betweens", "cut_experts")

    def __init__(self):
        self.counts: dict[str, dict[str, float]] = {}

    def add(self, phase: str, cpu_experts: int, cpu_bytes: int, cpu_seconds: float, streamed_experts: int,
            host: dict[str, float] | None = None, cut: bool = False) -> None:
        counts = self.counts.setdefault(phase, dict.fromkeys(self.FIELDS, 0))
        counts["cpu_experts"] += cpu_experts
        counts["cpu_bytes"] += cpu_bytes
        counts["cpu_seconds"] += cpu_seconds if cpu_experts else 0.0
        counts["cpu_parts"] += 1 if cpu_experts else 0
        counts["streamed_experts"] += streamed_experts
        counts["cut_experts"] += 1 if cut else 0  # an expert both devices computed, each its features (ExpertSplit)
        if cpu_experts and host:
            for part in ("route", "dispatch", "merge"):
                counts[f"{part}_seconds"] += host.get(part, 0.0)
            if host.get("between") is not None:
                counts["between_seconds"] += host["between"]
                counts["betweens"] += 1

    def totals(self) -> dict[str, float]:
        """'{phase}_{field}' → its running total."""
        return {f"{phase}_{field}": value for phase, counts in sorted(self.counts.items())
                for field, value in counts.items()}


class ExpertSplit:
    """Where to cut one routed expert's intermediate features between the CPU and PCIe, so that both finish together.

    At decode an experts op with a CPU part holds the one host thread: after the CPU part it still launches the
    merge, the next layer's attention and router (the host's 'chain', H seconds per CPU part: the GPU part's launches,
    the merge, and the host's time between two experts ops, `ExpertTally`), while the GPU, its copies done, waits.
    Whole experts cannot balance that at batch 1 (one routed expert each way leaves the GPU ~H idle). So the CPU's
    last routed expert is cut: the CPU computes its first c of F intermediate features (gate and up rows [0, c),
    down's columns [0, c)) from the host tier, the GPU the other F − c from a staged copy of those rows and columns,
    and the two partial outputs add up in the merge (the down projection is linear in the features). With m CPU
    experts, g streamed ones, C and P the CPU's (as measured over the decode steps so far) and the copy's (at load)
    seconds per expert, the host side takes
    (m − 1 + c/F)·C + H and the GPU side (g + 1 − c/F)·P, equal at

        c/F = ((g + 1)·P − (m − 1)·C − H) / (C + P),

    rounded to `rows` (at least `rows` stay on the CPU); no cut when that reaches F (the CPU is the faster side) or before H is measured (the first
    decode steps, or a share without a measured copy time)."""

    ROWS = 256  # the cut's granularity in features (whole AMX/GEMM tiles on both sides)

    def __init__(self, share: "ExpertShare", tally: ExpertTally, ffn_dim: int, rows: int = ROWS):
        self.share, self.tally, self.ffn_dim, self.rows = share, tally, ffn_dim, rows

    def host_seconds(self) -> float | None:
        """H: the host's chain per decode CPU part, from the tally (None until a CPU part followed another)."""
        counts = self.tally.counts.get("decode")
        if not counts or not counts["cpu_parts"] or not counts["betweens"]:
            return None
        parts = counts["cpu_parts"]
        return ((counts["dispatch_seconds"] + counts["merge_seconds"]) / parts
                + counts["between_seconds"] / counts["betweens"])

    def cpu_seconds(self, expert_bytes: int) -> float | None:
        """C: the CPU parts' host seconds per expert's bytes over the decode steps so far (the kernel's rate in place,
        beside the copies, which the load-time ratio does not see); None before any."""
        counts = self.tally.counts.get("decode")
        if not counts or not counts["cpu_bytes"] or not expert_bytes:
            return None
        return counts["cpu_seconds"] * expert_bytes / counts["cpu_bytes"]

    def features(self, cpu_experts: int, streamed_experts: int, expert_bytes: int = 0) -> int | None:
        """c, the CPU's features of its last routed expert this step; None: no cut (every expert whole). C is the
        CPU parts' measured seconds per expert (`cpu_seconds`), the share's ratio times P before any."""
        P, chain = self.share.pcie_seconds, self.host_seconds()
        if not cpu_experts or not P or chain is None:
            return None
        C = self.cpu_seconds(expert_bytes) or self.share.current * P
        share = ((streamed_experts + 1) * P - (cpu_experts - 1) * C - chain) / (C + P)
        c = int(round(share * self.ffn_dim / self.rows)) * self.rows
        if c >= self.ffn_dim:
            return None
        return max(c, self.rows)
