"""liac/fileio.py: safe names, reads kept inside a directory, bounded alias-free YAML, atomic writes, sweeps as
transactions (issue 13, items 1, 3, 4, 5, 6 and 8's write_atomic)."""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import signal
import stat
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liac import fileio
from liac.errors import LiacError
from liac.fileio import (NAME_LIMIT, SweepWriter, check_writable, inside, parse_json, parse_yaml, read_yaml,
                         safe_name, write_atomic, yaml_dump)

OWNED = re.compile(r"index\.yaml|p\d+\.yaml").fullmatch  # a toy sweep's naming


# ---------------------------------------------------------------------------------------------------------------
# Names (item 1)


@pytest.mark.parametrize("text, want", [
    ("opt-30b.spr-h100.b1-p128-g32", "opt-30b.spr-h100.b1-p128-g32"),  # what liac writes is unchanged
    ("/../../../../escaped", "_.._.._.._.._escaped"),
    ("..", "__"), (".", "_"), ("", "_"), (".hidden", "_hidden"), ("a/b\\c\x00d", "a_b_c_d"), ("ü", "_"),
])
def test_safe_name_examples(text, want):
    assert safe_name(text) == want


@given(st.text(max_size=400))
def test_safe_name_is_always_one_plain_component(text):
    name = safe_name(text)
    assert re.fullmatch(r"[A-Za-z0-9_+~-][A-Za-z0-9._+~-]*", name) and len(name) <= NAME_LIMIT
    assert Path(name).name == name and name not in (".", "..")
    if len(text) > NAME_LIMIT:  # long names keep their tail (a plan's batch suffix) and stay distinct
        assert name.endswith(safe_name("x" + text[-20:])[-20:]) and safe_name(text + "x") != name


def test_inside_refuses_what_leaves_the_directory(tmp_path):
    assert inside(tmp_path, "model-00001-of-00002.safetensors", "index") == tmp_path / "model-00001-of-00002.safetensors"
    for name in ("../other/x.safetensors", "/etc/passwd", "a/../../x", "", "~/x", 3, None):
        with pytest.raises(LiacError, match="weight_map.w"):
            inside(tmp_path, name, "index.json", "weight_map.w")


# ---------------------------------------------------------------------------------------------------------------
# YAML and JSON (item 6)


def test_read_yaml_and_its_one_line_errors(tmp_path):
    good = tmp_path / "a.yaml"
    good.write_text("b: 2\na: [1, 2]\n")
    assert read_yaml(good) == {"a": [1, 2], "b": 2}
    with pytest.raises(LiacError) as error:
        read_yaml(tmp_path / "missing.yaml")
    assert error.value.line() == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(LiacError, match="plan.yaml: must be UTF-8 text"):
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


def _alias_bomb(levels: int = 9, width: int = 10) -> str:
    lines = ["a0: &a0 [" + ", ".join(["x"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_refuses_an_alias_bomb_at_once(tmp_path):
    tracemalloc.start()
    with pytest.raises(LiacError, match=r"aliases \('\*name'\) are not allowed at line 2, column"):
        parse_yaml(_alias_bomb(), "bomb.yaml")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 * 2**20  # memory, not seconds: ten to the ninth elements were never built


def test_yaml_refuses_any_alias_and_the_pure_python_loader_agrees(monkeypatch):
    text = "a: &x 1\nb: *x\n"
    with pytest.raises(LiacError, match="aliases"):
        parse_yaml(text, "f.yaml")
    monkeypatch.setattr(fileio, "_CLoader", None)  # without libyaml
    with pytest.raises(LiacError, match="aliases"):
        parse_yaml(text, "f.yaml")
    assert parse_yaml("a: [1, {b: c}]\n", "f.yaml") == {"a": [1, {"b": "c"}]}


def test_yaml_is_bounded_and_never_quotes_the_document(tmp_path):
    with pytest.raises(LiacError, match="at most 100 bytes"):
        parse_yaml("a: " + "x" * 200, "f.yaml", max_bytes=100)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" * 10)
    with pytest.raises(LiacError, match="must be at most 20 bytes"):
        read_yaml(big, max_bytes=20)
    with pytest.raises(LiacError, match="nested too deeply|maximum nesting depth"):
        parse_yaml("[" * 100_000, "deep.yaml")
    secret = "root:x:0:0:root:/root:/bin/bash"
    with pytest.raises(LiacError) as info:
        parse_yaml(f"{secret}\n  - : [\n", "passwd")
    assert "root:/root" not in info.value.line() and "line" in info.value.line()


def test_yaml_and_json_refuse_files_that_are_not_regular(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opening it for reading would block forever
    with pytest.raises(LiacError, match="must be a regular file"):
        read_yaml(fifo)
    with pytest.raises(LiacError, match="must be a regular file"):
        read_yaml(tmp_path)


def test_json_refuses_nan_and_deep_nesting():
    for text in ('{"a": NaN}', '[Infinity]', '{"a": -Infinity}'):
        with pytest.raises(LiacError, match="not a number JSON allows"):
            parse_json(text, "config.json")
    with pytest.raises(LiacError, match="nested too deeply"):
        parse_json("[" * 100_000 + "]" * 100_000, "config.json")


# ---------------------------------------------------------------------------------------------------------------
# write_atomic (item 8)


def test_write_atomic_fsyncs_and_honours_the_umask(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)),
                                                 real_fsync(fd))[1])
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "a.yaml", "x: 1\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.yaml").stat().st_mode) == 0o640
    assert synced == [False, True]  # the file, then its directory (the rename)
    (tmp_path / "a.yaml").chmod(0o600)
    write_atomic(tmp_path / "a.yaml", "x: 2\n")  # a replaced file keeps its mode
    assert stat.S_IMODE((tmp_path / "a.yaml").stat().st_mode) == 0o600
    assert (tmp_path / "a.yaml").read_text() == "x: 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml"]


