"""Checks of a training table against SPEC §2.1, before anything is tensorized.

Structural problems (a missing column, a column of the wrong type, an empty table) always
raise `DataError`. Row problems (NaN rewards, unknown action names, propensities outside
(0, 1], time_diff < 1, ...) raise too — one message line per problem, naming the file, the
column, the number of bad rows and an example — unless `drop_bad_rows` is set, in which case
those rows are dropped and counted in the `ValidationReport` (and logged).
Every row check is a vectorised pyarrow/numpy pass; no Python loop over rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.data.readers import ALIASES
from reagent_lite.data.tensorize import (
    NAME_EMPTY,
    NAME_NULL,
    dictionary_codes,
    flat_parents,
    map_entries,
    small_string_dictionary,
    string_index,
)
from reagent_lite.errors import DataError

log = logging.getLogger(__name__)

Kind = Literal["dqn", "parametric_dqn"]

# Required columns; a tuple lists accepted alternatives (sparse map first, dense list second).
REQUIRED: tuple[str | tuple[str, ...], ...] = (
    "mdp_id",
    "sequence_number",
    ("state_features", "state"),
    "action",
    "reward",
    ("next_state_features", "next_state"),
    "next_action",
    "possible_actions",
    "possible_next_actions",
    "action_probability",
)
OPTIONAL = ("time_diff", "terminal", "metrics")
BAD_ID = "feature id is not a non-negative integer (digits, or an integer below 2**63)"
REPEATED_ID = "one feature id twice in the same map (which value is meant?)"


@dataclass(frozen=True)
class Problem:
    """Rows of one column that break one rule."""

    column: str
    count: int
    what: str
    example_row: int
    example: str
    example_file: str | None = None  # the part file of the example row, when not `source`

    def message(self, source: str) -> str:
        rows = "row" if self.count == 1 else "rows"
        where = f"row {self.example_row}"
        if self.example_file and self.example_file not in source:
            where += f" of the shard, in {self.example_file}"
        return (
            f"{source}: column '{self.column}': {self.count} bad {rows}: {self.what}"
            f" (e.g. {where}: {self.example})"
        )


_FILE_KEY = b"reagent_lite.file"


def tag_file(table: pa.Table, file: str | Path) -> pa.Table:
    """`table` marked as read from `file` (schema metadata), for error messages."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), _FILE_KEY: str(file)})


def _file_of(table: pa.Table) -> str | None:
    raw = (table.schema.metadata or {}).get(_FILE_KEY)
    return raw.decode() if raw else None


@dataclass
class ValidationReport:
    """What validation found; `dropped` is empty unless bad rows were dropped."""

    source: str
    kind: str
    rows_in: int
    rows_out: int
    dropped: list[Problem] = field(default_factory=list)

    @property
    def rows_dropped(self) -> int:
        return self.rows_in - self.rows_out

    def __str__(self) -> str:
        head = f"{self.source}: {self.rows_out:,} of {self.rows_in:,} rows valid ({self.kind})"
        return head + "".join(f"\n  dropped: {p.message(self.source)}" for p in self.dropped)


# ----------------------------------------------------------------------------- type predicates

_t = pa.types


def _is_str(t: pa.DataType) -> bool:
    if _t.is_dictionary(t):
        return _is_str(t.value_type)
    return bool(_t.is_string(t) or _t.is_large_string(t))


def _is_num(t: pa.DataType) -> bool:
    return bool(_t.is_integer(t) or _t.is_floating(t))


def _is_list(t: pa.DataType) -> bool:
    return bool(_t.is_list(t) or _t.is_large_list(t))


def _is_feature_map(t: pa.DataType) -> bool:
    return bool(
        _t.is_map(t) and (_is_str(t.key_type) or _t.is_integer(t.key_type)) and _is_num(t.item_type)
    )


def _is_dense(t: pa.DataType) -> bool:
    return _is_list(t) and _is_num(t.value_type)


Pred = Callable[[Any], bool]


def _list_of(pred: Pred) -> Pred:
    def check(t: pa.DataType) -> bool:
        return _is_list(t) and (_t.is_null(t.value_type) or pred(t.value_type))

    return check


