"""Files liac reads and writes: YAML documents in, deterministic YAML and atomic writes out.

Every plan, profile, index, page and metrics document goes through here, so how liac touches a file is decided once:

    read_yaml(path)          safe_load of one file; an unreadable file or invalid YAML is one LiacError line
    yaml_dump(data)          sorted keys, block style, no aliases: the same data gives the same bytes
    write_atomic(path, text) a temp file beside `path`, then a rename: readers never see half a file

    from liac.fileio import read_yaml, write_atomic, yaml_dump
    write_atomic("out/index.yaml", yaml_dump({"points": []}))
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from liac.errors import LiacError

__all__ = ["read_yaml", "parse_yaml", "yaml_dump", "write_atomic"]


def read_yaml(path: str | os.PathLike, source: str | None = None) -> Any:
    """One YAML file → plain data (`yaml.safe_load`).

    Raises:
        LiacError: the file cannot be read or is not valid YAML (named by `source`, default the path).
    """
    source = str(path) if source is None else source
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise LiacError(source, f"cannot read: {getattr(e, 'strerror', None) or e}") from e
    return parse_yaml(text, source)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text → plain data; invalid YAML is one LiacError line naming `source`."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise LiacError(source, f"not valid YAML: {' '.join(str(e).split())}") from e


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper, data):
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)


def yaml_dump(data: Any) -> str:
    """Deterministic YAML: sorted keys, block style, no aliases."""
    _Dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]
    return yaml.dump(data, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120,
                     allow_unicode=True)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temp file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        # mkstemp creates 0600; a plan or page is an ordinary file (keep the mode of the file it replaces).
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
