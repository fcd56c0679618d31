"""The one tensorizer: feature columns scattered into NaN-coded float32 arrays.

A map column's offsets, keys and items become flat cell indices (row · F + column) written
in one assignment; a dense list column's values are copied by position; a list of candidate
maps fills the slots of [rows, K, G]. A feature a row does not have stays NaN — the form
normalization samples and `Preprocessor.normalize_rows` take — so no presence matrix is
built. The shard builders (resident shards, disk windows, eval tables: `data/ingest.py`)
and `predict` tensorize through these. Tables are validated beforehand
(`data/validate.py`); what cannot be represented (an unknown action name, more candidates
than slots) is still a `DataError`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.data.arrow import (
    ArrowColumn,
    chunks,
    dictionary_codes,
    flat_parents,
    is_list,
    list_lengths,
    positions,
    small_string_dictionary,
    string_index,
    to_float32,
)
from reagent_lite.errors import DataError

_ROWS_PER_TASK = 131_072
_POOL: ThreadPoolExecutor | None = None


def worker_pool() -> ThreadPoolExecutor:
    """The process's pool for data work that releases the GIL (numpy scatters, Parquet
    reads), created on first use."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))
    return _POOL


# ----------------------------------------------------------------------------- features


def key_columns(keys: pa.Array, feature_ids: Sequence[str]) -> np.ndarray:
    """Column index of each key in `feature_ids` (-1 for features not asked for). Keys may
    be strings, integers or dictionary-encoded either way."""
    if pa.types.is_dictionary(keys.type):
        small = small_string_dictionary(keys)
        if small is not None:
            pos = positions(tuple(feature_ids))
            dict_idx = np.array([pos.get(k, -1) for k in small], np.int32)
        else:
            dict_idx = key_columns(keys.dictionary, feature_ids).astype(np.int32)
        codes = dictionary_codes(keys)
        return dict_idx[codes] if len(dict_idx) else np.full(len(keys), -1, np.int32)
    if pa.types.is_integer(keys.type):
        value_set = pa.array([int(f) for f in feature_ids], type=pa.int64())
        keys = keys.cast(pa.int64())
    else:
        if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
            keys = keys.cast(pa.string())
        value_set = pa.array(list(feature_ids), type=keys.type)
    idx = pc.index_in(keys, value_set=value_set)
    return idx.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def scatter_map(
    chunk: pa.MapArray, start: int, feature_ids: Sequence[str], out: np.ndarray
) -> None:
    """Write one slice of a map column into rows start… of `out` [rows, F] (columns in
    `feature_ids` order); cells of features a row does not have are left as they are."""
    F = out.shape[1]
    if not out.flags.c_contiguous:  # (the flat writes below would go to a copy)
        raise ValueError("scatter_map writes into C-contiguous rows")
    offsets = chunk.offsets.to_numpy()
    lo, hi = int(offsets[0]), int(offsets[-1])
    if hi == lo or F == 0:
        return
    # Flat cell index of each entry = row * F + column; the row part is each row's base
    # repeated once per entry (int32 where it fits: half the memory traffic).
    lengths = np.diff(offsets)
    itype = np.int32 if (start + len(chunk)) * F < 2**31 else np.int64
    flat = np.repeat(np.arange(start * F, (start + len(chunk)) * F, F, dtype=itype), lengths)
    cols = key_columns(chunk.keys.slice(lo, hi - lo), feature_ids)
    items = chunk.items.slice(lo, hi - lo)
    vals = to_float32(items)
    keep = None
    if cols.min() < 0 or items.null_count:
        keep = (cols >= 0) & ~np.isnan(vals)
    if chunk.null_count:  # Arrow lets a null map own entries; they must not count
        valid = np.repeat(np.asarray(chunk.is_valid()), lengths)
        keep = valid if keep is None else keep & valid
    flat += cols
    if keep is not None:
        flat, vals = flat[keep], vals[keep]
    out.reshape(-1)[flat] = vals


def _scatter_dense(col: ArrowColumn, feature_ids: Sequence[str], out: np.ndarray) -> None:
    """Dense lists: the value at position i is feature "i" (positions not asked for are
    ignored, ids beyond a list's length stay absent); a null or empty list is all absent."""
    pos = positions(tuple(feature_ids))
    for start, chunk in chunks(col):
        lengths = list_lengths(chunk)
        valid = lengths > 0
        if not valid.any():
            continue
        width = int(lengths[valid][0])
        if (lengths[valid] != width).any():
            raise DataError(f"dense feature lists differ in length ({sorted(set(lengths))})")
        target = np.array([pos.get(str(i), -1) for i in range(width)], np.int64)
        wanted = target >= 0
        values = to_float32(chunk.flatten()).reshape(-1, width)
        rows = np.nonzero(valid)[0] + start
        out[rows[:, None], target[wanted]] = values[:, wanted]