_EXPECTED: dict[str, tuple[Pred, str]] = {
    "mdp_id": (lambda t: _is_str(t) or _t.is_integer(t), "string or integer episode ids"),
    "sequence_number": (_t.is_integer, "integers"),
    "state_features": (_is_feature_map, "map<feature id, float>"),
    "state": (_is_dense, "list<float> (dense features)"),
    "reward": (_is_num, "numbers"),
    "action_probability": (_is_num, "numbers in (0, 1]"),
    "time_diff": (_is_num, "integers >= 1"),
    "terminal": (lambda t: _t.is_boolean(t) or _t.is_integer(t), "booleans"),
    "metrics": (lambda t: _t.is_map(t) and _is_num(t.item_type), "map<metric name, float>"),
}
_EXPECTED["next_state_features"] = _EXPECTED["state_features"]
_EXPECTED["next_state"] = _EXPECTED["state"]
_DQN: dict[str, tuple[Pred, str]] = {
    "action": (_is_str, "action names (strings)"),
    "next_action": (lambda t: _is_str(t) or _t.is_null(t), "action names (strings or null)"),
    "possible_actions": (
        _list_of(lambda t: _is_str(t) or _t.is_integer(t) or _t.is_boolean(t)),
        "lists of action names, or 0/1 masks of len(actions)",
    ),
}
_PARAM: dict[str, tuple[Pred, str]] = {
    "action": (_is_feature_map, "map<feature id, float>"),
    "next_action": (lambda t: _is_feature_map(t) or _t.is_null(t), "map<feature id, float>"),
    "possible_actions": (_list_of(_is_feature_map), "lists of map<feature id, float>"),
}
for _d in (_DQN, _PARAM):
    _d["possible_next_actions"] = _d["possible_actions"]


# ----------------------------------------------------------------------------- row checks