def test_write_atomic_replaces_whole_files_and_leaves_nothing_when_it_fails(tmp_path, monkeypatch):
    path = tmp_path / "out" / "plan.yaml"
    write_atomic(path, "one\n")
    os.chmod(path, 0o640)
    write_atomic(path, "two\n")
    assert path.read_text() == "two\n" and (path.stat().st_mode & 0o777) == 0o640  # the mode it had is kept

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(LiacError, match="disk full"):
        write_atomic(path, "three\n")
    assert path.read_text() == "two\n" and sorted(p.name for p in path.parent.iterdir()) == ["plan.yaml"]


def test_write_atomic_failure_is_one_error_and_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "plan.yaml"
    target.write_text("old\n")

    def full(path, data, mode=None):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    monkeypatch.setattr(fileio, "_write_new", full)
    with pytest.raises(LiacError, match="No space left on device"):
        write_atomic(target, "new\n", source="-o")
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]
    with pytest.raises(LiacError, match="cannot write"):  # under a file: the directory cannot exist
        write_atomic(target / "x.yaml", "x")


# ---------------------------------------------------------------------------------------------------------------
# Sweeps (items 3, 4, 5)


def _sweep(out: Path, files: dict[str, str], **kwargs) -> list[Path]:
    with SweepWriter(out, owned=OWNED, **kwargs) as writer:
        return writer.commit(files)


def _listing(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir())}


def test_a_sweep_replaces_only_the_files_it_owns(tmp_path):
    out = tmp_path / "sweep"
    _sweep(out, {"p1.yaml": "1", "p2.yaml": "2", "index.yaml": "i"})
    (out / "notes.yaml").write_text("mine")
    (out / "index.yaml").write_text("points: [{file: notes.yaml}, {file: index.yaml}]")  # item 4: a hostile index
    written = _sweep(out, {"p2.yaml": "2'", "index.yaml": "i'"})
    assert written == [out / "p2.yaml", out / "index.yaml"]
    assert _listing(out) == {"index.yaml": "i'", "notes.yaml": "mine", "p2.yaml": "2'"}  # p1 was stale
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]  # no temporary left beside it


def test_a_sweep_refuses_names_it_does_not_own():
    with pytest.raises(ValueError, match="not a file name the sweep owns"):
        _sweep(Path("/nonexistent-never-created/x"), {"../escape.yaml": "x"})


def test_a_second_writer_is_refused_while_the_first_holds_the_directory(tmp_path):
    out = tmp_path / "sweep"
    with SweepWriter(out, owned=OWNED) as first:
        with pytest.raises(LiacError, match="is being written by another liac process"):
            _sweep(out, {"p1.yaml": "x"})
        first.commit({"p1.yaml": "first"})
    assert _listing(out) == {"p1.yaml": "first"}
    _sweep(out, {"p1.yaml": "second"})  # the lock went with the first writer
    assert _listing(out) == {"p1.yaml": "second"}


@pytest.mark.parametrize("where, message", [
    ("file", "exists and is not a directory"),
    ("under-file", "cannot create"),
    ("subdir", "holds the directory 'plans'"),
    ("cwd", "is the current directory or one above it"),
])
def test_an_unusable_output_fails_on_entry(tmp_path, monkeypatch, where, message):
    (tmp_path / "f").write_text("x")
    (tmp_path / "tree" / "plans").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    out = {"file": tmp_path / "f", "under-file": tmp_path / "f" / "sweep", "subdir": tmp_path / "tree",
           "cwd": tmp_path}[where]
    monkeypatch.chdir(tmp_path / ("tree/plans" if where == "cwd" else "elsewhere"))
    with pytest.raises(LiacError, match=message):
        with SweepWriter(out, owned=OWNED):
            raise AssertionError("the block must not run")


