"""Plan files, sweep directories and directories of sweeps → every problem found, one line each (`liac validate`).

Three layers of checks, each run only when the previous one passed (a later layer needs what the earlier proves):

1. document: readable YAML, a known `apiVersion` (older ones are migrated first), the schema (`schema_check`);
2. semantics: `liac.plan.check_semantics` (known sublayers in order, contiguous layer ranges, config hash, tiers
   allowed by the placement);
3. capacities and status: the bytes the plan puts in each tier, recomputed from `spec.model.config` by
   `footprint.tier_footprint` (not taken from the compiler), against `spec.memory` and `spec.budgets`; the
   compiler's `status` against `spec` (its memory report, its per-sublayer devices, its totals; for a serving
   plan, a `status.serving` row per serving batch with its share and a step time no better than that batch size's
   own optimum); and a warning when the shipped hardware profile the plan names has changed since it was
   compiled.

A sweep directory (liac/sweep.py) is checked plan by plan and its `index.yaml` against the plans it lists
(`index.index_problems`); a directory of sweeps, sweep by sweep and its `sweeps.yaml` catalog against them.

A finding prints as `<file>: <yaml path>: <message>`, the same shape as `LiacError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liac.artifacts import footprint
from liac.artifacts.index import index_problems
from liac.artifacts.schema_check import schema_problems
from liac.errors import LiacError, brief
from liac.fileio import read_yaml, safe_name
from liac.migrate import MIGRATIONS, migrate_document
from liac.plan import API_VERSION, OffloadPlan, check_semantics
from liac.profile import profile_names, resolve_profile
from liac.schema_tools import from_data
from liac.sizes import format_gib
from liac.sweep import CATALOG_NAME, INDEX_NAME, plan_files, read_index

__all__ = ["Finding", "validate_document", "validate_plan_file", "validate_sweep", "validate_catalog",
           "validate_path", "BUDGET_FIELD", "staging_buffers"]

# Budget field of each tier (spec.budgets) and its reservation (spec.memory).
BUDGET_FIELD = {"hbm": "gpu_bytes", "ddr": "cpu_bytes", "cxl": "cxl_bytes"}
_RELATIVE_TOLERANCE = 1e-4  # status floats carry 6 significant digits (liac.schema_tools.stable_float)


@dataclass(frozen=True)
class Finding:
    """One problem: where (file, YAML path) and what was expected. `severity` is 'error' or 'warning'."""

    source: str
    path: str
    message: str
    severity: str = "error"

    def line(self) -> str:
        parts = [self.source] + ([self.path] if self.path else [])
        prefix = "warning: " if self.severity == "warning" else ""
        return prefix + ": ".join(parts + [self.message])


def staging_buffers(prefetch_depth: int) -> int:
    """Staging buffers on the GPU: the one being computed from plus `prefetch_depth` being filled (0: none)."""
    return prefetch_depth + 1 if prefetch_depth > 0 else 0


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_RELATIVE_TOLERANCE, abs_tol=1e-12)


def validate_document(doc: Any, source: str):
    """Parsed YAML → (OffloadPlan or None, findings). The plan is returned only when it passed layers 1 and 2."""
    if not isinstance(doc, dict):
        return None, [Finding(source, "", "must be a YAML mapping with apiVersion, kind, metadata, spec, status")]
    known = sorted({API_VERSION, *MIGRATIONS})
    if doc.get("apiVersion") not in known:
        return None, [Finding(source, "apiVersion", f"unsupported value {brief(doc.get('apiVersion'))}: must be one "
                              "of " + ", ".join(f"'{v}'" for v in known))]
    if doc["apiVersion"] != API_VERSION:
        try:  # the loader's own chain, so validate and load cannot disagree
            doc = migrate_document(doc, source)
        except LiacError as e:
            return None, [Finding(source, e.path, e.message)]
    problems = schema_problems(OffloadPlan, doc)
    if problems:
        return None, [Finding(source, path, message) for path, message in problems]
    plan = from_data(OffloadPlan, doc, source)
    problems = check_semantics(plan)
    if problems:
        return None, [Finding(source, path, message) for path, message in problems]
    return plan, [Finding(source, path, message, severity) for path, message, severity in plan_problems(plan)]


def plan_problems(plan) -> list[tuple[str, str, str]]:
    """Layer 3 on a semantically valid plan: (path, message, severity) triples."""
    return (_capacity_problems(plan) + _status_memory_problems(plan) + _status_time_problems(plan)
            + _status_serving_problems(plan) + _profile_warnings(plan))


def _profile_warnings(plan) -> list[tuple[str, str, str]]:
    """A plan naming a shipped profile that has changed since: still runnable, but its predictions are stale."""
    name = plan.spec.hardware.profile
    if name not in profile_names():
        return []  # a user's own profile file: nothing to compare with
    current = resolve_profile(name, shipped_only=True).sha256()
    if current == plan.spec.hardware.sha256:
        return []
    return [("spec.hardware.sha256", f"the shipped profile '{name}' has changed since this plan was compiled "
             f"(now '{current[:12]}…', plan '{plan.spec.hardware.sha256[:12]}…'): recompile for current "
             "predictions", "warning")]


def _capacity_problems(plan) -> list[tuple[str, str, str]]:
    spec = plan.spec
    used = footprint.tier_footprint(plan)
    staging = spec.execution.staging_bytes * staging_buffers(spec.execution.prefetch_depth)
    out = []
    for tier, budget_field in BUDGET_FIELD.items():
        budget = getattr(spec.budgets, budget_field)
        reserved = getattr(spec.memory, f"{tier}_bytes")
        workspace = spec.execution.workspace_bytes if tier == "hbm" else 0
        need = used[tier].total_bytes + (staging if tier == "hbm" else 0) + workspace
        parts = [f"weights {format_gib(used[tier].weight_bytes)}", f"KV cache {format_gib(used[tier].kv_bytes)}"]
        if tier == "hbm" and staging:
            parts.append(f"staging {format_gib(staging)}")
        if workspace:
            parts.append(f"workspace {format_gib(workspace)}")
        what = f"{format_gib(need)} in '{tier}' ({', '.join(parts)})"
        if need > budget:
            out.append((f"spec.budgets.{budget_field}", f"over budget: the plan places {what}, more than the "
                        f"{format_gib(budget)} budget (short by {format_gib(need - budget)})", "error"))
            continue
        if reserved > budget:
            out.append((f"spec.memory.{tier}_bytes", f"must not exceed spec.budgets.{budget_field} "
                        f"({format_gib(budget)}), got {format_gib(reserved)}", "error"))
        if reserved < need:
            out.append((f"spec.memory.{tier}_bytes", f"must be at least {format_gib(need)}: the plan places {what}, "
                        f"got {format_gib(reserved)}", "error"))
    return out


def _status_memory_problems(plan) -> list[tuple[str, str, str]]:
    spec, out, seen = plan.spec, [], set()
    for index, usage in enumerate(plan.status.memory):
        where = f"status.memory[{index}]"
        if usage.tier in seen:
            out.append((f"{where}.tier", f"duplicate tier '{usage.tier}'", "error"))
        seen.add(usage.tier)
        budget_field = BUDGET_FIELD[usage.tier]
        budget = getattr(spec.budgets, budget_field)
        if usage.capacity_bytes != budget:
            out.append((f"{where}.capacity_bytes", f"must equal spec.budgets.{budget_field} ({budget}), "
                        f"got {usage.capacity_bytes}", "error"))
        if usage.used_bytes > usage.capacity_bytes:
            out.append((f"{where}.used_bytes", f"must not exceed capacity_bytes ({format_gib(usage.capacity_bytes)})"
                        f", got {format_gib(usage.used_bytes)}", "error"))
    return out


def _status_time_problems(plan) -> list[tuple[str, str, str]]:
    spec, predicted, out = plan.spec, plan.status.predicted, []
    devices = {}
    for group in spec.layer_groups:
        for sub in group.sublayers:
            devices[(group.name, sub.name)] = {"prefill": sub.prefill, "decode": sub.decode}
    seen = set()
    for index, item in enumerate(predicted.sublayers):
        where = f"status.predicted.sublayers[{index}]"
        if (item.group, item.name) not in devices:
            out.append((where, f"names no sublayer of the plan: group '{item.group}' has no unit '{item.name}'",
                        "error"))
            continue
        if (item.group, item.name, item.phase) in seen:
            out.append((where, f"duplicate entry for group '{item.group}' unit '{item.name}' in {item.phase}",
                        "error"))
        seen.add((item.group, item.name, item.phase))
        planned = devices[(item.group, item.name)][item.phase]
        if item.device != planned:
            out.append((f"{where}.device", f"must be '{planned}': spec places group '{item.group}' unit "
                        f"'{item.name}' on '{planned}' in {item.phase}, got '{item.device}'", "error"))
    work = spec.workload
    total = predicted.prefill_seconds + predicted.decode_seconds
    if not _close(predicted.total_seconds, total):
        out.append(("status.predicted.total_seconds", f"must equal prefill_seconds + decode_seconds ({total:.6g}), "
                    f"got {predicted.total_seconds:.6g}", "error"))
    if predicted.total_seconds > 0:
        rate = work.batch_size * work.gen_len / predicted.total_seconds
        if not _close(predicted.tokens_per_second, rate):
            out.append(("status.predicted.tokens_per_second", f"must equal batch_size × gen_len / total_seconds "
                        f"({rate:.6g}), got {predicted.tokens_per_second:.6g}", "error"))
    return out


def _status_serving_problems(plan) -> list[tuple[str, str, str]]:
    """status.serving against spec.serving: one row per serving batch, in order, with its share of the weights;
    sharing one memory placement never beats the batch size's own optimum (the compiler's optimum is exact)."""
    batches, rows = plan.spec.serving.batches, plan.status.serving.batches
    want = [b.batch_size for b in batches]
    got = [r.batch_size for r in rows]
    if got != want:
        return [("status.serving.batches", f"must hold one row per spec.serving.batches entry, batch sizes "
                 f"{want}, got {got}", "error")]
    out = []
    total = sum(b.weight for b in batches)
    for index, (batch, row) in enumerate(zip(batches, rows)):
        where = f"status.serving.batches[{index}]"
        if total and not _close(row.share, batch.weight / total):
            out.append((f"{where}.share", f"must equal spec.serving.batches[{index}].weight / the sum of weights "
                        f"({batch.weight / total:.6g}), got {row.share:.6g}", "error"))
        if row.step_seconds < row.own_step_seconds * (1 - _RELATIVE_TOLERANCE):
            out.append((f"{where}.step_seconds", f"must be at least own_step_seconds ({row.own_step_seconds:.6g}): "
                        f"a batch size cannot run faster over a shared memory placement than over its own optimum, "
                        f"got {row.step_seconds:.6g}", "error"))
    return out


def validate_plan_file(path: str | Path):
    """Read one plan file → (OffloadPlan or None, findings)."""
    source = str(path)
    try:
        doc = read_yaml(path, source)
    except LiacError as e:
        return None, [Finding(source, e.path, e.message)]
    return validate_document(doc, source)


def validate_sweep(directory: Path):
    """A sweep directory → (sources checked, findings): each plan, and index.yaml against the plans."""
    checked, findings, plans = [], [], {}
    files = plan_files(directory)
    if not files:
        return [str(directory)], [Finding(str(directory), "", "holds no plan files (*.yaml)")]
    for path in files:
        plan, found = validate_plan_file(path)
        checked.append(str(path))
        findings.extend(found)
        plans[path.name] = plan
    index_source = str(directory / INDEX_NAME)
    doc, problems = read_index(directory)
    checked.append(index_source)
    if problems:
        findings += [Finding(index_source if path else str(directory), path, message) for path, message in problems]
    else:
        findings += [Finding(index_source, path, message) for path, message in index_problems(doc, plans)]
    return checked, findings


def validate_catalog(directory: Path):
    """A directory of sweeps (like plans/) → (sources checked, findings): every sweep in it, and its sweeps.yaml
    when present (each entry names a model and hardware and either an existing sweep directory or a reason)."""
    checked, findings = [], []
    sweeps = [d for d in sorted(directory.iterdir()) if d.is_dir() and plan_files(d)]
    for sweep in sweeps:
        done, found = validate_sweep(sweep)
        checked += done
        findings += found
    path = directory / CATALOG_NAME
    if not path.is_file():
        return checked, findings
    checked.append(str(path))
    try:
        doc = read_yaml(path)
    except LiacError as e:
        return checked, findings + [Finding(str(path), "", e.message)]
    if not isinstance(doc, dict) or not isinstance(doc.get("sweeps"), list):
        return checked, findings + [Finding(str(path), "sweeps", "must be a list of {model, hardware, directory "
                                                                 "or reason}")]
    listed = set()
    for index, entry in enumerate(doc["sweeps"]):
        where = f"sweeps[{index}]"
        if not isinstance(entry, dict) or not {"model", "hardware"} <= set(entry) \
                or ("directory" in entry) == ("reason" in entry):
            findings.append(Finding(str(path), where, "must name 'model' and 'hardware', and either 'directory' or "
                                                      "'reason'"))
            continue
        if "directory" in entry:
            name = entry["directory"]
            if isinstance(name, str) and name == safe_name(name):
                listed.add(name)
            if not isinstance(name, str) or name != safe_name(name) or not (directory / name / INDEX_NAME).is_file():
                findings.append(Finding(str(path), f"{where}.directory", f"{brief(name)} must be a sweep "
                                                                         f"directory beside {CATALOG_NAME}"))
    for sweep in sweeps:
        if sweep.name not in listed:
            findings.append(Finding(str(path), "sweeps", f"must list every sweep directory: '{sweep.name}' is "
                                                         "missing"))
    return checked, findings


def validate_path(path: str | Path) -> tuple[list[str], list[Finding]]:
    """A plan file, a sweep directory (or its index.yaml), or a directory of sweeps (or its sweeps.yaml) →
    (sources checked, findings)."""
    path = Path(path)
    if path.name == INDEX_NAME and path.is_file():
        return validate_sweep(path.parent)
    if path.name == CATALOG_NAME and path.is_file():
        return validate_catalog(path.parent)
    if path.is_dir() and not plan_files(path) and any(plan_files(d) for d in path.iterdir() if d.is_dir()):
        return validate_catalog(path)
    if path.is_dir():
        return validate_sweep(path)
    _, findings = validate_plan_file(path)
    return [str(path)], findings
