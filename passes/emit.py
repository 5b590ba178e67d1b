"""CostGraph + Assignment → OffloadPlan: contiguous layer groups, reservations, and the predicted costs.

Decoder layers that share a configuration become one contiguous `layer_group`; groups are ordered by how much of
their weights and KV cache sits in HBM (most first: LIA's resident layers lead, as in its artifact), ties broken
by the configuration itself, so the same assignment always gives the same plan. `spec` gets what the runtime needs
(model with its full config and hash, hardware profile and hash, workload, budgets, bytes to reserve per tier,
prefetch depth, staging size and the prefill's micro-batch); `status` gets the solver report, the predicted seconds per phase and per
sublayer (the groups priced by `price.price_groups`, the equations the solver used and `liac explain` and
`liac calibrate` re-price with), tokens/s, and memory per tier against its budget. No timestamps, no solve times:
same inputs, same bytes.
"""

from __future__ import annotations

import liac
from liac.models.config import ModelConfig
from liac.passes.costs import CostGraph
from liac.passes.ilp import Assignment, LayerConfig, SolverReport
from liac.passes.price import PlanPrice, price_groups
from liac.plan import (API_VERSION, KIND, PHASES, TIERS, Budgets, Execution, ExpertPlacement, HardwareSpec,
                       LayerGroup, Metadata, ModelSpec, OffloadPlan, PlanSpec, PlanStatus, Predicted, SublayerPlacement,
                       SublayerTime, TierBytes, TierUsage, Serving, ServingStatus, experts_from_permille,
                       placement_of)
from liac.plan import SolverReport as PlanSolverReport
from liac.plan import Workload as PlanWorkload

__all__ = ["emit_plan", "plan_name"]


def plan_name(model: str, profile: str, batch: int, prompt_len: int, gen_len: int, policy: str) -> str:
    """`<model>.<profile>.b<batch>-p<prompt>-g<gen>`, plus `.<policy>` for a fixed policy ('/' → '+')."""
    name = f"{model}.{profile}.b{batch}-p{prompt_len}-g{gen_len}"
    return name if policy == "optimal" else f"{name}.{policy.replace('/', '+')}"


def _order_key(config: LayerConfig):
    return (-config.hbm_bytes, sum(config.decode_cpu_permille), sum(config.prefill_cpu_permille), config.weights,
            config.kv_cache, config.prefill_cpu_permille, config.decode_cpu_permille, config.hbm_experts)


def _experts(config: LayerConfig, unit: int, num_experts: int) -> ExpertPlacement | None:
    """The expert counts of an MoE experts unit (None for every other unit)."""
    if not num_experts:
        return None
    return ExpertPlacement(hbm=config.hbm_experts,
                           prefill_cpu=experts_from_permille(config.prefill_cpu_permille[unit], num_experts),
                           decode_cpu=experts_from_permille(config.decode_cpu_permille[unit], num_experts))


def _layer_groups(costs: CostGraph, assignment: Assignment) -> tuple[LayerGroup, ...]:
    """The assignment's configurations as contiguous layer groups, embed, decoders (most in HBM first), head."""
    by_class = {name: [] for name in ("embed", "decoder", "head")}
    for choice in assignment.choices:
        by_class[choice.layer_class].append(choice)
    groups = []
    for name in ("embed", "decoder", "head"):
        cls = costs.layer_class(name)
        experts = [unit.experts for unit in cls.prefill.units]
        first = 0
        for position, choice in enumerate(sorted(by_class[name], key=lambda c: _order_key(c.config))):
            config = choice.config
            sublayers = tuple(SublayerPlacement(name=unit, prefill=placement_of(config.prefill_cpu_permille[i]),
                                                decode=placement_of(config.decode_cpu_permille[i]),
                                                weights=config.weights[i],
                                                prefill_cpu_permille=config.prefill_cpu_permille[i],
                                                decode_cpu_permille=config.decode_cpu_permille[i],
                                                experts=_experts(config, i, experts[i]))
                              for i, unit in enumerate(cls.units))
            groups.append(LayerGroup(name=name if name != "decoder" else f"decoder-{position}", layer_class=name,
                                     first_layer=first, layer_count=choice.count, kv_cache=config.kv_cache,
                                     sublayers=sublayers))
            first += choice.count
    return tuple(groups)


