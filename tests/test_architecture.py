"""The import rules of docs/architecture.md ("What may import what"), checked by walking every module's imports.

The source tree is read with `ast`, never imported: every `import` and `from ... import` counts, at the top of a
module or inside a function, and under `if TYPE_CHECKING:` too (an import that only an annotation needs is still a
dependency). Checked:

  * each folder imports only the folders its rule allows (the runtime never the compiler; the compiler never the
    tools on top of it; the plan's contract nothing above it);
  * no import cycle between modules;
  * an import inside a function is a *late import* of a heavy or optional dependency and says so in a comment
    ('late import: ...') on its line or right above its block of imports; no liac module under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where a source folder installs (pyproject.toml's package-dir).
PACKAGES = {"liac": "liac", "passes": "liac.passes", "runtime": "liac.runtime"}

# The layers of docs/architecture.md: a module belongs to the first group whose prefix names it.
GROUPS = (
    ("contract", ("liac.errors", "liac.sizes", "liac.fileio", "liac.progress", "liac.migrate", "liac.schema_tools",
                  "liac.plan", "liac.hub", "liac.models", "liac.sweep")),
    ("compiler-core", ("liac.profile", "liac.ir")),
    ("passes", ("liac.passes",)),
    ("runtime", ("liac.runtime",)),
    ("library", ("liac.api", "liac.calibrate", "liac.probe", "liac.host")),
    ("artifacts", ("liac.artifacts",)),
    ("cli", ("liac.commands", "liac.cli", "liac.__main__", "liac.quick")),
    ("package", ("liac",)),
)
# What each group may import (besides itself). The runtime reads plans (the contract) and shares `liac.cli`'s one-line
# argument parser ("cli-parser": that module alone); it never imports a pass.
MAY_IMPORT = {
    "contract": set(),
    "compiler-core": {"contract"},
    "passes": {"contract", "compiler-core"},
    "runtime": {"contract", "cli-parser"},
    "library": {"contract", "compiler-core", "passes"},
    "artifacts": {"contract", "compiler-core", "passes", "library"},
    "cli": {"contract", "compiler-core", "passes", "runtime", "library", "artifacts"},
    "package": set(),
}
# figures.py names each figure by a hash of its own bytes (liac/artifacts/figures.py: STYLE): editing it renames every
# checked-in figure. Its late imports are matplotlib (the optional 'docs' extra), without the comment.
UNCOMMENTED_LATE_IMPORTS = {"liac.artifacts.figures"}


def _sources() -> dict[str, Path]:
    """Module name → file, for every module liac installs."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


SOURCES = _sources()


def _group(module: str) -> str:
    for name, prefixes in GROUPS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    raise AssertionError(f"{module} is in no group of the import rules: add it to GROUPS (and to docs)")


def _target(name: str) -> str | None:
    """The liac module an imported name refers to (a submodule when it is one), or None outside liac."""
    if name != "liac" and not name.startswith("liac."):
        return None
    while name not in SOURCES:
        name = name.rsplit(".", 1)[0]
    return name


class _Imports(ast.NodeVisitor):
    """Every import of a module: (line, imported names, inside a function, under TYPE_CHECKING)."""

    def __init__(self):
        self.found: list[tuple[int, list[str], bool, bool]] = []
        self.depth = 0
        self.type_checking = False

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_If(self, node):
        guarded = isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        before, self.type_checking = self.type_checking, self.type_checking or guarded
        self.generic_visit(node)
        self.type_checking = before

    def visit_Import(self, node):
        self.found.append((node.lineno, [a.name for a in node.names], self.depth > 0, self.type_checking))

    def visit_ImportFrom(self, node):
        base = node.module or ""
        self.found.append((node.lineno, [base] + [f"{base}.{a.name}" for a in node.names], self.depth > 0,
                           self.type_checking))


def _imports(path: Path) -> list[tuple[int, list[str], bool, bool]]:
    visitor = _Imports()
    visitor.visit(ast.parse(path.read_text(), filename=str(path)))
    return visitor.found


def _edges() -> dict[str, set[str]]:
    """Module → the liac modules it imports (anywhere in it)."""
    edges = {}
    for module, path in SOURCES.items():
        targets = set()
        for _, names, _, _ in _imports(path):
            targets.update(t for t in map(_target, names) if t is not None and t != module)
        edges[module] = targets
    return edges


def _allowed(importer: str, imported: str) -> bool:
    source, target = _group(importer), _group(imported)
    if source == target or imported == "liac":
        return True
    if imported == "liac.cli" and "cli-parser" in MAY_IMPORT[source]:
        return True
    return target in MAY_IMPORT[source]


def test_every_folder_imports_only_what_its_rule_allows():
    broken = [f"{importer} ({_group(importer)}) imports {imported} ({_group(imported)})"
              for importer, targets in sorted(_edges().items()) for imported in sorted(targets)
              if not _allowed(importer, imported)]
    assert broken == []


def test_runtime_imports_no_compiler_module():
    """The plan is the only contract: the runtime imports neither a pass nor the IR, profiles or the tools."""
    compiler = ("liac.passes", "liac.ir", "liac.profile", "liac.api", "liac.calibrate", "liac.artifacts",
                "liac.commands")
    found = [f"{m} imports {t}" for m, targets in _edges().items() if m.startswith("liac.runtime")
             for t in targets if t.startswith(compiler)]
    assert found == []


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return out


def test_no_import_cycle_between_modules():
    assert _cycles(_edges()) == []


def test_the_cycle_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _late_import_comment(lines: list[str], line: int) -> bool:
    """A 'late import' comment on the import's line, or above its block of imports (blank lines included)."""
    if "late import" in lines[line - 1]:
        return True
    row = line - 2
    while row >= 0:
        text = lines[row].strip()
        if text.startswith("#"):
            return "late import" in text
        if text and not text.startswith(("import ", "from ")):
            return False
        row -= 1
    return False


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_imports_are_at_the_top_unless_late_and_said_so(module):
    path = SOURCES[module]
    lines = path.read_text().splitlines()
    problems = []
    for line, names, local, type_checking in _imports(path):
        if type_checking and any(_target(n) for n in names):
            problems.append(f"{path.name}:{line}: a liac module under TYPE_CHECKING (an import cycle in hiding)")
        if local and module not in UNCOMMENTED_LATE_IMPORTS and not _late_import_comment(lines, line):
            problems.append(f"{path.name}:{line}: an import inside a function without a '# late import: why' "
                            "comment (imports belong at the top)")
    assert problems == []
