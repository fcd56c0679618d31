"""The arrays a shard is ingested into, shared by the dqn and parametric builders.

A builder (`ShardBuilder`) is handed a shard's validated batches (row-group slices) in
order and scatters each straight into arrays preallocated for the shard's rows (the count
from the Parquet footers). Feature maps become float32 matrices with NaN where a feature is
absent — the form normalization samples want and `Preprocessor.normalize_rows` accepts — so
no presence matrix is ever built. Feature ids are not known before reading: columns are
assigned as ids are first seen (`FeatureColumns`), the matrices widen when new ones appear,
and `reorder_columns` later puts them in the order the ranks agreed on (ids this shard
never saw come out all-absent) — in place when, as usual, that is a permutation or nothing.
When the agreed ids are known beforehand (a streamed window) they get the first columns,
and `UnitAssembly` has one builder per unit (row group) write into its rows of the whole's
arrays, so that units can be collected in parallel.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.data import tensorize as tz
from reagent_lite.data.validate import ValidationReport

# ----------------------------------------------------------------------------- features


class FeatureColumns:
    """Feature id → column, assigned as ids are first seen (numerically sorted within a
    batch, so a shard whose first batch has every id ends up in the agreed order)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._col: dict[str, int] = {}

    @classmethod
    def of(cls, ids: Sequence[str]) -> FeatureColumns:
        """Columns for `ids`, in that order."""
        columns = cls()
        columns.ids = list(ids)
        columns._col = {f: i for i, f in enumerate(columns.ids)}
        return columns

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


# ----------------------------------------------------------------------------- builders


def _grow(
    a: np.ndarray, rows: int, filled: int, tail: tuple[int, ...] | None = None, fill: float = np.nan
) -> np.ndarray:
    """A copy of `a` with room for `rows` rows of trailing shape `tail` (default: `a`'s): its
    first `filled` rows copied, cells new to them set to `fill` (NaN: a feature absent; 0:
    no candidate in the slot); the rest left for `add` to write (so the shard's big arrays
    are touched once, not filled twice)."""
    tail = a.shape[1:] if tail is None else tail
    out = np.empty((rows, *tail), a.dtype)
    if tail != a.shape[1:]:
        out[:filled] = fill
    out[(slice(0, filled), *(slice(0, d) for d in a.shape[1:]))] = a[:filled]
    return out


