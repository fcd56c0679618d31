"""The timeline as it was before the SQL engines (reagent_lite/timeline/): in memory, with Arrow.

Kept as the baseline `bench_timeline.py` prints beside the engines, and as an independent
oracle the engine tests compare against (only the split's hash changed: it now calls
`reagent_lite.timeline.episode_hash`, so both sides put the same episodes in eval).

Each logged step knows its own state, action, reward and candidates; a transition also needs
what came next. Rows are sorted by (mdp_id, sequence_number) and every step is paired with
the following step of the same episode by index arithmetic on whole columns, so the cost is
a sort and a few `take`s whatever the number of rows. The last step of an episode becomes a
terminal row whose next_* values come from a one-row "filler" appended to each column
(empty map / empty list / null), which keeps the nested Arrow types exactly as in the input.

"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reagent_lite.errors import DataError
from reagent_lite.io_utils import atomic_write
from reagent_lite.timeline.duck import ROW_GROUP_SIZE
from reagent_lite.timeline.query import (
    OUTPUT_ORDER,
    PROPENSITY_COLUMNS,
    REQUIRED_COLUMNS,
    STATE_COLUMNS,
    episode_hash,
)


def build_training_table(
    steps: pa.Table,
    *,
    eval_fraction: float = 0.1,
    seed: int = 0,
    source: str = "<steps>",
) -> tuple[pa.Table, pa.Table]:
    """Pair consecutive steps of each episode into transitions and split train / eval.

    `source` names the input in error messages (usually its file path). Returns
    `(train, eval)`, both sorted by (mdp_id, sequence_number), with the training table's columns.
    Raises `DataError` for missing columns, nulls in key columns, bad propensities or
    duplicate (mdp_id, sequence_number) pairs.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise DataError(f"{source}: eval_fraction must be in [0, 1) (got {eval_fraction})")
    steps = _check_steps(steps, source)
    n = steps.num_rows
    if n == 0:
        empty = _pair(steps, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        return empty, empty

    order = pc.sort_indices(
        steps, sort_keys=[("mdp_id", "ascending"), ("sequence_number", "ascending")]
    )
    steps = steps.take(order)

    codes = _episode_codes(steps.column("mdp_id"))
    seq = steps.column("sequence_number").to_numpy().astype(np.int64)
    has_next = np.zeros(n, dtype=bool)
    has_next[:-1] = codes[:-1] == codes[1:]
    gaps = np.ones(n, dtype=np.int64)
    gaps[:-1][has_next[:-1]] = np.diff(seq)[has_next[:-1]]
    duplicates = int(np.count_nonzero(gaps == 0))
    if duplicates:
        raise DataError(
            f"{source}: columns 'mdp_id', 'sequence_number': {duplicates} rows repeat the "
            "sequence number of another step of the same episode (expected unique pairs)"
        )
    # Terminal rows point at the filler element appended after the last real row (index n).
    next_idx = np.where(has_next, np.arange(n, dtype=np.int64) + 1, n)
    table = _pair(steps, next_idx, gaps)

    is_eval = _eval_mask(steps.column("mdp_id"), eval_fraction, seed)
    return table.filter(pa.array(~is_eval)), table.filter(pa.array(is_eval))


def _check_steps(steps: pa.Table, source: str) -> pa.Table:
    """Check columns and key values; rename the `propensity` alias. Returns the table."""
    names = set(steps.column_names)
    missing = [repr(c) for c in REQUIRED_COLUMNS if c not in names]
    for pair in (STATE_COLUMNS, PROPENSITY_COLUMNS):
        if not names.intersection(pair):
            missing.append(" or ".join(repr(c) for c in pair))
    if missing:
        raise DataError(
            f"{source}: missing column(s) {', '.join(missing)}; step logs need mdp_id, "
            "sequence_number, state_features, action, reward, possible_actions, "
            f"action_probability (found: {', '.join(steps.column_names) or 'none'})"
        )
    if "action_probability" not in names:
        steps = steps.rename_columns(
            ["action_probability" if c == "propensity" else c for c in steps.column_names]
        )
    for col in ("next_state_features", "next_action", "possible_next_actions", "time_diff"):
        if col in names:
            raise DataError(
                f"{source}: column '{col}' is already present; the input should be step "
                "logs, not a training table"
            )

    seq_type = steps.schema.field("sequence_number").type
    if not pa.types.is_integer(seq_type):
        raise DataError(
            f"{source}: column 'sequence_number' has type {seq_type}; expected an integer"
        )
    for col, expected in (
        ("reward", pa.types.is_floating),
        ("action_probability", pa.types.is_floating),
    ):
        typ = steps.schema.field(col).type
        if not (expected(typ) or pa.types.is_integer(typ)):
            raise DataError(f"{source}: column '{col}' has type {typ}; expected a number")
    for state_col in STATE_COLUMNS:
        if state_col in names:
            typ = steps.schema.field(state_col).type
            ok = pa.types.is_map(typ) if state_col == "state_features" else _is_list(typ)
            if not ok:
                kind = "a map feature-id → float" if state_col == "state_features" else "a list"
                raise DataError(f"{source}: column '{state_col}' has type {typ}; expected {kind}")
    typ = steps.schema.field("possible_actions").type
    if not _is_list(typ):
        raise DataError(f"{source}: column 'possible_actions' has type {typ}; expected a list")

    for col in ("mdp_id", "sequence_number", "action", "reward", "action_probability"):
        nulls = steps.column(col).null_count
        if nulls:
            raise DataError(f"{source}: column '{col}': {nulls} rows are null (expected values)")
    prop = steps.column("action_probability").to_numpy().astype(np.float64)
    bad = int(np.count_nonzero(~((prop > 0.0) & (prop <= 1.0))))
    if bad:
        raise DataError(
            f"{source}: column 'action_probability': {bad} rows outside (0, 1] "
            "(a logging propensity must be positive and at most 1)"
        )
    return steps


def _is_list(typ: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
    )


def _episode_codes(mdp_id: pa.ChunkedArray) -> np.ndarray:
    """Dense integer codes of the episode ids (equal ids ⇔ equal codes)."""
    encoded = mdp_id.combine_chunks().dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def _with_filler(column: pa.ChunkedArray, filler: pa.Array) -> pa.Array:
    return pa.concat_arrays([column.combine_chunks(), filler.cast(column.type)])


def _filler(column: pa.ChunkedArray, *, dense_state: bool) -> pa.Array:
    """The one-element array a terminal row's next_* value is taken from."""
    typ = column.type
    if dense_state:
        # A zero vector of the state's length keeps a dense `next_state` column rectangular.
        width = typ.list_size if pa.types.is_fixed_size_list(typ) else len(column[0].as_py())
        return pa.array([[0.0] * width], type=typ)
    if pa.types.is_map(typ) or _is_list(typ):
        return pa.array([[]], type=typ)  # empty map / empty candidate list
    return pa.nulls(1, type=typ)


def _pair(steps: pa.Table, next_idx: np.ndarray, gaps: np.ndarray) -> pa.Table:
    indices = pa.array(next_idx, type=pa.int64())
    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    for name in steps.column_names:
        columns[name] = steps.column(name)
    pairs = [("possible_actions", "possible_next_actions"), ("action", "next_action")]
    for state_col in STATE_COLUMNS:
        if state_col in columns:
            pairs.append((state_col, f"next_{state_col}"))
    for src, dst in pairs:
        col = steps.column(src)
        filler = _filler(col, dense_state=src == "state" and len(col) > 0)
        columns[dst] = _with_filler(col, filler).take(indices)
    columns["time_diff"] = pa.array(gaps, type=pa.int64())
    # The training table's column order first, then any extra columns of the logs (e.g. a date partition).
    names = [c for c in OUTPUT_ORDER if c in columns]
    names += [c for c in columns if c not in OUTPUT_ORDER]
    return pa.table({c: columns[c] for c in names})


def _eval_mask(mdp_id: pa.ChunkedArray, eval_fraction: float, seed: int) -> np.ndarray:
    """Row mask of the eval side: a stable hash of (seed, str(mdp_id)) below `eval_fraction`."""
    encoded = pc.cast(mdp_id.combine_chunks(), pa.string()).dictionary_encode()
    unique_ids = encoded.dictionary.to_pylist()
    threshold = int(eval_fraction * 2**64)
    in_eval = np.fromiter(
        (episode_hash(i, seed) < threshold for i in unique_ids), dtype=bool, count=len(unique_ids)
    )
    return in_eval[encoded.indices.to_numpy(zero_copy_only=False)]


def read_steps(path: str | os.PathLike[str]) -> pa.Table:
    """Read step logs from a Parquet file or a directory of Parquet files."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    try:
        return pq.read_table(p)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{p}: cannot read as Parquet ({err})") from err


def write_table(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """Write `table` as Parquet atomically (temp file in the same directory, then rename)."""
    p = Path(path)
    atomic_write(p, lambda tmp: pq.write_table(table, tmp, row_group_size=ROW_GROUP_SIZE))
    return p
