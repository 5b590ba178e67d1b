"""Plain data + record class → every schema violation, each with its YAML path (not just the first).

`liac.schema_tools.from_data` stops at the first problem, which is right for a loader; `liac validate` must report
all of them. This walker follows the same rules (required and unknown fields, types, `enum`, `minimum`,
`maximum`, `pattern` from `spec_field` metadata; leaves through the loader's own `scalar_problem`) and words each
message exactly as `from_data` does, so the first problem it
finds is the one the loader raises (tests/artifacts/test_validate.py checks that).
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any

from liac.errors import brief
from liac.schema_tools import scalar_problem

__all__ = ["schema_problems"]


def schema_problems(cls, data: Any, path: str = "") -> list[tuple[str, str]]:
    """Every way `data` fails to be a `cls` record, as (YAML path, message) pairs in document order.

    Args:
        cls: a record class (frozen dataclass using `spec_field`), e.g. `liac.plan.OffloadPlan`.
        data: parsed YAML.
        path: the YAML path of `data` ('' for the document).

    Returns:
        An empty list when `liac.schema_tools.from_data(cls, data, ...)` would succeed.
    """
    if not isinstance(data, dict):
        return [(path or "(document)", f"must be a mapping, got {type(data).__name__}")]
    problems: list[tuple[str, str]] = []
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            name = brief(key, 60, quote=False) if isinstance(key, str) else brief(key)
            problems.append((f"{path}.{name}" if path else name,
                             f"unknown field: must be one of {', '.join(sorted(known))}"))
    for f in fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:  # type: ignore[misc]
                problems.append((where, "required field is missing"))
            continue
        problems.extend(_value_problems(hints[f.name], f.metadata, data[f.name], where))
    return problems


def _value_problems(typ, meta, value, where) -> list[tuple[str, str]]:
    args = typing.get_args(typ)
    if type(None) in args and len(args) == 2 and any(is_dataclass(a) for a in args):  # an optional record
        if value is None:
            return []
        (typ,) = [a for a in args if a is not type(None)]
        if not isinstance(value, dict):
            return [(where, f"must be a mapping, got {type(value).__name__}")]
        return schema_problems(typ, value, where)
    if typing.get_origin(typ) is tuple:
        (item,) = [a for a in typing.get_args(typ) if a is not Ellipsis]
        if not isinstance(value, list):
            return [(where, f"must be a list, got {type(value).__name__}")]
        out = []
        for index, element in enumerate(value):
            out.extend(_value_problems(item, meta, element, f"{where}[{index}]"))
        return out
    if is_dataclass(typ):
        return schema_problems(typ, value, where)
    if typ is dict:
        return [] if isinstance(value, dict) else [(where, f"must be a mapping, got {type(value).__name__}")]
    message, _ = scalar_problem(typ, meta, value)
    return [(where, message)] if message else []
