"""Small filesystem helpers: atomic writes and an early writability check."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reagent_lite.errors import ConfigError


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Calls `write(tmp)` on a temp file beside `path`, then renames it over `path`.

    A crash mid-write leaves the old file (or none), never a half-written one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent
    )
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        # mkstemp makes 0600 files; outputs on a shared filesystem should honour the umask.
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def default_file_mode() -> int:
    """0666 minus the process umask: the mode a plain open() would have given."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_text(path: Path, text: str) -> None:
    def write(tmp: Path) -> None:
        tmp.write_text(text)

    atomic_write(path, write)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def ensure_writable_dir(path: Path, what: str) -> None:
    """Creates `path` if needed and proves a file can be written there, or raises ConfigError."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as err:
        raise ConfigError(
            f"{what}: cannot write to directory '{path}' ({err.strerror or err}); "
            "expected a writable directory"
        ) from err
