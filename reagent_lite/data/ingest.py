"""Streaming ingest: a shard, row group by row group, into preallocated training arrays.

`read_shard` + `validate` + `tensorize_discrete` hold the whole Arrow shard and then the
raw tensors (values *and* float presence masks) at the same time, about four times the
bytes of what training keeps. Here a shard is read one batch (Parquet row group) at a
time, each batch validated (`ShardValidation`, same checks and messages) in slices and
scattered by a builder (`data/shard_builder.py`: NaN-coded feature matrices, columns as
ids are first seen, reordered to the agreed ids later) straight into arrays sized from the
Parquet footers, then dropped. `ingest_shard` is that loop for any builder; this module
holds the dqn builder, `data/ingest_parametric.py` the parametric one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from reagent_lite.data import tensorize as tz
from reagent_lite.data.readers import (
    ShardPiece,
    _apply_aliases,
    _parquet_file_for_read,
    file_format,
    iter_parquet_rows,
    read_piece,
    shard_plan,
)
from reagent_lite.data.shard_builder import (
    FeatureColumns,
    IngestedShard,
    S,
    ShardBuilder,
    reorder_columns,
)
from reagent_lite.data.validate import ShardValidation, ValidationReport, tag_file
from reagent_lite.errors import DataError

# ----------------------------------------------------------------------------- batches

# dqn action names repeat on every row: decoded as dictionary codes, reading is ~30% faster
# and looking names up touches each distinct string once (`tensorize.string_index`).
ACTION_NAME_COLUMNS = ("action", "next_action", "possible_actions", "possible_next_actions")


def _piece_batches(piece: ShardPiece) -> Iterator[pa.Table]:
    """One shard piece as tables of at most a row group each (JSON Lines: the whole piece),
    each tagged with its file (`validate.tag_file`: errors name the part file)."""
    for table in _untagged_piece_batches(piece):
        yield tag_file(table, piece.file)


def _untagged_piece_batches(piece: ShardPiece) -> Iterator[pa.Table]:
    if file_format(piece.file) != "parquet":
        yield read_piece(piece)  # JSON Lines is parsed whole
        return
    pf = _parquet_file_for_read(piece.file, extra_dictionary_columns=ACTION_NAME_COLUMNS)
    if piece.kind == "rows":
        try:
            for batch in iter_parquet_rows(pf, piece):
                yield _apply_aliases(pa.Table.from_batches([batch]), piece.file)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{piece.file}: cannot read Parquet data ({e})") from e
        return
    groups = piece.row_groups if piece.kind == "row_groups" else range(pf.num_row_groups)
    for g in groups:
        try:
            table = pf.read_row_group(g)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{piece.file}: cannot read Parquet data ({e})") from e
        yield _apply_aliases(table, piece.file)


def shard_batches(
    path: str | Path, rank: int, world_size: int, *, prefetch: bool = True
) -> tuple[int | None, Iterator[pa.Table]]:
    """(rows of the shard from the Parquet footers, or None for JSON Lines; the shard's
    rows as a sequence of tables, in `read_shard` order). With `prefetch` the next batch is
    read in a background thread while the caller works on the current one."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world size {world_size}")
    spec = shard_plan(path, world_size)[rank]
    rows = spec.num_rows

    def gen() -> Iterator[pa.Table]:
        for piece in spec.pieces:
            yield from _piece_batches(piece)

    return rows, (_prefetched(gen()) if prefetch else gen())


def _prefetched(it: Iterator[pa.Table]) -> Iterator[pa.Table]:
    pool = tz._pool()
    pending: Future[pa.Table | None] = pool.submit(next, it, None)
    while True:
        item = pending.result()
        if item is None:
            return
        pending = pool.submit(next, it, None)
        yield item


# ----------------------------------------------------------------------------- discrete


@dataclass
class DiscreteShard(IngestedShard):
    """A dqn shard as arrays: `features` "state" / "next_state" float32 [N, C] in
    `columns.ids` order with NaN = absent; `fields` as in `DiscreteTransitions`."""

    @property
    def state(self) -> np.ndarray:
        return self.features["state"]

    @property
    def next_state(self) -> np.ndarray:
        return self.features["next_state"]

    def reorder(self, feature_ids: Sequence[str]) -> None:
        """Makes `state` and `next_state` columns follow `feature_ids` (`reorder_columns`)."""
        ids = list(feature_ids)
        self.features = {k: reorder_columns(v, self.columns, ids) for k, v in self.features.items()}
        self.columns = FeatureColumns.of(ids)


# The order of `DiscreteTransitions` (training tensors keep it).
DISCRETE_FIELDS = (
    "action", "next_action", "reward", "possible_actions_mask", "possible_next_actions_mask",
    "terminal", "time_diff", "propensity", "mdp_id", "sequence_number",
)  # fmt: skip


