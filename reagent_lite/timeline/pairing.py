"""Pairing a sorted step stream in Arrow: how DuckDB runs `transitions_sql` with one sort.

`transitions_sql` pairs steps with `LEAD(...) OVER (PARTITION BY mdp_id ORDER BY
sequence_number)`; executed as written, DuckDB sorts the rows with all their maps and lists
for the window, and again for the final `ORDER BY`. Here the engine sorts once
(`sorted_steps_sql`: by side, mdp_id, sequence_number, out of core) and streams Arrow
batches; in that order the next step of a row's episode, when it has one, is the next row.
So each next_* column is its source column shifted up by one row, with the terminal value
of `query.terminal` where the next row starts another episode (or side, or there is none),
and `time_diff` is the difference of neighbouring sequence numbers, else 1: the same
values, row for row, as the SQL (tests compare the two on logs spanning many batches).

The stream also runs the value checks of `checks_sql` and `duplicates_sql` (nulls, the
propensity range, a repeated (mdp_id, sequence_number), which in this order is two
neighbouring rows with a gap of 0) on each batch it already holds, instead of two more
passes over the log. The first row breaking one raises `BrokenCheck`; the engine then
runs the checks' SQL for the message every engine gives (the count and an example row).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.errors import DataError
from reagent_lite.timeline.query import (
    EVAL_FLAG,
    NOT_NULL,
    Side,
    StepColumns,
    Terminal,
    output_order,
    pairs,
    terminal,
)


class BrokenCheck(DataError):
    """A row of the stream breaks a rule of `checks_sql` or `duplicates_sql`: the message
    names the column and the first such row of the stream (no count: the stream stops)."""


@dataclass(frozen=True)
class Layout:
    """How the stream's batches become transition batches."""

    schema: pa.Schema  # of the transitions, in training-table order
    paired: dict[str, tuple[str, Terminal]]  # next_* column → (source column, terminal value)
    split: bool  # the stream carries EVAL_FLAG (sides train / eval), else one side "all"

    @classmethod
    def of(cls, stream: pa.Schema, columns: StepColumns) -> Layout:
        """The layout for a stream of `sorted_steps_sql` over a log with `columns`."""
        paired = {
            dst: (src, terminal(src, columns.kind(src))) for dst, src in pairs(columns).items()
        }
        types = {f.name: f for f in stream if f.name != EVAL_FLAG}
        types.update({dst: stream.field(src).with_name(dst) for dst, (src, _) in paired.items()})
        types["time_diff"] = pa.field("time_diff", pa.int64())
        schema = pa.schema([types[c] for c in output_order(types)])
        return cls(schema, paired, EVAL_FLAG in stream.names)


def paired_batches(
    batches: Iterable[pa.RecordBatch], layout: Layout, *, check: bool = False
) -> Generator[tuple[Side, pa.RecordBatch], None, None]:
    """Transition batches, each with its side, in the stream's order. `check`: raise
    `BrokenCheck` at the first row breaking a value check (the stream must hold every row
    of the log: sides `all`, or train and eval)."""
    pending: tuple[Side, pa.RecordBatch] | None = None
    for batch in batches:
        if check:
            _check_values(batch)
        for side, part in _sides(batch, layout.split):
            if pending is not None:
                look = part if side == pending[0] else None
                yield pending[0], _pair(pending[1], look, layout, check)
            pending = (side, part)
    if pending is not None:
        yield pending[0], _pair(pending[1], None, layout, check)


def _check_values(batch: pa.RecordBatch) -> None:
    """The rules of `checks_sql` on one batch: no nulls where a value is needed, and a
    propensity in (0, 1] (a NaN is outside)."""
    for name in NOT_NULL:
        column = batch.column(name)
        if column.null_count:
            row = pc.index(column.is_null(), True).as_py()
            raise BrokenCheck(
                f"column '{name}': rows are null (expected values); e.g. {_example(batch, row)}"
            )
    prop = pc.cast(batch.column("action_probability"), pa.float64())
    inside = pc.and_(pc.greater(prop, 0.0), pc.less_equal(prop, 1.0))
    if not pc.all(inside).as_py():
        row = pc.index(inside, False).as_py()
        raise BrokenCheck(
            "column 'action_probability': rows outside (0, 1] (a logging propensity must be "
            f"positive and at most 1); e.g. {_example(batch, row)}, value={prop[row].as_py()}"
        )


def _example(batch: pa.RecordBatch, row: int) -> str:
    """Row `row` named as in the checks' messages (`query.ROW_EXAMPLE`)."""
    key = [batch.column(c)[row].as_py() for c in ("mdp_id", "sequence_number")]
    mdp_id, seq = ("null" if v is None else v for v in key)
    return f"mdp_id={mdp_id}, sequence_number={seq}"


