"""Tables to score, read batch by batch, and scored tables, written batch by batch in the
format their file name asks for: `.parquet`, `.csv`, `.jsonl`.

Parquet keeps every column as is. JSON Lines writes one object per row, feature maps as
JSON objects. CSV has no nested values, so a list or map cell is written as its JSON text
(`[0.1, 2.3]`, `{"0": 1.0}`), which any CSV reader can hand to a JSON parser.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from reagent_lite.data.readers import (
    ShardPiece,
    apply_aliases,
    file_format,
    list_data_files,
    open_parquet,
    read_piece,
)
from reagent_lite.errors import ConfigError, DataError
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


def read_batches(path: str | Path, batch_size: int) -> Iterator[pa.Table]:
    """The rows of the table at `path` (a file or a directory of them) in order, in tables
    of at most `batch_size` rows: Parquet one row group's batch at a time (a batch never
    spans row groups: pyarrow cannot join their dictionary-read map keys), JSON Lines a
    file at a time (its column types come from its rows). At least one table, with no rows
    for an empty input; aliased columns renamed. A file that cannot be read is a
    `DataError`."""
    files = list_data_files(path)
    empty: pa.Table | None = None
    yielded = False
    for file in files:
        try:
            if file_format(file) == "parquet":
                pf = open_parquet(file)
                if empty is None:
                    empty = pf.schema_arrow.empty_table()
                for group in range(pf.num_row_groups):
                    for batch in pf.iter_batches(batch_size=batch_size, row_groups=[group]):
                        yielded = True
                        yield apply_aliases(pa.Table.from_batches([batch]), file)
                continue
        except (OSError, pa.ArrowException) as err:
            raise DataError(f"{file}: cannot read Parquet data ({err})") from err
        table = read_piece(ShardPiece(file, "file"))
        if empty is None:
            empty = table.slice(0, 0)
        for start in range(0, table.num_rows, batch_size):
            yielded = True
            yield table.slice(start, batch_size)
    if not yielded:
        assert empty is not None  # list_data_files names at least one file
        yield apply_aliases(empty, files[0])


class TableWriter:
    """Writes tables to `path` in `fmt` as they come: each `write` goes to the file before
    it returns (a Parquet row group, CSV or JSON Lines rows), so the writer holds one batch
    at most. Every batch takes the columns and types of the first (a later file's
    compatible types are cast); one that cannot is a `DataError`."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path, self.fmt = path, fmt
        self.rows = 0
        self._schema: pa.Schema | None = None
        self._writer: pq.ParquetWriter | pacsv.CSVWriter | None = None
        self._text: IO[str] | None = None

    def write(self, table: pa.Table) -> None:
        if self.fmt == "csv":
            table = _flatten_nested(table)
        table = self._conform(table)
        if self.fmt == "jsonl":
            if self._text is None:
                # Open across `write` calls; `close` (the context's exit) closes it.
                self._text = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
            for row in table.to_pylist():
                self._text.write(json.dumps(_plain(row)) + "\n")
        else:
            if self._writer is None:
                assert self._schema is not None
                if self.fmt == "parquet":
                    self._writer = pq.ParquetWriter(self.path, self._schema)
                else:
                    self._writer = pacsv.CSVWriter(self.path, self._schema)
            self._writer.write_table(table)
        self.rows += table.num_rows

    def _conform(self, table: pa.Table) -> pa.Table:
        if self._schema is None:
            self._schema = table.schema
            return table
        if table.schema.equals(self._schema):
            return table
        try:
            return table.select(self._schema.names).cast(self._schema)
        except (KeyError, ValueError, pa.ArrowException) as err:
            raise DataError(
                f"the table's files have incompatible columns: {table.schema.names} with"
                f" types {[str(t) for t in table.schema.types][:8]} after"
                f" {self._schema.names} ({str(err)[:200]})"
            ) from err

    def close(self) -> None:
        if self._text is not None:
            self._text.close()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> TableWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def write_table(table: pa.Table, path: str | Path) -> None:
    """Writes `table` atomically in the format of `path`'s extension."""
    fmt = output_format(path)

    def write(tmp: Path) -> None:
        with TableWriter(tmp, fmt) as writer:
            writer.write(table)

    atomic_write(Path(path), write)


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
