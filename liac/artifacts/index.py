"""Sweep index.yaml + the plans it lists → disagreements between them (checked by `liac validate DIR`).

The index (written by `liac.api.write_plans`, described in docs/compile.md) is a summary: every value in it must
be what the plan it names says. Checked: the document's kind and version; each plan file listed exactly once and
each listed file present; per point the workload, the policy strings, the predicted times, memory per tier and
the solver report against the plan; the sweep's model, profile and objective against every plan; `best_throughput`
naming the point with the most tokens/s; infeasible points being well-formed and not also listed as plans.
"""

from __future__ import annotations

import math

from liac.errors import brief
from liac.sweep import INDEX_API_VERSION, INDEX_KIND, policy_string

__all__ = ["index_problems"]

_FLOATS = ("prefill_seconds", "decode_seconds_per_token", "total_seconds", "tokens_per_second")


def _expected(plan) -> dict:
    work, predicted, solver = plan.spec.workload, plan.status.predicted, plan.status.solver
    return {"batch_size": work.batch_size, "prompt_len": work.prompt_len, "gen_len": work.gen_len,
            "prefill": policy_string(plan, "prefill"), "decode": policy_string(plan, "decode"),
            **{name: getattr(predicted, name) for name in _FLOATS},
            "memory": {f"{u.tier}_bytes": u.used_bytes for u in plan.status.memory},
            "solver": {"name": solver.name, "status": solver.status, "gap": solver.gap}}


def _same(want, got) -> bool:
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return math.isclose(want, got, rel_tol=1e-5, abs_tol=1e-12)
    if isinstance(want, dict) and isinstance(got, dict):
        return want.keys() == got.keys() and all(_same(want[k], got[k]) for k in want)
    return want == got and type(want) is type(got)


def _point_problems(where: str, entry: dict, plan) -> list[tuple[str, str]]:
    out = []
    for key, want in _expected(plan).items():
        if key not in entry:
            out.append((f"{where}.{key}", "required field is missing"))
        elif not _same(want, entry[key]):
            out.append((f"{where}.{key}", f"must repeat the plan's value {brief(want)}, got {brief(entry[key])}"))
    return out


def index_problems(doc, plans: dict) -> list[tuple[str, str]]:
    """Parsed index.yaml, {file name: OffloadPlan, or None when the file is invalid} → [(path, message)]."""
    if not isinstance(doc, dict):
        return [("", f"must be a YAML mapping (kind '{INDEX_KIND}')")]
    out = []
    if doc.get("kind") != INDEX_KIND:
        out.append(("kind", f"must be '{INDEX_KIND}', got {brief(doc.get('kind'))}"))
    if doc.get("apiVersion") != INDEX_API_VERSION:
        out.append(("apiVersion", f"must be '{INDEX_API_VERSION}', got {brief(doc.get('apiVersion'))}"))
    points = doc.get("points")
    if not isinstance(points, list):
        return out + [("points", "must be a list of the sweep's plans")]
    listed: dict[str, int] = {}
    valid = [p for p in plans.values() if p is not None]
    for index, entry in enumerate(points):
        where = f"points[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            out.append((where, "must be a mapping naming its plan in 'file'"))
            continue
        name = entry["file"]
        if name in listed:
            out.append((f"{where}.file", f"{brief(name)} is already listed at points[{listed[name]}]"))
            continue
        listed[name] = index
        if name not in plans:
            out.append((f"{where}.file", f"{brief(name)} does not exist in the sweep directory"))
        elif plans[name] is not None:
            out += _point_problems(where, entry, plans[name])
    for name in sorted(set(plans) - set(listed)):
        out.append(("points", f"must list every plan of the directory: '{name}' is missing"))
    for key, want in (("model", {p.spec.model.name for p in valid}),
                      ("profile", {p.spec.hardware.profile for p in valid}),
                      ("objective", {p.spec.workload.objective for p in valid})):
        if len(want) == 1 and (not isinstance(doc.get(key), str) or doc.get(key) not in want):
            out.append((key, f"must be '{next(iter(want))}' (what the plans say), got {brief(doc.get(key))}"))
        elif len(want) > 1:
            out.append((key, f"the plans disagree: {', '.join(sorted(map(str, want)))} (one sweep is one "
                             f"{key})"))
    best = doc.get("best_throughput")
    ranked = {name: p.status.predicted.tokens_per_second for name, p in plans.items() if p is not None}
    if best is not None and (not isinstance(best, str) or best not in listed):
        out.append(("best_throughput", f"must name a listed plan, got {brief(best)}"))
    elif best is not None and ranked and best in ranked and ranked[best] < max(ranked.values()):
        top = max(ranked, key=lambda n: ranked[n])
        out.append(("best_throughput", f"must name the plan with the most tokens/s ('{top}'), got '{best}'"))
    batches = {p.spec.workload.batch_size for p in valid}
    infeasible = doc.get("infeasible") or []
    if not isinstance(infeasible, list):
        return out + [("infeasible", f"must be a list of {{batch_size, reason}}, got {brief(infeasible)}")]
    for index, entry in enumerate(infeasible):
        where = f"infeasible[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("batch_size"), int) \
                or not isinstance(entry.get("reason"), str):
            out.append((where, "must be a mapping with an integer 'batch_size' and a 'reason'"))
        elif entry["batch_size"] in batches:
            out.append((f"{where}.batch_size", f"batch {entry['batch_size']} has a plan in this sweep: it must "
                                               "not also be listed as infeasible"))
    return out
