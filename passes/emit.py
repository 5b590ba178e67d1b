"""CostGraph + Assignment → OffloadPlan: contiguous layer groups, reservations, and the predicted costs.

Decoder layers that share a configuration become one contiguous `layer_group`; groups are ordered by how much of
their weights and KV cache sits in HBM (most first: LIA's resident layers lead, as in its artifact), ties broken
by the configuration itself, so the same assignment always gives the same plan. `spec` gets what the runtime needs
(model with its full config and hash, hardware profile and hash, workload, budgets, bytes to reserve per tier,
prefetch depth and staging size); `status` gets the solver report, the predicted seconds per phase (recomputed
from the CostGraph with `costs.layer_seconds`, the same equations the solver used), a per-sublayer breakdown,
tokens/s, and memory per tier against its budget. No timestamps, no solve times: same inputs, same bytes.
"""

from __future__ import annotations

import numpy as np

import liac
from liac.models.config import ModelConfig
from liac.passes.costs import CostGraph, layer_seconds, unit_breakdown
from liac.passes.ilp import Assignment, LayerConfig, SolverReport, unit_tiers
from liac.plan import (API_VERSION, KIND, Budgets, Execution, HardwareSpec, LayerGroup, Metadata, ModelSpec,
                       OffloadPlan, PlanSpec, PlanStatus, Predicted, SublayerPlacement, SublayerTime, TierBytes,
                       TierUsage)
from liac.plan import SolverReport as PlanSolverReport
from liac.plan import Workload as PlanWorkload

__all__ = ["emit_plan", "plan_name", "placement_string", "placement_of"]



def plan_name(model: str, profile: str, batch: int, prompt_len: int, gen_len: int, policy: str) -> str:
    """`<model>.<profile>.b<batch>-p<prompt>-g<gen>`, plus `.<policy>` for a fixed policy ('/' → '+')."""
    name = f"{model}.{profile}.b{batch}-p{prompt_len}-g{gen_len}"
    return name if policy == "optimal" else f"{name}.{policy.replace('/', '+')}"


def placement_string(cpu_permille: tuple[int, ...]) -> str:
    """(1000, 0, 400) → 'CGS': one letter per unit, C = CPU, G = GPU, S = split between them."""
    return "".join("C" if p == 1000 else "G" if p == 0 else "S" for p in cpu_permille)


def _order_key(config: LayerConfig):
    return (-config.hbm_bytes, sum(config.decode_cpu_permille), sum(config.prefill_cpu_permille), config.weights,
            config.kv_cache, config.prefill_cpu_permille, config.decode_cpu_permille)


def placement_of(cpu_permille: int) -> str:
    """The plan's placement for a CPU share: 'cpu' (1000 permille), 'gpu' (0) or 'split'."""
    return {1000: "cpu", 0: "gpu"}.get(cpu_permille, "split")


def emit_plan(costs: CostGraph, assignment: Assignment, report: SolverReport, cfg: ModelConfig,
              objective: str) -> OffloadPlan:
    """CostGraph + Assignment → OffloadPlan (see the module docstring).

    Args:
        costs: the cost graph the assignment was solved on.
        assignment: the solver's choice.
        report: the solver's report (its wall time is not written).
        cfg: the model's architecture (spec.model.config).
        objective: 'latency' or 'throughput' (recorded in spec.workload).
    """
    work = costs.workload
    groups, times = [], []
    prefill_seconds = decode_seconds = 0.0
    by_class = {name: [] for name in ("embed", "decoder", "head")}
    for name, config, count in assignment.choices:
        by_class[name].append((config, count))
    for name in ("embed", "decoder", "head"):
        cls = costs.layer_class(name)
        first = 0
        entries = sorted(by_class[name], key=lambda item: _order_key(item[0]))
        for position, (config, count) in enumerate(entries):
            group = name if name != "decoder" else f"decoder-{position}"
            tiers = unit_tiers(cls, config.weights, config.kv_cache)
            sublayers = tuple(SublayerPlacement(name=unit, prefill=placement_of(config.prefill_cpu_permille[i]),
                                                decode=placement_of(config.decode_cpu_permille[i]),
                                                weights=config.weights[i],
                                                prefill_cpu_permille=config.prefill_cpu_permille[i],
                                                decode_cpu_permille=config.decode_cpu_permille[i])
                              for i, unit in enumerate(cls.units))
            groups.append(LayerGroup(name=group, layer_class=name, first_layer=first, layer_count=count,
                                     kv_cache=config.kv_cache, sublayers=sublayers))
            first += count
            for phase in ("prefill", "decode"):
                placement = config.gpu_shares(phase)
                seconds, _, _, _ = layer_seconds(costs, cls, phase, tiers, np.array([placement]))
                if phase == "prefill":
                    prefill_seconds += float(seconds[0]) * count
                else:
                    decode_seconds += float(seconds[0]) * count
                for unit, device, compute, transfer, stream in unit_breakdown(costs, cls, phase, tiers, placement):
                    times.append(SublayerTime(group=group, name=unit, phase=phase, device=device,
                                              compute_seconds=compute, transfer_seconds=transfer,
                                              stream_seconds=stream))
    total = prefill_seconds + decode_seconds
    decode_steps = max(work.gen_len - 1, 1)
    depth = costs.budgets.prefetch_depth if assignment.staging_bytes else 0
    used = {tier: assignment.tier_used_bytes(tier, costs.budgets.prefetch_depth) for tier in ("hbm", "ddr", "cxl")}
    capacity = {"hbm": costs.budgets.hbm_bytes, "ddr": costs.budgets.ddr_bytes, "cxl": costs.budgets.cxl_bytes}
    spec = PlanSpec(
        model=ModelSpec(name=cfg.name, family=cfg.family, config_sha256=cfg.sha256(), config=cfg.to_dict()),
        hardware=HardwareSpec(profile=costs.profile, sha256=costs.profile_sha256),
        workload=PlanWorkload(batch_size=work.batch_size, prompt_len=work.prompt_len, gen_len=work.gen_len,
                              objective=objective),
        budgets=Budgets(gpu_bytes=capacity["hbm"], cpu_bytes=capacity["ddr"], cxl_bytes=capacity["cxl"]),
        memory=TierBytes(hbm_bytes=used["hbm"], ddr_bytes=used["ddr"], cxl_bytes=used["cxl"]),
        execution=Execution(prefetch_depth=depth, staging_bytes=assignment.staging_bytes),
        layer_groups=tuple(groups))
    status = PlanStatus(
        solver=PlanSolverReport(name=report.name, status=report.status, objective_seconds=report.objective_seconds,
                                gap=report.gap),
        predicted=Predicted(prefill_seconds=prefill_seconds, decode_seconds=decode_seconds,
                            decode_seconds_per_token=decode_seconds / decode_steps if work.gen_len > 1 else 0.0,
                            total_seconds=total,
                            tokens_per_second=work.batch_size * work.gen_len / total if total > 0 else 0.0,
                            sublayers=tuple(times)),
        memory=tuple(TierUsage(tier=tier, used_bytes=used[tier], capacity_bytes=capacity[tier])
                     for tier in ("hbm", "ddr", "cxl")))
    name = plan_name(cfg.name, costs.profile, work.batch_size, work.prompt_len, work.gen_len, report.policy)
    return OffloadPlan(apiVersion=API_VERSION, kind=KIND, metadata=Metadata(name=name, liac_version=liac.__version__),
                       spec=spec, status=status)
