"""Small filesystem helpers: durable atomic writes, an early writability check, and the
check that this run still owns the output directory it writes into."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reagent_lite.errors import ConfigError, TrainingError

# The lock file of an output directory (`training/ownership.py`), and the environment
# variable through which the lock's holder tells its worker processes which directories
# it holds under which token: {absolute directory: token}.
LOCK_FILE = ".lock"
OWNED_ENV = "REAGENT_LITE_OWNED_DIRS"


class OwnershipLost(TrainingError):
    """Another run took the output directory over (this one was paused or unreachable for
    longer than the lock's staleness limit): this run stops and writes nothing more."""


def owned_dirs() -> dict[str, str]:
    """The output directories this process's run holds the lock of, with its tokens."""
    try:
        found = json.loads(os.environ.get(OWNED_ENV) or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def lock_holder(lock: Path) -> dict[str, Any] | None:
    """The lock file's record (host, pid, token...); None when there is none."""
    try:
        found = json.loads(lock.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def check_owner(path: Path) -> None:
    """`OwnershipLost` when `path` lies in an output directory this run locked and the
    lock there is no longer this run's. Every write that matters under the output
    directory (checkpoints, model files, run.json, metrics) calls it first: `atomic_write`
    just before its rename, so a run that lost the directory leaves no trace of the write."""
    for directory, token in owned_dirs().items():
        if not Path(path).absolute().is_relative_to(directory):
            continue
        holder = lock_holder(Path(directory) / LOCK_FILE) or {}
        if holder.get("token") != token:
            who = f"host {holder.get('host', '?')} pid {holder.get('pid', '?')}"
            raise OwnershipLost(
                f"model_output_path: this run no longer owns '{directory}': its lock now "
                f"belongs to another run ({who}) — this process was paused or unreachable "
                "for longer than the lock's staleness limit and was taken over. Stopping "
                f"without writing '{path}' or anything else there; give each run its own "
                "model_output_path"
            )


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Calls `write(tmp)` on a temp file beside `path`, then renames it over `path`.

    A crash mid-write leaves the old file (or none), never a half-written one; the new
    content and the directory entry are on disk (fsync) before the call returns, so a file
    replaced or deleted after it (an older checkpoint) is never the last good copy lost to
    a power cut. A temp file of a killed write is left as `.<name>.*.tmp*`:
    `remove_temp_files` clears them.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent
    )
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            write(tmp)
        except OSError as err:  # named after the file meant, not its temp file
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        # mkstemp makes 0600 files; outputs on a shared filesystem should honour the umask.
        os.chmod(tmp, default_file_mode())
        try:
            fsync_path(tmp)
            check_owner(path)  # as late as can be: a paused run that lost it writes nothing
            os.replace(tmp, path)
            fsync_path(path.parent)
        except OSError as err:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
    finally:
        tmp.unlink(missing_ok=True)


def fsync_path(path: Path) -> None:
    """Flushes a file's data, or a directory's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temp_files(directory: Path) -> list[Path]:
    """Deletes the temp files `atomic_write` left in `directory` when a process died
    mid-write (only safe while no other process writes there); returns them."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.name.startswith(".") and ".tmp" in p.name]
    for p in found:
        if p.is_file():
            p.unlink(missing_ok=True)
    return found


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_file_mode() -> int:
    """0666 minus the process umask: the mode a plain open() would have given."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    def write(tmp: Path) -> None:
        tmp.write_bytes(data)

    atomic_write(path, write)


def serialized(save: Callable[[io.BytesIO], None]) -> bytes:
    """What `save(buffer)` writes, in memory: torch's file writers report a full disk as
    "unexpected pos" RuntimeErrors; written by us, it is an OSError naming the errno."""
    buffer = io.BytesIO()
    save(buffer)
    return buffer.getvalue()


def describe_os_error(err: OSError) -> str:
    """`'<file>': <reason> (<ERRNO NAME>)`, for one-line messages."""
    name = errno.errorcode.get(err.errno or 0, str(err.errno))
    return f"'{err.filename or '?'}': {err.strerror or err} ({name})"


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


@contextmanager
def output_errors(output_dir: Path, last_good: Callable[[], Path | None]) -> Iterator[None]:
    """A write under `output_dir` that fails (a full disk, a filesystem turned read-only)
    becomes one `TrainingError` naming the file and the errno; what was written before —
    checkpoints, the previous model.pt2 — is untouched (atomic writes)."""
    try:
        yield
    except OSError as err:
        name = err.filename
        if not name or not Path(str(name)).absolute().is_relative_to(output_dir.absolute()):
            raise
        raise TrainingError(
            f"cannot write {describe_os_error(err)}; stopping. Last good checkpoint: "
            f"{last_good() or 'none yet'} (earlier model files are untouched; model_meta.json "
            "marks a complete model). Free space or fix the filesystem, then --resume"
        ) from err


def check_path_length(key: str, value: str) -> None:
    """`ConfigError` naming `key` when `value` cannot name a file here: one of its names is
    longer than the filesystem allows (NAME_MAX, 255 bytes on most) or the whole path
    longer than PATH_MAX. Checked once on the config, so that it is not an `OSError: File
    name too long` wherever the path is first touched."""
    path = Path(value)
    probe = path
    while not os.path.exists(probe) and probe != probe.parent:  # the nearest real dir
        probe = probe.parent
    try:
        name_max = os.pathconf(probe, "PC_NAME_MAX")
        path_max = os.pathconf(probe, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    shown = value if len(value) <= 80 else f"{value[:60]}...{value[-16:]} ({len(value)} chars)"
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(
                f"{key}: '{shown}' holds a name of {len(os.fsencode(part))} bytes "
                f"('{part[:24]}...'); expected names of at most {name_max} bytes each"
            )
    if len(os.fsencode(value)) >= path_max:
        raise ConfigError(
            f"{key}: '{shown}' is {len(os.fsencode(value))} bytes long; expected a path "
            f"shorter than {path_max} bytes"
        )
