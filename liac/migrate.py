"""Plan document (older apiVersion) → plan document (next apiVersion): the migration functions.

Each incompatible change to the plan format bumps `apiVersion` and adds one function here,

    def migrate_<old>_to_<new>(doc: dict) -> dict

pure (no I/O, the input is not mutated), registered below in `MIGRATIONS[old] = (new, function)`. The plan loader
(`liac.plan.parse_plan`) and `liac validate` apply them in a chain (v1alpha1 → v1 → v2 ...) with `migrate_document`
before validating, so every document ever written keeps loading. This module sits beside the schema it migrates
(liac/plan.py, whose `API_VERSION` is the newest version here) and imports only `liac.errors`.
A migration encodes the format *as it was*: it must not read today's tables (unit names, enums) that a later change
could alter, so the tables it needs are frozen copies below. docs/plan-format.md ("Versioning") has the procedure;
tests/test_migrate.py loads a kept fixture of every old version.

Versions:
    liac/v1alpha1  placement as per-phase maps ({prefill: {qkv: gpu, ...}, decode: {...}}) plus a `weights` map
                   from unit to tier (units without weights absent), on each layer group.
    liac/v1        placement as a list of units in execution order, each `{name, prefill, decode, weights}`.
    liac/v2        each unit also gives the CPU's share of its output features per phase, `prefill_cpu_permille`
                   and `decode_cpu_permille`, and may be 'split' between the CPU and the GPU (issue 6).
    liac/v3        `spec.execution` says how the prefill is cut into micro-batches, `prefill_microbatch_sequences`
                   and `prefill_microbatch_tokens` (issue 17).
    liac/v4        `spec.serving` (a compute placement per live batch size over the one memory placement: serving
                   plans) and `status.serving` (their predicted costs); both are empty for a plan of one point
                   (issue 15).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from liac.errors import LiacError, brief

__all__ = ["MigrationError", "migrate_v1alpha1_to_v1", "migrate_v1_to_v2", "migrate_v2_to_v3", "migrate_v3_to_v4",
           "V1ALPHA1", "V1", "V2", "V3", "V4", "LATEST", "MIGRATIONS", "migrate_document"]

V1ALPHA1 = "liac/v1alpha1"
V1 = "liac/v1"
V2 = "liac/v2"
V3 = "liac/v3"
V4 = "liac/v4"
LATEST = V4  # what liac writes (liac.plan.API_VERSION)

# Units of one layer in execution order as of liac/v1 (frozen copy of liac.models.SUBLAYERS at that version).
_V1_UNITS = {
    "embed": ("embed",),
    "head": ("lm_head",),
    "opt": ("qkv", "attn_score", "attn_context", "out_proj", "fc1", "fc2"),
    "llama": ("qkv", "attn_score", "attn_context", "out_proj", "gate_up", "down"),
    "qwen2": ("qkv", "attn_score", "attn_context", "out_proj", "gate_up", "down"),
    "mixtral": ("qkv", "attn_score", "attn_context", "out_proj", "router", "experts"),
}
_V1_WEIGHTLESS = ("attn_score", "attn_context")


class MigrationError(ValueError):
    """An old document that cannot be migrated: `path` is the YAML path in the *old* document."""

    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")


def _mapping(value: Any, path: str) -> dict:
    if not isinstance(value, dict):
        raise MigrationError(path, f"must be a mapping, got {type(value).__name__}")
    return value


def _group_v1alpha1_to_v1(group: dict, units: tuple[str, ...], path: str) -> dict:
    placement = _mapping(group.get("placement"), f"{path}.placement")
    prefill = _mapping(placement.get("prefill"), f"{path}.placement.prefill")
    decode = _mapping(placement.get("decode"), f"{path}.placement.decode")
    weights = _mapping(group.get("weights", {}), f"{path}.weights")
    for where, table in ((f"{path}.placement.prefill", prefill), (f"{path}.placement.decode", decode),
                         (f"{path}.weights", weights)):
        unknown = sorted(set(table) - set(units))
        if unknown:
            raise MigrationError(f"{where}.{unknown[0]}", "unknown sublayer: must be one of "
                                 + ", ".join(f"'{u}'" for u in units))
    sublayers = []
    for unit in units:
        for where, table in ((f"{path}.placement.prefill", prefill), (f"{path}.placement.decode", decode)):
            if unit not in table:
                raise MigrationError(f"{where}.{unit}", "required sublayer is missing")
        # v1alpha1 left weightless units out of `weights`; v1 spells that 'none'.
        tier = weights.get(unit, "none" if unit in _V1_WEIGHTLESS else None)
        if tier is None:
            raise MigrationError(f"{path}.weights.{unit}", "required sublayer is missing")
        sublayers.append({"name": unit, "prefill": prefill[unit], "decode": decode[unit], "weights": tier})
    out = {key: value for key, value in group.items() if key not in ("placement", "weights")}
    out["sublayers"] = sublayers
    return out


def migrate_v1alpha1_to_v1(doc: dict) -> dict:
    """liac/v1alpha1 → liac/v1: per-phase placement maps become the ordered list of sublayer placements.

    Args:
        doc: a parsed liac/v1alpha1 document (not modified).

    Returns:
        A new liac/v1 document; everything but the layer groups' placement is carried over unchanged.

    Raises:
        MigrationError: naming the path in the old document when a group's maps do not name its units exactly.
    """
    out = copy.deepcopy(doc)
    out["apiVersion"] = V1
    spec = _mapping(out.get("spec"), "spec")
    model = _mapping(spec.get("model"), "spec.model")
    family = model.get("family")
    if family not in _V1_UNITS or family in ("embed", "head"):
        raise MigrationError("spec.model.family", f"unsupported value {brief(family)}: must be one of "
                             + ", ".join(f"'{f}'" for f in ("opt", "llama", "qwen2", "mixtral")))
    groups = spec.get("layer_groups")
    if not isinstance(groups, list):
        raise MigrationError("spec.layer_groups", "must be a list")
    new_groups = []
    for index, group in enumerate(groups):
        path = f"spec.layer_groups[{index}]"
        group = _mapping(group, path)
        layer_class = group.get("layer_class")
        units = _V1_UNITS.get(family if layer_class == "decoder" else layer_class)
        if units is None or layer_class not in ("embed", "decoder", "head"):
            raise MigrationError(f"{path}.layer_class", f"unsupported value {brief(layer_class)}: must be one of "
                                 "'embed', 'decoder', 'head'")
        new_groups.append(_group_v1alpha1_to_v1(group, units, path))
    spec["layer_groups"] = new_groups
    return out


# The CPU's permille of a v1 placement (frozen: v1 had only whole placements).
_V1_PERMILLE = {"cpu": 1000, "gpu": 0}


def migrate_v1_to_v2(doc: dict) -> dict:
    """liac/v1 → liac/v2: every sublayer gains `prefill_cpu_permille` and `decode_cpu_permille`, 1000 where v1 put
    it on the CPU and 0 on the GPU (v1 had no splits).

    Args:
        doc: a parsed liac/v1 document (not modified).

    Returns:
        A new liac/v2 document; everything else is carried over unchanged.

    Raises:
        MigrationError: naming the path in the old document when a group or sublayer is not a mapping, or a
            placement is neither 'cpu' nor 'gpu'.
    """
    out = copy.deepcopy(doc)
    out["apiVersion"] = V2
    spec = _mapping(out.get("spec"), "spec")
    groups = spec.get("layer_groups")
    if not isinstance(groups, list):
        raise MigrationError("spec.layer_groups", "must be a list")
    for index, group in enumerate(groups):
        path = f"spec.layer_groups[{index}]"
        subs = _mapping(group, path).get("sublayers")
        if not isinstance(subs, list):
            raise MigrationError(f"{path}.sublayers", "must be a list")
        for position, sub in enumerate(subs):
            where = f"{path}.sublayers[{position}]"
            sub = _mapping(sub, where)
            for phase in ("prefill", "decode"):
                device = sub.get(phase)
                if device not in _V1_PERMILLE:
                    raise MigrationError(f"{where}.{phase}", f"unsupported value {brief(device)}: must be one of "
                                         "'cpu', 'gpu'")
                sub[f"{phase}_cpu_permille"] = _V1_PERMILLE[device]
    return out


def _positive_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MigrationError(path, f"must be a positive integer, got {value!r}")
    return value


def migrate_v2_to_v3(doc: dict) -> dict:
    """liac/v2 → liac/v3: `spec.execution` gains `prefill_microbatch_sequences` = `spec.workload.batch_size` and
    `prefill_microbatch_tokens` = `spec.workload.prompt_len`: v2 prefilled the whole batch at once.

    Args:
        doc: a parsed liac/v2 document (not modified).

    Returns:
        A new liac/v3 document; everything else is carried over unchanged.

    Raises:
        MigrationError: naming the path in the old document when the workload or the execution is not a mapping,
            or the batch size or the prompt length is not a positive integer.
    """
    out = copy.deepcopy(doc)
    out["apiVersion"] = V3
    spec = _mapping(out.get("spec"), "spec")
    work = _mapping(spec.get("workload"), "spec.workload")
    execution = _mapping(spec.get("execution"), "spec.execution")
    execution["prefill_microbatch_sequences"] = _positive_int(work.get("batch_size"), "spec.workload.batch_size")
    execution["prefill_microbatch_tokens"] = _positive_int(work.get("prompt_len"), "spec.workload.prompt_len")
    return out


def migrate_v3_to_v4(doc: dict) -> dict:
    """liac/v3 → liac/v4: the plan gains `spec.serving` and `status.serving`, both with no batches (a v3 plan is a
    plan of one workload point: its layer groups are the placement at its batch).

    Args:
        doc: a parsed liac/v3 document (not modified).

    Returns:
        A new liac/v4 document; everything else is carried over unchanged.

    Raises:
        MigrationError: naming the path in the old document when `spec` or `status` is not a mapping, or already
            holds a `serving` field (v3 had none).
    """
    out = copy.deepcopy(doc)
    out["apiVersion"] = V4
    for part in ("spec", "status"):
        section = _mapping(out.get(part), part)
        if "serving" in section:
            raise MigrationError(f"{part}.serving", "unknown field: liac/v3 has no serving batches")
        section["serving"] = {"batches": []}
    return out


# MIGRATIONS[old] = (new, function(doc) -> doc); each function is pure and covered by a kept fixture
# (tests/fixtures/); docs/plan-format.md ("Versioning") has the procedure.
MIGRATIONS: dict[str, tuple[str, Callable[[dict], dict]]] = {
    V1ALPHA1: (V1, migrate_v1alpha1_to_v1),
    V1: (V2, migrate_v1_to_v2),
    V2: (V3, migrate_v2_to_v3),
    V3: (V4, migrate_v3_to_v4),
}


def migrate_document(doc: Any, source: str) -> Any:
    """An older plan document → the same plan at `LATEST`, one migration at a time (anything else is returned as is).

    Raises:
        LiacError: a migration refused the document (naming the path in the old document and the version).
    """
    seen = set()
    while isinstance(doc, dict) and doc.get("apiVersion") in MIGRATIONS and doc.get("apiVersion") != LATEST:
        version = doc["apiVersion"]
        if version in seen:
            raise LiacError(source, f"migration loop at '{version}'", path="apiVersion")
        seen.add(version)
        _, migrate = MIGRATIONS[version]
        try:
            doc = migrate(doc)
        except MigrationError as e:
            raise LiacError(source, f"{e.message} (while migrating from '{version}')", path=e.path) from e
    return doc
