"""docs/plan-format.md: generated from the JSON Schema, complete, and fresh."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

from liac.artifacts.schemadoc import render_plan_format
from liac.migrate import MIGRATIONS
from liac.plan import OffloadPlan

PAGE = Path(__file__).resolve().parents[2] / "docs" / "plan-format.md"


def _records(cls, path=""):
    """(YAML path, record class) of every record reachable from `cls`, walked from the dataclasses themselves."""
    yield path or "(document)", cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        typ = hints[f.name]
        child = f"{path}.{f.name}" if path else f.name
        if typing.get_origin(typ) is tuple:
            (typ,) = [a for a in typing.get_args(typ) if a is not Ellipsis]
            child += "[]"
        if dataclasses.is_dataclass(typ):
            yield from _records(typ, child)


def test_committed_page_is_fresh():
    assert PAGE.read_text() == render_plan_format(), (
        "docs/plan-format.md is stale: run scripts/refresh-artifacts (or `liac docs --plan-format "
        "docs/plan-format.md`) and commit the result")


def test_every_field_type_enum_and_description_is_documented():
    text = render_plan_format()
    sections = {chunk.split("`", 1)[0]: chunk for chunk in text.split("\n### `")[1:]}
    for path, cls in _records(OffloadPlan):
        assert path in sections, f"no section for {path}"
        section = sections[path]
        for f in dataclasses.fields(cls):
            row = next((line for line in section.splitlines() if line.startswith(f"| `{f.name}` |")), None)
            assert row is not None, f"{path}.{f.name} is not documented"
            for value in f.metadata.get("enum", ()):
                assert f"`{value}`" in row
            doc = f.metadata["doc"].replace("<", "&lt;").replace(">", "&gt;")
            assert row.endswith(f"| {doc} |")


def test_versioning_section_lists_every_migration():
    text = render_plan_format()
    for old, (new, function) in MIGRATIONS.items():
        assert f"| `{old}` | `liac.migrate.{function.__name__}` | `{new}` |" in text
