"""What a run was trained on: a fingerprint of its input files, kept in every checkpoint,
so that `--resume` refuses to continue old weights on data that changed underneath them
(normalization would be refitted on the new rows, the weights would not).

Cheap by design — no file is read whole: each data file's path, size, mtime_ns and a
digest of its Parquet footer (the schema, row groups and column statistics; for another
format its first and last 64 KiB); the normalization files, small, are digested whole.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from reagent_lite.config import WorkflowConfig
from reagent_lite.data.readers import list_data_files
from reagent_lite.errors import DataError

# One file's mark: "path", "size", "mtime_ns", "digest" (JSON values, as checkpoints hold).
FileMark = dict[str, str | int]
# Config key -> the marks of the files behind it.
Fingerprint = dict[str, list[FileMark]]

_EDGE = 64 * 1024


def fingerprint(cfg: WorkflowConfig) -> Fingerprint:
    """The marks of the training table's files, the eval table's and the normalization
    files'. A path that cannot be listed is left out: loading the data names that error."""
    paths: dict[str, str | None] = {"training_data_path": cfg.training_data_path}
    paths.update(cfg.optional_inputs())
    out: Fingerprint = {}
    for key, value in paths.items():
        if not value:
            continue
        try:
            files = list_data_files(value) if key.endswith("data_path") else [Path(value)]
            out[key] = [_mark(f) for f in files]
        except (DataError, OSError):
            continue
    return out


def _mark(path: Path) -> FileMark:
    st = path.stat()
    return {
        "path": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "digest": _digest(path, st.st_size),
    }


def _digest(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        if size <= 2 * _EDGE:
            h.update(f.read())
            return h.hexdigest()
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] == b"PAR1":  # Parquet: <footer><footer length: 4 bytes LE>PAR1
            footer = int.from_bytes(tail[:4], "little")
            f.seek(max(0, size - 8 - footer))
            h.update(f.read(footer + 8))
            return h.hexdigest()
        f.seek(0)
        h.update(f.read(_EDGE))
        f.seek(size - _EDGE)
        h.update(f.read(_EDGE))
    return h.hexdigest()


def changes(saved: Fingerprint, current: Fingerprint) -> list[str]:
    """What differs between the inputs a checkpoint was trained on (`saved`) and this
    run's (`current`), one phrase per file, naming the file and old vs new."""
    out: list[str] = []
    for key in sorted(set(saved) | set(current)):
        before = {str(m["path"]): m for m in saved.get(key, [])}
        now = {str(m["path"]): m for m in current.get(key, [])}
        for path in sorted(set(before) | set(now)):
            old, new = before.get(path), now.get(path)
            if old is None:
                out.append(f"{key}: {path} is new")
            elif new is None:
                out.append(f"{key}: {path} is gone")
            elif old != new:
                diff = [
                    f"{field} {old[field]} -> {new[field]}"
                    for field in ("size", "mtime_ns")
                    if old[field] != new[field]
                ]
                if old["digest"] != new["digest"]:
                    diff.append("content digest differs")
                out.append(f"{key}: {path} changed ({', '.join(diff)})")
    return out
