"""Files in and out, safely: the one home of every rule about paths, YAML/JSON reading and atomic writing.

- **Names from files** (a model name, a profile name, a plan's `metadata.name`) become a path component only
  through `safe_name`, which reduces them to `[A-Za-z0-9._+-]`, never hidden, never `.` or `..`, at most
  `NAME_LIMIT` characters: one rule, one function.
- **Names a file points at** (a checkpoint index's `weight_map`) are resolved with `inside`, which refuses
  absolute paths and `..`, so nothing is read from outside the directory the user named.
- **YAML** is read by `read_yaml` / `parse_yaml`: safe types only, no aliases (plans and profiles never need
  them, and a nested alias bomb would expand to gigabytes), at most `MAX_YAML_BYTES`, only from regular files;
  errors name the line and column, never quote the file's text. `load_json` is the same for JSON (NaN and
  Infinity refused). `yaml_dump` writes deterministic YAML: sorted keys, block style, no aliases.
- **Writes** go through `write_atomic`: a temp file beside the target, fsync, rename, fsync of the directory; the
  new file gets the umask's mode (or the mode of the file it replaces).
- **Sweeps** (`SweepWriter`) are transactions: the output directory is checked and locked before any compute
  (`fcntl.flock`, so a second compile into it is refused), the new files are written into a temporary directory
  beside it, files of the user's that are not part of the sweep are carried over (hard links), and the two
  directories are swapped in one `renameat2(RENAME_EXCHANGE)` (two renames where the filesystem has no exchange).
  A killed compile leaves the old sweep or the new one, never a mix; only names the caller owns are dropped.

Every failure is a `LiacError` naming the file and what went wrong, in one line.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any, Callable

import yaml

from liac.errors import LiacError, brief

__all__ = ["NAME_LIMIT", "MAX_YAML_BYTES", "MAX_JSON_BYTES", "safe_name", "inside", "read_text", "parse_yaml",
           "read_yaml", "yaml_dump", "parse_json", "load_json", "write_atomic", "check_writable", "SweepWriter"]

NAME_LIMIT = 200  # characters of a file name we make (leaves room for '.yaml' and a temp suffix under 255 bytes)
MAX_YAML_BYTES = 16 * 2**20  # the largest checked-in plan is ~60 kB; a profile ~5 kB
MAX_JSON_BYTES = 64 * 2**20  # config.json, checkpoint index, --prompt-ids

_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


# ---------------------------------------------------------------------------------------------------------------
# Names


def safe_name(text: object) -> str:
    """Any text → a file name: characters outside `[A-Za-z0-9._+-]` become '_', leading dots become '_' (no
    hidden files, never '.' or '..'), and a name longer than NAME_LIMIT keeps its head and tail around a hash of
    the whole (so the batch suffix of a plan name survives and distinct names stay distinct).

    Example:
        >>> safe_name("/../../escaped")
        '_.._.._escaped'
        >>> safe_name("opt-30b.spr-h100.b1-p128-g32")
        'opt-30b.spr-h100.b1-p128-g32'
    """
    text = str(text)
    name = _UNSAFE.sub("_", text)
    stripped = name.lstrip(".")
    name = "_" * (len(name) - len(stripped)) + stripped
    if len(name) > NAME_LIMIT:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        half = (NAME_LIMIT - len(digest) - 2) // 2
        name = f"{name[:half]}~{digest}~{name[-half:]}"
    return name or "_"


def inside(directory: str | os.PathLike, name: object, source: str, path: str = "") -> Path:
    """`directory / name` for a relative name read from a file in `directory`, refusing anything that leaves it
    (an absolute path, a '..' component, an empty name). Symbolic links inside the directory are followed (the
    Hugging Face cache links a snapshot's files to its blobs)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise LiacError(source, f"must be a file name in '{directory}', got {brief(name)}", path=path)
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or name.startswith("~"):
        raise LiacError(source, f"must name a file inside '{directory}' (no absolute path, no '..'), got "
                                f"{brief(name)}", path=path)
    return Path(directory) / name


# ---------------------------------------------------------------------------------------------------------------
# Reading


def read_text(path: str | os.PathLike, source: str | None = None, max_bytes: int = MAX_YAML_BYTES) -> str:
    """A regular file's text (UTF-8), refusing directories, devices and FIFOs (which could block or never end)
    and files over `max_bytes`."""
    source = str(path) if source is None else source
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise LiacError(source, "must be a regular file")
        if info.st_size > max_bytes:
            raise LiacError(source, f"is {info.st_size} bytes: must be at most {max_bytes} bytes")
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as e:
        raise LiacError(source, f"cannot read: {e.strerror or e}") from e
    if len(data) > max_bytes:
        raise LiacError(source, f"must be at most {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LiacError(source, f"must be UTF-8 text (byte {e.start} is not)") from e


class _NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses aliases (`*name`): no document liac reads needs them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(problem="aliases ('*name') are not allowed", problem_mark=event.start_mark)
        return super().compose_node(parent, index)


_CLoader = getattr(yaml, "CSafeLoader", None)  # libyaml: ~8x faster on the checked-in plans


def _load_no_alias(text: str) -> Any:
    if _CLoader is None:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    # libyaml composes in C, out of reach of compose_node: scan its event stream for aliases first (a fraction of
    # the load's cost), then load. Aliases in C are references, never expanded copies, so the scan is cheap too.
    for event in yaml.parse(text, Loader=_CLoader):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.MarkedYAMLError(problem="aliases ('*name') are not allowed", problem_mark=event.start_mark)
    return yaml.load(text, Loader=_CLoader)  # noqa: S506 - libyaml's SafeLoader


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error as one short line: what and where (line, column), without quoting the document."""
    if isinstance(e, yaml.MarkedYAMLError):
        words = " ".join(part for part in (e.context, e.problem) if part)
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return brief(" ".join(words.split()), 200, quote=False) + where
    return brief(" ".join(str(e).split()), 200, quote=False)


def parse_yaml(text: str, source: str, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """YAML text → plain data (safe types only; aliases refused; at most `max_bytes`)."""
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise LiacError(source, f"must be at most {max_bytes} bytes of YAML")
    try:
        return _load_no_alias(text)
    except yaml.YAMLError as e:
        raise LiacError(source, f"not valid YAML: {_yaml_problem(e)}") from e
    except RecursionError as e:
        raise LiacError(source, "not valid YAML: nested too deeply") from e


def read_yaml(path: str | os.PathLike, source: str | None = None, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """Read and parse a YAML file (see `parse_yaml`).

    Raises:
        LiacError: the file cannot be read, is not a regular file, is too large, or is not valid YAML (named by
            `source`, default the path).
    """
    source = str(path) if source is None else source
    return parse_yaml(read_text(path, source, max_bytes), source, max_bytes)


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper, data):
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)
_Dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]


def yaml_dump(data: Any) -> str:
    """Deterministic YAML: sorted keys, block style, no aliases (the same data gives the same bytes)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120,
                     allow_unicode=True)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str | bytes, source: str) -> Any:
    """JSON → plain data; NaN and Infinity are refused (they are not JSON), as is nesting deeper than Python's
    recursion limit."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise LiacError(source, f"not valid JSON: {brief(' '.join(str(e).split()), 200, quote=False)}") from e
    except RecursionError as e:
        raise LiacError(source, "not valid JSON: nested too deeply") from e


def load_json(path: str | os.PathLike, source: str | None = None, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read and parse a JSON file (see `parse_json`)."""
    source = str(path) if source is None else source
    return parse_json(read_text(path, source, max_bytes), source)


