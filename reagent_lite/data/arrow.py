"""Arrow columns as numpy: the vectorised helpers that validation and tensorization share.

Everything here works on whole Arrow buffers (a map column's offsets, keys and items; a
dictionary's codes), so the cost is a few passes over the flattened entries, never a Python
loop over rows.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.errors import DataError

ArrowColumn: TypeAlias = "pa.Array | pa.ChunkedArray"
_t = pa.types

# ----------------------------------------------------------------------------- types


def is_str(t: pa.DataType) -> bool:
    """Strings, or dictionary-encoded strings."""
    if _t.is_dictionary(t):
        return is_str(t.value_type)
    return bool(_t.is_string(t) or _t.is_large_string(t))


def is_num(t: pa.DataType) -> bool:
    return bool(_t.is_integer(t) or _t.is_floating(t))


def is_list(t: pa.DataType) -> bool:
    return bool(_t.is_list(t) or _t.is_large_list(t))


def is_feature_map(t: pa.DataType) -> bool:
    """map<feature id (string or integer), number>."""
    return bool(
        _t.is_map(t) and (is_str(t.key_type) or _t.is_integer(t.key_type)) and is_num(t.item_type)
    )


def is_dense(t: pa.DataType) -> bool:
    """list<number>: dense features, feature id "i" at position i."""
    return is_list(t) and is_num(t.value_type)


# ----------------------------------------------------------------------------- columns


def chunks(col: ArrowColumn) -> Iterator[tuple[int, pa.Array]]:
    """(first row, chunk) pairs; a plain Array is one chunk."""
    if isinstance(col, pa.ChunkedArray):
        start = 0
        for chunk in col.chunks:
            yield start, chunk
            start += len(chunk)
    else:
        yield 0, col


def column_of(table: pa.Table, names: Sequence[str], source: str) -> pa.ChunkedArray:
    """The first of `names` (a column and its alternatives) that `table` has."""
    for n in names:
        if n in table.column_names:
            return table.column(n)
    raise DataError(f"{source}: missing column '{names[0]}'")


def list_lengths(col: ArrowColumn) -> np.ndarray:
    """Entries per row of a list column (a null list has none)."""
    return np.asarray(pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False))


def flat_parents(lists: pa.Array) -> np.ndarray:
    """Row of each element of `lists.flatten()`. (`pc.list_parent_indices` also counts
    elements that a null list slot owns, which `flatten` leaves out.)"""
    return np.repeat(np.arange(len(lists), dtype=np.int64), list_lengths(lists))


def map_entries(arr: pa.MapArray) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """(row index per entry int64 [E], keys [E], items [E]) of a map array, honouring slices
    and null rows (a null map is an empty one)."""
    offsets = arr.offsets.to_numpy()
    lo, hi = int(offsets[0]), int(offsets[-1])
    rows = np.repeat(np.arange(len(arr), dtype=np.int64), np.diff(offsets))
    keys = arr.keys.slice(lo, hi - lo)
    items = arr.items.slice(lo, hi - lo)
    if arr.null_count:
        # Arrow lets a null slot own entries; they must not count.
        keep = np.asarray(arr.is_valid())[rows]
        if not keep.all():
            mask = pa.array(keep)
            rows, keys, items = rows[keep], keys.filter(mask), items.filter(mask)
    return rows, keys, items


def map_keys(arr: pa.MapArray) -> pa.Array:
    """The keys of the (non-null) maps of a map array."""
    if arr.null_count:
        return map_entries(arr)[1]
    offsets = arr.offsets
    lo, hi = offsets[0].as_py(), offsets[-1].as_py()
    return arr.keys.slice(lo, hi - lo)


def used_keys(keys: pa.Array) -> list[str]:
    """The distinct keys of a map's key array, as strings."""
    if _t.is_dictionary(keys.type):
        codes = keys.indices.to_numpy(zero_copy_only=False)
        used = np.bincount(codes, minlength=len(keys.dictionary)) > 0
        return [str(k) for k in keys.dictionary.filter(pa.array(used)).to_pylist()]
    return [str(k) for k in pc.unique(keys).to_pylist()]


def bools(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as numpy, nulls as False."""
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def nonfinite(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per value: null, NaN or ±inf."""
    if _t.is_integer(values.type):
        return np.asarray(values.is_null().to_numpy(zero_copy_only=False), bool)
    if _t.is_float32(values.type) or _t.is_float64(values.type):
        v = values.to_numpy(zero_copy_only=False)  # nulls come out as NaN
    else:
        v = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
    return ~np.isfinite(v)


def to_float32(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Values as float32; nulls become NaN."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if _t.is_floating(arr.type) and arr.null_count == 0:
        return arr.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False), np.float32)


# ----------------------------------------------------------------------------- dictionaries

# Dictionaries up to this size are looked up in Python: a per-call pyarrow kernel costs
# more than the lookup itself, and a shard is processed in many small slices.
SMALL_DICTIONARY = 256


@functools.lru_cache(maxsize=16)
def positions(names: tuple[str, ...]) -> dict[str, int]:
    """name → its index in `names` (cached: the same few id lists are looked up per slice)."""
    return {n: i for i, n in enumerate(names)}


def small_string_dictionary(arr: pa.Array) -> list[str] | None:
    """The dictionary of a dictionary-encoded string array as a list, if it is small."""
    d = arr.dictionary
    if len(d) > SMALL_DICTIONARY or not (_t.is_string(d.type) or _t.is_large_string(d.type)):
        return None
    return d.to_pylist()


