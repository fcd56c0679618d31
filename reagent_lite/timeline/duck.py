"""The timeline on DuckDB: embedded, out of core, every core (the default engine).

DuckDB runs its one sort of the steps (`sorted_steps_sql`) over a Parquet file or directory
(read in place, only the columns a query needs) or JSON Lines (parsed once into a temporary
table). The sort spills to a temporary directory when it outgrows `memory_limit`, so a step
log of any size runs in bounded memory; its threads cover every core unless told otherwise.
The sorted steps stream out as Arrow batches, are paired and checked in Arrow (`pairing.py`:
the values of `transitions_sql`, without its second sort and window, and the rules of the
checks' SQL, which runs only once a row breaks one, for the message) and written by Arrow's
Parquet writer (`tables.py`), which costs about half the CPU of DuckDB's on these nested
columns (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Collection, Generator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from reagent_lite.errors import ConfigError, DataError, ReagentLiteError
from reagent_lite.timeline.files import step_files
from reagent_lite.timeline.pairing import Layout, paired_batches
from reagent_lite.timeline.query import (
    Kind,
    Side,
    StepColumns,
    checks_sql,
    duplicates_sql,
    raise_for_checks,
    sorted_steps_sql,
)
from reagent_lite.timeline.tables import ROW_GROUP_SIZE, TableFile

DEFAULT_MEMORY_LIMIT = "1GB"
# Rows per Arrow batch of the sorted stream, one row group's worth: per-batch work stays
# amortised, and the batches in flight (about four) stay small beside DuckDB's memory
# limit (65,536 rows took 0.14 GiB more peak memory at 5M steps, for the same CPU time).
STREAM_BATCH_ROWS = ROW_GROUP_SIZE
_INTEGER = {
    "TINYINT",
    "SMALLINT",
    "INTEGER",
    "BIGINT",
    "HUGEINT",
    "UTINYINT",
    "USMALLINT",
    "UINTEGER",
    "UBIGINT",
    "UHUGEINT",
}
_FLOAT = {"FLOAT", "DOUBLE"}
_FEATURE_MAP = "MAP(VARCHAR, DOUBLE)"
_GUESSED_FROM_STRINGS = {"DATE", "TIME", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "UUID"}


class DuckDialect:
    def empty(self, type_name: str, kind: Kind) -> str:
        return f"CAST({'MAP {}' if kind == 'map' else '[]'} AS {type_name})"

    def zeros_like(self, column: str, type_name: str) -> str:
        return f"CAST(list_transform({self.quote(column)}, lambda x: 0.0) AS {type_name})"

    def quote(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'


def duck_kind(type_name: str) -> Kind:
    if type_name in _INTEGER:
        return "integer"
    if type_name in _FLOAT or type_name.startswith("DECIMAL"):
        return "float"
    if type_name == "VARCHAR":
        return "string"
    if type_name.endswith("]"):
        return "list"
    if type_name.startswith("MAP("):
        return "map"
    return "other"


@dataclass(frozen=True)
class DuckSettings:
    """How DuckDB may use the machine."""

    memory_limit: str = DEFAULT_MEMORY_LIMIT  # e.g. "1GB", "16GB"
    threads: int | None = None  # None: every core
    temp_dir: str | None = None  # where sorts spill; None: the system's temp directory


# Memory each DuckDB thread needs for this workload (sorts of rows with nested columns):
# on a 64-core host, every core under the default 1GB limit ran out of memory.
_BYTES_PER_THREAD = 128 * 2**20
_UNITS = {"B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}  # fmt: skip


def _default_threads(con: duckdb.DuckDBPyConnection) -> int:
    """Every core DuckDB sees, but no more than the memory limit gives 128 MiB each."""
    cores, limit = con.execute(
        "SELECT current_setting('threads'), current_setting('memory_limit')"
    ).fetchone() or (1, "")
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?I?B)\s*", str(limit).upper())
    if match is None:  # a limit DuckDB spells otherwise: keep its own choice
        return int(cores)
    size = float(match.group(1)) * _UNITS[match.group(2)]
    return max(1, min(int(cores), int(size // _BYTES_PER_THREAD)))


@contextmanager
def connect(settings: DuckSettings) -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB connection that spills to a private temporary directory."""
    spill = tempfile.mkdtemp(prefix="reagent-timeline-", dir=settings.temp_dir)
    con = duckdb.connect(":memory:")
    try:
        try:
            con.execute(f"SET memory_limit = '{settings.memory_limit}'")
        except duckdb.Error as err:
            raise _flag_error(
                "--memory-limit", settings.memory_limit, "a size such as 1GB or 512MB", err
            ) from err
        if settings.threads is not None:
            con.execute(f"SET threads = {int(settings.threads)}")
        else:
            con.execute(f"SET threads = {_default_threads(con)}")
        con.execute(f"SET temp_directory = '{_sql_string(spill)}'")
        # Row order inside a query is not needed (the output is sorted); this lets DuckDB
        # stream and spill more freely.
        con.execute("SET preserve_insertion_order = false")
        yield con
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def _flag_error(flag: str, value: object, expected: str, err: Exception) -> ConfigError:
    return ConfigError(f"{flag}: bad value {value!r}; expected {expected} ({err})")