# ---------------------------------------------------------------------------------------------------------------
# Writing


def _fsync_directory(directory: Path) -> None:
    """Make a rename in `directory` durable (a crash after it cannot bring back the old entry)."""
    with contextlib.suppress(OSError):  # some filesystems cannot open or fsync a directory: best effort
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_new(path: Path, data: bytes, mode: int | None = None) -> None:
    """Create `path` (it must not exist), write, fsync. Created with 0o666 so the umask applies, as for any file
    a program writes; `mode` (of a file being replaced) overrides it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(path, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def _bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def _oserror(source: str, what: str, e: OSError) -> LiacError:
    return LiacError(source, f"cannot {what}: {e.strerror or e}")


def write_atomic(path: str | os.PathLike, data: str | bytes, source: str | None = None) -> None:
    """Write `data` to a temp file beside `path`, fsync it, rename it over `path`, fsync the directory: a reader
    (or a crash) never sees half a file. The file gets the mode of the one it replaces, else 0o666 less the umask.

    Raises:
        LiacError: the directory cannot be created or written (read-only, under a file, disk full), naming
            `source` (default: the path).
    """
    path = Path(path)
    source = str(path) if source is None else source
    _refuse_special(path, source)
    tmp = path.parent / f".{path.name[:NAME_LIMIT]}.{secrets.token_hex(4)}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(path.stat().st_mode) if path.is_file() else None
        _write_new(tmp, _bytes(data), mode)
        try:
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise _oserror(source, f"write '{path}'", e) from e
    _fsync_directory(path.parent)


def _refuse_special(path: Path, source: str) -> None:
    """An output may replace a regular file, never a device, FIFO or socket: renaming over `/dev/zero` (as root)
    would replace the device with a file."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # absent (or unreachable: the write itself says why)
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise LiacError(source, f"'{brief(str(path), 120, quote=False)}' is a device, FIFO or socket: must name a "
                                "regular file or a new one")


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            return candidate
    return Path(".")