def dictionary_codes(arr: pa.Array) -> np.ndarray:
    """The codes of a dictionary array (nulls as code 0: callers mask them)."""
    codes = arr.indices
    if codes.null_count:
        codes = codes.fill_null(0)
    return np.asarray(codes.to_numpy(zero_copy_only=False))


# Codes of `string_index` for strings that are not one of the names.
NAME_UNKNOWN, NAME_NULL, NAME_EMPTY = -1, -2, -3


def _string_index_array(arr: pa.Array, names: Sequence[str]) -> np.ndarray:
    if _t.is_dictionary(arr.type):
        # Work on the (small) dictionary, then look the codes up: no string is touched twice.
        small = small_string_dictionary(arr)
        if small is not None:
            pos = positions(tuple(names))
            per_value = np.array(
                [pos.get(v, NAME_EMPTY if v == "" else NAME_UNKNOWN) for v in small], np.int64
            )
        else:
            per_value = _string_index_array(arr.dictionary, names)
        if len(per_value) == 0:
            out = np.full(len(arr), NAME_UNKNOWN, np.int64)
        else:
            out = per_value[dictionary_codes(arr)]
        if arr.null_count:
            out[np.asarray(arr.is_null().to_numpy(zero_copy_only=False))] = NAME_NULL
        return out
    if not (_t.is_string(arr.type) or _t.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    idx = pc.index_in(arr, value_set=pa.array(list(names), arr.type))
    out = np.asarray(idx.fill_null(NAME_UNKNOWN).to_numpy(zero_copy_only=False), np.int64)
    missing = out < 0
    if missing.any():
        empty = np.asarray(pc.equal(arr, "").fill_null(False).to_numpy(zero_copy_only=False))
        out[missing & empty] = NAME_EMPTY
        if arr.null_count:
            out[np.asarray(arr.is_null().to_numpy(zero_copy_only=False))] = NAME_NULL
    return out


def string_index(col: ArrowColumn, names: Sequence[str]) -> np.ndarray:
    """Index of each string of `col` in `names` (int64); `NAME_NULL` for nulls, `NAME_EMPTY`
    for "" (unless "" is a name), `NAME_UNKNOWN` for anything else. Dictionary-encoded
    strings are looked up by dictionary entry."""
    if _t.is_null(col.type):
        return np.full(len(col), NAME_NULL, np.int64)
    parts = [_string_index_array(chunk, names) for _, chunk in chunks(col)]
    return np.concatenate(parts) if len(parts) != 1 else parts[0]


# ----------------------------------------------------------------------------- structs


def is_numeric_struct(t: pa.DataType) -> bool:
    """A struct whose fields are all numbers (or all-null): what `df.to_parquet()` makes of
    a column of dicts, one field per key seen in any row."""
    return bool(
        _t.is_struct(t)
        and t.num_fields > 0
        # A map's physical form (list<struct<key, value>>) is not a dict of features.
        and {t.field(i).name for i in range(t.num_fields)} != {"key", "value"}
        and all(is_num(t.field(i).type) or _t.is_null(t.field(i).type) for i in range(t.num_fields))
    )


_MAP = pa.map_(pa.string(), pa.float64())


def structs_as_maps(table: pa.Table) -> pa.Table:
    """`table` with every struct column of numeric fields read as a map field name →
    value (float64), and every list of such structs as a list of maps (parametric
    candidates): a field that is null in a row is a key that row's dict did not have, so it
    is left out of that row's map (absent, not 0); a null struct is a null map."""
    for i, name in enumerate(table.column_names):
        column = table.column(i)
        if is_numeric_struct(column.type):
            maps = [_struct_to_map(chunk) for chunk in column.chunks]
            table = table.set_column(i, name, pa.chunked_array(maps, type=_MAP))
        elif is_list(column.type) and is_numeric_struct(column.type.value_type):
            lists = [_structs_to_maps(chunk) for chunk in column.chunks]
            table = table.set_column(i, name, pa.chunked_array(lists, type=pa.list_(_MAP)))
    return table


def _structs_to_maps(chunk: pa.ListArray) -> pa.ListArray:
    # Rebased offsets over this (maybe sliced) chunk's own values: from_arrays takes no
    # null mask together with offsets into a larger buffer.
    offsets = chunk.offsets.to_numpy().astype(np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    values = chunk.values.slice(start, stop - start)
    return pa.ListArray.from_arrays(
        pa.array((offsets - start).astype(np.int32), pa.int32()),
        _struct_to_map(values),
        type=pa.list_(_MAP),
        mask=chunk.is_null(),
    )


def _struct_to_map(chunk: pa.StructArray) -> pa.MapArray:
    n, names = len(chunk), [chunk.type.field(i).name for i in range(chunk.type.num_fields)]
    k = len(names)
    # Row-major (row, field) entries, then the null ones dropped: no loop over rows.
    fields = [chunk.field(i).cast(pa.float64()) for i in range(k)]
    stacked = pa.concat_arrays(fields) if fields else pa.array([], pa.float64())
    order = np.arange(k, dtype=np.int64)[None, :] * n + np.arange(n, dtype=np.int64)[:, None]
    values = stacked.take(pa.array(order.ravel()))
    valid = values.is_valid().to_numpy(zero_copy_only=False).reshape(n, k)
    row_valid = chunk.is_valid().to_numpy(zero_copy_only=False)
    valid &= row_valid[:, None]
    keys = np.tile(np.array(names, dtype=object), n)[valid.ravel()]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(valid.sum(axis=1), out=offsets[1:])
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(keys, pa.string()),
        values.filter(pa.array(valid.ravel())),
        mask=pa.array(~row_valid),
    )
