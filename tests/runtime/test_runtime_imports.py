"""The plan is the only contract: runtime/ never imports the compiler, and reads `status` only to report it."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def _modules():
    files = sorted(RUNTIME.rglob("*.py"))  # runtime/serve/ too
    assert len(files) >= 10  # the walk really sees the package
    return [(path, ast.parse(path.read_text(), filename=str(path))) for path in files]


def _imported_names(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_runtime_never_imports_passes():
    offending = []
    for path, tree in _modules():
        for name in _imported_names(tree):
            # absolute (liac.passes, passes) or relative (..passes) imports of the compiler
            if name.split(".")[0] == "passes" or "liac.passes" in name or name.lstrip(".").startswith("passes"):
                offending.append(f"{path.name}: {name}")
        text = path.read_text()
        assert "import_module(\"liac.passes" not in text and "__import__(\"liac.passes" not in text
    assert offending == []


def test_walk_catches_a_passes_import():
    tree = ast.parse("from liac.passes import ilp\nimport liac.passes.costs\nfrom ..passes import trace\n")
    names = _imported_names(tree)
    assert "liac.passes.ilp" in names and "liac.passes.costs" in names and "..passes.trace" in names


def test_only_metrics_reads_status():
    readers = set()
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "status":
                readers.add(str(path.relative_to(RUNTIME)))
    assert readers == {"metrics.py"}
