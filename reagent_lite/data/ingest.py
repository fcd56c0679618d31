"""The ingest engine: a table, row group by row group, validated into preallocated arrays.

Every table a run reads takes this way — a rank's training shard (`ingest`), a window of
row groups streamed from disk (`data/windows.py`: `load_units`), an eval table (`ingest`
of the whole table, conformed to the training run's feature space) — and `predict`
tensorizes through the same scatter (`data/scatter.py`). A batch (Parquet row group) is
read at a time, validated in slices against the kind's schema (`ShardValidation`) and
scattered by the kind's builder (`data/shard_builder.py`: NaN-coded feature matrices,
columns as ids are first seen, reordered to the agreed ids later) straight into arrays
sized from the Parquet footers, then dropped: peak memory stays near the size of the
arrays, not the Arrow table plus its tensors.

What differs between kinds comes in a `Layout`: the schema, the builder, and how a shard is
conformed to a known feature space.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Generic

import pyarrow as pa

from reagent_lite.data.readers import (
    ShardPiece,
    apply_aliases,
    file_format,
    iter_parquet_rows,
    open_parquet,
    read_piece,
    shard_plan,
)
from reagent_lite.data.scatter import worker_pool
from reagent_lite.data.schema import TableSchema
from reagent_lite.data.shard_builder import S, ShardBuilder
from reagent_lite.data.validate import ShardValidation, tag_file
from reagent_lite.errors import DataError

# String columns (or list elements) read as dictionaries: dqn action names repeat on every
# row, and decoded as dictionary codes reading is ~30% faster and looking names up touches
# each distinct string once (`arrow.string_index`).
DICTIONARY_COLUMNS = ("action", "next_action", "possible_actions", "possible_next_actions")
# Rows validated and tensorized at a time inside a row group: bounds the per-row
# temporaries of validation and tensorization (a few hundred bytes a row) to a few MiB.
SLICE_ROWS = 32_768


@dataclass(frozen=True)
class Layout(Generic[S]):
    """How a kind's table becomes a shard: `schema` validates it, `builder(capacity,
    source)` collects it (capacity: the rows expected, None when unknown), `conform` puts
    a finished shard in the feature space agreed on (None: not known yet)."""

    schema: TableSchema
    builder: Callable[[int | None, str], ShardBuilder[S]]
    conform: Callable[[S], None] | None = None
    drop_bad_rows: bool = False
    null_propensity_as_one: bool = False  # config null_propensity: "one"

    def validation(self, source: str) -> ShardValidation:
        return ShardValidation(
            self.schema,
            source=source,
            drop_bad_rows=self.drop_bad_rows,
            null_propensity_as_one=self.null_propensity_as_one,
        )


def piece_batches(piece: ShardPiece) -> Iterator[pa.Table]:
    """One shard piece as tables of at most a row group each (JSON Lines: the whole piece),
    aliases renamed, each tagged with its file (errors name the part file)."""
    for table in _untagged_batches(piece):
        yield tag_file(table, piece.file)


def _untagged_batches(piece: ShardPiece) -> Iterator[pa.Table]:
    if file_format(piece.file) != "parquet":
        yield read_piece(piece)  # JSON Lines is parsed whole
        return
    pf = open_parquet(piece.file, extra_dictionary_columns=DICTIONARY_COLUMNS)
    try:
        if piece.kind == "rows":
            for batch in iter_parquet_rows(pf, piece):
                yield apply_aliases(pa.Table.from_batches([batch]), piece.file)
            return
        groups = piece.row_groups if piece.kind == "row_groups" else range(pf.num_row_groups)
        for g in groups:
            yield apply_aliases(pf.read_row_group(g), piece.file)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{piece.file}: cannot read Parquet data ({e})") from e


def shard_batches(
    path: str | Path, rank: int, world_size: int, *, prefetch: bool = True
) -> tuple[int | None, Iterator[pa.Table]]:
    """(rows of the shard from the Parquet footers, or None for JSON Lines; the shard's
    rows as a sequence of tables, in `read_shard` order). With `prefetch` the next batch is
    read in a background thread while the caller works on the current one."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    spec = shard_plan(path, world_size)[rank]

    def gen() -> Iterator[pa.Table]:
        for piece in spec.pieces:
            yield from piece_batches(piece)

    return spec.num_rows, (_prefetched(gen()) if prefetch else gen())


def _prefetched(it: Iterator[pa.Table]) -> Iterator[pa.Table]:
    pool = worker_pool()
    pending: Future[pa.Table | None] = pool.submit(next, it, None)
    while True:
        item = pending.result()
        if item is None:
            return
        pending = pool.submit(next, it, None)
        yield item


def feed(
    batches: Iterator[pa.Table],
    check: ShardValidation,
    builder: ShardBuilder[S],
    timings: dict[str, float],
    slice_rows: int = SLICE_ROWS,
    *,
    release: bool = True,
) -> None:
    """Validates `batches` slice by slice and hands the checked slices to `builder` (none
    once validation is failing: `finish` will raise, the rest is only counted); adds the
    seconds spent reading, validating and tensorizing to `timings`. `release`: hand the
    memory of each batch back to Arrow's allocator once done with it."""
    clock = time.perf_counter
    t0 = clock()
    for batch in batches:
        timings["read"] = timings.get("read", 0.0) + clock() - t0
        for start in range(0, batch.num_rows, slice_rows):
            t1 = clock()
            checked = check.check(batch.slice(start, slice_rows))
            t2 = clock()
            if not check.failing:
                builder.add(checked)
            timings["validate"] = timings.get("validate", 0.0) + t2 - t1
            timings["tensorize"] = timings.get("tensorize", 0.0) + clock() - t2
            del checked
        del batch
        if release:
            # Arrow's allocator keeps freed batches cached; handing them back keeps the
            # shard's peak near the size of its arrays (measured: -60 MiB at 1M rows).
            pa.default_memory_pool().release_unused()
        t0 = clock()


def ingest(
    path: str | Path,
    parts: Sequence[tuple[int, int]],
    layout: Layout[S],
    *,
    prefetch: bool = False,
    slice_rows: int = SLICE_ROWS,
) -> S:
    """The shard(s) `parts` — (rank, world_size) pairs, normally one; (0, 1): the whole
    table — of the table at `path`, validated and collected batch by batch, conformed if
    the layout says how. Several parts are laid end to end (`rows_per_part` tells their
    sizes). Errors name `path`, the column and the row (counted from the shard's first;
    in a directory of part files, the part file too).

    `prefetch` reads the next row group in a background thread (pyarrow releases the GIL)
    at the cost of one more row group in memory; off by default, as on a shared 2-core
    machine it measured no faster and ~10 MiB higher at 1M rows."""
    plans = [shard_batches(path, r, w, prefetch=prefetch) for r, w in parts]
    counts = [rows for rows, _ in plans]
    capacity = None if any(c is None for c in counts) else sum(c or 0 for c in counts)
    check = layout.validation(str(path))
    builder = layout.builder(capacity, str(path))
    timings = dict.fromkeys(("read", "validate", "tensorize"), 0.0)
    rows_per_part = []
    for _, batches in plans:
        before = builder.n
        feed(batches, check, builder, timings, slice_rows)
        rows_per_part.append(builder.n - before)
    t = time.perf_counter()
    shard = _finish(check, builder, layout)
    timings["tensorize"] += time.perf_counter() - t
    shard.rows_per_part = rows_per_part
    shard.timings = timings
    return shard


def ingest_table(table: pa.Table, layout: Layout[S], source: str = "table") -> S:
    """A table already in memory (tests, benchmarks), as `ingest` ingests a file."""
    check = layout.validation(source)
    builder = layout.builder(table.num_rows, source)
    feed(iter([table]), check, builder, {})
    return _finish(check, builder, layout)


def _finish(check: ShardValidation, builder: ShardBuilder[S], layout: Layout[S]) -> S:
    report = check.finish()  # raises for bad rows (unless dropped) and for no rows
    shard = builder.finish(report)
    if layout.conform is not None:
        layout.conform(shard)
    return shard