class DiscreteShardBuilder(ShardBuilder[DiscreteShard]):
    """Collects a dqn shard batch by batch (see the module docstring)."""

    def __init__(
        self,
        actions: Sequence[str],
        *,
        capacity: int | None,
        use_seq_num_diff_as_time_diff: bool = False,
        source: str = "table",
        feature_ids: Sequence[str] = (),
    ) -> None:
        super().__init__(
            capacity=capacity,
            use_seq_num_diff_as_time_diff=use_seq_num_diff_as_time_diff,
            source=source,
            feature_ids=feature_ids,
        )
        self.actions = list(actions)
        A = len(self.actions)
        for name in ("action", "next_action"):
            self._alloc(name, (), np.int64)
        for name in ("possible_actions_mask", "possible_next_actions_mask"):
            self._alloc(name, (A,), np.float32)

    def add(self, table: pa.Table) -> None:
        b = table.num_rows
        if b == 0:
            return
        src = self.source
        s_col = tz._column_of(table, tz.STATE_COLUMNS, src)
        ns_col = tz._column_of(table, tz.NEXT_STATE_COLUMNS, src)
        self._discover(s_col, self.columns, self.state_ids)
        self._discover(ns_col, self.columns)
        lo, hi = self.n, self.n + b
        self._ensure(hi)
        f = self.arrays
        fut = None
        s_out, ns_out = f["state"][lo:hi], f["next_state"][lo:hi]
        s_out.fill(np.nan)
        ns_out.fill(np.nan)
        if b >= 16_384:  # state and next_state scatter in parallel (numpy releases the GIL)
            fut = tz._pool().submit(self._features, ns_col, ns_out, self.columns)
        else:
            self._features(ns_col, ns_out, self.columns)
        self._features(s_col, s_out, self.columns)
        actions = self.actions
        action = tz._action_index(tz._column_of(table, ["action"], src), actions)
        if (action < 0).any():
            bad = int((action < 0).sum())
            raise DataError(f"{src}: column 'action': {bad} rows name no known action {actions}")
        f["action"][lo:hi] = action
        f["next_action"][lo:hi] = tz._action_index(
            tz._column_of(table, ["next_action"], src), actions
        )
        pna = tz._actions_mask(tz._column_of(table, ["possible_next_actions"], src), actions, src)
        f["possible_next_actions_mask"][lo:hi] = pna
        f["possible_actions_mask"][lo:hi] = tz._actions_mask(
            tz._column_of(table, ["possible_actions"], src), actions, src
        )
        self._common(table, lo, hi, pna.sum(axis=1) == 0)
        if fut is not None:
            fut.result()
        self.n = hi

    def finish(self, report: ValidationReport) -> DiscreteShard:
        return DiscreteShard(
            report,
            columns=self.columns,
            state_ids=self.state_ids,
            features=self._rows(("state", "next_state")),
            fields=self._rows(DISCRETE_FIELDS),
            episodes=list(self._mdp_codes),
        )


# ----------------------------------------------------------------------------- ingest


def ingest_shard(
    path: str | Path,
    parts: Sequence[tuple[int, int]],
    check: ShardValidation,
    make_builder: Callable[[int | None], ShardBuilder[S]],
    *,
    prefetch: bool,
    slice_rows: int,
) -> S:
    """The shard(s) `parts` — (rank, world_size) pairs, normally one — of the table at
    `path`, validated by `check` and collected by `make_builder(capacity)` batch by batch.
    Several parts are laid end to end (`rows_per_part` tells their sizes)."""
    plans = [shard_batches(path, r, w, prefetch=prefetch) for r, w in parts]
    counts = [rows for rows, _ in plans]
    builder = make_builder(None if any(c is None for c in counts) else sum(c or 0 for c in counts))
    rows_per_part = []
    timings = dict.fromkeys(("read", "validate", "tensorize"), 0.0)
    clock = time.perf_counter
    for _, batches in plans:
        before = builder.n
        t0 = clock()
        for batch in batches:
            checked = None  # (a batch of no rows has no slices)
            t1 = clock()
            timings["read"] += t1 - t0
            # Slices of a row group bound the per-row temporaries of validation and
            # tensorization (a few hundred bytes a row) to a few MiB.
            for start in range(0, batch.num_rows, slice_rows):
                t1 = clock()
                checked = check.check(batch.slice(start, slice_rows))
                t2 = clock()
                if not check.failing:  # (finish() will raise; just count the rest)
                    builder.add(checked)
                timings["validate"] += t2 - t1
                timings["tensorize"] += clock() - t2
            del batch, checked
            # Arrow's allocator keeps freed batches cached; handing them back keeps the
            # shard's peak near the size of its arrays (measured: -60 MiB at 1M rows).
            pa.default_memory_pool().release_unused()
            t0 = clock()
        rows_per_part.append(builder.n - before)
    report = check.finish()
    t = clock()
    shard = builder.finish(report)
    timings["tensorize"] += clock() - t
    shard.rows_per_part = rows_per_part
    shard.timings = timings
    return shard


def ingest_discrete(
    path: str | Path,
    parts: Sequence[tuple[int, int]],
    actions: Sequence[str],
    *,
    use_seq_num_diff_as_time_diff: bool = False,
    drop_bad_rows: bool = False,
    prefetch: bool = False,
    slice_rows: int = 32768,
) -> DiscreteShard:
    """The dqn shard(s) `parts` of the table at `path` (`ingest_shard`), validated (as
    `validate`) and tensorized (as `tensorize_discrete`) batch by batch.

    `prefetch` reads the next row group in a background thread (pyarrow releases the GIL)
    at the cost of one more row group in memory; off by default, as on the shared 2-core
    machine it measured no faster and ~10 MiB higher at 1M rows. `slice_rows` bounds
    the temporaries of validation and tensorization."""
    source = str(path)
    check = ShardValidation("dqn", actions=actions, source=source, drop_bad_rows=drop_bad_rows)

    def builder(capacity: int | None) -> DiscreteShardBuilder:
        return DiscreteShardBuilder(
            actions,
            capacity=capacity,
            use_seq_num_diff_as_time_diff=use_seq_num_diff_as_time_diff,
            source=source,
        )

    return ingest_shard(path, parts, check, builder, prefetch=prefetch, slice_rows=slice_rows)
