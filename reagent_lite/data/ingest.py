"""Streaming ingest: a shard, row group by row group, into preallocated training arrays.

`read_shard` + `validate` + `tensorize_discrete` hold the whole Arrow shard and then the
raw tensors (values *and* float presence masks) at the same time, about four times the
bytes of what training keeps. Here a shard is read one batch (Parquet row group) at a
time, each batch validated (`ShardValidation`, same checks and messages) in slices and
scattered straight into arrays sized from the Parquet footers, then dropped. Feature maps
become one float32 matrix with NaN where a feature is absent — the form normalization
samples want and the `Preprocessor` accepts — so no presence matrix is ever built.

Feature ids are not known before reading: columns are assigned as ids are first seen
(state and next_state maps alike), and `DiscreteShard.reorder` later puts the columns in
the order of the ids the ranks agreed on (ids this shard never saw come out all-absent)
— in place when, as usual, that is a permutation or nothing at all.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
from reagent_lite.data.validate import ShardValidation, ValidationReport
from reagent_lite.errors import DataError

# ----------------------------------------------------------------------------- batches

# dqn action names repeat on every row: decoded as dictionary codes, reading is ~30% faster
# and looking names up touches each distinct string once (`tensorize.string_index`).
ACTION_NAME_COLUMNS = ("action", "next_action", "possible_actions", "possible_next_actions")


def _piece_batches(piece: ShardPiece) -> Iterator[pa.Table]:
    """One shard piece as tables of at most a row group each (JSON Lines: the whole piece)."""
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


# ----------------------------------------------------------------------------- features


class FeatureColumns:
    """Feature id → column, assigned as ids are first seen (numerically sorted within a
    batch, so a shard whose first batch has every id ends up in the agreed order)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._col: dict[str, int] = {}

    def add(self, ids: Sequence[str]) -> None:
        """Appends the ids not seen yet, in numeric order (the order the workflow agrees on,
        so that usually no reordering is needed later)."""
        for f in sorted(ids, key=lambda s: (0, int(s), "") if s.isdigit() else (1, 0, s)):
            if f not in self._col:
                self._col[f] = len(self.ids)
                self.ids.append(f)


def _used_keys(keys: pa.Array) -> list[str]:
    """The distinct keys of a map's key array, as strings."""
    if pa.types.is_dictionary(keys.type):
        codes = keys.indices.to_numpy(zero_copy_only=False)
        used = np.bincount(codes, minlength=len(keys.dictionary)) > 0
        return [str(k) for k in keys.dictionary.filter(pa.array(used)).to_pylist()]
    return [str(k) for k in pc.unique(keys).to_pylist()]


def _map_keys(arr: pa.MapArray) -> pa.Array:
    if arr.null_count:
        return tz.map_entries(arr)[1]
    offsets = arr.offsets
    lo, hi = offsets[0].as_py(), offsets[-1].as_py()
    return arr.keys.slice(lo, hi - lo)


# ----------------------------------------------------------------------------- discrete


def _grow(a: np.ndarray, rows: int, filled: int, cols: int | None = None) -> np.ndarray:
    """A copy of `a` with room for `rows` rows (and `cols` columns): its first `filled` rows
    copied (new feature columns of those rows absent, NaN); the rest left for `add` to
    write (so the shard's big arrays are touched once, not filled twice)."""
    shape = (rows,) + ((cols,) if cols is not None else a.shape[1:])
    out = np.empty(shape, a.dtype)
    if a.ndim == 2:
        out[:filled, : a.shape[1]] = a[:filled]
        out[:filled, a.shape[1] :] = np.nan
    else:
        out[:filled] = a[:filled]
    return out


@dataclass
class DiscreteShard:
    """A dqn shard as arrays: `state`/`next_state` float32 [N, C] in `columns.ids` order
    with NaN = absent; the other fields as in `DiscreteTransitions`. `state_ids` are the
    ids seen in `state_features` (those the workflow agrees on)."""

    columns: FeatureColumns
    state_ids: set[str]
    state: np.ndarray
    next_state: np.ndarray
    fields: dict[str, np.ndarray]
    report: ValidationReport
    rows_per_part: list[int] = field(default_factory=list)
    # Seconds spent waiting for batches to be read, validating, and tensorizing.
    timings: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.state.shape[0])

    def reorder(self, feature_ids: Sequence[str]) -> None:
        """Makes `state` and `next_state` columns follow `feature_ids` (ids never seen are
        all-absent columns; seen ids not listed are dropped). A permutation of the stored
        columns is applied in place, chunk by chunk; anything else builds new arrays."""
        ids = list(feature_ids)
        cols = self.columns._col
        if ids == self.columns.ids:
            return
        if sorted(ids) == sorted(self.columns.ids):
            perm = [cols[f] for f in ids]
            for m in (self.state, self.next_state):
                for s in range(0, m.shape[0], 65536):
                    m[s : s + 65536] = m[s : s + 65536][:, perm]
        else:
            for name in ("state", "next_state"):
                m = getattr(self, name)
                out = np.full((m.shape[0], len(ids)), np.nan, np.float32)
                for j, f in enumerate(ids):
                    if f in cols:
                        out[:, j] = m[:, cols[f]]
                setattr(self, name, out)
        self.columns = FeatureColumns()
        self.columns.add(ids)


