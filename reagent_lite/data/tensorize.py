"""Arrow table → torch tensors (raw feature values + presence masks).

Everything here works on whole Arrow buffers: a map column's offsets, keys and items are
turned into numpy index arrays and scattered into dense [N, F] matrices in one assignment,
so the cost is a few passes over the flattened entries, not a Python loop over rows.
Values are validated beforehand (`validate.py`); tensorization still refuses what it cannot
represent (an unknown action name, too many candidates) with a `DataError`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from reagent_lite.data.batches import DiscreteTransitions, ParametricTransitions
from reagent_lite.errors import DataError

ArrowColumn: TypeAlias = "pa.Array | pa.ChunkedArray"

STATE_COLUMNS = ("state_features", "state")  # sparse map, or dense list alternative
NEXT_STATE_COLUMNS = ("next_state_features", "next_state")


# ----------------------------------------------------------------------------- low level


def _is_listlike(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _chunks(col: ArrowColumn) -> Iterator[tuple[int, pa.Array]]:
    """(first row, chunk) pairs; a plain Array is one chunk."""
    if isinstance(col, pa.ChunkedArray):
        start = 0
        for chunk in col.chunks:
            yield start, chunk
            start += len(chunk)
    else:
        yield 0, col


_ROWS_PER_TASK = 131_072
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))
    return _POOL


def _row_slices(col: ArrowColumn, rows: int) -> Iterator[tuple[int, pa.Array]]:
    """(first row, slice) pairs of at most `rows` rows (slices are zero-copy)."""
    for start, chunk in _chunks(col):
        for s in range(0, len(chunk), rows):
            yield start + s, chunk.slice(s, rows)


def flat_parents(lists: pa.Array) -> np.ndarray:
    """Row of each element of `lists.flatten()`. (`pc.list_parent_indices` also counts
    elements that a null list slot owns, which `flatten` leaves out.)"""
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
    return np.repeat(np.arange(len(lists), dtype=np.int64), lengths)


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


# Dictionaries up to this size are looked up in Python: a per-call pyarrow kernel costs
# more than the lookup itself, and a shard is processed in many small slices.
SMALL_DICTIONARY = 256


@functools.lru_cache(maxsize=16)
def _positions(names: tuple[str, ...]) -> dict[str, int]:
    return {n: i for i, n in enumerate(names)}


def small_string_dictionary(arr: pa.Array) -> list[str] | None:
    """The dictionary of a dictionary-encoded string array as a list, if it is small."""
    d = arr.dictionary
    if len(d) > SMALL_DICTIONARY or not (
        pa.types.is_string(d.type) or pa.types.is_large_string(d.type)
    ):
        return None
    return d.to_pylist()


def dictionary_codes(arr: pa.Array) -> np.ndarray:
    """The codes of a dictionary array (nulls as code 0: callers mask them)."""
    codes = arr.indices
    if codes.null_count:
        codes = codes.fill_null(0)
    return np.asarray(codes.to_numpy(zero_copy_only=False))


def _key_columns(keys: pa.Array, feature_ids: Sequence[str]) -> np.ndarray:
    """Column index of each key in `feature_ids` (-1 for features not asked for). Keys may
    be strings, integers or dictionary-encoded either way."""
    if pa.types.is_dictionary(keys.type):
        small = small_string_dictionary(keys)
        if small is not None:
            pos = _positions(tuple(feature_ids))
            dict_idx = np.array([pos.get(k, -1) for k in small], np.int32)
        else:
            dict_idx = _key_columns(keys.dictionary, feature_ids).astype(np.int32)
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


def _to_float32(arr: pa.Array) -> np.ndarray:
    """Values as float32; nulls become NaN."""
    if pa.types.is_floating(arr.type) and arr.null_count == 0:
        return arr.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False), np.float32)


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor owning writable memory (arrays viewing Arrow buffers are read-only)."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _column_of(table: pa.Table, names: Sequence[str], source: str) -> pa.ChunkedArray:
    for n in names:
        if n in table.column_names:
            return table.column(n)
    raise DataError(f"{source}: missing column '{names[0]}'")


def sparse_to_dense(
    map_column: ArrowColumn, feature_ids: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Sparse feature maps → (values float32 [N, F], presence float32 [N, F]), columns in the
    order of `feature_ids`. Absent (and null-valued) features get value 0 and presence 0;
    features not in `feature_ids` are ignored. Dense list columns are accepted too (every
    listed position present)."""
    if pa.types.is_list(map_column.type) or pa.types.is_large_list(map_column.type):
        return dense_list_to_dense(map_column, feature_ids)
    if pa.types.is_null(map_column.type):  # e.g. a JSON column that is null throughout
        n0 = len(map_column)
        return np.zeros((n0, len(feature_ids)), np.float32), np.zeros(
            (n0, len(feature_ids)), np.float32
        )
    if not pa.types.is_map(map_column.type):
        raise TypeError(f"expected a map column, got {map_column.type}")
    n, F = len(map_column), len(feature_ids)
    values = np.zeros((n, F), np.float32)
    presence = np.zeros((n, F), np.float32)
    if F == 0:
        return values, presence
    # Row slices write disjoint rows, so they run in threads (numpy and Arrow release the GIL).
    tasks = list(_row_slices(map_column, _ROWS_PER_TASK))
    if len(tasks) > 1 and n >= 2 * _ROWS_PER_TASK:
        list(_pool().map(lambda t: _scatter_map(t[1], t[0], feature_ids, values, presence), tasks))
    else:
        for start, arr in tasks:
            _scatter_map(arr, start, feature_ids, values, presence)
    return values, presence


