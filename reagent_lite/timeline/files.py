"""Which files make up a step log, and in what format (the rules of docs/DATA_FORMAT.md#files).

Kept apart from `reagent_lite.data.readers` so the timeline imports neither torch nor the
ingest code: a Parquet file or directory (`*.parquet`, `*.parq`, `*.pq`, Spark's
suffix-less `part-*`), or JSON Lines (`*.jsonl`, `*.json`, `*.ndjson`, optionally `.gz`);
a directory is searched recursively, skipping names that start with `.` or `_`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from reagent_lite.errors import ConfigError, DataError

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


def check_outputs(input_path: str, outputs: Mapping[str, str | None]) -> None:
    """Raise `ConfigError` when an output (flag → path) would replace the step log: the
    same path as `--input` (after symlinks), the same file under another name (a hard
    link), a path inside an input directory, or a directory holding the input. URIs
    other than `file://` (read by Spark) are not local paths and are not compared."""
    source = _local(input_path)
    if source is None:
        return
    for flag, output in outputs.items():
        target = None if output is None else _local(output)
        if target is None:
            continue
        same = target == source or (
            target.exists() and source.exists() and os.path.samefile(target, source)
        )
        if same or source in target.parents or target in source.parents:
            relation = "is" if same else "is inside" if source in target.parents else "holds"
            raise ConfigError(
                f"{flag}: {output} {relation} --input {input_path}; writing it would replace "
                "the step log (expected an output path outside the input)"
            )


def _local(path: str) -> Path | None:
    """A local path, resolved (symlinks followed); None for a URI such as `hdfs://`."""
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif "://" in path:
        return None
    return Path(path).resolve()
