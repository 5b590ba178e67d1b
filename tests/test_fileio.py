"""liac/fileio.py: YAML read with one-line errors, deterministic YAML out, and writes that are whole or absent."""

from __future__ import annotations

import os

import pytest

from liac.errors import LiacError
from liac.fileio import parse_yaml, read_yaml, write_atomic, yaml_dump


def test_read_yaml_and_its_one_line_errors(tmp_path):
    good = tmp_path / "a.yaml"
    good.write_text("b: 2\na: [1, 2]\n")
    assert read_yaml(good) == {"a": [1, 2], "b": 2}
    with pytest.raises(LiacError) as error:
        read_yaml(tmp_path / "missing.yaml")
    assert error.value.line() == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(LiacError, match="cannot read: .*codec can't decode"):
        read_yaml(binary, source="plan.yaml")
    with pytest.raises(LiacError) as error:
        parse_yaml("a: [unclosed\n", "x.yaml")
    assert error.value.source == "x.yaml" and error.value.message.startswith("not valid YAML: ")
    assert "\n" not in error.value.message


def test_yaml_dump_is_sorted_block_style_without_aliases():
    shared = [1, 2]
    text = yaml_dump({"b": shared, "a": {"z": "x", "y": shared}})
    assert text == "a:\n  y:\n  - 1\n  - 2\n  z: x\nb:\n- 1\n- 2\n"
    assert parse_yaml(text, "t") == {"a": {"y": [1, 2], "z": "x"}, "b": [1, 2]}


def test_write_atomic_replaces_whole_files_and_leaves_nothing_when_it_fails(tmp_path, monkeypatch):
    path = tmp_path / "out" / "plan.yaml"
    write_atomic(path, "one\n")
    os.chmod(path, 0o640)
    write_atomic(path, "two\n")
    assert path.read_text() == "two\n" and (path.stat().st_mode & 0o777) == 0o640  # the mode it had is kept

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, "three\n")
    assert path.read_text() == "two\n" and sorted(p.name for p in path.parent.iterdir()) == ["plan.yaml"]