def check_writable(path: str | os.PathLike, source: str) -> None:
    """Refuse now, before any work, an output file that could not be written later: its directory (or the
    nearest one that exists) must be a directory we can create a file in."""
    path = Path(path)
    if path.is_dir():
        raise LiacError(source, f"'{path}' is a directory: must name a file")
    _refuse_special(path, source)
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise LiacError(source, f"cannot write '{path}': '{base}' is not a directory")
    probe = base / f".liac-probe.{secrets.token_hex(4)}.tmp"
    try:
        _write_new(probe, b"")
    except OSError as e:
        raise _oserror(source, f"write '{path}'", e) from e
    os.unlink(probe)


# ---------------------------------------------------------------------------------------------------------------
# Sweeps


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
        return False
    raise OSError(code, os.strerror(code), str(b))


class SweepWriter:
    """A directory of generated files, replaced as a whole (see the module docstring).

        with SweepWriter("plans/opt-30b", owned=is_sweep_file) as sweep:   # checked, locked: before compute
            ...compute...
            sweep.commit({"index.yaml": text, ...})                        # all or nothing

    Args:
        out: the output directory (created if missing; removed again if the work fails and it is still empty).
        owned: which existing file names belong to the sweep (dropped on commit); every other file in `out`
            is carried over unchanged.
        source: how errors name the output (the CLI flag).

    Raises (on entry):
        LiacError: `out` is a file, is (or contains) the current directory, holds subdirectories (a directory of
            sweeps, not a sweep), cannot be created or written, or another process is writing it.
    """

    def __init__(self, out: str | os.PathLike, owned: Callable[[str], bool], source: str = "-o"):
        self.requested = Path(out)
        self.owned = owned
        self.source = source
        self.out = Path(os.path.abspath(out))
        self._fd: int | None = None
        self._created = False
        self._staging: Path | None = None

    # -- entry: check, create, lock --------------------------------------------------------------------------
    def __enter__(self) -> "SweepWriter":
        try:
            self._open()
        except BaseException:
            self._close(failed=True)
            raise
        return self

    def _fail(self, message: str) -> LiacError:
        return LiacError(self.source, f"'{self.requested}' {message}")

    def _open(self) -> None:
        if self.out.is_symlink():
            self.out = Path(os.path.realpath(self.out))
        out = self.out
        cwd = Path(os.path.abspath(os.getcwd()))
        if out == cwd or out in cwd.parents:
            raise self._fail("is the current directory or one above it: name a directory for the sweep")
        if os.path.lexists(out) and not out.is_dir():
            raise self._fail("exists and is not a directory")
        self._recover_renamed()
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            if not out.exists():
                out.mkdir()
                self._created = True
        except OSError as e:
            raise _oserror(self.source, f"create '{self.requested}'", e) from e
        for _ in range(20):  # another compile may swap a new directory in between our open and our lock
            fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._fail("is being written by another liac process: wait for it to finish or choose "
                                 "another directory") from None
            if os.path.exists(out) and os.fstat(fd).st_ino == os.stat(out).st_ino:
                self._fd = fd
                break
            os.close(fd)
        else:
            raise self._fail("keeps changing while liac tries to lock it")
        self._remove_leftovers()
        for entry in os.scandir(out):
            if entry.is_dir(follow_symlinks=False):
                raise self._fail(f"holds the directory '{brief(entry.name, 60, quote=False)}': a sweep directory "
                                 "holds files only (name a directory of its own, e.g. one per model and profile)")
            if not (entry.is_file(follow_symlinks=False) or entry.is_symlink()):
                raise self._fail(f"holds '{brief(entry.name, 60, quote=False)}', which is not a regular file")
        try:
            self._staging = self._new_staging()
        except OSError as e:
            raise _oserror(self.source, f"write beside '{self.requested}'", e) from e

    def _prefix(self, kind: str) -> str:
        return f".{self.out.name[:NAME_LIMIT]}.liac-{kind}-"

    def _siblings(self, kind: str) -> list[Path]:
        prefix = self._prefix(kind)
        try:
            return sorted(p for p in self.out.parent.iterdir() if p.name.startswith(prefix))
        except OSError:
            return []

    def _new_staging(self) -> Path:
        path = self.out.parent / f"{self._prefix('new')}{secrets.token_hex(6)}"
        path.mkdir()
        return path

    def _recover_renamed(self) -> None:
        """Without RENAME_EXCHANGE a commit is two renames (out → old, new → out): a process killed between
        them leaves no `out` and the old sweep under its 'old' name. Put the old one back."""
        if os.path.lexists(self.out):
            return
        for old in self._siblings("old"):
            with contextlib.suppress(OSError):
                os.rename(old, self.out)
                return

    def _remove_leftovers(self) -> None:
        """Temporary directories of killed commits into this output (we hold its lock, so none is live)."""
        for path in self._siblings("new") + self._siblings("old"):
            shutil.rmtree(path, ignore_errors=True)

    # -- commit ----------------------------------------------------------------------------------------------
    def commit(self, files: dict[str, str | bytes]) -> list[Path]:
        """Replace the sweep: `files` (name → content) plus every file of `out` not owned by the sweep.

        Returns:
            the paths written, in the order of `files`.
        """
        assert self._staging is not None, "commit() outside the with block"
        staging, out = self._staging, self.out
        for name in files:
            if name != safe_name(name) or not self.owned(name):
                raise ValueError(f"refusing to write '{name}': not a file name the sweep owns")
        try:
            for name, data in files.items():
                _write_new(staging / name, _bytes(data))
            for entry in os.scandir(out):
                if entry.name in files or self.owned(entry.name):
                    continue  # replaced, or a stale file of an earlier sweep
                self._carry(Path(entry.path), staging / entry.name)
            os.chmod(staging, stat.S_IMODE(os.stat(out).st_mode))
            _fsync_directory(staging)
            if _exchange(staging, out):
                pass  # staging now holds the old sweep
            else:
                old = out.parent / f"{self._prefix('old')}{secrets.token_hex(6)}"
                os.rename(out, old)
                os.rename(staging, out)
                self._staging = old
            _fsync_directory(out.parent)
        except OSError as e:
            raise _oserror(self.source, f"write '{self.requested}'", e) from e
        return [self.requested / name for name in files]

    @staticmethod
    def _carry(src: Path, dst: Path) -> None:
        """A file of the user's into the new directory, unchanged: the same inode where possible."""
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
            return
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    # -- exit ------------------------------------------------------------------------------------------------
    def __exit__(self, exc_type, exc, tb) -> None:
        self._close(failed=exc_type is not None)

    def _close(self, failed: bool) -> None:
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
        if failed and self._created:
            with contextlib.suppress(OSError):
                self.out.rmdir()  # only when still empty
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None
