"""What a table must hold: its columns, the types each may have, the rules its rows obey.

A `TableSchema` is plain data. The kinds declare theirs (`Kind.schema`): the columns every
transition table has (`transition_schema`) around the kind's own action columns; `predict`
declares the few columns it scores. `ShardValidation` (`data/validate.py`) checks a table
against whichever schema it is handed, so nothing in `data/` knows a kind. The columns and
what they mean: docs/DATA_FORMAT.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from reagent_lite.data.arrow import is_dense, is_feature_map, is_list, is_num, is_str
from reagent_lite.data.checks import (
    Rule,
    feature_problems,
    nonfinite_rows,
    null_rows,
    propensity_rows,
    time_diff_rows,
)
from reagent_lite.errors import DataError

_t = pa.types
Pred = Callable[[pa.DataType], bool]

# A state column is a sparse map, or its dense list alternative.
STATE_COLUMNS = ("state_features", "state")
NEXT_STATE_COLUMNS = ("next_state_features", "next_state")
FEATURE_MAP = "map<feature id, float>"


@dataclass(frozen=True)
class Column:
    """One name a field may have in a table, and the types it may have under that name."""

    name: str
    accepts: Pred
    expected: str  # what `accepts` accepts, for messages


@dataclass(frozen=True)
class Field:
    """One column of a table: the names it may have (alternatives, the preferred first) and
    the row rules its values obey."""

    columns: tuple[Column, ...]
    rules: tuple[Rule, ...] = ()
    required: bool = True

    @property
    def name(self) -> str:
        return self.columns[0].name


def field(name: str, accepts: Pred, expected: str, *rules: Rule, required: bool = True) -> Field:
    """A field of one name."""
    return Field((Column(name, accepts, expected),), rules, required)


@dataclass(frozen=True)
class TableSchema:
    """The fields of a table, in the order they are checked; `kind`: what the table is for
    (messages name it)."""

    kind: str
    fields: tuple[Field, ...]


def list_of(pred: Pred) -> Pred:
    """Lists whose elements `pred` accepts (a list of nulls: JSON Lines lists all empty)."""
    return lambda t: is_list(t) and (_t.is_null(t.value_type) or pred(t.value_type))


def or_null(pred: Pred) -> Pred:
    """What `pred` accepts, or a column of nulls throughout (JSON Lines)."""
    return lambda t: pred(t) or _t.is_null(t)


def features(name: str, dense: str) -> Field:
    """A feature column: a sparse map `name`, or a dense list `dense`."""
    return Field(
        (
            Column(name, is_feature_map, FEATURE_MAP),
            Column(dense, is_dense, "list<float> (dense features)"),
        ),
        (feature_problems,),
    )


def transition_schema(kind: str, action_fields: Sequence[Field]) -> TableSchema:
    """The columns every transition table has, around a kind's fields for its actions
    (`action`, `next_action`, `possible_actions`, `possible_next_actions`)."""
    return TableSchema(
        kind,
        (
            field(
                "mdp_id",
                lambda t: is_str(t) or _t.is_integer(t),
                "string or integer episode ids",
                null_rows("null episode id"),
            ),
            field("sequence_number", _t.is_integer, "integers", null_rows("null sequence number")),
            field("reward", is_num, "numbers", nonfinite_rows("null, NaN or infinite reward")),
            field("action_probability", is_num, "numbers in (0, 1]", propensity_rows),
            field("time_diff", is_num, "integers >= 1", time_diff_rows, required=False),
            field(
                "terminal",
                lambda t: _t.is_boolean(t) or _t.is_integer(t),
                "booleans",
                required=False,
            ),
            field(
                "metrics",
                lambda t: _t.is_map(t) and is_num(t.item_type),
                "map<metric name, float>",
                required=False,
            ),
            features(*STATE_COLUMNS),
            features(*NEXT_STATE_COLUMNS),
            *action_fields,
        ),
    )


def check_columns(
    table: pa.Table, schema: TableSchema, source: str, *, types: bool = True
) -> list[tuple[Field, str]]:
    """(field, the column used for it) of every field `table` has; a `DataError` naming
    `source` for missing required columns and (with `types`) mistyped ones. Needs no rows:
    `--dry_run` runs it on an empty table of the data's schema."""
    names = set(table.column_names)
    missing, found = [], []
    for f in schema.fields:
        column = next((c for c in f.columns if c.name in names), None)
        if column is not None:
            found.append((f, column))
        elif f.required:
            missing.append(" or ".join(f"'{c.name}'" for c in f.columns))
    if missing:
        raise DataError(
            f"{source}: missing required column(s) {', '.join(missing)} for {schema.kind}"
            f" (columns present: {sorted(names)})"
        )
    wrong = [
        f"{source}: column '{c.name}': expected {c.expected}, got {table.schema.field(c.name).type}"
        for _, c in found
        if types and not c.accepts(table.schema.field(c.name).type)
    ]
    if wrong:
        raise DataError("\n".join(wrong))
    return [(f, c.name) for f, c in found]
