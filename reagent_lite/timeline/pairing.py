"""Pairing sorted steps in Arrow, and checking them: how the local engine runs
`transitions_sql`.

`transitions_sql` pairs steps with `LEAD(...) OVER (PARTITION BY mdp_id ORDER BY
sequence_number)`. In a run of whole episodes sorted by (mdp_id, sequence_number)
(`buckets.py`) the next step of a row's episode, when it has one, is the next row: each
next_* column is its source column shifted up one row, with the terminal value of
`query.terminal` on an episode's last row, and `time_diff` is the difference of
neighbouring sequence numbers, else 1 — the same values, row for row, as the SQL (the
tests compare the two).

The sort also checks every row it holds (`check_steps`: the rules of `checks_sql` and
`duplicates_sql`: nulls, the propensity range, a repeated (mdp_id, sequence_number), which
once sorted is two neighbouring rows of one id with one sequence number) instead of
passes of their own over the log. The first row breaking one raises `BrokenCheck`; the
engine then runs the checks' SQL for the message every engine gives (count and example).

Horizon's step logs (`StepColumns.absorbing`, `null_propensity`): an absorbing step ending
an episode is dropped once the step before it has taken its state, and a null propensity
reads as 1.0 when asked; `Tally` counts both for the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.errors import DataError
from reagent_lite.timeline.query import (
    NOT_NULL,
    StepColumns,
    Terminal,
    output_order,
    pairs,
    terminal,
)
from reagent_lite.timeline.scan import plain_schema


class BrokenCheck(DataError):
    """A row breaks a rule of `checks_sql` or `duplicates_sql`: the message names the
    column and the first such row found (no count: the sort stops there)."""


@dataclass(frozen=True)
class Layout:
    """How runs of steps become transition batches."""

    schema: pa.Schema  # of the transition batches (string leaves as the scan reads them)
    plain: pa.Schema  # the same without dictionaries: what readers of the table get
    paired: dict[str, tuple[str, Terminal]]  # next_* column → (source column, terminal value)
    fill_propensity: bool = False  # a null propensity reads as 1.0 (a DOUBLE column)

    @classmethod
    def of(cls, steps: pa.Schema, columns: StepColumns) -> Layout:
        """The layout for runs of steps of schema `steps` from a log with `columns`."""
        paired = {
            dst: (src, terminal(src, columns.kind(src))) for dst, src in pairs(columns).items()
        }
        fields = {f.name: f for f in steps}
        fill = columns.null_propensity == "one"
        if fill:
            fields["action_probability"] = pa.field("action_probability", pa.float64())
        fields.update({dst: steps.field(src).with_name(dst) for dst, (src, _) in paired.items()})
        fields["time_diff"] = pa.field("time_diff", pa.int64())
        schema = pa.schema([fields[c] for c in output_order(fields)])
        return cls(schema, plain_schema(schema), paired, fill)


@dataclass
class Tally:
    """What `transitions` did to Horizon's conventions, summed over the runs."""

    absorbing: int = 0  # absorbing steps dropped (each ended its episode)
    null_propensities: int = 0  # null propensities read as 1.0
    examples: list[str] = field(default_factory=list)  # a dropped step, named