def _scatter_map(
    chunk: pa.MapArray,
    start: int,
    feature_ids: Sequence[str],
    values: np.ndarray,
    presence: np.ndarray | None,
) -> None:
    """Write one slice of a map column into rows start… of the dense outputs. Without
    `presence`, absent cells are left as they are (the streaming ingest pre-fills NaN)."""
    F = values.shape[1]
    offsets = chunk.offsets.to_numpy()
    lo, hi = int(offsets[0]), int(offsets[-1])
    if hi == lo:
        return
    # Flat cell index of each entry = row * F + column; the row part is each row's base
    # repeated once per entry (int32 where it fits: half the memory traffic).
    lengths = np.diff(offsets)
    itype = np.int32 if (start + len(chunk)) * F < 2**31 else np.int64
    flat = np.repeat(np.arange(start * F, (start + len(chunk)) * F, F, dtype=itype), lengths)
    cols = _key_columns(chunk.keys.slice(lo, hi - lo), feature_ids)
    items = chunk.items.slice(lo, hi - lo)
    vals = _to_float32(items)
    keep = None
    if cols.min() < 0 or items.null_count:
        keep = (cols >= 0) & ~np.isnan(vals)
    if chunk.null_count:  # Arrow lets a null map own entries; they must not count
        valid = np.repeat(np.asarray(chunk.is_valid()), lengths)
        keep = valid if keep is None else keep & valid
    flat += cols
    if keep is not None:
        flat, vals = flat[keep], vals[keep]
    values.reshape(-1)[flat] = vals
    if presence is not None:
        presence.reshape(-1)[flat] = 1.0


