"""CostGraphs + ServeAssignment → OffloadPlan: a serving plan, one memory placement and a compute placement per live
batch size (issue 15).

The plan is `emit_plan`'s plan at the largest batch (its layer groups, memory, buffers and `status.predicted` are
that batch's), plus `spec.serving`: per batch size its weight and, for every layer group, where each sublayer
computes and its split shares at that batch; and `status.serving`: per batch size its predicted prefill, decode
step and step time (prefill amortised over gen_len), beside the step time of the plan that batch size would get
alone (`own_seconds`, memory placement free: what sharing costs it). Every number is priced by passes/price.py
from the plan's own groups (`liac.plan.batch_plan`: what the runtime runs for that batch).

Groups are ordered as `emit_plan` orders them at the largest batch, ties broken by the smaller batches'
configurations, so the same assignment always gives the same plan.
"""

from __future__ import annotations

import dataclasses

from liac.models.config import ModelConfig
from liac.passes.costs import CostGraph
from liac.passes.emit import _order_key, emit_plan, plan_name
from liac.passes.ilp import LayerChoice, SolverReport
from liac.passes.ilp_serve import ServeAssignment, batch_shares
from liac.passes.price import price_groups
from liac.plan import (ComputePlacement, GroupPlacement, Metadata, OffloadPlan, Serving, ServingBatch,
                       ServingBatchStatus, ServingStatus, batch_plan, placement_of)
from liac.plan import SolverReport as PlanSolverReport

__all__ = ["emit_serving_plan", "serving_plan_name"]

_CLASSES = ("embed", "decoder", "head")


def serving_plan_name(model: str, profile: str, batches: tuple[int, ...], prompt_len: int, gen_len: int,
                      policy: str) -> str:
    """`<model>.<profile>.serve-b<smallest>-<largest>-p<prompt>-g<gen>`, plus `.<policy>` for a fixed policy
    (as `plan_name` adds it)."""
    one = plan_name(model, profile, batches[-1], prompt_len, gen_len, policy)
    head = f"{model}.{profile}.b{batches[-1]}"
    return f"{model}.{profile}.serve-b{batches[0]}-{batches[-1]}" + one[len(head):]


def _ordered(serve: ServeAssignment) -> list[int]:
    """Indices of the chosen columns in group order: by class, then as emit_plan orders the largest batch's
    configurations, then by the smaller batches' (stable, so emit_plan keeps this order)."""
    choices = serve.memory.choices

    def key(index: int):
        name = choices[index].layer_class
        per_batch = [assignment.choices[index].config for assignment in serve.per_batch]
        return (_CLASSES.index(name), _order_key(per_batch[-1]), tuple(_order_key(c) for c in per_batch[:-1]))

    return sorted(range(len(choices)), key=key)


def _placements(plan: OffloadPlan, choices: list[LayerChoice]) -> tuple[GroupPlacement, ...]:
    """The compute placement of each of the plan's groups (one per choice, same order) at one batch size."""
    out = []
    for group, choice in zip(plan.spec.layer_groups, choices):
        pre, dec = choice.config.prefill_cpu_permille, choice.config.decode_cpu_permille
        out.append(GroupPlacement(group.name, tuple(
            ComputePlacement(sub.name, placement_of(pre[i]), placement_of(dec[i]), pre[i], dec[i])
            for i, sub in enumerate(group.sublayers))))
    return tuple(out)


def emit_serving_plan(costs: tuple[CostGraph, ...], serve: ServeAssignment, report: SolverReport,
                      own_seconds: tuple[float, ...], cfg: ModelConfig, objective: str) -> OffloadPlan:
    """CostGraphs (one per batch size, ascending) + ServeAssignment → the serving plan (module docstring).

    Args:
        costs: the cost graphs the assignment was solved on, one per batch size.
        serve: the solver's choice.
        report: the solver's report (objective: the weighted sum of each batch size's prefill + decode).
        own_seconds: per batch size, prefill + decode of its own optimum (a plan compiled for it alone).
        cfg: the model's architecture. objective: recorded in spec.workload ('latency').
    """
    order = _ordered(serve)
    per_batch = [[assignment.choices[i] for i in order] for assignment in serve.per_batch]
    top = dataclasses.replace(serve.per_batch[-1], choices=tuple(per_batch[-1]))
    plan = emit_plan(costs[-1], top, report, cfg, objective)
    batches = tuple(ServingBatch(batch, weight, _placements(plan, choices))
                    for batch, weight, choices in zip(serve.batches, serve.weights, per_batch))
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, serving=Serving(batches)))
    gen = plan.spec.workload.gen_len
    rows = []
    for graph, batch, share, own in zip(costs, serve.batches, batch_shares(serve.weights), own_seconds):
        price = price_groups(graph, batch_plan(plan, batch).spec.layer_groups)
        rows.append(ServingBatchStatus(batch_size=batch, share=share, prefill_seconds=price.prefill_seconds,
                                       decode_seconds_per_token=price.decode_seconds_per_token,
                                       step_seconds=price.total_seconds / gen, own_step_seconds=own / gen))
    solver = PlanSolverReport(name=report.name, status=report.status, objective_seconds=report.objective_seconds,
                              gap=report.gap)
    status = dataclasses.replace(plan.status, solver=solver, serving=ServingStatus(tuple(rows)))
    name = serving_plan_name(cfg.name, costs[-1].profile, serve.batches, plan.spec.workload.prompt_len, gen,
                             report.policy)
    return dataclasses.replace(plan, metadata=Metadata(name=name, liac_version=plan.metadata.liac_version),
                               status=status)