def _sql_string(text: str) -> str:
    return text.replace("'", "''")


def describe(con: duckdb.DuckDBPyConnection, source: str) -> StepColumns:
    rows = con.execute("DESCRIBE steps").fetchall()
    return StepColumns({r[0]: (str(r[1]), duck_kind(str(r[1]))) for r in rows}, source)


def open_steps(con: duckdb.DuckDBPyConnection, path: str | os.PathLike[str]) -> StepColumns:
    """Register the step log at `path` as the view `steps`; its columns, checked."""
    fmt, files = step_files(path)
    listed = "[" + ", ".join(f"'{_sql_string(str(f))}'" for f in files) + "]"
    source = str(path)
    try:
        if fmt == "parquet":
            con.execute(f"CREATE VIEW steps AS SELECT * FROM read_parquet({listed})")
        else:
            reader = f"read_json({listed}, format = 'newline_delimited'"
            inferred = con.execute(f"DESCRIBE SELECT * FROM {reader})").fetchall()
            spec = ", ".join(
                f"'{_sql_string(str(r[0]))}': '{_json_type(str(r[1]))}'" for r in inferred
            )
            con.execute(f"CREATE TEMP TABLE steps AS SELECT * FROM {reader}, columns = {{{spec}}})")
    except duckdb.Error as err:
        raise DataError(f"{source}: cannot read as {fmt} ({_first_line(err)})") from err
    columns = describe(con, source)
    columns.check()
    return columns


def _json_type(type_name: str) -> str:
    """The type a JSON column is read as: objects as feature maps (as everywhere in
    reagent-lite, not structs), strings as strings (not dates or UUIDs guessed from them)."""
    if type_name in _GUESSED_FROM_STRINGS:
        return "VARCHAR"
    if re.fullmatch(r"(STRUCT|MAP)\(.*\)\[\]", type_name):
        return _FEATURE_MAP + "[]"
    if type_name.startswith(("STRUCT", "MAP")):
        return _FEATURE_MAP
    return type_name


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def check_values(con: duckdb.DuckDBPyConnection, columns: StepColumns) -> None:
    """Nulls, propensities and repeated (mdp_id, sequence_number) pairs: one `DataError`.

    Without DuckDB's statistics propagation: it answers `p > 0`, `p <= 1` and even
    `isnan(p)` from a Parquet file's min/max statistics, which leave NaN out, so a NaN
    propensity passed (DuckDB 2.0.1, `tests/timeline/test_pairing.py`)."""
    con.execute("SET disabled_optimizers = 'statistics_propagation'")
    try:
        for sql in (checks_sql(columns), duplicates_sql()):
            cur = con.execute(sql)
            names = [d[0] for d in cur.description or []]
            rows = cur.fetchall()
            row = rows[0] if rows else ()
            raise_for_checks(columns.source, dict(zip(names, row, strict=False)))
    finally:
        con.execute("RESET disabled_optimizers")


def stream_transitions(
    con: duckdb.DuckDBPyConnection,
    columns: StepColumns,
    sides: Collection[Side],
    *,
    eval_fraction: float,
    seed: int,
    batch_rows: int = STREAM_BATCH_ROWS,
    check: bool = False,
) -> tuple[pa.Schema, Generator[tuple[Side, pa.RecordBatch], None, None]]:
    """The transitions of `sides` as Arrow batches (train before eval, each sorted by
    mdp_id and sequence_number), and their schema. Close the iterator when done early.
    `check`: raise `pairing.BrokenCheck` at the first row breaking a value check."""
    sql = sorted_steps_sql(
        columns, DuckDialect(), sides=sides, eval_fraction=eval_fraction, seed=seed
    )
    reader = con.sql(sql).to_arrow_reader(batch_rows)
    layout = Layout.of(reader.schema, columns)
    batches = paired_batches(reader, layout, check=check)
    return layout.schema, _read_ahead(batches, con.interrupt, reader.close)


@contextmanager
def checked(
    con: duckdb.DuckDBPyConnection, columns: StepColumns, *, already: bool = False
) -> Iterator[None]:
    """Run a stream of every step with `check=True` inside: if it fails (a row breaks a
    check, or pairing or DuckDB fail on a bad row), the checks' SQL runs first and raises
    their `DataError` (the count and an example, as when they ran before the sort, two
    passes over the log that a good log no longer pays); else the failure itself — also
    when the checks cannot run (say, DuckDB out of memory: the first error says more) or
    ran `already` (before a one-side stream). Running out of memory while streaming is a
    `ReagentLiteError`, not rechecked."""
    try:
        yield
    except (DataError, duckdb.Error, pa.ArrowException):
        if not already:
            with contextlib.suppress(duckdb.Error, pa.ArrowException):
                check_values(con, columns)
        raise