def _predicted(price: PlanPrice) -> Predicted:
    times = tuple(SublayerTime(group=group.name, name=unit.name, phase=phase, device=unit.device,
                               compute_seconds=unit.compute_seconds, transfer_seconds=unit.transfer_seconds,
                               stream_seconds=unit.stream_seconds)
                  for group in price.groups for phase in PHASES for unit in group.units[phase])
    return Predicted(prefill_seconds=price.prefill_seconds, decode_seconds=price.decode_seconds,
                     decode_seconds_per_token=price.decode_seconds_per_token, total_seconds=price.total_seconds,
                     tokens_per_second=price.tokens_per_second, sublayers=times)


def emit_plan(costs: CostGraph, assignment: Assignment, report: SolverReport, cfg: ModelConfig,
              objective: str) -> OffloadPlan:
    """CostGraph + Assignment → OffloadPlan (see the module docstring).

    Args:
        costs: the cost graph the assignment was solved on (priced at the micro-batch the solver chose).
        assignment: the solver's choice.
        report: the solver's report (its wall time is not written).
        cfg: the model's architecture (spec.model.config).
        objective: 'latency' or 'throughput' (recorded in spec.workload).
    """
    costs = costs.with_prefill(assignment.prefill_microbatch)
    work = costs.workload
    groups = _layer_groups(costs, assignment)
    depth = costs.budgets.prefetch_depth if assignment.staging_bytes else 0
    used = {tier: assignment.tier_used_bytes(tier, costs.budgets.prefetch_depth) for tier in TIERS}
    capacity = {"hbm": costs.budgets.hbm_bytes, "ddr": costs.budgets.ddr_bytes, "cxl": costs.budgets.cxl_bytes}
    spec = PlanSpec(
        model=ModelSpec(name=cfg.name, family=cfg.family, config_sha256=cfg.sha256(), config=cfg.to_dict()),
        hardware=HardwareSpec(profile=costs.profile, sha256=costs.profile_sha256),
        workload=PlanWorkload(batch_size=work.batch_size, prompt_len=work.prompt_len, gen_len=work.gen_len,
                              objective=objective),
        budgets=Budgets(gpu_bytes=capacity["hbm"], cpu_bytes=capacity["ddr"], cxl_bytes=capacity["cxl"]),
        memory=TierBytes(hbm_bytes=used["hbm"], ddr_bytes=used["ddr"], cxl_bytes=used["cxl"]),
        execution=Execution(prefetch_depth=depth, staging_bytes=assignment.staging_bytes,
                            workspace_bytes=max(0, assignment.workspace_bytes - costs.gpu_context_bytes),
                            prefill_microbatch_sequences=assignment.prefill_microbatch.sequences,
                            prefill_microbatch_tokens=assignment.prefill_microbatch.tokens),
        layer_groups=groups, serving=Serving(batches=()))
    status = PlanStatus(
        solver=PlanSolverReport(name=report.name, status=report.status, objective_seconds=report.objective_seconds,
                                gap=report.gap),
        predicted=_predicted(price_groups(costs, groups)),
        memory=tuple(TierUsage(tier=tier, used_bytes=used[tier], capacity_bytes=capacity[tier]) for tier in TIERS),
        serving=ServingStatus(batches=()))
    name = plan_name(cfg.name, costs.profile, work.batch_size, work.prompt_len, work.gen_len, report.policy)
    return OffloadPlan(apiVersion=API_VERSION, kind=KIND, metadata=Metadata(name=name, liac_version=liac.__version__),
                       spec=spec, status=status)
