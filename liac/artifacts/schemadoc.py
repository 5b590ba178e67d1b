"""JSON Schema of the plan → docs/plan-format.md (every field, type, enum, bound and description).

The page is generated, never edited by hand: `scripts/refresh-artifacts` (or `liac docs --plan-format FILE`)
writes it, and tests/artifacts/test_schemadoc.py fails when the committed page differs from a fresh render. The
prose around the tables (semantic rules, versioning procedure) lives in `liac/templates/plan-format.md.j2`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from liac.artifacts.render import template_environment
from liac.migrate import MIGRATIONS
from liac.plan import API_VERSION, plan_json_schema

__all__ = ["SchemaField", "SchemaRecord", "schema_records", "render_plan_format"]


@dataclass(frozen=True)
class SchemaField:
    """One row of a record's table."""

    name: str
    type: str
    required: bool
    constraints: str
    description: str


@dataclass(frozen=True)
class SchemaRecord:
    """One object of the schema, addressed by its YAML path ('spec.layer_groups[]')."""

    path: str
    description: str
    fields: tuple[SchemaField, ...]


def _type_of(node: dict[str, Any], path: str) -> str:
    if node.get("type") == "array":
        item = node["items"]
        return f"list of [`{path}[]`](#{_anchor(path + '[]')})" if item.get("type") == "object" and \
            "properties" in item else f"list of {item.get('type')}"
    if node.get("type") == "object" and "properties" in node:
        return f"[`{path}`](#{_anchor(path)})"
    if node.get("type") == "object":
        return "mapping"
    return str(node.get("type"))


def _anchor(path: str) -> str:
    """GitHub's heading anchor for a heading that is just `path` in backquotes."""
    return "".join(c for c in path.lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def _constraints(node: dict[str, Any]) -> str:
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    if "minimum" in node:
        parts.append(f"≥ {node['minimum']}")
    if "maximum" in node:
        parts.append(f"≤ {node['maximum']}")
    if "pattern" in node:
        parts.append(f"matches `{node['pattern']}`")
    return "; ".join(parts)


def schema_records(schema: dict[str, Any], path: str = "") -> list[SchemaRecord]:
    """Depth-first list of the schema's objects, fields in declaration order."""
    out: list[SchemaRecord] = []
    children: list[tuple[str, dict]] = []
    rows = []
    required = set(schema.get("required", ()))
    for name, node in schema.get("properties", {}).items():
        child = f"{path}.{name}" if path else name
        rows.append(SchemaField(name, _type_of(node, child), name in required, _constraints(node),
                                node.get("description", "")))
        if node.get("type") == "object" and "properties" in node:
            children.append((child, node))
        elif node.get("type") == "array" and "properties" in node.get("items", {}):
            children.append((child + "[]", {**node["items"]}))
    out.append(SchemaRecord(path or "(document)", schema.get("description", ""), tuple(rows)))
    for child, node in children:
        out.extend(schema_records(node, child))
    return out


def render_plan_format() -> str:
    """The text of docs/plan-format.md for the current code."""
    schema = plan_json_schema()
    versions = [(old, new) for old, (new, _) in sorted(MIGRATIONS.items())]
    functions = {old: function.__name__ for old, (_, function) in MIGRATIONS.items()}
    return template_environment().get_template("plan-format.md.j2").render(
        api_version=API_VERSION, records=schema_records(schema), versions=versions, functions=functions,
        schema_file=f"liac/schema/offload-plan-{API_VERSION.split('/')[1]}.schema.json")