def _out_of_memory(err: Exception) -> bool:
    return isinstance(err, duckdb.OutOfMemoryException) or "Out of Memory" in str(err)


_END = object()
_Item = tuple[Side, pa.RecordBatch]


def _read_ahead(
    batches: Iterator[_Item],
    interrupt: Callable[[], None],
    release: Callable[[], None],
    depth: int = 2,
) -> Generator[_Item, None, None]:
    """`batches`, produced by a thread: DuckDB merges and converts the next batch and it is
    paired while the caller writes this one (Arrow and DuckDB release the GIL), which keeps
    the writer, the longest single-threaded part, busy. A caller that stops early (an
    error, Ctrl-C) interrupts the query rather than wait for its sort. At the end the
    query's result is `release`d, so the connection can run another query (the checks)."""
    items: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in batches:
                if not put(item):
                    return
            put(_END)
        except BaseException as err:  # handed to the caller, raised there
            put(err)

    thread = threading.Thread(target=produce, name="timeline-read-ahead", daemon=True)
    thread.start()
    finished = False
    try:
        while (item := items.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
        finished = True
    finally:
        stop.set()
        if not finished:
            interrupt()
        thread.join()
        release()


def build_training_table(
    steps: pa.Table,
    *,
    eval_fraction: float = 0.1,
    seed: int = 0,
    source: str = "<steps>",
    settings: DuckSettings | None = None,
) -> tuple[pa.Table, pa.Table]:
    """In memory: the `(train, eval)` transition tables of the step log `steps`, each
    sorted by (mdp_id, sequence_number). Raises `DataError` for bad input."""
    if not 0.0 <= eval_fraction < 1.0:
        raise DataError(f"{source}: eval_fraction must be in [0, 1) (got {eval_fraction})")
    with connect(settings or DuckSettings()) as con:
        con.register("steps_arrow", steps)
        con.execute("CREATE VIEW steps AS SELECT * FROM steps_arrow")
        columns = describe(con, source)
        columns.check()
        batches: dict[Side, list[pa.RecordBatch]] = {"train": [], "eval": []}
        with checked(con, columns):
            schema, stream = stream_transitions(
                con, columns, ("train", "eval"), eval_fraction=eval_fraction, seed=seed,
                check=True,
            )  # fmt: skip
            try:
                with closing(stream):
                    for side, batch in stream:
                        batches[side].append(batch)
            except DataError as err:  # from pairing: name the input
                raise DataError(f"{source}: {err}") from err
    return (
        pa.Table.from_batches(batches["train"], schema),
        pa.Table.from_batches(batches["eval"], schema),
    )


def write_sides(
    input_path: str | os.PathLike[str],
    outputs: dict[Side, Path],
    *,
    eval_fraction: float,
    seed: int,
    settings: DuckSettings,
    batch_rows: int = STREAM_BATCH_ROWS,
) -> dict[Side, int]:
    """Read the step log, check it, and write each side's transitions to its Parquet file
    (atomically: a temporary file beside it, then a rename). Returns rows per side."""
    with connect(settings) as con:
        columns = open_steps(con, input_path)
        every_row = set(outputs) in ({"all"}, {"train", "eval"})
        if not every_row:  # the stream holds one side: check the whole log beforehand
            check_values(con, columns)
        with checked(con, columns, already=not every_row):
            return _write(
                input_path, outputs,
                lambda: stream_transitions(
                    con, columns, list(outputs), eval_fraction=eval_fraction, seed=seed,
                    batch_rows=batch_rows, check=every_row,
                ),
            )  # fmt: skip


def _write(
    input_path: str | os.PathLike[str],
    outputs: dict[Side, Path],
    transitions: Callable[[], tuple[pa.Schema, Generator[_Item, None, None]]],
) -> dict[Side, int]:
    """Write each side's batches of the stream `transitions()` starts; on any failure, no
    file (nor its temporary)."""
    files: dict[Side, TableFile] = {}
    try:
        schema, stream = transitions()
        for side, path in outputs.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            files[side] = TableFile(path, schema)
        with closing(stream):
            for side, batch in stream:
                files[side].write(batch)
        # Both files complete before either takes its name: a failure leaves neither.
        for table_file in files.values():
            table_file.finish()
        for table_file in files.values():
            table_file.publish()
    except DataError as err:  # from pairing: name the input
        raise DataError(f"{input_path}: {err}") from err
    except (duckdb.Error, pa.ArrowException) as err:
        if _out_of_memory(err):
            raise ReagentLiteError(
                f"{input_path}: DuckDB ran out of memory ({_first_line(err)}); raise "
                "--memory-limit or point --temp-dir at a disk with more free space"
            ) from err
        raise DataError(f"{input_path}: {_first_line(err)}") from err
    finally:
        for table_file in files.values():
            if table_file.tmp.exists():
                table_file.discard()
    return {side: table_file.rows for side, table_file in files.items()}