def _sides(batch: pa.RecordBatch, split: bool) -> Iterator[tuple[Side, pa.RecordBatch]]:
    """The non-empty parts of `batch` by side (sorted by side, so at most one change)."""
    if batch.num_rows == 0:
        return
    if not split:
        yield "all", batch
        return
    flags = batch.column(EVAL_FLAG).to_numpy(zero_copy_only=False)
    cut = int(np.argmax(flags)) if flags[-1] else batch.num_rows
    if cut > 0:
        yield "train", batch.slice(0, cut)
    if cut < batch.num_rows:
        yield "eval", batch.slice(cut)


def _pair(
    batch: pa.RecordBatch, look: pa.RecordBatch | None, layout: Layout, check: bool = False
) -> pa.RecordBatch:
    """`batch`'s transitions; `look` is the stream's next part on the same side, if any.
    `check`: raise `BrokenCheck` if a row and the next repeat (mdp_id, sequence_number)."""
    n = batch.num_rows
    ids = batch.column("mdp_id")
    # has_next[i]: row i + 1 (the first row of `look` for the last row) is the same episode.
    has_next = np.zeros(n, dtype=bool)
    if n > 1:
        same = pc.equal(ids.slice(0, n - 1), ids.slice(1))
        has_next[:-1] = pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    if look is not None:
        has_next[-1] = ids[n - 1].as_py() == look.column("mdp_id")[0].as_py()
    rows = np.arange(n)
    columns = {
        name: batch.column(name) for name in layout.schema.names if name in batch.schema.names
    }
    for dst, (src, end) in layout.paired.items():
        own = batch.column(src)
        # One array holding [rows 0..n-1, the next part's first row, the terminal values]:
        # row i's next value is at i + 1, or its terminal value after them.
        nxt = look.column(src).slice(0, 1) if look is not None else pa.nulls(1, own.type)
        ends, at_end = _terminal_values(own, end)
        source = pa.concat_arrays([own, nxt, ends])
        index = np.where(has_next, rows + 1, n + 1 + (rows if at_end else 0))
        columns[dst] = source.take(pa.array(index))
    seq = pc.cast(batch.column("sequence_number"), pa.int64())
    nxt_seq = (
        pc.cast(look.column("sequence_number").slice(0, 1), pa.int64())
        if look is not None
        else pa.array([0])
    )
    try:
        gaps = pc.subtract_checked(pa.concat_arrays([seq.slice(1), nxt_seq]), seq)
    except pa.ArrowInvalid as err:  # the SQL fails likewise ("Overflow in subtraction")
        raise DataError(
            f"column 'sequence_number': the gap between two steps of one episode does not "
            f"fit a 64-bit integer (near mdp_id={ids[0]}) ({err})"
        ) from err
    following = pa.array(has_next)
    if check:
        repeated = pc.and_(following, pc.equal(gaps, 0))
        if pc.any(repeated).as_py():
            row = pc.index(repeated, True).as_py()
            raise BrokenCheck(
                "columns 'mdp_id', 'sequence_number': rows repeat the sequence number of "
                f"another step of the same episode (expected unique pairs); e.g. "
                f"{_example(batch, row)}"
            )
    columns["time_diff"] = pc.if_else(following, gaps, pa.scalar(1, pa.int64()))
    return pa.RecordBatch.from_arrays(
        [columns[f.name] for f in layout.schema], schema=layout.schema
    )


def _terminal_values(own: pa.Array, end: Terminal) -> tuple[pa.Array, bool]:
    """The terminal next values: one for every row (`zeros`, as long as the row's own list)
    or a single one for all, and which."""
    if end == "null":
        return pa.nulls(1, own.type), False
    if end == "empty":
        return pa.array([[]], own.type), False
    # zeros: a list of zeros as long as each row's own (null stays null), of its own type.
    child = own.type.value_type
    if pa.types.is_fixed_size_list(own.type):
        zeros = pa.array(np.zeros(len(own) * own.type.list_size)).cast(child)
        return pa.FixedSizeListArray.from_arrays(zeros, type=own.type, mask=own.is_null()), True
    offsets = pc.subtract(own.offsets, own.offsets[0])
    zeros = pa.array(np.zeros(offsets[-1].as_py())).cast(child)
    list_cls = pa.LargeListArray if pa.types.is_large_list(own.type) else pa.ListArray
    return list_cls.from_arrays(offsets, zeros, type=own.type, mask=own.is_null()), True
