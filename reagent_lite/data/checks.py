"""Row rules for the columns of a transition table: which rows break them.

A rule takes a column and returns `(bad-row mask, what is wrong)` pairs; the table schemas
(`data/schema.py`, the kinds' action columns) list which rules each column obeys and
`ShardValidation` (`data/validate.py`) runs them. Every rule is a vectorised pyarrow/numpy
pass; none loops over rows in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.data.arrow import (
    NAME_UNKNOWN,
    bools,
    dictionary_codes,
    flat_parents,
    is_list,
    is_str,
    map_entries,
    nonfinite,
    small_string_dictionary,
    string_index,
)

_t = pa.types
Problems = list[tuple[np.ndarray, str]]
Rule = Callable[[pa.ChunkedArray], Problems]

BAD_ID = "feature id is not a non-negative integer (digits, or an integer below 2**63)"
REPEATED_ID = "one feature id twice in the same map (which value is meant?)"

# ----------------------------------------------------------------------------- simple rules


def null_rows(what: str) -> Rule:
    """Rows whose value is null."""
    return lambda col: [(bools(col.is_null()), what)]


def nonfinite_rows(what: str) -> Rule:
    """Rows whose value is null, NaN or infinite."""
    return lambda col: [(nonfinite(col), what)]


def propensity_rows(col: pa.ChunkedArray) -> Problems:
    in_range = pc.and_(pc.greater(col, 0), pc.less_equal(col, 1))
    return [(~bools(in_range), "propensity outside (0, 1] (or null/NaN)")]


def time_diff_rows(col: pa.ChunkedArray) -> Problems:
    return [(bools(pc.less(col, 1)), "time_diff < 1")]


# ----------------------------------------------------------------------------- feature ids


def bad_key_entries(keys: pa.Array) -> np.ndarray:
    """Per map key: not a non-negative integer (as a string, or an integer below 2**63)."""
    if _t.is_dictionary(keys.type):
        small = small_string_dictionary(keys)
        if small is not None:  # the regex below, in Python: no kernel call per slice
            bad_dict = np.array([not (k.isascii() and k.isdigit()) for k in small], bool)
        else:
            bad_dict = bad_key_entries(keys.dictionary)
        if not bad_dict.any():
            return np.zeros(len(keys), bool)
        return bad_dict[dictionary_codes(keys)]
    if _t.is_uint64(keys.type):  # ids are read as int64 further on
        return bools(pc.greater(keys, pa.scalar(2**63 - 1, pa.uint64())))
    if _t.is_unsigned_integer(keys.type):
        return np.zeros(len(keys), bool)
    if _t.is_integer(keys.type):
        return bools(pc.less(keys, 0))
    return ~bools(pc.match_substring_regex(keys, r"^[0-9]+$"))


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


# ----------------------------------------------------------------------------- feature columns


def _table_rows(map_index: np.ndarray, chunk: pa.Array, nested: bool, start: int) -> np.ndarray:
    """Table row of each map index of a chunk's maps (of `chunk.flatten()` when `nested`)."""
    if not nested or not len(map_index):
        return map_index + start
    return flat_parents(chunk)[map_index] + start


def map_rows(col: pa.ChunkedArray, nested: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows with a non-finite value, rows with a malformed feature id, rows with a feature
    id repeated within one map) of a map column, or of a list<map> column with `nested`."""
    n = len(col)
    bad_val, bad_key, bad_dup = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    start = 0
    for chunk in col.chunks:
        maps = chunk.flatten() if nested else chunk
        bad_dup[_table_rows(_maps_repeating_a_key(maps), chunk, nested, start)] = True
        if not maps.null_count:
            # Check the entries first; rows are only worked out when some entry is bad.
            lo, hi = maps.offsets[0].as_py(), maps.offsets[-1].as_py()
            if not (
                nonfinite(maps.items.slice(lo, hi - lo)).any()
                or bad_key_entries(maps.keys.slice(lo, hi - lo)).any()
            ):
                start += len(chunk)
                continue
        entry_map, keys, items = map_entries(maps)
        bad_val[_table_rows(entry_map[nonfinite(items)], chunk, nested, start)] = True
        bad_key[_table_rows(entry_map[bad_key_entries(keys)], chunk, nested, start)] = True
        start += len(chunk)
    return bad_val, bad_key, bad_dup


def dense_rows(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(rows with a non-finite value or null, rows whose length differs from the first row's)."""
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    null = np.isnan(lengths.astype(np.float64))
    bad_val = null.copy()
    start = 0
    for chunk in col.chunks:
        if len(chunk):
            parent = flat_parents(chunk)
            bad_val[parent[nonfinite(chunk.flatten())] + start] = True
        start += len(chunk)
    lengths = np.nan_to_num(lengths.astype(np.float64), nan=-1)
    width = lengths[~null][0] if (~null).any() else -1
    return bad_val, (lengths != width) & ~null


def feature_problems(col: pa.ChunkedArray) -> Problems:
    """The rules of a feature column: a sparse map (finite values under well-formed ids,
    each id at most once per map) or a dense list (finite values, one length); a column
    of nulls throughout (JSON Lines) has nothing to check."""
    if _t.is_map(col.type):
        bad_val, bad_key, bad_dup = map_rows(col, nested=False)
        return [
            (bad_val, "null, NaN or infinite feature value"),
            (bad_key, BAD_ID),
            (bad_dup, REPEATED_ID),
        ]
    if is_list(col.type) and not _t.is_null(col.type.value_type):
        bad_val, bad_len = dense_rows(col)
        return [
            (bad_val, "null list, or NaN or infinite feature value"),
            (bad_len, "dense feature list of a different length than the first row's"),
        ]
    return []


def candidate_problems(col: pa.ChunkedArray) -> Problems:
    """The rules of a list of candidate feature maps (each candidate as `feature_problems`)."""
    if _t.is_null(col.type) or _t.is_null(col.type.value_type):
        return []  # JSON Lines lists empty throughout
    bad_val, bad_key, bad_dup = map_rows(col, nested=True)
    return [
        (bad_val, "null, NaN or infinite candidate feature value"),
        (bad_key, "candidate " + BAD_ID),
        (bad_dup, "a candidate's map names one feature id twice"),
    ]


# ----------------------------------------------------------------------------- action names


def name_rows(col: pa.ChunkedArray, actions: Sequence[str]) -> np.ndarray:
    """Rows naming an action not in `actions`: a name (null and "" are no action, not an
    unknown one), or a list of names (each must be one) or of 0/1 masks (one entry per
    action, each 0 or 1; an empty list = no action possible)."""
    n = len(col)
    if not is_list(col.type):
        if _t.is_null(col.type):
            return np.zeros(n, bool)
        return string_index(col, actions) == NAME_UNKNOWN
    bad = np.zeros(n, bool)
    if _t.is_null(col.type.value_type):
        return bad
    start = 0
    for chunk in col.chunks:
        names = chunk.flatten()
        if is_str(names.type):
            unknown = string_index(names, actions) < 0
            if unknown.any():
                bad[flat_parents(chunk)[unknown] + start] = True
        else:
            lengths = pc.list_value_length(chunk).fill_null(0).to_numpy(zero_copy_only=False)
            bad[start : start + len(chunk)] |= (lengths != len(actions)) & (lengths != 0)
            # ... and each entry 0 or 1 (a 2, a −1 or a null is a broken mask)
            values = names.to_numpy(zero_copy_only=False)
            off_mask = ~np.isin(values, (0, 1)) | np.asarray(names.is_null())
            if off_mask.any():
                bad[flat_parents(chunk)[off_mask] + start] = True
        start += len(chunk)
    return bad
