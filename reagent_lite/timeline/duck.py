"""The timeline on one machine (the default engine): DuckDB and Arrow, out of core, on
every core.

DuckDB opens the step log (a Parquet file or directory in place; JSON Lines parsed once
into a temporary table, which spills like its sorts), names and checks its columns, hashes
episodes to their side with the SQL's own split and, when a row breaks a rule, runs the
checks' SQL for the message. The rows themselves are read by Arrow where it reads them as
DuckDB does (`scan.py`), sorted in memory-bounded buckets (`buckets.py`), paired
(`pairing.py`) on one thread and written by Arrow's Parquet writer (`tables.py`) on
another: about two thirds of the CPU time of DuckDB sorting the rows itself, and three
quarters of the wall time (benchmarks/RESULTS.md), with the same rows as `transitions_sql`
executed as written.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import threading
from collections.abc import Callable, Collection, Generator, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from reagent_lite.errors import DataError, ReagentLiteError
from reagent_lite.timeline.ahead import read_ahead
from reagent_lite.timeline.buckets import SortSettings, sorted_runs
from reagent_lite.timeline.connection import (
    DuckSettings,
    connect,
    memory_limit_bytes,
    setting,
    sql_string,
)
from reagent_lite.timeline.files import step_files
from reagent_lite.timeline.pairing import Layout, Tally, transitions
from reagent_lite.timeline.query import (
    PROPENSITY_COLUMNS,
    Kind,
    NullPropensity,
    Side,
    StepColumns,
    checks_sql,
    duplicates_sql,
    raise_for_checks,
    split_condition,
)
from reagent_lite.timeline.scan import DuckScan, ReadError, Scan, open_parquet
from reagent_lite.timeline.tables import ROW_GROUP_SIZE, TableFile

log = logging.getLogger(__name__)
# Rows per run of transitions (whole episodes: at least this many), one row group's
# worth: per-run work stays amortised and the runs in flight stay small.
RUN_ROWS = ROW_GROUP_SIZE
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


def describe(
    con: duckdb.DuckDBPyConnection, source: str, null_propensity: NullPropensity = "error"
) -> StepColumns:
    rows = con.execute("DESCRIBE steps").fetchall()
    types = {r[0]: (str(r[1]), duck_kind(str(r[1]))) for r in rows}
    return StepColumns(types, source, null_propensity)


def open_steps(
    con: duckdb.DuckDBPyConnection,
    path: str | os.PathLike[str],
    *,
    threads: int | None = None,
    null_propensity: NullPropensity = "error",
) -> tuple[StepColumns, Scan]:
    """Register the step log at `path` as the view `steps`; its columns, checked, and the
    scan that reads its rows (Arrow's where it reads what DuckDB does, else DuckDB's)."""
    fmt, files = step_files(path)
    listed = "[" + ", ".join(f"'{sql_string(str(f))}'" for f in files) + "]"
    source = str(path)
    try:
        if fmt == "parquet":
            con.execute(f"CREATE VIEW steps AS SELECT * FROM read_parquet({listed})")
        else:
            reader = f"read_json({listed}, format = 'newline_delimited'"
            inferred = con.execute(f"DESCRIBE SELECT * FROM {reader})").fetchall()
            spec = ", ".join(
                f"'{sql_string(str(r[0]))}': '{_json_type(str(r[0]), str(r[1]))}'" for r in inferred
            )
            con.execute(f"CREATE TEMP TABLE steps AS SELECT * FROM {reader}, columns = {{{spec}}})")
        columns = describe(con, source, null_propensity)
        columns.check()
        duck = DuckScan.of(con, columns, DuckDialect())
    except duckdb.Error as err:
        raise DataError(f"{source}: cannot read as {fmt} ({_first_line(err)})") from err
    if fmt == "parquet":
        with contextlib.suppress(pa.ArrowException, OSError):  # Arrow cannot: DuckDB reads
            arrow = open_parquet(files, columns, duck.schema, threads=threads)
            if arrow is not None:
                return columns, arrow
    return columns, duck


def _json_type(name: str, type_name: str) -> str:
    """The type a JSON column is read as: objects as feature maps (as everywhere in
    reagent-lite, not structs), strings as strings (not dates or UUIDs guessed from them),
    a propensity that is always null (Horizon's deterministic policies) as a number."""
    if name in PROPENSITY_COLUMNS and type_name in ('"NULL"', "NULL", "JSON"):
        return "DOUBLE"
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
        for sql in (checks_sql(columns, DuckDialect()), duplicates_sql()):
            cur = con.execute(sql)
            names = [d[0] for d in cur.description or []]
            rows = cur.fetchall()
            row = rows[0] if rows else ()
            raise_for_checks(columns.source, dict(zip(names, row, strict=False)))
    finally:
        con.execute("RESET disabled_optimizers")


def eval_flags(
    con: duckdb.DuckDBPyConnection, eval_fraction: float, seed: int
) -> Callable[[pa.Array], np.ndarray]:
    """The SQL's split (`split_condition`) as a function: distinct episode ids → True for
    those on the eval side, computed by DuckDB (its own text of each id and its MD5)."""
    cursor = con.cursor()  # called from the sorting thread
    condition = split_condition("eval", eval_fraction, seed)

    def flags(ids: pa.Array) -> np.ndarray:
        cursor.register("episode_ids", pa.table({"mdp_id": ids, "i": np.arange(len(ids))}))
        try:
            sql = f"SELECT ({condition}) AS e FROM episode_ids ORDER BY i"
            return cursor.sql(sql).to_arrow_table().column(0).to_numpy()
        finally:
            cursor.unregister("episode_ids")

    return flags


def stream_transitions(
    con: duckdb.DuckDBPyConnection,
    columns: StepColumns,
    scan: Scan,
    sides: Collection[Side],
    *,
    eval_fraction: float,
    seed: int,
    run_rows: int = RUN_ROWS,
    tally: Tally | None = None,
) -> tuple[Layout, Generator[tuple[Side, pa.RecordBatch], None, None]]:
    """The transitions of `sides` as Arrow batches (each side's sorted by mdp_id and
    sequence_number; every row of the log is checked, `pairing.BrokenCheck` at the first
    bad one), made on a thread of their own, and their layout; `tally` counts what was
    done to Horizon's conventions. Close the iterator when done early."""
    layout = Layout.of(scan.schema, columns)
    flags = None if set(sides) == {"all"} else eval_flags(con, eval_fraction, seed)
    spill = str(setting(con, "temp_directory"))
    stop = threading.Event()  # set when the caller stops early: the sort stops soon after
    settings = SortSettings(
        memory_limit_bytes(con) or 2**30,
        Path(spill) / "buckets",
        max(1, run_rows),
        stop,
        null_one=columns.null_propensity == "one",
    )
    ordered: list[Side] = [s for s in ("all", "train", "eval") if s in sides]
    runs = sorted_runs(scan, ordered, flags, settings)
    batches = ((run.side, transitions(run.steps, run.has_next, layout, tally)) for run in runs)
    return layout, read_ahead(batches, name="timeline-sort", interrupt=con.interrupt, stop=stop)


@contextmanager
def checked(con: duckdb.DuckDBPyConnection, columns: StepColumns) -> Iterator[None]:
    """Run a stream of transitions inside: if it fails (a row breaks a check, or the sort,
    pairing or DuckDB fail on a bad row), the checks' SQL runs and raises its `DataError`
    (the count and an example, the message every engine gives; two passes over the log
    that a good log does not pay); else the failure itself — also when the checks cannot
    run (say, DuckDB out of memory: the first error says more)."""
    try:
        yield
    except (DataError, duckdb.Error, pa.ArrowException):
        with contextlib.suppress(duckdb.Error, pa.ArrowException):
            check_values(con, columns)
        raise


def _out_of_memory(err: Exception) -> bool:
    return isinstance(err, duckdb.OutOfMemoryException) or "Out of Memory" in str(err)


_Item = tuple[Side, pa.RecordBatch]


def build_training_table(
    steps: pa.Table,
    *,
    eval_fraction: float = 0.1,
    seed: int = 0,
    source: str = "<steps>",
    settings: DuckSettings | None = None,
    null_propensity: NullPropensity = "error",
) -> tuple[pa.Table, pa.Table]:
    """In memory: the `(train, eval)` transition tables of the step log `steps`, each
    sorted by (mdp_id, sequence_number). Raises `DataError` for bad input.
    `null_propensity`: "one" reads a null propensity as 1.0 (counted and logged)."""
    if not 0.0 <= eval_fraction < 1.0:
        raise DataError(f"{source}: eval_fraction must be in [0, 1) (got {eval_fraction})")
    with connect(settings or DuckSettings()) as con:
        con.register("steps_arrow", steps)
        con.execute("CREATE VIEW steps AS SELECT * FROM steps_arrow")
        columns = describe(con, source, null_propensity)
        columns.check()
        scan = DuckScan.of(con, columns, DuckDialect())
        batches: dict[Side, list[pa.RecordBatch]] = {"train": [], "eval": []}
        tally = Tally()
        with checked(con, columns):
            layout, stream = stream_transitions(
                con, columns, scan, ("train", "eval"), eval_fraction=eval_fraction, seed=seed,
                tally=tally,
            )  # fmt: skip
            try:
                with closing(stream):
                    for side, batch in stream:
                        batches[side].append(batch)
            except DataError as err:  # from pairing: name the input
                raise DataError(f"{source}: {err}") from err
    log_tally(source, tally)
    return (
        pa.Table.from_batches(batches["train"], layout.schema).cast(layout.plain),
        pa.Table.from_batches(batches["eval"], layout.schema).cast(layout.plain),
    )


def write_sides(
    input_path: str | os.PathLike[str],
    outputs: dict[Side, Path],
    *,
    eval_fraction: float,
    seed: int,
    settings: DuckSettings,
    run_rows: int = RUN_ROWS,
    null_propensity: NullPropensity = "error",
) -> dict[Side, int]:
    """Read the step log, check it, and write each side's transitions to its Parquet file
    (atomically: a temporary file beside it, then a rename). Returns rows per side;
    logs what was done to Horizon's conventions (`Tally`)."""
    tally = Tally()
    with connect(settings) as con:
        columns, scan = open_steps(
            con, input_path, threads=settings.threads, null_propensity=null_propensity
        )
        with checked(con, columns):
            written = _write(
                input_path, outputs,
                lambda: stream_transitions(
                    con, columns, scan, list(outputs), eval_fraction=eval_fraction, seed=seed,
                    run_rows=run_rows, tally=tally,
                ),
            )  # fmt: skip
    log_tally(str(input_path), tally)
    return written


def log_tally(source: str, tally: Tally) -> None:
    """The counted, logged messages of the workflows' own choices for Horizon's logs."""
    if tally.null_propensities:
        log.warning(
            "%s: %d rows with a null action_probability read as 1.0 (--null-propensity "
            "one, a deterministic logging policy)",
            source,
            tally.null_propensities,
        )
    if tally.absorbing:
        log.warning(
            "%s: %d absorbing steps (null action, no possible actions, reward 0: Horizon's "
            "end of an episode) dropped; each is the next state of the step before it, "
            "which is terminal (e.g. %s)",
            source,
            tally.absorbing,
            tally.examples[0],
        )


def _write(
    input_path: str | os.PathLike[str],
    outputs: dict[Side, Path],
    transitions: Callable[[], tuple[Layout, Generator[_Item, None, None]]],
) -> dict[Side, int]:
    """Write each side's batches of the stream `transitions()` starts; on any failure, no
    file (nor its temporary)."""
    files: dict[Side, TableFile] = {}
    try:
        layout, stream = transitions()
        for side, path in outputs.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            files[side] = TableFile(path, layout.schema, layout.plain)
        with closing(stream):
            for side, batch in stream:
                files[side].write(batch)
        # Both files complete before either takes its name: a failure leaves neither.
        for table_file in files.values():
            table_file.finish()
        for table_file in files.values():
            table_file.publish()
    except ReadError:  # names its file already
        raise
    except DataError as err:  # from the sort or the pairing: name the input
        raise DataError(f"{input_path}: {err}") from err
    except (duckdb.Error, pa.ArrowException, OSError) as err:
        if _out_of_memory(err):
            raise ReagentLiteError(
                f"{input_path}: DuckDB ran out of memory ({_first_line(err)}); raise "
                "--memory-limit or point --temp-dir at a disk with more free space"
            ) from err
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            raise ReagentLiteError(
                f"{input_path}: no space left on a disk ({err}); point --temp-dir at a disk "
                "with more free space (the sort spills there), or free some"
            ) from err
        if isinstance(err, OSError) and not isinstance(err, pa.ArrowException):
            raise ReagentLiteError(f"{input_path}: {err}") from err  # an output, say
        raise DataError(f"{input_path}: {_first_line(err)}") from err
    finally:
        for table_file in files.values():
            if table_file.tmp.exists():
                table_file.discard()
    return {side: table_file.rows for side, table_file in files.items()}