def test_a_read_only_parent_fails_on_entry_and_leaves_nothing(tmp_path, monkeypatch):
    def refuse(self):  # as a read-only directory answers (and root, which bypasses modes, would not)
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
    monkeypatch.setattr(SweepWriter, "_new_staging", refuse)
    with pytest.raises(LiacError, match="Permission denied"):
        with SweepWriter(tmp_path / "new", owned=OWNED):
            raise AssertionError("the block must not run")
    assert list(tmp_path.iterdir()) == []  # the directory it created is gone again


def test_a_full_disk_keeps_the_old_sweep(tmp_path, monkeypatch):
    out = tmp_path / "sweep"
    _sweep(out, {"p1.yaml": "1", "index.yaml": "i"})
    real = fileio._write_new
    calls = []

    def fill_up(path, data, mode=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, data, mode)
    monkeypatch.setattr(fileio, "_write_new", fill_up)
    with pytest.raises(LiacError, match="No space left on device"):
        _sweep(out, {"p1.yaml": "1'", "p2.yaml": "2'", "index.yaml": "i'"})
    assert _listing(out) == {"index.yaml": "i", "p1.yaml": "1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]


def _commit_and_die(out: str, stage: str, exchange: bool) -> None:
    """In a child process: commit a new sweep and SIGKILL ourselves at `stage`."""
    def die(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if not exchange:
        fileio._exchange = lambda a, b: False
    if stage == "writing":
        real = fileio._write_new

        def write_then_die(path, data, mode=None):
            real(path, data, mode)
            if Path(path).name == "p2.yaml":
                die()
        fileio._write_new = write_then_die
    elif stage == "swapping":
        if exchange:
            real_exchange = fileio._exchange
            fileio._exchange = lambda a, b: (real_exchange(a, b), die())[0]
        else:
            real_rename = os.rename
            renames = []

            def rename_then_die(a, b):
                real_rename(a, b)
                renames.append(b)
                if len(renames) == 1:  # out moved aside, the new sweep not yet in place
                    die()
            os.rename = rename_then_die
    with SweepWriter(out, owned=OWNED) as writer:
        writer.commit({"p1.yaml": "new", "p2.yaml": "new", "index.yaml": "new"})


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
@pytest.mark.parametrize("stage", ["writing", "swapping"])
def test_a_killed_commit_leaves_the_old_sweep_or_the_new_one(tmp_path, stage, exchange):
    out = tmp_path / "sweep"
    _sweep(out, {"p1.yaml": "old", "p3.yaml": "old", "index.yaml": "old"})
    (out / "notes.yaml").write_text("mine")
    old = _listing(out)
    new = {"p1.yaml": "new", "p2.yaml": "new", "index.yaml": "new", "notes.yaml": "mine"}
    child = multiprocessing.get_context("fork").Process(target=_commit_and_die, args=(str(out), stage, exchange))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    if out.exists():
        assert _listing(out) in (old, new)
    # the next writer recovers (the old sweep put back where only two renames were possible) and cleans up
    _sweep(out, {"p1.yaml": "next", "index.yaml": "next"})
    assert _listing(out) == {"index.yaml": "next", "notes.yaml": "mine", "p1.yaml": "next"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["p1.yaml", "p2.yaml", "index.yaml", "notes.yaml", "a.txt", ".hidden"]),
                unique=True),
       st.lists(st.sampled_from(["p1.yaml", "p2.yaml", "p3.yaml", "index.yaml"]), unique=True, min_size=1))
def test_a_commit_is_old_foreign_files_plus_the_new_ones(tmp_path_factory, before, after):
    out = tmp_path_factory.mktemp("fuzz") / "sweep"
    out.mkdir()
    for name in before:
        (out / name).write_text("before")
    _sweep(out, {name: "after" for name in after})
    want = {name: "before" for name in before if not OWNED(name)} | {name: "after" for name in after}
    assert _listing(out) == dict(sorted(want.items()))


def test_an_output_never_replaces_a_device_or_a_fifo(tmp_path):
    """Found by bench/fuzz.py: `--metrics-out /dev/zero`, run as root, renamed a metrics file over the device."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/zero"), Path("/dev/null")):
        before = os.stat(target).st_mode
        for call in (lambda: check_writable(target, "--metrics-out"), lambda: write_atomic(target, "{}", "--out")):
            with pytest.raises(LiacError, match="is a device, FIFO or socket: must name a regular file or a new one"):
                call()
        assert os.stat(target).st_mode == before and not stat.S_ISREG(os.stat(target).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]  # no temporary left