def reorder_columns(m: np.ndarray, columns: FeatureColumns, ids: list[str]) -> np.ndarray:
    """`m` — feature columns on its last axis, in `columns.ids` order — with its columns in
    the order of `ids` (ids never seen are all-absent columns; seen ids not listed are
    dropped). A permutation is applied in place, a block of rows at a time; anything else
    builds a new array."""
    if ids == columns.ids:
        return m
    cols = columns._col
    if sorted(ids) == sorted(columns.ids):
        perm = [cols[f] for f in ids]
        step = max(1, (1 << 20) // max(1, int(np.prod(m.shape[1:]))))
        for s in range(0, m.shape[0], step):
            m[s : s + step] = m[s : s + step][..., perm]
        return m
    out = np.full((*m.shape[:-1], len(ids)), np.nan, np.float32)
    for j, f in enumerate(ids):
        if f in cols:
            out[..., j] = m[..., cols[f]]
    return out


@dataclass
class IngestedShard:
    """A shard from the streaming ingest, either kind: its arrays, all indexed by row —
    `features` (NaN-coded feature matrices; state and next_state columns in `columns.ids`
    order) and `fields` (the others) — and what its rows showed: `state_ids`, the ids seen
    in `state_features` (those the workflow agrees on), and `episodes`, the episode ids in
    the order of their codes in `fields["mdp_id"]` (first appearance)."""

    report: ValidationReport
    columns: FeatureColumns
    state_ids: set[str]
    features: dict[str, np.ndarray]
    fields: dict[str, np.ndarray]
    episodes: list[object] = field(default_factory=list, kw_only=True)
    rows_per_part: list[int] = field(default_factory=list, kw_only=True)
    # Seconds spent waiting for batches to be read, validating, and tensorizing.
    timings: dict[str, float] = field(default_factory=dict, kw_only=True)

    def __len__(self) -> int:
        return int(self.features["state"].shape[0])

    def merge_seen(self, other: IngestedShard) -> None:
        """Adds what `other`'s rows showed (ids) to this shard's."""
        self.state_ids |= other.state_ids


S = TypeVar("S", bound=IngestedShard)


class ShardBuilder(Generic[S]):
    """What the dqn and parametric builders share: arrays of `capacity` rows (the footers'
    count; grown if more come), feature matrices whose columns follow the ids as they are
    seen, the state matrices, and the fields every transition table has. A subclass
    allocates its own arrays (`_alloc`), says how wide those that follow ids must be now
    (`_tails`), and writes a (validated) batch in `add`."""

    def __init__(
        self,
        *,
        capacity: int | None,
        use_seq_num_diff_as_time_diff: bool,
        source: str,
        feature_ids: Sequence[str] = (),
    ):
        self.use_time_diff = use_seq_num_diff_as_time_diff
        self.source = source
        # State and next_state features: `feature_ids` first, in that order (the agreed ids,
        # when known: then no reordering is needed), others as they are seen.
        self.columns = FeatureColumns.of(feature_ids)
        self.state_ids: set[str] = set()  # the ids of `state_features` (the agreed ones)
        self.n = 0
        self.cap = max(capacity or 0, 1)
        self.arrays: dict[str, np.ndarray] = {}
        self._fill: dict[str, float] = {}
        for name in ("state", "next_state"):
            self._alloc(name, (0,), np.float32)
        for name in ("reward", "terminal", "time_diff", "propensity"):
            self._alloc(name, (), np.float32)
        for name in ("sequence_number", "mdp_id"):
            self._alloc(name, (), np.int64)
        # Episode id → dense code, in order of first appearance (as `dictionary_encode` of
        # the whole column numbers them); no Arrow buffer of a batch outlives the batch.
        self._mdp_codes: dict[object, int] = {}

    def _alloc(self, name: str, tail: tuple[int, ...], dtype: type, fill: float = np.nan) -> None:
        self.arrays[name] = np.empty((self.cap, *tail), dtype)
        self._fill[name] = fill

    def _tails(self) -> dict[str, tuple[int, ...]]:
        """The trailing shape the arrays that follow feature ids need now."""
        width = (len(self.columns.ids),)
        return {"state": width, "next_state": width}

    def shaped_arrays(self) -> dict[str, np.ndarray]:
        """The arrays `add` writes into, shaped for the columns known now."""
        self._ensure(self.n)
        return self.arrays

    def write_into(self, arrays: dict[str, np.ndarray]) -> None:
        """Collects rows into `arrays` (rows of a larger shard's `shaped_arrays`) instead of
        arrays of its own — as long as no feature id outside its columns turns up (that
        widens the matrices into new arrays)."""
        tails = self._tails()
        for name, a in arrays.items():
            if a.shape[1:] != tails.get(name, self.arrays[name].shape[1:]):
                raise ValueError(f"{name}: shape {a.shape[1:]}, builder needs {tails.get(name)}")
        self.arrays.update(arrays)
        self.cap = min(len(a) for a in self.arrays.values())

    def _ensure(self, rows: int) -> None:
        tails = self._tails()
        more = rows > self.cap
        if more:
            self.cap = max(rows, self.cap + self.cap // 2)
        for name, a in self.arrays.items():
            tail = tails.get(name, a.shape[1:])
            if more or tail != a.shape[1:]:
                self.arrays[name] = _grow(a, self.cap, self.n, tail, self._fill[name])

    # -- features
    def _discover(
        self, col: pa.ChunkedArray, columns: FeatureColumns, seen: set[str] | None = None
    ) -> None:
        """Gives the ids of a map column (of a list<map> column's maps, of a dense list
        column's positions) columns, and adds them to `seen`."""
        value_type = col.type.value_type if tz._is_listlike(col.type) else None
        if value_type is not None and pa.types.is_map(value_type):
            col = pa.chunked_array([c.flatten() for c in col.chunks], value_type)
        if pa.types.is_map(col.type):
            for chunk in col.chunks:
                keys = _map_keys(chunk)
                if pa.types.is_dictionary(keys.type):
                    # Slices of a row group share its dictionary: once all its entries are
                    # known (as columns, and in `seen`) there is nothing new to find.
                    entries = [str(k) for k in keys.dictionary.to_pylist()]
                    known = seen if seen is not None else columns._col
                    if all(k in known for k in entries):
                        continue
                ids = _used_keys(keys)
                columns.add(ids)
                if seen is not None:
                    seen.update(ids)
        elif value_type is not None and not pa.types.is_null(value_type):
            width = max((pc.max(pc.list_value_length(c)).as_py() or 0) for c in col.chunks)
            ids = [str(i) for i in range(width)]
            columns.add(ids)
            if seen is not None:
                seen.update(ids)

    def _features(self, col: pa.ChunkedArray, out: np.ndarray, columns: FeatureColumns) -> None:
        """Scatter one batch's feature column into `out` (rows of this batch, NaN-filled)."""
        ids = columns.ids
        if pa.types.is_map(col.type):
            for start, chunk in tz._chunks(col):
                tz._scatter_map(chunk, start, ids, out, None)
        elif tz._is_listlike(col.type):
            width = max((pc.max(pc.list_value_length(c)).as_py() or 0) for c in col.chunks)
            pos = [str(i) for i in range(width)]
            vals, pres = tz.dense_list_to_dense(col, pos)
            idx = [columns._col[p] for p in pos]
            out[:, idx] = np.where(pres > 0, vals, np.float32(np.nan))
        # a null-typed column: every feature absent (out stays NaN)

    def _common(self, table: pa.Table, lo: int, hi: int, terminal: np.ndarray) -> None:
        """Rows lo:hi of the fields both tables have; `terminal`: from the candidate lists
        (an explicit `terminal` column adds to it)."""
        f, src, names = self.arrays, self.source, table.column_names
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
        if "terminal" in names:
            explicit = table.column("terminal").combine_chunks().fill_null(False)
            terminal = terminal | np.asarray(
                explicit.cast(pa.bool_()).to_numpy(zero_copy_only=False)
            )
        f["terminal"][lo:hi] = terminal
        seq = tz._column_of(table, ["sequence_number"], src).combine_chunks()
        f["sequence_number"][lo:hi] = np.asarray(
            seq.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        )
        f["mdp_id"][lo:hi] = self._episode_codes(tz._column_of(table, ["mdp_id"], src))

    def _episode_codes(self, col: pa.ChunkedArray) -> np.ndarray:
        enc = col.combine_chunks().dictionary_encode()
        known = self._mdp_codes
        codes = np.array(
            [known.setdefault(v, len(known)) for v in enc.dictionary.to_pylist()], np.int64
        )
        return codes[tz.dictionary_codes(enc)] if len(codes) else np.zeros(len(col), np.int64)

    def _rows(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The filled rows of the named arrays, in that order."""
        return {k: self.arrays[k][: self.n] for k in names}

    def add(self, table: pa.Table) -> None:
        raise NotImplementedError

    def finish(self, report: ValidationReport) -> S:
        raise NotImplementedError


# ----------------------------------------------------------------------------- assembly

B = TypeVar("B", bound=ShardBuilder[Any])


class UnitAssembly(Generic[S]):
    """The shards of consecutive units (row groups), each collected by its own builder and
    conformed to the same columns, as one shard equal to what a single builder fed the
    units in order gives.

    The arrays of the whole are allocated once, for the units' rows as their footers count
    them (by a builder for them all, `whole`); each unit's builder writes straight into
    that unit's rows (`share`), from any thread, units in any order; `put` copies what a
    unit's builder had to put elsewhere (new columns, fields computed afterwards) and
    drops the unit's arrays. `finish` then, in unit order, closes the gaps that rows
    dropped as bad leave, numbers episodes by first appearance over the whole, and merges
    the ids the units saw.
    """

    def __init__(self, unit_rows: Sequence[int], whole: ShardBuilder[S]) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(unit_rows, dtype=np.int64)])
        self._arrays = dict(whole.shaped_arrays())
        self._shared = list(self._arrays)  # (`put` may add fields computed afterwards)
        self._parts: list[S | None] = [None] * len(unit_rows)
        self._rows = [0] * len(unit_rows)
        self._lock = threading.Lock()

    def share(self, i: int, builder: B) -> B:
        """`builder` (of unit `i`, with the whole's columns), writing into its rows."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        builder.write_into({k: self._arrays[k][lo:hi] for k in self._shared})
        return builder

    def put(self, i: int, part: S) -> None:
        """Unit `i`'s rows, in place; `part` keeps only what its rows showed."""
        lo, n = int(self.offsets[i]), len(part)
        if n > self.offsets[i + 1] - lo:
            raise ValueError(f"unit {i}: {n} rows, more than its {self.offsets[i + 1] - lo}")
        for k, a in {**part.features, **part.fields}.items():
            with self._lock:  # fields computed after collecting (action_index): first seen
                out = self._arrays.get(k)
                if out is None:
                    shape = (int(self.offsets[-1]), *a.shape[1:])
                    out = self._arrays[k] = np.empty(shape, a.dtype)
            if a.base is not out:  # not written in place (a view of `out` is of its rows)
                out[lo : lo + n] = a
        part.features = dict.fromkeys(part.features, _NO_ROWS)
        part.fields = dict.fromkeys(part.fields, _NO_ROWS)
        self._rows[i] = n
        self._parts[i] = part

    def finish(self, report: ValidationReport) -> S:
        """The whole, once every unit is in, as the first unit's shard."""
        parts = [p for p in self._parts if p is not None]
        if not parts or len(parts) < len(self._parts):
            raise ValueError(f"{len(parts)} of {len(self._parts)} units assembled")
        arrays, mdp = self._arrays, self._arrays["mdp_id"]
        # The units' episodes end to end, coded by first appearance (as one builder codes).
        episodes = pa.array([e for p in parts for e in p.episodes]).dictionary_encode()
        codes = np.asarray(episodes.indices)
        n = first = 0  # rows so far; the unit's first entry in `codes`
        for part, lo, rows in zip(parts, self.offsets.tolist(), self._rows, strict=False):
            if lo != n:  # rows dropped before this unit: move it up (numpy copes with overlap)
                for a in arrays.values():
                    a[n : n + rows] = a[lo : lo + rows]
            if rows:
                lut = codes[first : first + len(part.episodes)]
                mdp[n : n + rows] = lut[mdp[n : n + rows]]
            n, first = n + rows, first + len(part.episodes)
        shard = parts[0]
        for part in parts[1:]:
            shard.merge_seen(part)
        shard.report, shard.episodes = report, episodes.dictionary.to_pylist()
        shard.features = {k: arrays[k][:n] for k in shard.features}
        shard.fields = {k: arrays[k][:n] for k in shard.fields}
        self._parts, self._arrays = [], {}
        return shard


_NO_ROWS = np.empty(0, np.float32)  # what an assembled unit keeps of its arrays