def _bools(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as numpy, nulls as False."""
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _nonfinite(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per value: null, NaN or ±inf."""
    if _t.is_integer(values.type):
        return np.asarray(values.is_null().to_numpy(zero_copy_only=False), bool)
    if _t.is_float32(values.type) or _t.is_float64(values.type):
        v = values.to_numpy(zero_copy_only=False)  # nulls come out as NaN
    else:
        v = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    return ~np.isfinite(v)


def _bad_key_entries(keys: pa.Array) -> np.ndarray:
    """Per map key: not a non-negative integer (as a string, or an integer below 2**63)."""
    if _t.is_dictionary(keys.type):
        small = small_string_dictionary(keys)
        if small is not None:  # the regex below, in Python: no kernel call per slice
            bad_dict = np.array([not (k.isascii() and k.isdigit()) for k in small], bool)
        else:
            bad_dict = _bad_key_entries(keys.dictionary)
        if not bad_dict.any():
            return np.zeros(len(keys), bool)
        return bad_dict[dictionary_codes(keys)]
    if _t.is_uint64(keys.type):  # ids are read as int64 further on
        return _bools(pc.greater(keys, pa.scalar(2**63 - 1, pa.uint64())))
    if _t.is_unsigned_integer(keys.type):
        return np.zeros(len(keys), bool)
    if _t.is_integer(keys.type):
        return _bools(pc.less(keys, 0))
    return ~_bools(pc.match_substring_regex(keys, r"^[0-9]+$"))


def _key_codes(keys: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(code per map key, the distinct keys): codes index the distinct keys, so they are
    equal exactly where the keys are equal (as strings or integers, as the column holds)."""
    if _t.is_dictionary(keys.type):
        codes = dictionary_codes(keys)
        canon = pc.dictionary_encode(keys.dictionary)  # Arrow allows a value twice in one
        if len(canon.dictionary) < len(keys.dictionary):
            codes = canon.indices.to_numpy(zero_copy_only=False)[codes]
        return codes, canon.dictionary
    encoded = pc.dictionary_encode(keys)
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False)), encoded.dictionary


def _id_ranks(distinct: pa.Array) -> Iterator[np.ndarray]:
    """Rank of each distinct key in the orders writers sort feature ids in: numeric (ties
    such as "7" / "07" broken by the string), then, for strings, as strings."""
    orders = []
    if _t.is_integer(distinct.type):
        orders.append([(distinct, "ascending")])
    else:
        try:
            numbers = pc.cast(distinct, pa.int64())
            orders.append([(numbers, "ascending"), (distinct, "ascending")])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        orders.append([(distinct, "ascending")])
    for keys in orders:
        table = pa.table({str(i): k for i, (k, _) in enumerate(keys)})
        order = pc.sort_indices(table, sort_keys=[(str(i), d) for i, (_, d) in enumerate(keys)])
        rank = np.empty(len(distinct), np.int64)
        rank[order.to_numpy()] = np.arange(len(distinct), dtype=np.int64)
        yield rank


def _rising_in_every_map(codes: np.ndarray, offsets: np.ndarray) -> bool:
    """Codes (of the entries offsets[0]:offsets[-1]) strictly increasing within every map:
    then no map repeats a key."""
    rising = codes[1:] > codes[:-1]
    starts = offsets[1:-1] - offsets[0]  # first entry of every map but the first
    rising[starts[(starts > 0) & (starts < len(codes))] - 1] = True
    return bool(rising.all())


# Up to this many (map, distinct key) cells, repeats are counted on a dense bitmap: O(cells
# + entries) whatever the key order; above it, entries are sorted.
_BITMAP_CELLS = 1 << 25


def _maps_repeating_a_key(maps: pa.MapArray) -> np.ndarray:
    """Indices of the maps in `maps` that hold a feature id twice (Arrow's map type allows
    it; the dense tensors could keep only one of the values)."""
    offsets = maps.offsets.to_numpy()
    lo, hi = int(offsets[0]), int(offsets[-1])
    if hi - lo < 2:
        return np.zeros(0, np.int64)
    # Cheap first: keys in one order in every row (the order of first appearance, numeric
    # or string order) cannot repeat within a row. Ranks cost a sort of the distinct keys,
    # so only where they are few against the entries.
    codes, distinct = _key_codes(maps.keys.slice(lo, hi - lo))
    if _rising_in_every_map(codes, offsets):
        return np.zeros(0, np.int64)
    if len(distinct) * 4 <= len(codes) and any(
        _rising_in_every_map(rank[codes], offsets) for rank in _id_ranks(distinct)
    ):
        return np.zeros(0, np.int64)
    # Exact. Entries that a null map slot owns do not count.
    if maps.null_count:
        rows, keys, _ = map_entries(maps)
        codes, distinct = _key_codes(keys)
    else:
        rows = np.repeat(np.arange(len(maps), dtype=np.int64), np.diff(offsets))
    width = len(distinct)
    cell = rows * width + codes.astype(np.int64)
    if len(maps) * width <= _BITMAP_CELLS:
        seen = np.zeros(len(maps) * width, bool)
        seen[cell] = True
        if np.count_nonzero(seen) == len(cell):
            return np.zeros(0, np.int64)
    cell.sort()  # rows ascending, then codes: a repeat is an equal neighbour
    repeated = cell[1:][cell[1:] == cell[:-1]]
    return np.unique(repeated // width)


def _table_rows(map_index: np.ndarray, chunk: pa.Array, nested: bool, start: int) -> np.ndarray:
    """Table row of each map index of a chunk's maps (of `chunk.flatten()` when `nested`)."""
    if not nested or not len(map_index):
        return map_index + start
    return flat_parents(chunk)[map_index] + start


def _map_rows(
    col: pa.ChunkedArray, n: int, nested: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows with a non-finite value, rows with a malformed feature id, rows with a feature
    id repeated within one map) of a map column, or of a list<map> column with `nested`."""
    bad_val, bad_key, bad_dup = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    start = 0
    for chunk in col.chunks:
        maps = chunk.flatten() if nested else chunk
        bad_dup[_table_rows(_maps_repeating_a_key(maps), chunk, nested, start)] = True
        if not maps.null_count:
            # Check the entries first; rows are only worked out when some entry is bad.
            lo, hi = maps.offsets[0].as_py(), maps.offsets[-1].as_py()
            if not (
                _nonfinite(maps.items.slice(lo, hi - lo)).any()
                or _bad_key_entries(maps.keys.slice(lo, hi - lo)).any()
            ):
                start += len(chunk)
                continue
        entry_map, keys, items = map_entries(maps)
        bad_val[_table_rows(entry_map[_nonfinite(items)], chunk, nested, start)] = True
        bad_key[_table_rows(entry_map[_bad_key_entries(keys)], chunk, nested, start)] = True
        start += len(chunk)
    return bad_val, bad_key, bad_dup


def _map_problems(col: pa.ChunkedArray, n: int, nested: bool) -> list[tuple[np.ndarray, str]]:
    """(bad-row mask, what is wrong) of each rule for a map column (`nested`: list<map>)."""
    bad_val, bad_key, bad_dup = _map_rows(col, n, nested=nested)
    if nested:
        return [
            (bad_val, "null, NaN or infinite candidate feature value"),
            (bad_key, "candidate " + BAD_ID),
            (bad_dup, "a candidate's map names one feature id twice"),
        ]
    return [
        (bad_val, "null, NaN or infinite feature value"),
        (bad_key, BAD_ID),
        (bad_dup, REPEATED_ID),
    ]


def _dense_problems(col: pa.ChunkedArray) -> list[tuple[np.ndarray, str]]:
    """(bad-row mask, what is wrong) of each rule for a dense list-of-numbers column."""
    bad_val, bad_len = _dense_rows(col)
    return [
        (bad_val, "null list, or NaN or infinite feature value"),
        (bad_len, "dense feature list of a different length than the first row's"),
    ]


def _dense_rows(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(rows with a non-finite value or null, rows whose length differs from the first row's)."""
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    null = np.isnan(lengths.astype(np.float64))
    bad_val = null.copy()
    start = 0
    for chunk in col.chunks:
        if len(chunk):
            parent = flat_parents(chunk)
            bad_val[parent[_nonfinite(chunk.flatten())] + start] = True
        start += len(chunk)
    lengths = np.nan_to_num(lengths.astype(np.float64), nan=-1)
    width = lengths[~null][0] if (~null).any() else -1
    return bad_val, (lengths != width) & ~null


def _name_rows(
    col: pa.ChunkedArray, actions: Sequence[str], n: int, allow_empty: bool
) -> np.ndarray:
    """Rows naming an action not in `actions` (lists checked element-wise)."""
    if _is_list(col.type):
        bad = np.zeros(n, bool)
        if _t.is_null(col.type.value_type):
            return bad
        start = 0
        for chunk in col.chunks:
            names = chunk.flatten()
            if _is_str(names.type):
                parent = flat_parents(chunk)
                unknown = string_index(names, actions) < 0
                if unknown.any():
                    bad[parent[unknown] + start] = True
            else:  # 0/1 masks: one entry per action (an empty list = no action possible)
                lengths = pc.list_value_length(chunk).fill_null(0).to_numpy(zero_copy_only=False)
                bad[start : start + len(chunk)] |= (lengths != len(actions)) & (lengths != 0)
                # ... and each entry 0 or 1 (a 2, a −1 or a null is a broken mask)
                values = names.to_numpy(zero_copy_only=False)
                off_mask = ~np.isin(values, (0, 1)) | np.asarray(names.is_null())
                if off_mask.any():
                    parent = flat_parents(chunk)
                    bad[parent[off_mask] + start] = True
            start += len(chunk)
        return bad
    if _t.is_null(col.type):
        return np.zeros(n, bool)
    idx = string_index(col, actions)
    if allow_empty:
        return idx == -1
    return idx < 0


# ----------------------------------------------------------------------------- validate


def _example(table: pa.Table, column: str, mask: np.ndarray) -> tuple[int, str]:
    row = int(np.argmax(mask))
    text = repr(table.column(column)[row].as_py())
    return row, text if len(text) <= 80 else text[:77] + "..."


def check_columns(
    table: pa.Table, kind: Kind, source: str, *, types: bool = True
) -> dict[str, str]:
    """Canonical name → column used; raises on missing or (with `types`) mistyped columns.
    Needs no rows: `--dry_run` runs it on an empty table of the data's schema."""
    names = set(table.column_names)
    missing, chosen = [], {}
    for req in REQUIRED:
        alts = (req,) if isinstance(req, str) else req
        found = next((a for a in alts if a in names), None)
        if found is None:
            missing.append(" or ".join(f"'{a}'" for a in alts))
        else:
            chosen[alts[0]] = found
    if missing:
        raise DataError(
            f"{source}: missing required column(s) {', '.join(missing)} for {kind}"
            f" (columns present: {sorted(names)})"
        )
    chosen.update({c: c for c in OPTIONAL if c in names})
    if not types:
        return chosen
    expected = {**_EXPECTED, **(_DQN if kind == "dqn" else _PARAM)}
    wrong = []
    for col in chosen.values():
        pred, what = expected[col]
        if not pred(table.schema.field(col).type):
            wrong.append(
                f"{source}: column '{col}': expected {what}, got {table.schema.field(col).type}"
            )
    if wrong:
        raise DataError("\n".join(wrong))
    return chosen


def _row_checks(
    table: pa.Table, kind: Kind, cols: dict[str, str], actions: Sequence[str] | None
) -> list[tuple[str, np.ndarray, str]]:
    """(column, bad-row mask, what is wrong) for every rule some row of `table` breaks."""
    n = table.num_rows
    checks: list[tuple[str, np.ndarray, str]] = []

    def add(column: str, mask: np.ndarray, what: str) -> None:
        if mask.any():
            checks.append((column, mask, what))

    col = table.column
    add("mdp_id", _bools(col("mdp_id").is_null()), "null episode id")
    add("sequence_number", _bools(col("sequence_number").is_null()), "null sequence number")
    add("reward", _nonfinite(col("reward")), "null, NaN or infinite reward")
    prop = col("action_probability")
    in_range = pc.and_(pc.greater(prop, 0), pc.less_equal(prop, 1))
    add("action_probability", ~_bools(in_range), "propensity outside (0, 1] (or null/NaN)")
    if "time_diff" in cols:
        add("time_diff", _bools(pc.less(col("time_diff"), 1)), "time_diff < 1")
    for canon in ("state_features", "next_state_features"):
        name = cols[canon]
        if name.endswith("_features"):
            problems = _map_problems(col(name), n, nested=False)
        else:
            problems = _dense_problems(col(name))
        for mask, what in problems:
            add(name, mask, what)

    if kind == "dqn":
        action_idx = string_index(col("action"), actions or [])
        add(
            "action",
            (action_idx == NAME_NULL) | (action_idx == NAME_EMPTY),
            "no action (null or empty)",
        )
        if actions is not None:
            add(
                "action",
                _name_rows(col("action"), actions, n, allow_empty=True),
                f"unknown action name (expected one of {list(actions)})",
            )
            add(
                "next_action",
                _name_rows(col("next_action"), actions, n, allow_empty=True),
                f'unknown action name (expected one of {list(actions)}, or null/"")',
            )
            for name in ("possible_actions", "possible_next_actions"):
                add(
                    name,
                    _name_rows(col(name), actions, n, allow_empty=True),
                    f"unknown action name, or a mask whose length is not {len(actions)} "
                    "or whose entries are not all 0 or 1",
                )
    else:
        add("action", _bools(col("action").is_null()), "no action (null map)")
        for name in ("action", "next_action"):
            if _t.is_map(table.schema.field(name).type):
                for mask, what in _map_problems(col(name), n, nested=False):
                    add(name, mask, what)
        for name in ("possible_actions", "possible_next_actions"):
            if not _t.is_null(table.schema.field(name).type.value_type):
                for mask, what in _map_problems(col(name), n, nested=True):
                    add(name, mask, what)
    return checks


class ShardValidation:
    """Validation of a shard that arrives in batches (row groups), with the same checks,
    counts and messages as validating the whole shard at once: `check` each batch in order
    (it returns the batch, bad rows dropped if asked), then `finish` (raises on problems
    unless dropping; raises on an empty shard). Example row numbers count from the shard's
    first row. `validate` is this with one batch."""

    def __init__(
        self,
        kind: Kind,
        *,
        actions: Sequence[str] | None = None,
        source: str,
        drop_bad_rows: bool = False,
    ) -> None:
        if kind not in ("dqn", "parametric_dqn"):
            raise ValueError(f"kind must be 'dqn' or 'parametric_dqn', got {kind!r}")
        self.kind: Kind = kind
        self.actions = actions
        self.source = source
        self.drop_bad_rows = drop_bad_rows
        self.rows_in = 0
        self.rows_out = 0
        # (column, what) → [bad rows, first bad row in the shard, its value, its file]
        self._found: dict[tuple[str, str], list[Any]] = {}

    def check(self, table: pa.Table) -> pa.Table:
        for alias, canon in ALIASES.items():
            if alias in table.column_names and canon not in table.column_names:
                table = table.rename_columns(
                    [canon if c == alias else c for c in table.column_names]
                )
        n = table.num_rows
        if n == 0:
            return table
        cols = check_columns(table, self.kind, self.source)
        checks = _row_checks(table, self.kind, cols, self.actions)
        for column, mask, what in checks:
            entry = self._found.get((column, what))
            if entry is None:
                row, example = _example(table, column, mask)
                self._found[(column, what)] = [
                    int(mask.sum()),
                    row + self.rows_in,
                    example,
                    _file_of(table),
                ]
            else:
                entry[0] += int(mask.sum())
        self.rows_in += n
        if checks and self.drop_bad_rows:
            bad = np.logical_or.reduce([mask for _, mask, _ in checks])
            table = table.filter(pa.array(~bad))
        self.rows_out += table.num_rows
        return table

    @property
    def failing(self) -> bool:
        """Whether `finish` is going to raise for the rows checked so far."""
        return bool(self._found) and not self.drop_bad_rows

    def finish(self) -> ValidationReport:
        source = self.source
        if self.rows_in == 0:
            raise DataError(
                f"{source}: no rows (empty table, or an empty shard: more ranks than rows?)"
            )
        problems = [
            Problem(column, count, what, row, example, file)
            for (column, what), (count, row, example, file) in self._found.items()
        ]
        if problems and not self.drop_bad_rows:
            raise DataError("\n".join(p.message(source) for p in problems))
        report = ValidationReport(
            source, self.kind, rows_in=self.rows_in, rows_out=self.rows_out, dropped=problems
        )
        for p in problems:
            log.warning("dropping bad rows: %s", p.message(source))
        if problems and self.rows_out == 0:
            raise DataError(
                f"{source}: every row is bad; nothing left after dropping them\n{report}"
            )
        return report


def validate(
    table: pa.Table,
    kind: Kind,
    *,
    actions: Sequence[str] | None = None,
    source: str,
    drop_bad_rows: bool = False,
) -> tuple[pa.Table, ValidationReport]:
    """Check `table` (one shard, read from `source`) for the `kind` workflow.

    Returns the table (aliases renamed, bad rows dropped if asked) and a report. `actions`
    (dqn) enables the action-name checks.
    """
    v = ShardValidation(kind, actions=actions, source=source, drop_bad_rows=drop_bad_rows)
    table = v.check(table)
    return table, v.finish()


def check_feature_column(
    table: pa.Table, column: str, source: str, *, candidates: bool = False
) -> None:
    """`DataError` unless every row of a feature column holds finite values under
    well-formed ids, each id at most once per map: the training rules, for tables that are
    scored rather than trained on (`reagent_lite.predict`), where a NaN would become a
    silent NaN score. A state column is a sparse map or a dense list of numbers; with
    `candidates`, the column is a list of candidate maps."""
    col, n = table.column(column), table.num_rows
    ctype = col.type
    if _t.is_null(ctype) or (_is_list(ctype) and _t.is_null(ctype.value_type)):
        return  # JSON Lines columns empty throughout: nothing to check
    nested = _is_list(ctype) and _is_feature_map(ctype.value_type)
    flat = _is_feature_map(ctype) or _is_dense(ctype)
    if (nested, flat) != (candidates, not candidates):
        expected = (
            "a list of candidate maps (feature id → number)"
            if candidates
            else "a map of feature id → number or a list of numbers"
        )
        raise DataError(f"{source}: column '{column}' has type {ctype}; expected {expected}")
    dense = _is_dense(ctype)
    masks = _dense_problems(col) if dense else _map_problems(col, n, nested=nested)
    problems = []
    for mask, what in masks:
        if mask.any():
            row, text = _example(table, column, mask)
            problems.append(Problem(column, int(mask.sum()), what, row, text))
    if problems:
        raise DataError("\n".join(p.message(source) for p in problems))