def dense_list_to_dense(
    list_column: ArrowColumn, feature_ids: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-length float lists (`state`) → (values, presence); feature id "i" is position i.
    A null row is all absent."""
    n, positions = len(list_column), np.array([int(f) for f in feature_ids], np.int64)
    values = np.zeros((n, len(positions)), np.float32)
    presence = np.zeros((n, len(positions)), np.float32)
    for start, chunk in _chunks(list_column):
        lengths = pc.list_value_length(chunk).fill_null(0).to_numpy(zero_copy_only=False)
        valid = lengths > 0
        if not valid.any():
            continue
        width = int(lengths[valid][0])
        if (lengths[valid] != width).any():
            raise DataError(f"dense feature lists differ in length ({sorted(set(lengths))})")
        if len(positions) and positions.max() >= width:
            raise DataError(f"dense feature list has {width} values, feature id {positions.max()}")
        flat = _to_float32(chunk.flatten()).reshape(-1, width)
        rows = np.nonzero(valid)[0] + start
        values[rows] = flat[:, positions]
        presence[rows] = 1.0
    return values, presence


def collect_feature_ids(table: pa.Table, column: str | Sequence[str]) -> list[str]:
    """The feature ids that occur in map column(s) (lists of maps included), sorted
    numerically; for a dense list column, "0" … "L-1"."""
    names = [column] if isinstance(column, str) else list(column)
    found: set[str] = set()
    for name in names:
        for _, chunk in _chunks(table.column(name)):
            arr = chunk
            while _is_listlike(arr.type) and (
                pa.types.is_map(arr.type.value_type) or _is_listlike(arr.type.value_type)
            ):
                arr = arr.flatten()
            if pa.types.is_map(arr.type):
                _, keys, _ = map_entries(arr)
                if pa.types.is_dictionary(keys.type):
                    keys = keys.dictionary_decode()
                found.update(str(k) for k in pc.unique(keys).to_pylist())
            elif _is_listlike(arr.type) and len(arr):
                width = pc.max(pc.list_value_length(arr)).as_py() or 0
                found.update(str(i) for i in range(width))
    return sorted(found, key=lambda s: (0, int(s), "") if s.isdigit() else (1, 0, s))


# Codes of `string_index` for strings that are not one of the names.
NAME_UNKNOWN, NAME_NULL, NAME_EMPTY = -1, -2, -3


def _string_index_array(arr: pa.Array, names: Sequence[str]) -> np.ndarray:
    if pa.types.is_dictionary(arr.type):
        # Work on the (small) dictionary, then look the codes up: no string is touched twice.
        small = small_string_dictionary(arr)
        if small is not None:
            pos = _positions(tuple(names))
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
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
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
    if pa.types.is_null(col.type):
        return np.full(len(col), NAME_NULL, np.int64)
    parts = [_string_index_array(chunk, names) for _, chunk in _chunks(col)]
    return np.concatenate(parts) if len(parts) != 1 else parts[0]


def _action_index(col: ArrowColumn, actions: Sequence[str]) -> np.ndarray:
    """Action names → index in `actions`; null, "" and unknown names → -1."""
    idx = string_index(col, actions)
    idx[idx < 0] = -1
    return idx


def _actions_mask(col: ArrowColumn, actions: Sequence[str], source: str) -> np.ndarray:
    """possible_actions as a float32 [N, A] mask, from lists of names or 0/1 masks."""
    n, A = len(col), len(actions)
    mask = np.zeros((n, A), np.float32)
    for start, chunk in _chunks(col):
        vtype = chunk.type.value_type
        if (
            pa.types.is_string(vtype)
            or pa.types.is_large_string(vtype)
            or pa.types.is_dictionary(vtype)
        ):
            idx = string_index(chunk.flatten(), actions)
            flat = flat_parents(chunk) + start
            flat = flat * A + idx
            mask.reshape(-1)[flat[idx >= 0] if (idx < 0).any() else flat] = 1.0
        else:
            lengths = pc.list_value_length(chunk).fill_null(0).to_numpy(zero_copy_only=False)
            full = lengths == A
            if not ((lengths == 0) | full).all():
                raise DataError(f"{source}: action masks must have {A} entries (one per action)")
            if full.any():
                rows = np.nonzero(full)[0] + start
                mask[rows] = _to_float32(chunk.filter(pa.array(full)).flatten()).reshape(-1, A)
    return mask


def _is_empty_list(col: ArrowColumn) -> np.ndarray:
    return list_lengths(col) == 0


class _Common:
    """Fields shared by both batch types."""

    def __init__(
        self, table: pa.Table, terminal_from_lists: np.ndarray, use_time_diff: bool, source: str
    ) -> None:
        names = table.column_names
        n = table.num_rows
        self.reward = _tensor(_to_float32(_column_of(table, ["reward"], source).combine_chunks()))
        prop_col = next((c for c in ("action_probability", "propensity") if c in names), None)
        self.propensity = (
            _tensor(_to_float32(table.column(prop_col).combine_chunks()))
            if prop_col
            else torch.ones(n)
        )
        # ReAgent semantics: the time_diff column (sequence-number gap) is used as the
        # discount exponent only with use_seq_num_diff_as_time_diff; otherwise one step.
        if use_time_diff and "time_diff" in names:
            self.time_diff = _tensor(_to_float32(table.column("time_diff").combine_chunks()))
        else:
            self.time_diff = torch.ones(n)
        terminal = terminal_from_lists.copy()
        if "terminal" in names:
            explicit = table.column("terminal").combine_chunks().fill_null(False)
            terminal |= np.asarray(explicit.cast(pa.bool_()).to_numpy(zero_copy_only=False))
        self.terminal = _tensor(terminal.astype(np.float32))
        mdp = _column_of(table, ["mdp_id"], source).combine_chunks().dictionary_encode()
        self.mdp_id = _tensor(mdp.indices.to_numpy(zero_copy_only=False).astype(np.int64))
        seq = _column_of(table, ["sequence_number"], source).combine_chunks()
        self.sequence_number = _tensor(
            np.asarray(seq.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
        )


def _state_tensors(
    table: pa.Table, names: Sequence[str], feature_ids: Sequence[str], source: str
) -> tuple[torch.Tensor, torch.Tensor]:
    values, presence = sparse_to_dense(_column_of(table, names, source), feature_ids)
    return _tensor(values), _tensor(presence)


# ----------------------------------------------------------------------------- discrete


def tensorize_discrete(
    table: pa.Table,
    state_feature_ids: Sequence[str],
    actions: Sequence[str],
    use_seq_num_diff_as_time_diff: bool = False,
    *,
    source: str = "table",
) -> DiscreteTransitions:
    """A validated dqn table → `DiscreteTransitions` (raw values + presence)."""
    state, state_presence = _state_tensors(table, STATE_COLUMNS, state_feature_ids, source)
    next_state, next_presence = _state_tensors(table, NEXT_STATE_COLUMNS, state_feature_ids, source)
    action = _action_index(_column_of(table, ["action"], source), actions)
    if (action < 0).any():
        bad = int((action < 0).sum())
        raise DataError(
            f"{source}: column 'action': {bad} rows name no known action {list(actions)}"
        )
    next_action = _action_index(_column_of(table, ["next_action"], source), actions)
    pna_col = _column_of(table, ["possible_next_actions"], source)
    pna = _actions_mask(pna_col, actions, source)
    pa_mask = _actions_mask(_column_of(table, ["possible_actions"], source), actions, source)
    common = _Common(table, pna.sum(axis=1) == 0, use_seq_num_diff_as_time_diff, source)
    return DiscreteTransitions(
        state=state,
        state_presence=state_presence,
        action=_tensor(action),
        reward=common.reward,
        next_state=next_state,
        next_state_presence=next_presence,
        next_action=_tensor(next_action),
        possible_actions_mask=_tensor(pa_mask),
        possible_next_actions_mask=_tensor(pna),
        propensity=common.propensity,
        time_diff=common.time_diff,
        terminal=common.terminal,
        mdp_id=common.mdp_id,
        sequence_number=common.sequence_number,
    )


# ----------------------------------------------------------------------------- parametric


def candidates_to_dense(
    col: ArrowColumn, feature_ids: Sequence[str], max_candidates: int, source: str = "table"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lists of candidate action maps → (values [N,K,G], presence [N,K,G], mask [N,K])."""
    n, K, G = len(col), max_candidates, len(feature_ids)
    values = np.zeros((n, K, G), np.float32)
    presence = np.zeros((n, K, G), np.float32)
    mask = np.zeros((n, K), np.float32)
    for start, chunk in _chunks(col):
        rows, pos = candidate_slots(chunk, K, source)
        c_vals, c_pres = sparse_to_dense(chunk.flatten(), feature_ids)
        values[rows + start, pos] = c_vals
        presence[rows + start, pos] = c_pres
        mask[rows + start, pos] = 1.0
    return values, presence, mask


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


def list_lengths(col: ArrowColumn) -> np.ndarray:
    """Entries per row of a list column (a null list has none)."""
    return np.asarray(pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False))