def scatter_features(col: ArrowColumn, feature_ids: Sequence[str], out: np.ndarray) -> None:
    """A feature column — sparse maps, dense lists, or nulls throughout (JSON Lines) — into
    `out` [len(col), len(feature_ids)], which holds NaN where no feature is written:
    columns follow `feature_ids`, features not among them are ignored."""
    if pa.types.is_map(col.type):
        # Row slices write disjoint rows: a long column's run in threads (numpy releases
        # the GIL).
        tasks = [
            (start + s, chunk.slice(s, _ROWS_PER_TASK))
            for start, chunk in chunks(col)
            for s in range(0, len(chunk), _ROWS_PER_TASK)
        ]
        if len(tasks) > 1 and len(col) >= 2 * _ROWS_PER_TASK:
            list(worker_pool().map(lambda t: scatter_map(t[1], t[0], feature_ids, out), tasks))
        else:
            for start, arr in tasks:
                scatter_map(arr, start, feature_ids, out)
    elif is_list(col.type) and not pa.types.is_null(col.type.value_type):
        _scatter_dense(col, feature_ids, out)


def feature_matrix(col: ArrowColumn, feature_ids: Sequence[str]) -> np.ndarray:
    """`scatter_features` into a new float32 [N, F] matrix, NaN = absent."""
    out = np.full((len(col), len(feature_ids)), np.nan, np.float32)
    scatter_features(col, feature_ids, out)
    return out


# ----------------------------------------------------------------------------- candidates


def candidate_slots(
    chunk: pa.Array, max_candidates: int, source: str = "table"
) -> tuple[np.ndarray, np.ndarray]:
    """(row, slot) int64 [E] of each candidate of a list column chunk, in the order of its
    flattened entries; a `DataError` if a row has more than `max_candidates`."""
    lengths = list_lengths(chunk)
    if len(lengths) and lengths.max() > max_candidates:
        bad = int((lengths > max_candidates).sum())
        raise DataError(
            f"{source}: {bad} rows have more than max_candidates={max_candidates} candidate"
            f" actions (largest: {int(lengths.max())})"
        )
    rows = np.repeat(np.arange(len(chunk), dtype=np.int64), lengths)
    pos = np.arange(len(rows), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return rows, pos


def scatter_candidates(
    col: ArrowColumn,
    feature_ids: Sequence[str],
    out: np.ndarray,
    mask: np.ndarray,
    source: str = "table",
) -> None:
    """Lists of candidate maps into `out` [rows, K, G] (NaN where nothing is written) and
    `mask` [rows, K] (0 where nothing is written): candidate j of row i in slot j, 1 in its
    mask; a `DataError` for a row of more than K candidates."""
    for start, chunk in chunks(col):
        rows, pos = candidate_slots(chunk, out.shape[1], source)
        rows += start
        mask[rows, pos] = 1.0
        maps = chunk.flatten()
        if len(rows) and feature_ids and pa.types.is_map(maps.type):
            values = np.full((len(maps), len(feature_ids)), np.nan, np.float32)
            scatter_map(maps, 0, feature_ids, values)
            out[rows, pos] = values


def candidate_tensor(
    col: ArrowColumn, feature_ids: Sequence[str], max_candidates: int, source: str = "table"
) -> tuple[np.ndarray, np.ndarray]:
    """`scatter_candidates` into new arrays: (values [N, K, G] NaN = absent, mask [N, K])."""
    n, g = len(col), len(feature_ids)
    out = np.full((n, max_candidates, g), np.nan, np.float32)
    mask = np.zeros((n, max_candidates), np.float32)
    scatter_candidates(col, feature_ids, out, mask, source)
    return out, mask


def match_index(
    action: np.ndarray, cands: np.ndarray, mask: np.ndarray, block: int = 65536
) -> np.ndarray:
    """Index of the first candidate equal to the action (NaN-coded: an absent feature
    matches only an absent one), else -1."""
    out = np.full(len(action), -1, np.int64)
    for s in range(0, len(action), block):
        e = s + block
        c, a = cands[s:e], action[s:e, None]
        same = (c == a) | (np.isnan(c) & np.isnan(a))
        hit = same.all(axis=2) & (mask[s:e] > 0)
        found = hit.any(axis=1)
        out[s:e] = np.where(found, hit.argmax(axis=1), -1)
    return out


# ----------------------------------------------------------------------------- action names


def action_index(col: ArrowColumn, actions: Sequence[str]) -> np.ndarray:
    """Action names → index in `actions`; null, "" and unknown names → -1."""
    idx = string_index(col, actions)
    idx[idx < 0] = -1
    return idx


def actions_mask(col: ArrowColumn, actions: Sequence[str], source: str) -> np.ndarray:
    """possible_actions as a float32 [N, A] mask, from lists of names or 0/1 masks."""
    n, A = len(col), len(actions)
    mask = np.zeros((n, A), np.float32)
    for start, chunk in chunks(col):
        vtype = chunk.type.value_type
        if (
            pa.types.is_string(vtype)
            or pa.types.is_large_string(vtype)
            or pa.types.is_dictionary(vtype)
        ):
            idx = string_index(chunk.flatten(), actions)
            flat = (flat_parents(chunk) + start) * A + idx
            mask.reshape(-1)[flat[idx >= 0] if (idx < 0).any() else flat] = 1.0
        else:
            lengths = list_lengths(chunk)
            full = lengths == A
            if not ((lengths == 0) | full).all():
                raise DataError(f"{source}: action masks must have {A} entries (one per action)")
            if full.any():
                rows = np.nonzero(full)[0] + start
                mask[rows] = to_float32(chunk.filter(pa.array(full)).flatten()).reshape(-1, A)
    return mask
