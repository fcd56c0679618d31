"""Which files make up a step log, and in what format (the rules of docs/DATA_FORMAT.md#files).

Kept apart from `reagent_lite.data.readers` so the timeline imports neither torch nor the
ingest code: a Parquet file or directory (`*.parquet`, `*.parq`, `*.pq`, Spark's
suffix-less `part-*`), or JSON Lines (`*.jsonl`, `*.json`, `*.ndjson`, optionally `.gz`);
a directory is searched recursively, skipping names that start with `.` or `_`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from reagent_lite.errors import DataError

StepFormat = Literal["parquet", "json"]
_PARQUET = (".parquet", ".parq", ".pq")
_JSON = (".jsonl", ".json", ".ndjson")


def file_format(path: Path) -> StepFormat | None:
    name = path.name.lower()
    if name.endswith(_PARQUET) or (name.startswith("part-") and "." not in name):
        return "parquet"
    if name.endswith(".bz2") and name[:-4].endswith(_JSON):
        raise DataError(
            f"{path}: bz2-compressed JSON Lines are not read by the timeline; decompress "
            "the file or recompress it with gzip (.gz)"
        )
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith(_JSON):
        return "json"
    return None


def step_files(path: str | os.PathLike[str]) -> tuple[StepFormat, list[Path]]:
    """The data files of the step log at `path` (a file or a directory) and their format."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    if p.is_file():
        fmt = file_format(p) or "parquet"  # a single file of any name: try Parquet
        return fmt, [p]
    files = sorted(
        f
        for f in p.rglob("*")
        if f.is_file()
        and not any(part.startswith((".", "_")) for part in f.relative_to(p).parts)
        and file_format(f) is not None
    )
    if not files:
        raise DataError(f"{p}: no Parquet or JSON Lines files in this directory")
    formats = {file_format(f) or "parquet" for f in files}  # None is filtered out above
    if len(formats) > 1:
        raise DataError(f"{p}: mixes Parquet and JSON Lines files; keep one format per directory")
    return formats.pop(), files
