"""JSON Lines files (`.jsonl`, `.json`, `.ndjson`, optionally `.gz` / `.bz2`) as Arrow tables.

JSON objects are feature maps in the transition table (docs/DATA_FORMAT.md); pyarrow's
JSON reader would turn them into structs whose fields change from block to block, so the
columns are built here: objects become map<string, float64>, lists of objects lists of
such maps, anything else what `pa.array` infers.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from reagent_lite.errors import DataError

_FEATURE_MAP = pa.map_(pa.string(), pa.float64())


def open_text(path: Path) -> io.TextIOBase:
    """A text file, decompressed by its suffix."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    if name.endswith(".bz2"):
        return bz2.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _is_map_like(values: Iterable[Any]) -> Literal["map", "list_map", "other"]:
    """Whether a JSON column holds objects (feature maps) or lists of objects."""
    for v in values:
        if v is None:
            continue
        if isinstance(v, dict):
            return "map"
        if isinstance(v, list):
            for e in v:
                if e is not None:
                    return "list_map" if isinstance(e, dict) else "other"
            continue
        return "other"
    return "other"


def _to_table(records: list[dict[str, Any]], source: Path) -> pa.Table:
    names: list[str] = list(dict.fromkeys(k for r in records for k in r))
    arrays: list[pa.Array] = []
    for name in names:
        values = [r.get(name) for r in records]
        shape = _is_map_like(values)
        try:
            if shape == "map":
                arrays.append(pa.array(values, type=_FEATURE_MAP))
            elif shape == "list_map":
                arrays.append(pa.array(values, type=pa.list_(_FEATURE_MAP)))
            else:
                arrays.append(pa.array(values))
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise DataError(f"{source}: column '{name}': values of mixed or bad types ({e})") from e
    return pa.Table.from_arrays(arrays, names=names)


def read_jsonl(path: Path, part: tuple[int, int] | None = None) -> pa.Table:
    """The records of a JSON Lines file; with `part` = (k, parts), only the k-th of `parts`
    equal runs of its lines (the file is scanned, only that run parsed)."""
    try:
        with open_text(path) as fh:
            lines = [ln for ln in fh if ln.strip()]
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read file ({e})") from e
    if part is not None:
        k, parts = part
        lines = lines[k * len(lines) // parts : (k + 1) * len(lines) // parts]
    records: list[dict[str, Any]] = []
    for i, ln in enumerate(lines):
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {i + 1} of the shard is not valid JSON ({e})") from e
        except RecursionError as e:  # a value nested deeper than the parser allows
            raise DataError(
                f"{path}: line {i + 1} of the shard is nested deeper than a record can be"
            ) from e
        if not isinstance(rec, dict):
            raise DataError(f"{path}: line {i + 1} of the shard is not a JSON object")
        records.append(rec)
    return _to_table(records, path)


def first_record_keys(path: Path) -> list[str]:
    """The keys of the first record of a JSON Lines file (its columns, without types)."""
    try:
        with open_text(path) as fh:
            line = next((ln for ln in fh if ln.strip()), "{}")
        record = json.loads(line)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise DataError(f"{path}: cannot read the first record ({str(e)[:200]})") from e
    if not isinstance(record, dict):
        raise DataError(f"{path}: line 1 is not a JSON object")
    return list(record)


def table_from_records(records: list[dict[str, Any]], source: str = "records") -> pa.Table:
    """Python records (e.g. a DataFrame's rows) as a table, JSON objects read as feature
    maps exactly as in a JSON Lines file; `source` names them in errors."""
    return _to_table(records, Path(source))