def absorbing_steps(steps: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Per row: a Horizon absorbing step (`StepColumns.absorbing`): no action (null, `""`
    or an empty map), an empty (not null) `possible_actions`, reward 0."""
    action = _one_array(steps.column("action"))
    no_action = action.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_map(action.type):
        no_action |= _lengths(action) == 0
    elif pa.types.is_dictionary(action.type) and pa.types.is_string(action.type.value_type):
        no_action |= pc.fill_null(pc.equal(action.dictionary_decode(), ""), False).to_numpy(
            zero_copy_only=False
        )
    elif pa.types.is_string(action.type) or pa.types.is_large_string(action.type):
        no_action |= pc.fill_null(pc.equal(action, ""), False).to_numpy(zero_copy_only=False)
    candidates = _one_array(steps.column("possible_actions"))
    empty = (_lengths(candidates) == 0) & candidates.is_valid().to_numpy(zero_copy_only=False)
    zero = pc.fill_null(pc.equal(steps.column("reward"), 0), False)
    return no_action & empty & np.asarray(zero.to_numpy(zero_copy_only=False), bool)


def _one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _lengths(lists: pa.Array) -> np.ndarray:
    """Entries per list or map (0 where null)."""
    if pa.types.is_fixed_size_list(lists.type):
        return np.full(len(lists), lists.type.list_size)
    offsets = lists.offsets.to_numpy()
    return np.diff(offsets) * lists.is_valid().to_numpy(zero_copy_only=False)


def transitions(
    steps: pa.RecordBatch, has_next: np.ndarray, layout: Layout, tally: Tally | None = None
) -> pa.RecordBatch:
    """The transitions of `steps`, whole episodes sorted by (mdp_id, sequence_number);
    `has_next[i]`: row i + 1 is the next step of row i's episode. An absorbing step ending
    its episode gives no transition; the step before it gets the terminal next_action."""
    n = steps.num_rows
    columns = {name: steps.column(name) for name in steps.schema.names}
    absorbing = absorbing_steps(steps)
    before_absorbing = has_next & np.r_[absorbing[1:], False]
    for dst, (src, end) in layout.paired.items():
        follows = has_next & ~before_absorbing if src == "action" else has_next
        columns[dst] = _next_values(columns[src], follows, end)
    seq = pc.cast(steps.column("sequence_number"), pa.int64())
    following = pa.array(has_next)
    later = pa.concat_arrays([seq.slice(1), seq.slice(0, min(n, 1))])
    try:  # only a step and the next one of its episode are subtracted, as `LEAD` does
        gaps = pc.subtract_checked(pc.if_else(following, later, seq), seq)
    except pa.ArrowInvalid as err:  # the SQL fails likewise ("Overflow in subtraction")
        values = seq.to_numpy().astype(np.float64)
        wide = has_next[:-1] & (np.abs(values[1:] - values[:-1]) >= 2.0**63)
        row = int(np.argmax(wide)) if wide.any() else 0
        raise DataError(
            "column 'sequence_number': the gap between two steps of one episode does not "
            f"fit a 64-bit integer (expected gaps below 2^63); e.g. {_example(steps, row)}"
        ) from err
    columns["time_diff"] = pc.if_else(following, gaps, pa.scalar(1, pa.int64()))
    if layout.fill_propensity:
        prop = pc.cast(columns["action_probability"], pa.float64())
        columns["action_probability"] = pc.fill_null(prop, 1.0)
    batch = pa.RecordBatch.from_arrays(
        [columns[f.name] for f in layout.schema], schema=layout.schema
    )
    ends = absorbing & ~has_next
    if tally is not None:
        if layout.fill_propensity:  # the nulls of the rows written, now 1.0
            nulls = steps.column("action_probability").is_null().to_numpy(zero_copy_only=False)
            tally.null_propensities += int((nulls & ~ends).sum())
        tally.absorbing += int(ends.sum())
        if ends.any() and not tally.examples:
            tally.examples.append(_example(steps, int(np.argmax(ends))))
    return batch.filter(pa.array(~ends)) if ends.any() else batch


def check_steps(
    table: pa.Table, order: np.ndarray, ids: np.ndarray, seq: np.ndarray, *, null_one: bool
) -> None:
    """The rules of `checks_sql` and `duplicates_sql` on `table`'s rows: no nulls where a
    value is needed (a propensity may be null with `null_one`), a propensity in (0, 1]
    (NaN is outside), no (mdp_id, sequence_number) twice, absorbing steps (which need no
    action nor propensity) only at an episode's end. `order` sorts the rows; `ids` and
    `seq` are the sorted rows' id ranks and sequence numbers."""
    absorbing = absorbing_steps(table)
    for name in NOT_NULL:
        if null_one and name == "action_probability":
            continue
        nulls = table.column(name).is_null().to_numpy(zero_copy_only=False)
        if name in ("action", "action_probability"):
            nulls = nulls & ~absorbing
        if nulls.any():
            row = int(np.argmax(nulls))
            raise BrokenCheck(
                f"column '{name}': rows are null (expected values); e.g. {_example(table, row)}"
            )
    prop = pc.cast(table.column("action_probability"), pa.float64())
    inside = pc.fill_null(pc.and_(pc.greater(prop, 0.0), pc.less_equal(prop, 1.0)), True)
    inside = pc.or_(inside, pa.array(absorbing))
    if not pc.all(inside).as_py():
        row = pc.index(inside, False).as_py()
        raise BrokenCheck(
            "column 'action_probability': rows outside (0, 1] (a logging propensity must be "
            f"positive and at most 1); e.g. {_example(table, row)}, value={prop[row].as_py()}"
        )
    repeated = np.flatnonzero((ids[1:] == ids[:-1]) & (seq[1:] == seq[:-1]))
    if len(repeated):
        raise BrokenCheck(
            "columns 'mdp_id', 'sequence_number': rows repeat the sequence number of another "
            f"step of the same episode (expected unique pairs); e.g. "
            f"{_example(table, int(order[repeated[0]]))}"
        )
    followed = np.flatnonzero(absorbing[order][:-1] & (ids[1:] == ids[:-1]))
    if len(followed):
        raise BrokenCheck(
            "columns 'action', 'possible_actions': absorbing steps (no action, no possible "
            "actions, reward 0) are followed by another step of their episode (expected "
            f"only as an episode's last step); e.g. {_example(table, int(order[followed[0]]))}"
        )


def _example(table: pa.Table | pa.RecordBatch, row: int) -> str:
    """Row `row` named as in the checks' messages (`query.ROW_EXAMPLE`)."""
    key = [table.column(c)[row].as_py() for c in ("mdp_id", "sequence_number")]
    mdp_id, seq = ("null" if v is None else v for v in key)
    return f"mdp_id={mdp_id}, sequence_number={seq}"


def _next_values(own: pa.Array, has_next: np.ndarray, end: Terminal) -> pa.Array:
    """Each row's next value of the column `own`: the next row's where the episode goes on,
    else the terminal value `end`."""
    n = len(own)
    rows = np.arange(n)
    nulls = pa.array(np.where(has_next, rows + 1, -1), mask=~has_next)
    if end == "null":  # a null index takes a null
        return own.take(nulls)
    if end == "empty":
        # Taken with nulls at the ends, whose lists are then empty: rebuilt from the same
        # offsets and values, null only where the next step's own value is null.
        taken = own.take(nulls)
        next_null = np.zeros(n, bool)
        next_null[:-1] = own.is_null().to_numpy(zero_copy_only=False)[1:]
        offsets = pa.array(taken.offsets.to_numpy(), mask=np.r_[has_next & next_null, False]).cast(
            taken.offsets.type
        )  # a null offset makes its list null
        if pa.types.is_map(own.type):
            return pa.MapArray.from_arrays(offsets, taken.keys, taken.items, type=own.type)
        list_cls = pa.LargeListArray if pa.types.is_large_list(own.type) else pa.ListArray
        return list_cls.from_arrays(offsets, taken.values, type=own.type)
    # zeros: a list of zeros as long as each row's own (null stays null), of its own type.
    child = own.type.value_type
    if pa.types.is_fixed_size_list(own.type):
        zeros = pa.array(np.zeros(n * own.type.list_size)).cast(child)
        ends = pa.FixedSizeListArray.from_arrays(zeros, type=own.type, mask=own.is_null())
    else:
        offsets = pc.subtract(own.offsets, own.offsets[0])
        zeros = pa.array(np.zeros(offsets[-1].as_py())).cast(child)
        list_cls = pa.LargeListArray if pa.types.is_large_list(own.type) else pa.ListArray
        ends = list_cls.from_arrays(offsets, zeros, type=own.type, mask=own.is_null())
    return pa.concat_arrays([own, ends]).take(pa.array(np.where(has_next, rows + 1, n + rows)))
