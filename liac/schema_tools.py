"""Frozen dataclasses as a schema: load (with path-named errors), dump, and JSON Schema generation.

A record is a frozen dataclass whose fields use these types: `int`, `float`, `str`, `bool`, `dict` (a free-form
mapping, checked by the record's own code), another record, `Record | None` with default None (an optional record:
absent from the YAML when None, Go's `omitempty`), or `tuple[Record, ...]` (a YAML list of records).
Field metadata (`spec_field(...)`) adds `enum`, `minimum`, `maximum`, `pattern` and `doc`, which both the loader and the
generated JSON Schema enforce, so the two cannot drift. A `float` must be finite (NaN and infinities are not JSON
numbers either); values quoted in errors are bounded (`liac.errors.brief`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import MISSING, field, fields, is_dataclass
from typing import Any

from liac.errors import LiacError, brief

__all__ = ["spec_field", "from_data", "to_data", "json_schema", "stable_float", "scalar_problem"]


def spec_field(doc: str, *, enum: tuple[str, ...] | None = None, minimum: float | None = None,
               maximum: float | None = None, pattern: str | None = None, default: Any = MISSING):
    meta = {"doc": doc}
    if enum is not None:
        meta["enum"] = tuple(enum)
    if minimum is not None:
        meta["minimum"] = minimum
    if maximum is not None:
        meta["maximum"] = maximum
    if pattern is not None:
        meta["pattern"] = pattern
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def stable_float(value: float, digits: int = 6) -> float:
    """Round to `digits` significant digits so dumps are stable across platforms and runs."""
    if value == 0 or value != value or value in (float("inf"), float("-inf")):
        return float(value)
    return float(f"{value:.{digits}g}")


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(typ) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            dict: "a mapping"}.get(typ, "a mapping")


def from_data(cls, data: Any, source: str, path: str = ""):
    """Build record `cls` from plain data (parsed YAML/JSON); the first problem raises a path-named LiacError."""
    if not isinstance(data, dict):
        raise LiacError(source, f"must be a mapping, got {type(data).__name__}", path=path or "(document)")
    hints = _hints(cls)
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            name = brief(key, 60, quote=False) if isinstance(key, str) else brief(key)
            where = f"{path}.{name}" if path else name
            raise LiacError(source, f"unknown field: must be one of {', '.join(sorted(known))}", path=where)
    values = {}
    for f in fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        if f.name not in data:
            if f.default is not MISSING:
                values[f.name] = f.default
                continue
            if f.default_factory is not MISSING:  # type: ignore[misc]
                values[f.name] = f.default_factory()  # type: ignore[misc]
                continue
            raise LiacError(source, "required field is missing", path=where)
        values[f.name] = _value(hints[f.name], f.metadata, data[f.name], source, where)
    return cls(**values)


def _optional(typ):
    """The record type of an optional field (`Record | None`), else None."""
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if len(args) == 1 and type(None) in typing.get_args(typ):
            return args[0]
    return None


def _value(typ, meta, value, source, where):
    inner = _optional(typ)
    if inner is not None:
        return None if value is None else _value(inner, meta, value, source, where)
    origin = typing.get_origin(typ)
    if origin is tuple:
        (item,) = [a for a in typing.get_args(typ) if a is not Ellipsis]
        if not isinstance(value, list):
            raise LiacError(source, f"must be a list, got {type(value).__name__}", path=where)
        return tuple(_value(item, meta, v, source, f"{where}[{index}]") for index, v in enumerate(value))
    if is_dataclass(typ):
        return from_data(typ, value, source, where)
    if typ is dict:
        if not isinstance(value, dict):
            raise LiacError(source, f"must be a mapping, got {type(value).__name__}", path=where)
        return dict(value)
    message, value = scalar_problem(typ, meta, value)
    if message:
        raise LiacError(source, message, path=where)
    return value


def scalar_problem(typ, meta, value) -> tuple[str | None, Any]:
    """A leaf value (int, float, str, bool) against its type and field metadata → (what is wrong or None, the
    value as loaded: ints become floats where a float is expected). Shared by `from_data` and `liac validate`'s
    walker (liac/artifacts/schema_check.py), so both word every problem the same way."""
    if typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            try:
                number = float(value)
            except OverflowError:  # an integer beyond any float
                number = math.inf
            if not math.isfinite(number):
                return f"must be a finite number, got {brief(value)}", value
            value = number
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, typ)
    if not ok:
        return f"must be {_type_name(typ)}, got {brief(value)}", value
    if "enum" in meta and value not in meta["enum"]:
        allowed = ", ".join(f"'{v}'" for v in meta["enum"])
        return f"unsupported value {brief(value)}: must be one of {allowed}", value
    if "minimum" in meta and value < meta["minimum"]:
        return f"must be at least {meta['minimum']}, got {brief(value)}", value
    if "maximum" in meta and value > meta["maximum"]:
        return f"must be at most {meta['maximum']}, got {brief(value)}", value
    if "pattern" in meta and not re.fullmatch(meta["pattern"], value):
        return f"must match '{meta['pattern']}', got {brief(value)}", value
    return None, value


def to_data(record) -> Any:
    """Record → plain data (floats rounded by `stable_float`); the inverse of `from_data`."""
    if is_dataclass(record):  # an optional record left unset (None) is left out
        return {f.name: to_data(getattr(record, f.name)) for f in fields(record)
                if not (getattr(record, f.name) is None and f.default is None)}
    if isinstance(record, (list, tuple)):
        return [to_data(v) for v in record]
    if isinstance(record, dict):
        return {str(k): to_data(v) for k, v in record.items()}
    if isinstance(record, float):
        return stable_float(record)
    return record


def json_schema(cls, title: str | None = None) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of record `cls`."""
    schema = _schema_of(cls)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **({"title": title} if title else {}),
              **schema}
    return schema


def _schema_of(cls) -> dict[str, Any]:
    hints = _hints(cls)
    props, required = {}, []
    for f in fields(cls):
        props[f.name] = _schema_of_type(hints[f.name], f.metadata)
        if f.default is MISSING and f.default_factory is MISSING:  # type: ignore[misc]
            required.append(f.name)
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": props}
    if cls.__doc__:
        out["description"] = " ".join(cls.__doc__.split())
    if required:
        out["required"] = required
    return out


def _schema_of_type(typ, meta) -> dict[str, Any]:
    inner = _optional(typ)
    if inner is not None:  # absent when unset: not in 'required' (its default is None)
        return _schema_of_type(inner, meta)
    origin = typing.get_origin(typ)
    if origin is tuple:
        (item,) = [a for a in typing.get_args(typ) if a is not Ellipsis]
        out = {"type": "array", "items": _schema_of_type(item, {})}
    elif is_dataclass(typ):
        out = _schema_of(typ)
    elif typ is dict:
        out = {"type": "object"}
    else:
        out = {"type": {int: "integer", float: "number", str: "string", bool: "boolean"}[typ]}
    if meta.get("doc"):
        out["description"] = meta["doc"]
    if "enum" in meta:
        out["enum"] = list(meta["enum"])
    if "minimum" in meta:
        out["minimum"] = meta["minimum"]
    if "maximum" in meta:
        out["maximum"] = meta["maximum"]
    if "pattern" in meta:
        out["pattern"] = meta["pattern"]
    return out


def replace(record, **changes):
    return dataclasses.replace(record, **changes)
