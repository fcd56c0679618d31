"""Reading a step log as Arrow batches of its step columns, as often as the sort asks.

Every scan yields batches in the form of the SQL's `step_sources` (the log's columns in the
training table's order, `propensity` renamed `action_probability` where it is the
propensity), so the sort and the pairing never see the log's own layout:

* `open_parquet`: Parquet files read by Arrow row group by row group (the next one decoded
  on a thread of its own), the strings that repeat (feature ids, candidate and action
  names) decoded straight from Parquet's dictionary pages as dictionaries: the cheap way
  to read these rows and to move them (on the benchmark's log ≈ 0.25 CPU-s per million
  steps to read, against ≈ 0.6 for DuckDB's reader, and the sort's `take` at half the
  cost of plain strings; benchmarks/RESULTS.md). Only where Arrow reads every step column
  with the type DuckDB gives it: a Hive-style `key=value/` folder is a column to DuckDB
  alone, say;
* `DuckScan`: a DuckDB query over the view `steps` (those logs, JSON Lines parsed once by
  DuckDB, tables in memory).

Dictionaries stay dictionaries through the sort and into the Parquet writer (which writes
their indices as they are); `plain_schema` gives the types readers of the file get back.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from reagent_lite.errors import DataError
from reagent_lite.timeline.ahead import read_ahead
from reagent_lite.timeline.query import Dialect, StepColumns, step_sources

# Rows per batch a scan yields, at most, and bytes (the batches in flight stay small
# whatever the rows' width): per-batch work amortised.
SCAN_BATCH_ROWS = 65_536
SCAN_BATCH_BYTES = 16 * 2**20

_Reader = Callable[[list[str]], Iterator[pa.RecordBatch]]


class ReadError(DataError):
    """A file of the log cannot be read (damaged data): the message names the file."""


@dataclass
class ArrowScan:
    """The step columns of Arrow batches: Parquet files, or a spill file of the sort."""

    read: _Reader  # the given source columns, in batches
    sources: dict[str, str]  # output name → source column (`step_sources`)
    rows: int
    schema: pa.Schema  # of the batches `batches` yields

    @classmethod
    def of(cls, read: _Reader, sources: dict[str, str], rows: int, own: pa.Schema) -> ArrowScan:
        """`own`: the schema of the source columns as `read` gives them."""
        fields = [own.field(src).with_name(name) for name, src in sources.items()]
        return cls(read, sources, rows, pa.schema(fields))

    def batches(
        self, columns: Sequence[str] | None = None
    ) -> Generator[pa.RecordBatch, None, None]:
        """The step columns (or only `columns`, by output name) of every row, in batches."""
        names = list(self.sources) if columns is None else list(columns)
        for batch in self.read(list(dict.fromkeys(self.sources[n] for n in names))):
            yield pa.RecordBatch.from_arrays(
                [batch.column(self.sources[n]) for n in names], names=names
            )


def open_parquet(
    files: Sequence[Path], columns: StepColumns, duck: pa.Schema, *, threads: int | None = None
) -> ArrowScan | None:
    """An Arrow scan of the Parquet `files`, or None unless Arrow reads every step column
    of every file with the type DuckDB gives it (`duck`: DuckDB's Arrow schema of the step
    columns): not a Hive partition column (DuckDB's alone), nor files that disagree.
    `threads`: 1 decodes on one thread, else a row group's columns in parallel."""
    sources = step_sources(columns)
    names = list(dict.fromkeys(sources.values()))
    footers = [_Footer.of(f) for f in files]
    if not all(set(names) <= set(f.arrow.names) for f in footers):
        return None
    own = pa.schema([footers[0].arrow.field(c) for c in names])
    if any(pa.schema([f.arrow.field(c) for c in names]) != own for f in footers[1:]):
        return None
    renamed = pa.schema([own.field(src).with_name(name) for name, src in sources.items()])
    if renamed != duck.remove_metadata():
        return None
    leaves = [string_leaves(f.parquet, names) for f in footers]
    schema = pa.schema([f.with_type(_dictionary_leaves(f.name, f.type)) for f in own])

    def decoded(read: list[str]) -> Iterator[pa.RecordBatch]:
        want = pa.schema([schema.field(c) for c in read])
        for path, footer, file_leaves in zip(files, footers, leaves, strict=True):
            dictionaries = [leaf for leaf in file_leaves if leaf.split(".")[0] in read]
            with pq.ParquetFile(path, read_dictionary=dictionaries, pre_buffer=False) as file:
                for i in range(file.num_row_groups):
                    # Per row group: a file's row groups have dictionaries of their own,
                    # which Arrow cannot read into one nested array.
                    batches = file.iter_batches(
                        batch_size=footer.batch_rows, row_groups=[i], columns=read,
                        use_threads=threads != 1,
                    )  # fmt: skip
                    try:
                        for batch in batches:
                            yield batch if batch.schema == want else batch.cast(want)
                    except (OSError, pa.ArrowException) as err:
                        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                        raise ReadError(f"{path}: row group {i} cannot be read ({first})") from err

    def read(names: list[str]) -> Iterator[pa.RecordBatch]:
        # The next batches decoded on a thread of their own while the caller works.
        yield from read_ahead(decoded(names), depth=2, name="timeline-read")

    return ArrowScan.of(read, sources, sum(f.rows for f in footers), schema)


@dataclass(frozen=True)
class _Footer:
    """What a Parquet file's footer says (the file closed again: logs of many files)."""

    arrow: pa.Schema
    parquet: pq.ParquetSchema
    rows: int
    batch_rows: int  # about SCAN_BATCH_BYTES of its decoded rows, at most SCAN_BATCH_ROWS

    @classmethod
    def of(cls, path: Path) -> _Footer:
        with pq.ParquetFile(path) as file:
            meta = file.metadata
            size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
            per_row = size / max(meta.num_rows, 1)
            batch_rows = rows_within(SCAN_BATCH_BYTES, per_row, SCAN_BATCH_ROWS)
            return cls(file.schema_arrow, file.schema, meta.num_rows, batch_rows)


def rows_within(budget: int, row_bytes: float, at_most: int) -> int:
    """How many rows of `row_bytes` each fit in `budget` bytes: at least 1, at most
    `at_most` (batches and runs sized in bytes as well as rows: wide rows, fewer)."""
    return int(min(at_most, max(1, budget // max(row_bytes, 1.0))))


def _dictionary_leaves(name: str, t: pa.DataType) -> pa.DataType:
    """The type the scan reads column `name` of type `t` as (`string_leaves`): nested
    strings and `action` as dictionaries."""
    words = pa.dictionary(pa.int32(), pa.string())

    def nested(t: pa.DataType) -> pa.DataType:
        if pa.types.is_string(t):
            return words
        if pa.types.is_map(t):
            return pa.map_(nested(t.key_type), nested(t.item_type))
        if pa.types.is_list(t):
            return pa.list_(t.value_field.with_type(nested(t.value_type)))
        return t

    if name == "action" and pa.types.is_string(t):
        return words
    return t if pa.types.is_string(t) else nested(t)


@dataclass
class DuckScan:
    """The step columns of the view `steps`, as DuckDB reads them."""

    con: duckdb.DuckDBPyConnection
    dialect: Dialect
    sources: dict[str, str]
    rows: int
    schema: pa.Schema

    @classmethod
    def of(cls, con: duckdb.DuckDBPyConnection, columns: StepColumns, dialect: Dialect) -> DuckScan:
        scan = cls(con, dialect, step_sources(columns), 0, pa.schema([]))
        scan.schema = con.sql(f"{scan.select()} LIMIT 0").to_arrow_table().schema
        scan.rows = int(con.execute("SELECT count(*) FROM steps").fetchall()[0][0])
        return scan

    def select(self, columns: Sequence[str] | None = None) -> str:
        q = self.dialect.quote
        names = list(self.sources) if columns is None else list(columns)
        return f"SELECT {', '.join(f'{q(self.sources[n])} AS {q(n)}' for n in names)} FROM steps"

    def batches(
        self, columns: Sequence[str] | None = None
    ) -> Generator[pa.RecordBatch, None, None]:
        # The connection's own (its temporary tables and registered tables are its own);
        # one reader at a time, which the sort keeps to.
        reader = self.con.sql(self.select(columns)).to_arrow_reader(SCAN_BATCH_ROWS)
        try:
            yield from reader
        finally:
            reader.close()


Scan = ArrowScan | DuckScan


def string_leaves(schema: pq.ParquetSchema, columns: Collection[str]) -> list[str]:
    """Parquet paths of the string leaves of `columns` to read as dictionaries, as the file
    names them (writers differ on nested names): nested ones (feature ids, candidate
    names) and `action`, whose values are few. Not `mdp_id` nor other top-level strings: a
    column of many distinct values is cheaper as plain strings (a dictionary as large as
    the data makes the writer re-encode it for every row group)."""
    leaves = (schema.column(i) for i in range(len(schema)))
    return [
        c.path
        for c in leaves
        if c.physical_type == "BYTE_ARRAY"
        and c.logical_type.type == "STRING"
        and c.path.split(".")[0] in columns
        and ("." in c.path or c.path == "action")
    ]


def plain_type(t: pa.DataType) -> pa.DataType:
    """`t` with every dictionary replaced by its value type (what a reader of the file gets)."""
    if pa.types.is_dictionary(t):
        return plain_type(t.value_type)
    if pa.types.is_map(t):
        return pa.map_(plain_type(t.key_type), plain_type(t.item_type))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(plain_type(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(plain_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(plain_type(t.value_type)), t.list_size)
    return t


def plain(array: pa.Array) -> pa.Array:
    """`array` with its dictionaries decoded."""
    target = plain_type(array.type)
    return array if target == array.type else array.cast(target)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(plain_type(f.type)) for f in schema])