class DiscreteShardBuilder:
    """Collects a dqn shard batch by batch (see the module docstring)."""

    def __init__(
        self,
        actions: Sequence[str],
        *,
        capacity: int | None,
        use_seq_num_diff_as_time_diff: bool = False,
        source: str = "table",
    ) -> None:
        self.actions = list(actions)
        self.use_time_diff = use_seq_num_diff_as_time_diff
        self.source = source
        self.columns = FeatureColumns()
        self.state_ids: set[str] = set()
        self.n = 0
        cap = max(capacity or 0, 1)
        A = len(self.actions)
        self.state = np.empty((cap, 0), np.float32)
        self.next_state = np.empty((cap, 0), np.float32)
        self.f: dict[str, np.ndarray] = {
            "action": np.empty(cap, np.int64),
            "next_action": np.empty(cap, np.int64),
            "reward": np.empty(cap, np.float32),
            "possible_actions_mask": np.empty((cap, A), np.float32),
            "possible_next_actions_mask": np.empty((cap, A), np.float32),
            "terminal": np.empty(cap, np.float32),
            "time_diff": np.empty(cap, np.float32),
            "propensity": np.empty(cap, np.float32),
            "sequence_number": np.empty(cap, np.int64),
            "mdp_id": np.empty(cap, np.int64),
        }
        # Episode id → dense code, in order of first appearance (as `dictionary_encode` of
        # the whole column numbers them); no Arrow buffer of a batch outlives the batch.
        self._mdp_codes: dict[object, int] = {}

    # -- features
    def _discover(self, col: pa.ChunkedArray, is_state: bool) -> None:
        if pa.types.is_map(col.type):
            for chunk in col.chunks:
                keys = _map_keys(chunk)
                if pa.types.is_dictionary(keys.type):
                    # Slices of a row group share its dictionary: once all its entries are
                    # known (as columns, and as state ids for the state column) there is
                    # nothing new to find.
                    entries = [str(k) for k in keys.dictionary.to_pylist()]
                    known = self.state_ids if is_state else self.columns._col
                    if all(k in known for k in entries):
                        continue
                ids = _used_keys(keys)
                self.columns.add(ids)
                if is_state:
                    self.state_ids.update(ids)
        elif tz._is_listlike(col.type):
            width = max((pc.max(pc.list_value_length(c)).as_py() or 0) for c in col.chunks)
            ids = [str(i) for i in range(width)]
            self.columns.add(ids)
            if is_state:
                self.state_ids.update(ids)

    def _ensure(self, rows: int) -> None:
        cap, C = self.state.shape
        want_c = len(self.columns.ids)
        if rows <= cap and want_c <= C:
            return
        new_cap = max(rows, cap + cap // 2) if rows > cap else cap
        self.state = _grow(self.state, new_cap, self.n, want_c)
        self.next_state = _grow(self.next_state, new_cap, self.n, want_c)
        if rows > cap:
            self.f = {k: _grow(v, new_cap, self.n) for k, v in self.f.items()}

    def _features(self, col: pa.ChunkedArray, out: np.ndarray) -> None:
        """Scatter one batch's feature column into `out` (rows of this batch, NaN-filled)."""
        ids = self.columns.ids
        if pa.types.is_map(col.type):
            for start, chunk in tz._chunks(col):
                tz._scatter_map(chunk, start, ids, out, None)
        elif tz._is_listlike(col.type):
            width = max((pc.max(pc.list_value_length(c)).as_py() or 0) for c in col.chunks)
            pos = [str(i) for i in range(width)]
            vals, pres = tz.dense_list_to_dense(col, pos)
            idx = [self.columns._col[p] for p in pos]
            out[:, idx] = np.where(pres > 0, vals, np.float32(np.nan))
        # a null-typed column: every feature absent (out stays NaN)

    # -- one batch
    def add(self, table: pa.Table) -> None:
        b = table.num_rows
        if b == 0:
            return
        src = self.source
        s_col = tz._column_of(table, tz.STATE_COLUMNS, src)
        ns_col = tz._column_of(table, tz.NEXT_STATE_COLUMNS, src)
        self._discover(s_col, True)
        self._discover(ns_col, False)
        lo, hi = self.n, self.n + b
        self._ensure(hi)
        f = self.f
        fut = None
        pool_ok = b >= 16_384
        s_out, ns_out = self.state[lo:hi], self.next_state[lo:hi]
        s_out.fill(np.nan)
        ns_out.fill(np.nan)
        if pool_ok:  # state and next_state scatter in parallel (numpy releases the GIL)
            fut = tz._pool().submit(self._features, ns_col, ns_out)
        else:
            self._features(ns_col, ns_out)
        self._features(s_col, s_out)
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
        names = table.column_names
        f["reward"][lo:hi] = tz._to_float32(tz._column_of(table, ["reward"], src).combine_chunks())
        if "action_probability" in names:
            f["propensity"][lo:hi] = tz._to_float32(
                table.column("action_probability").combine_chunks()
            )
        else:
            f["propensity"][lo:hi] = 1.0
        if self.use_time_diff and "time_diff" in names:
            f["time_diff"][lo:hi] = tz._to_float32(table.column("time_diff").combine_chunks())
        else:
            f["time_diff"][lo:hi] = 1.0
        terminal = pna.sum(axis=1) == 0
        if "terminal" in names:
            explicit = table.column("terminal").combine_chunks().fill_null(False)
            terminal |= np.asarray(explicit.cast(pa.bool_()).to_numpy(zero_copy_only=False))
        f["terminal"][lo:hi] = terminal
        seq = tz._column_of(table, ["sequence_number"], src).combine_chunks()
        f["sequence_number"][lo:hi] = np.asarray(
            seq.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        )
        f["mdp_id"][lo:hi] = self._episode_codes(tz._column_of(table, ["mdp_id"], src))
        if fut is not None:
            fut.result()
        self.n = hi

    def _episode_codes(self, col: pa.ChunkedArray) -> np.ndarray:
        enc = col.combine_chunks().dictionary_encode()
        known = self._mdp_codes
        codes = np.array(
            [known.setdefault(v, len(known)) for v in enc.dictionary.to_pylist()], np.int64
        )
        return codes[tz.dictionary_codes(enc)] if len(codes) else np.zeros(len(col), np.int64)

    def finish(self, report: ValidationReport) -> DiscreteShard:
        n = self.n
        fields = {k: v[:n] for k, v in self.f.items()}
        # The order of `DiscreteTransitions` (training tensors keep it).
        order = (
            "action", "next_action", "reward", "possible_actions_mask",
            "possible_next_actions_mask", "terminal", "time_diff", "propensity", "mdp_id",
            "sequence_number",
        )  # fmt: skip
        fields = {k: fields[k] for k in order}
        return DiscreteShard(
            self.columns, self.state_ids, self.state[:n], self.next_state[:n], fields, report
        )


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
    """The shard(s) `parts` — (rank, world_size) pairs, normally one — of the dqn table at
    `path`, validated (as `validate`) and tensorized (as `tensorize_discrete`) batch by
    batch. Several parts are laid end to end (`rows_per_part` tells their sizes).

    `prefetch` reads the next row group in a background thread (pyarrow releases the GIL)
    at the cost of one more row group in memory; off by default, as on the shared 2-core
    machine it measured no faster and ~10 MiB higher at 1M rows. `slice_rows` bounds
    the temporaries of validation and tensorization."""
    source = str(path)
    check = ShardValidation("dqn", actions=actions, source=source, drop_bad_rows=drop_bad_rows)
    plans = [shard_batches(path, r, w, prefetch=prefetch) for r, w in parts]
    counts = [rows for rows, _ in plans]
    capacity = None if any(c is None for c in counts) else sum(c or 0 for c in counts)
    builder = DiscreteShardBuilder(
        actions,
        capacity=capacity,
        use_seq_num_diff_as_time_diff=use_seq_num_diff_as_time_diff,
        source=source,
    )
    rows_per_part = []
    timings = dict.fromkeys(("read", "validate", "tensorize"), 0.0)
    clock = time.perf_counter
    for _, batches in plans:
        before = builder.n
        t0 = clock()
        for batch in batches:
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
