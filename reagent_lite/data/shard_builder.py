"""The arrays a shard is ingested into, shared by the dqn and parametric builders.

A builder (`ShardBuilder`) is handed a shard's validated batches (row-group slices) in
order and scatters each (`data/scatter.py`) straight into arrays preallocated for the
shard's rows (the count from the Parquet footers). Feature columns become float32 matrices
with NaN where a feature is absent — the form normalization samples want and
`Preprocessor.normalize_rows` accepts — so no presence matrix is ever built. Feature ids
are not known before reading: columns are assigned as ids are first seen
(`FeatureColumns`), the matrices widen when new ones appear, and `reorder_columns` later
puts them in the order the ranks agreed on (ids this shard never saw come out
all-absent) — in place when, as usual, that is a permutation or nothing. When the agreed
ids are known beforehand (a streamed window, an eval table) they get the first columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.data.arrow import (
    column_of,
    dictionary_codes,
    is_list,
    map_keys,
    to_float32,
    used_keys,
)
from reagent_lite.data.scatter import scatter_features
from reagent_lite.data.validate import ValidationReport

# ----------------------------------------------------------------------------- features


def id_order(feature_id: str) -> tuple[int, int, str]:
    """Sort key of feature ids: numeric ids numerically, then the others as strings."""
    return (0, int(feature_id), "") if feature_id.isdigit() else (1, 0, feature_id)


class FeatureColumns:
    """Feature id → column, assigned as ids are first seen (numerically sorted within a
    batch, so a shard whose first batch has every id ends up in the agreed order)."""

    def __init__(self, ids: Sequence[str] = ()) -> None:
        self.ids: list[str] = list(ids)
        self.index: dict[str, int] = {f: i for i, f in enumerate(self.ids)}

    def add(self, ids: Sequence[str]) -> None:
        """Appends the ids not seen yet, in numeric order (the order the workflow agrees on,
        so that usually no reordering is needed later)."""
        for f in sorted(ids, key=id_order):
            if f not in self.index:
                self.index[f] = len(self.ids)
                self.ids.append(f)


def reorder_columns(m: np.ndarray, columns: FeatureColumns, ids: list[str]) -> np.ndarray:
    """`m` — feature columns on its last axis, in `columns.ids` order — with its columns in
    the order of `ids` (ids never seen are all-absent columns; seen ids not listed are
    dropped). A permutation is applied in place, a block of rows at a time; anything else
    builds a new array."""
    if ids == columns.ids:
        return m
    cols = columns.index
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


# ----------------------------------------------------------------------------- shards


@dataclass
class IngestedShard:
    """A shard as the builders leave it, either kind: its arrays, all indexed by row —
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
    allocates its own arrays (`alloc`), says how wide those that follow ids must be now
    (`tails`), and writes a (validated) batch in `add`."""

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
        self.columns = FeatureColumns(feature_ids)
        self.state_ids: set[str] = set()  # the ids of `state_features` (the agreed ones)
        self.n = 0
        self.cap = max(capacity or 0, 1)
        self.arrays: dict[str, np.ndarray] = {}
        self._fill: dict[str, float] = {}
        for name in ("state", "next_state"):
            self.alloc(name, (0,), np.float32)
        for name in ("reward", "terminal", "time_diff", "propensity"):
            self.alloc(name, (), np.float32)
        for name in ("sequence_number", "mdp_id"):
            self.alloc(name, (), np.int64)
        # Episode id → dense code, in order of first appearance (as `dictionary_encode` of
        # the whole column numbers them); no Arrow buffer of a batch outlives the batch.
        self.episode_codes: dict[object, int] = {}

    def alloc(self, name: str, tail: tuple[int, ...], dtype: type, fill: float = np.nan) -> None:
        """An array `name` of trailing shape `tail`; `fill`: what cells new to filled rows
        hold when it widens."""
        self.arrays[name] = np.empty((self.cap, *tail), dtype)
        self._fill[name] = fill

    def tails(self) -> dict[str, tuple[int, ...]]:
        """The trailing shape the arrays that follow feature ids need now."""
        width = (len(self.columns.ids),)
        return {"state": width, "next_state": width}

    def shaped_arrays(self) -> dict[str, np.ndarray]:
        """The arrays `add` writes into, shaped for the columns known now."""
        self.ensure(self.n)
        return self.arrays

    def write_into(self, arrays: dict[str, np.ndarray]) -> None:
        """Collects rows into `arrays` (rows of a larger shard's `shaped_arrays`) instead of
        arrays of its own — as long as no feature id outside its columns turns up (that
        widens the matrices into new arrays)."""
        tails = self.tails()
        for name, a in arrays.items():
            if a.shape[1:] != tails.get(name, self.arrays[name].shape[1:]):
                raise ValueError(f"{name}: shape {a.shape[1:]}, builder needs {tails.get(name)}")
        self.arrays.update(arrays)
        self.cap = min(len(a) for a in self.arrays.values())

    def ensure(self, rows: int) -> None:
        """Room for `rows` rows, every array as wide as the columns known now."""
        tails = self.tails()
        more = rows > self.cap
        if more:
            self.cap = max(rows, self.cap + self.cap // 2)
        for name, a in self.arrays.items():
            tail = tails.get(name, a.shape[1:])
            if more or tail != a.shape[1:]:
                self.arrays[name] = _grow(a, self.cap, self.n, tail, self._fill[name])

    def discover(
        self, col: pa.ChunkedArray, columns: FeatureColumns, seen: set[str] | None = None
    ) -> None:
        """Gives the ids of a map column (of a list<map> column's maps, of a dense list
        column's positions) columns, and adds them to `seen`."""
        value_type = col.type.value_type if is_list(col.type) else None
        if value_type is not None and pa.types.is_map(value_type):
            col = pa.chunked_array([c.flatten() for c in col.chunks], value_type)
        if pa.types.is_map(col.type):
            for chunk in col.chunks:
                keys = map_keys(chunk)
                if pa.types.is_dictionary(keys.type):
                    # Slices of a row group share its dictionary: once all its entries are
                    # known (as columns, and in `seen`) there is nothing new to find.
                    entries = [str(k) for k in keys.dictionary.to_pylist()]
                    known = seen if seen is not None else columns.index
                    if all(k in known for k in entries):
                        continue
                ids = used_keys(keys)
                columns.add(ids)
                if seen is not None:
                    seen.update(ids)
        elif value_type is not None and not pa.types.is_null(value_type):
            width = max((pc.max(pc.list_value_length(c)).as_py() or 0) for c in col.chunks)
            ids = [str(i) for i in range(width)]
            columns.add(ids)
            if seen is not None:
                seen.update(ids)

    def common(self, table: pa.Table, lo: int, hi: int, terminal: np.ndarray) -> None:
        """Rows lo:hi of the fields both tables have; `terminal`: from the candidate lists
        (an explicit `terminal` column adds to it)."""
        f, src, names = self.arrays, self.source, table.column_names
        f["reward"][lo:hi] = to_float32(column_of(table, ["reward"], src))
        if "action_probability" in names:
            f["propensity"][lo:hi] = to_float32(table.column("action_probability"))
        else:
            f["propensity"][lo:hi] = 1.0
        # ReAgent semantics: the time_diff column (sequence-number gap) is the discount
        # exponent only with use_seq_num_diff_as_time_diff; otherwise one step.
        if self.use_time_diff and "time_diff" in names:
            f["time_diff"][lo:hi] = to_float32(table.column("time_diff"))
        else:
            f["time_diff"][lo:hi] = 1.0
        if "terminal" in names:
            explicit = table.column("terminal").combine_chunks().fill_null(False)
            terminal = terminal | np.asarray(
                explicit.cast(pa.bool_()).to_numpy(zero_copy_only=False)
            )
        f["terminal"][lo:hi] = terminal
        seq = column_of(table, ["sequence_number"], src).combine_chunks()
        f["sequence_number"][lo:hi] = np.asarray(
            seq.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        )
        f["mdp_id"][lo:hi] = self._episode_codes(column_of(table, ["mdp_id"], src))

    def _episode_codes(self, col: pa.ChunkedArray) -> np.ndarray:
        enc = col.combine_chunks().dictionary_encode()
        known = self.episode_codes
        codes = np.array(
            [known.setdefault(v, len(known)) for v in enc.dictionary.to_pylist()], np.int64
        )
        return codes[dictionary_codes(enc)] if len(codes) else np.zeros(len(col), np.int64)

    def scatter(self, col: pa.ChunkedArray, out: np.ndarray, columns: FeatureColumns) -> None:
        """One batch's feature column into `out` (this batch's rows), NaN where absent."""
        out.fill(np.nan)
        scatter_features(col, columns.ids, out)

    def rows(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The filled rows of the named arrays, in that order."""
        return {k: self.arrays[k][: self.n] for k in names}

    def add(self, table: pa.Table) -> None:
        raise NotImplementedError

    def finish(self, report: ValidationReport) -> S:
        raise NotImplementedError
