"""Writing a scored table in the format its file name asks for: `.parquet`, `.csv`, `.jsonl`.

Parquet keeps every column as is. JSON Lines writes one object per row, feature maps as
JSON objects. CSV has no nested values, so a list or map cell is written as its JSON text
(`[0.1, 2.3]`, `{"0": 1.0}`), which any CSV reader can hand to a JSON parser.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import atomic_write

OUTPUT_FORMATS = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl"}


def output_format(path: str | Path, flag: str = "--output") -> str:
    """The format `path`'s extension names; `ConfigError` (exit 2) for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        raise ConfigError(
            f"{flag}: cannot tell the format of '{path}' (got extension {suffix or 'none'!r}; "
            f"expected one of {', '.join(OUTPUT_FORMATS)})"
        )
    return OUTPUT_FORMATS[suffix]


def write_table(table: pa.Table, path: str | Path) -> None:
    """Writes `table` atomically in the format of `path`'s extension."""
    fmt, target = output_format(path), Path(path)
    if fmt == "parquet":
        atomic_write(target, lambda tmp: pq.write_table(table, tmp))
    elif fmt == "csv":
        flat = _flatten_nested(table)
        atomic_write(target, lambda tmp: pacsv.write_csv(flat, tmp))
    else:
        rows = table.to_pylist()
        text = "".join(json.dumps(_plain(r)) + "\n" for r in rows)

        def write_text(tmp: Path) -> None:
            tmp.write_text(text, encoding="utf-8")

        atomic_write(target, write_text)


def _flatten_nested(table: pa.Table) -> pa.Table:
    columns = []
    for col in table.columns:
        if pa.types.is_nested(col.type):
            col = pa.array(
                [None if v is None else json.dumps(_plain(v)) for v in col.to_pylist()],
                type=pa.string(),
            )
        columns.append(col)
    return pa.Table.from_arrays(columns, names=table.column_names)


def _plain(value: Any) -> Any:
    # Arrow hands a map cell back as a list of (key, value) pairs: write it as an object.
    if isinstance(value, list) and value and all(isinstance(e, tuple) for e in value):
        return {str(k): _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN / inf
    return value