def _match_index(
    action: np.ndarray,
    action_pres: np.ndarray | None,
    cands: np.ndarray,
    cand_pres: np.ndarray | None,
    mask: np.ndarray,
    block: int = 65536,
) -> np.ndarray:
    """Index of the first candidate equal (values and presence) to the action, else -1.
    Without presences the values are NaN-coded (NaN = absent, so NaN matches NaN)."""
    out = np.full(len(action), -1, np.int64)
    for s in range(0, len(action), block):
        e = s + block
        c, a = cands[s:e], action[s:e, None]
        if action_pres is None or cand_pres is None:
            same = (c == a) | (np.isnan(c) & np.isnan(a))
        else:
            same = (c == a) & (cand_pres[s:e] == action_pres[s:e, None])
        hit = same.all(axis=2) & (mask[s:e] > 0)
        found = hit.any(axis=1)
        out[s:e] = np.where(found, hit.argmax(axis=1), -1)
    return out


def max_candidates_in(table: pa.Table) -> int:
    """The largest candidate list of the table (at least 1)."""
    k = 1
    for name in ("possible_actions", "possible_next_actions"):
        if name in table.column_names and table.num_rows:
            k = max(k, pc.max(pc.list_value_length(table.column(name))).as_py() or 0)
    return k


def tensorize_parametric(
    table: pa.Table,
    state_feature_ids: Sequence[str],
    action_feature_ids: Sequence[str],
    max_candidates: int | None = None,
    use_seq_num_diff_as_time_diff: bool = False,
    *,
    source: str = "table",
) -> ParametricTransitions:
    """A validated parametric_dqn table → `ParametricTransitions`; K = `max_candidates` or
    the largest candidate list in the table."""
    K = max_candidates if max_candidates is not None else max_candidates_in(table)
    state, state_presence = _state_tensors(table, STATE_COLUMNS, state_feature_ids, source)
    next_state, next_presence = _state_tensors(table, NEXT_STATE_COLUMNS, state_feature_ids, source)
    act, act_p = sparse_to_dense(_column_of(table, ["action"], source), action_feature_ids)
    nxt, nxt_p = sparse_to_dense(_column_of(table, ["next_action"], source), action_feature_ids)
    pa_v, pa_p, pa_m = candidates_to_dense(
        _column_of(table, ["possible_actions"], source), action_feature_ids, K, source
    )
    pna_col = _column_of(table, ["possible_next_actions"], source)
    pna_v, pna_p, pna_m = candidates_to_dense(pna_col, action_feature_ids, K, source)
    common = _Common(table, _is_empty_list(pna_col), use_seq_num_diff_as_time_diff, source)
    t = _tensor
    return ParametricTransitions(
        state=state,
        state_presence=state_presence,
        next_state=next_state,
        next_state_presence=next_presence,
        action=t(act),
        action_presence=t(act_p),
        next_action=t(nxt),
        next_action_presence=t(nxt_p),
        possible_actions=t(pa_v),
        possible_actions_presence=t(pa_p),
        possible_actions_mask=t(pa_m),
        possible_next_actions=t(pna_v),
        possible_next_actions_presence=t(pna_p),
        possible_next_actions_mask=t(pna_m),
        action_index=t(_match_index(act, act_p, pa_v, pa_p, pa_m)),
        reward=common.reward,
        propensity=common.propensity,
        time_diff=common.time_diff,
        terminal=common.terminal,
        mdp_id=common.mdp_id,
        sequence_number=common.sequence_number,
    )
