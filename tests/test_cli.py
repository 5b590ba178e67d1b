"""CLI conventions: `--version`, `python -m liac`, docs/cli.md lists every flag, exit codes, dependencies (every
import is a core dependency or an extra that is named in one line when missing)."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import liac
from liac.cli import build_parser, main, version_text
from liac.errors import EXIT_INFEASIBLE, EXIT_INTERRUPTED, EXIT_NEGATIVE, EXIT_USER_ERROR, EXTRAS
from liac.runtime.cli import main as lia_run
from liac.runtime.serve.cli import build_parser as build_serve_parser

ROOT = Path(__file__).parents[1]
CLI_MD = (ROOT / "docs" / "cli.md").read_text()


def _declared() -> tuple[list[str], dict[str, list[str]]]:
    """(core requirements, extra → requirements) from pyproject.toml (Python 3.11+), else from the installed
    metadata, which `make setup` refreshes whenever pyproject.toml changes."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        core, extras = [], {}
        for requirement in metadata.requires("liac") or []:
            text, _, marker = requirement.partition(";")
            match = re.search(r"extra == \"([^\"]+)\"", marker)
            (extras.setdefault(match.group(1), []) if match else core).append(text.strip())
        return core, extras
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_version_on_both_commands(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    text = capsys.readouterr().out.strip()
    assert text == version_text("liac")
    assert text.startswith(f"liac {liac.__version__} (torch {metadata.version('torch')}, Python ")
    assert lia_run(["--version"]) == 0
    assert capsys.readouterr().out.strip() == version_text("lia-run")


def test_python_dash_m_liac(tmp_path):
    done = subprocess.run([sys.executable, "-m", "liac", "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == version_text("liac")
    done = subprocess.run([sys.executable, "-m", "liac", "compile", "--model", "opt-30b", "--gpu-mem", "24",
                           "-o", str(tmp_path / "p.yaml")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == EXIT_USER_ERROR
    assert done.stderr == ("liac compile: --gpu-mem: must be a size with a unit, like '24GiB', '24GB' or '512MiB' "
                           "(or 0), got '24'\n")
    assert not (tmp_path / "p.yaml").exists()


def _sections(text: str) -> dict[str, str]:
    """'## liac compile' → its text (up to the next '## ')."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("liac has no subcommands")


def test_cli_md_documents_every_command_and_flag():
    sections = _sections(CLI_MD)
    parser = build_parser()
    commands = _subparsers(parser)
    assert set(commands) == set(liac.cli.COMMANDS)
    missing = []
    for name, sub in commands.items():
        section = sections.get(f"liac {name}")
        if section is None:
            missing.append(f"section '## liac {name}'")
            continue
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            words = action.option_strings or [action.metavar or action.dest]
            missing += [f"liac {name} {word}" for word in words if f"`{word}" not in section]
    top = sections["liac (top level)"]
    missing += [f"liac {o}" for a in parser._actions for o in a.option_strings if f"`{o}`" not in top]
    assert missing == []
    assert "lia-run" in sections and "lia-run --help" in sections["lia-run"]
    serve = sections["lia-serve"]
    for action in build_serve_parser()._actions:
        if not isinstance(action, argparse._HelpAction):
            words = action.option_strings or [action.dest.upper()]
            assert any(f"`{word}" in serve for word in words), words


def test_cli_md_lists_the_exit_codes():
    table = _sections(CLI_MD)["Conventions"]
    for code in (0, EXIT_NEGATIVE, EXIT_USER_ERROR, EXIT_INFEASIBLE, EXIT_INTERRUPTED):
        assert re.search(rf"^\| {code} \| ", table, flags=re.M), code


def test_every_import_is_a_core_dependency_or_a_named_extra():
    """Every third-party module the installed packages import is a core dependency (so the wheel's requirements
    are complete), or an optional package of EXTRAS whose extra exists in pyproject.toml."""
    declared_core, declared_extras = _declared()
    core = {_requirement_name(r) for r in declared_core}
    extras = {name: {_requirement_name(r) for r in reqs} for name, reqs in declared_extras.items()}
    for module, extra in EXTRAS.items():
        assert module.replace("_", "-") in extras[extra], (module, extra)
    distributions = metadata.packages_distributions()
    imported = set()
    for folder in ("liac", "passes", "runtime"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"liac", "__future__"}
    unlisted = []
    for module in sorted(third_party):
        if module in EXTRAS:
            continue
        dists = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
        if not dists & core:
            unlisted.append(f"{module} ({', '.join(sorted(dists))})")
    assert unlisted == []
    # what `lia-run --weights` and text need is core, not an extra
    assert {"safetensors", "transformers", "huggingface-hub", "tqdm"} <= core


def test_a_missing_extra_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    out = tmp_path / "pages"
    assert main(["docs", str(ROOT / "plans"), "-o", str(out)]) == EXIT_USER_ERROR
    assert capsys.readouterr().err == ("liac docs: figures: needs the optional package 'matplotlib': pip install "
                                       "'liac[docs]'\n")
    assert not out.exists()  # nothing written
    import pulp

    monkeypatch.setitem(sys.modules, "highspy", None)
    monkeypatch.setattr(pulp, "listSolvers", lambda onlyAvailable=False: ["PULP_CBC_CMD"])
    assert main(["compile", "--model", "opt-125m", "--hw", "spr-h100", "--solver", "highs",
                 "-o", str(tmp_path / "p.yaml")]) == EXIT_USER_ERROR
    assert capsys.readouterr().err == ("liac compile: --solver 'highs': needs the optional package 'highspy': "
                                       "pip install 'liac[highs]'\n")


def test_a_usage_error_quoting_an_argument_with_newlines_is_one_line(capsys):
    """Found by bench/fuzz.py (seed 20076 of its text run): argparse quoted the argument with its newlines."""
    for argv in (["compile", "--model", "opt-30b", "name\nwith\nlines", "--batch", "1", "-o", "x"],
                 ["validate", "x.yaml", "--bogus=" + "y" * 5000]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == EXIT_USER_ERROR
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and len(err) < 1100, err
        assert "name\\nwith\\nlines" in err or "y" * 900 in err
