"""The timeline as SQL: step logs → transitions, written once for every engine.

Each engine (DuckDB on one machine, Spark on a cluster) registers the step log as a view
named `steps`, describes its columns (`StepColumns`) and renders the queries below with
its own `Dialect` — which only spells typed empty values and type names, never logic. So
the pairing (`LEAD` over each episode ordered by `sequence_number`), `time_diff` (the
sequence gap), the terminal row and the hashed train/eval split are the same text,
executed by either engine, and give the same rows value for value.

The split hashes `"<seed>:<mdp_id>"` with MD5 (a function both engines and Python have
built in) and puts an episode on the eval side when the first 16 hex digits of the hash,
read as a 64-bit number, are below `eval_fraction × 2⁶⁴` — compared as fixed-length
hex strings, which orders them as numbers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from reagent_lite.errors import DataError

Kind = Literal["integer", "float", "string", "map", "list", "other"]
Side = Literal["all", "train", "eval"]
# What a null propensity is: a bad row, or 1.0 (the workflows' `null_propensity`).
NullPropensity = Literal["error", "one"]
# Engines' type names of a column whose every value is null (JSON `null`, Arrow's null).
_NULL_TYPES = ('"NULL"', "NULL", "void")

REQUIRED_COLUMNS = ("mdp_id", "sequence_number", "action", "reward", "possible_actions")
# Columns each step log must have, beside REQUIRED_COLUMNS: one of each pair.
STATE_COLUMNS = ("state_features", "state")
PROPENSITY_COLUMNS = ("action_probability", "propensity")
# Columns of a training table: a step log that has them is the wrong input.
TRANSITION_COLUMNS = (
    "next_state_features",
    "next_state",
    "next_action",
    "possible_next_actions",
    "time_diff",
)
# Step columns whose value at the next step becomes a transition's next_* column.
PAIRED = {
    "state_features": "next_state_features",
    "state": "next_state",
    "action": "next_action",
    "possible_actions": "possible_next_actions",
}
OUTPUT_ORDER = (
    "mdp_id",
    "sequence_number",
    "state_features",
    "state",
    "action",
    "reward",
    "next_state_features",
    "next_state",
    "next_action",
    "possible_actions",
    "possible_next_actions",
    "action_probability",
    "time_diff",
    "metrics",
)
# Columns that may not be null in a step log (values checked by `checks_sql`).
NOT_NULL = ("mdp_id", "sequence_number", "action", "reward", "action_probability")


class Dialect(Protocol):
    """What differs between engines: how to write a typed empty value and a zero vector."""

    def empty(self, type_name: str, kind: Kind) -> str:
        """An empty map or list literal of the column's type."""
        ...

    def zeros_like(self, column: str, type_name: str) -> str:
        """A list of zeros as long as `column`'s list, of the column's type."""
        ...

    def quote(self, name: str) -> str:
        """A column name as an identifier."""
        ...


@dataclass(frozen=True)
class StepColumns:
    """The step log's columns in order: name → (engine type name, kind)."""

    types: Mapping[str, tuple[str, Kind]]
    source: str
    # "one": a null propensity reads as 1.0 (Horizon logged deterministic policies so).
    null_propensity: NullPropensity = "error"

    @property
    def names(self) -> list[str]:
        return list(self.types)

    def kind(self, name: str) -> Kind:
        return self.types[name][1]

    def check(self) -> None:
        """Raise `DataError` for missing, forbidden or mistyped columns (before any data is read)."""
        names = set(self.types)
        missing = [repr(c) for c in REQUIRED_COLUMNS if c not in names]
        for pair in (STATE_COLUMNS, PROPENSITY_COLUMNS):
            if not names.intersection(pair):
                missing.append(" or ".join(repr(c) for c in pair))
        if missing:
            raise DataError(
                f"{self.source}: missing column(s) {', '.join(missing)}; step logs need mdp_id, "
                "sequence_number, state_features, action, reward, possible_actions, "
                f"action_probability (found: {', '.join(self.names) or 'none'})"
            )
        for col in TRANSITION_COLUMNS:
            if col in names:
                raise DataError(
                    f"{self.source}: column '{col}' is already present; the input should be "
                    "step logs, not a training table"
                )
        expected: dict[str, tuple[tuple[Kind, ...], str]] = {
            "sequence_number": (("integer",), "an integer"),
            "reward": (("integer", "float"), "a number"),
            "action_probability": (("integer", "float"), "a number"),
            "propensity": (("integer", "float"), "a number"),
            "state_features": (("map",), "a map feature-id → float"),
            "state": (("list",), "a list"),
            "possible_actions": (("list",), "a list"),
        }
        for col, (kinds, words) in expected.items():
            if col in PROPENSITY_COLUMNS and self.types.get(col, ("", ""))[0] in _NULL_TYPES:
                continue  # only nulls: a null propensity (an error unless read as 1.0)
            if col in names and self.kind(col) not in kinds:
                if col == "propensity" and "action_probability" in names:
                    continue  # carried through as an extra column, not the propensity
                raise DataError(
                    f"{self.source}: column '{col}' has type {self.types[col][0]}; expected {words}"
                )

    def absorbing(self, dialect: Dialect) -> str:
        """SQL: true on a Horizon absorbing step, which marked an episode's end: no action
        (null, or Horizon's empty placeholder), no possible actions, reward 0."""
        action, candidates = dialect.quote("action"), dialect.quote("possible_actions")
        kind = self.kind("action")
        empty = {"map": f"cardinality({action}) = 0", "string": f"{action} = ''"}.get(kind, "FALSE")
        # Never null (a null list or reward is no absorbing step): the rules stay two-valued.
        return (
            f"coalesce(({action} IS NULL OR {empty}) AND cardinality({candidates}) = 0 "
            f"AND {dialect.quote('reward')} = 0, FALSE)"
        )

    def propensity(self) -> str:
        """The column holding the propensity (the alias `propensity` when that is all there is)."""
        return "action_probability" if "action_probability" in self.types else "propensity"


# SQL: a short text naming a row by its key, for error messages.
ROW_EXAMPLE = (
    "concat('mdp_id=', coalesce(CAST(mdp_id AS STRING), 'null'), ', sequence_number=', "
    "coalesce(CAST(sequence_number AS STRING), 'null'))"
)


def checks_sql(columns: StepColumns, dialect: Dialect, table: str = "steps") -> str:
    """One aggregate over the step log: for each rule, the number of rows breaking it and
    the first example (by its text), as columns `n_<rule>` and `e_<rule>`. An absorbing
    step (`StepColumns.absorbing`) needs no action nor propensity, but must end its
    episode."""
    example = ROW_EXAMPLE
    prop = columns.propensity()
    absorbing = columns.absorbing(dialect)
    rules = {f"null_{c}": f"{c if c != 'action_probability' else prop} IS NULL" for c in NOT_NULL}
    for rule in ("null_action", "null_action_probability"):
        rules[rule] += f" AND NOT {absorbing}"
    if columns.null_propensity == "one":
        del rules["null_action_probability"]
    # NaN is outside (0, 1] in every engine: Spark and DuckDB order NaN above all numbers;
    # a null is not (a null rule's business).
    rules["bad_propensity"] = f"NOT {absorbing} AND NOT ({prop} > 0 AND {prop} <= 1)"
    rules["absorbing_not_last"] = f"{absorbing} AND has_next_"
    parts = []
    for name, cond in rules.items():
        parts.append(f"sum(CASE WHEN {cond} THEN 1 ELSE 0 END) AS n_{name}")
        value = (
            f"concat({example}, ', value=', CAST({prop} AS STRING))"
            if name == "bad_propensity"
            else example
        )
        parts.append(f"min(CASE WHEN {cond} THEN {value} END) AS e_{name}")
    following = "LEAD(sequence_number) OVER (PARTITION BY mdp_id ORDER BY sequence_number)"
    return (
        f"SELECT {', '.join(parts)} FROM "
        f"(SELECT *, {following} IS NOT NULL AS has_next_ FROM {table}) AS checked_steps"
    )


def duplicates_sql(table: str = "steps") -> str:
    """Rows that repeat the (mdp_id, sequence_number) of another row: count and an example."""
    return (
        "SELECT sum(n - 1) AS n_dup, min(e) AS e_dup FROM ("
        "SELECT count(*) AS n, concat('mdp_id=', CAST(mdp_id AS STRING), ', sequence_number=', "
        f"CAST(sequence_number AS STRING)) AS e FROM {table} "
        "GROUP BY mdp_id, sequence_number HAVING count(*) > 1) AS d"
    )


def raise_for_checks(source: str, counts: Mapping[str, Any]) -> None:
    """Turn the results of `checks_sql` and `duplicates_sql` into one `DataError`, if any."""
    messages = {
        "null_mdp_id": (" 'mdp_id'", "rows are null (expected values)"),
        "null_sequence_number": (" 'sequence_number'", "rows are null (expected values)"),
        "null_action": (" 'action'", "rows are null (expected values)"),
        "null_reward": (" 'reward'", "rows are null (expected values)"),
        "null_action_probability": (
            " 'action_probability'",
            "rows are null (expected values; --null-propensity one reads a null as 1.0, "
            "a deterministic logging policy)",
        ),
        "bad_propensity": (
            " 'action_probability'",
            "rows outside (0, 1] (a logging propensity must be positive and at most 1)",
        ),
        "absorbing_not_last": (
            "s 'action', 'possible_actions'",
            "absorbing steps (no action, no possible actions, reward 0) are followed by "
            "another step of their episode (expected only as an episode's last step)",
        ),
        "dup": (
            "s 'mdp_id', 'sequence_number'",
            "rows repeat the sequence number of another step of the same episode "
            "(expected unique pairs)",
        ),
    }
    for rule, (column, words) in messages.items():
        n = counts.get(f"n_{rule}")
        if n:
            raise DataError(
                f"{source}: column{column}: {int(n)} {words}; e.g. {counts.get(f'e_{rule}')}"
            )


def eval_threshold(eval_fraction: float) -> str:
    """`eval_fraction × 2⁶⁴` as 16 hex digits: hash prefixes below it are on the eval side."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1) (got {eval_fraction})")
    return format(int(eval_fraction * 2**64), "016x")


def episode_hash(mdp_id: object, seed: int = 0) -> int:
    """The 64-bit hash the split uses: the same in Python, DuckDB and Spark, on every machine."""
    return int(hashlib.md5(f"{int(seed)}:{mdp_id}".encode()).hexdigest()[:16], 16)


def split_condition(side: Side, eval_fraction: float, seed: int) -> str:
    """SQL: true for the step rows of `side` (`all`: every row)."""
    if side == "all":
        return "TRUE"
    digest = f"substr(md5(concat('{int(seed)}:', CAST(mdp_id AS STRING))), 1, 16)"
    op = "<" if side == "eval" else ">="
    return f"{digest} {op} '{eval_threshold(eval_fraction)}'"


Terminal = Literal["zeros", "empty", "null"]


def terminal(src: str, kind: Kind) -> Terminal:
    """What a next_* column holds on an episode's last step: zeros as long as the row's own
    `state`, an empty map or list, or null."""
    if src == "state":
        return "zeros"
    return "empty" if kind in ("map", "list") else "null"


def pairs(columns: StepColumns) -> dict[str, str]:
    """next_* column → the step column whose next value it holds (those the log has)."""
    return {dst: src for src, dst in PAIRED.items() if src in columns.types}


def step_sources(columns: StepColumns) -> dict[str, str]:
    """A transition's own columns (the step's values), in the training table's order:
    output name → the step log's column (`propensity` becomes `action_probability` where it
    is the propensity; with both, `propensity` is carried as an extra column)."""
    prop = columns.propensity()
    sources = {c: c for c in columns.names if not (c == "propensity" == prop)}
    if prop == "propensity":
        sources["action_probability"] = "propensity"
    return {name: sources[name] for name in output_order(sources)}


def step_select(columns: StepColumns, dialect: Dialect) -> dict[str, str]:
    """`step_sources` as SQL: output name → expression (with `null_propensity` "one", the
    propensity as a DOUBLE, 1.0 where null)."""
    select = {name: dialect.quote(src) for name, src in step_sources(columns).items()}
    if columns.null_propensity == "one":
        prop = select["action_probability"]
        select["action_probability"] = f"coalesce(CAST({prop} AS DOUBLE), CAST(1 AS DOUBLE))"
    return select


def output_order(names: Collection[str]) -> list[str]:
    """The training table's column order: OUTPUT_ORDER first, other columns after, as given."""
    return [c for c in OUTPUT_ORDER if c in names] + [c for c in names if c not in OUTPUT_ORDER]


def transitions_sql(
    columns: StepColumns,
    dialect: Dialect,
    *,
    side: Side = "all",
    eval_fraction: float = 0.0,
    seed: int = 0,
    order: bool = True,
    table: str = "steps",
) -> str:
    """The transformation: one row per step, paired with the next step of its episode.

    next_* are the next step's values; on an episode's last step (the terminal row) they are
    an empty map / list (`next_state`: zeros of the same length) or null, and `time_diff`
    is 1. A Horizon absorbing step that ends its episode (`StepColumns.absorbing`) is no
    transition of its own: the step before it has its state as next state, the terminal
    next_action and its empty possible actions. `order`: sort the result by (mdp_id,
    sequence_number). `table`: the step log's table or view.
    """
    select = step_select(columns, dialect)
    has_next = "LEAD(sequence_number) OVER w IS NOT NULL"
    for dst, src in pairs(columns).items():
        type_name, kind = columns.types[src]
        end = terminal(src, kind)
        if end == "zeros":
            value = dialect.zeros_like(src, type_name)
        elif end == "empty":
            value = dialect.empty(type_name, kind)
        else:
            value = "NULL"
        follows = has_next if src != "action" else f"{has_next} AND NOT LEAD(absorbing_) OVER w"
        select[dst] = f"CASE WHEN {follows} THEN LEAD({src}) OVER w ELSE {value} END"
    select["time_diff"] = (
        "CAST(coalesce((LEAD(sequence_number) OVER w) - sequence_number, 1) AS BIGINT)"
    )
    names = output_order(select)
    select["absorbing_end_"] = f"absorbing_ AND NOT {has_next}"
    body = ",\n  ".join(f"{select[c]} AS {dialect.quote(c)}" for c in [*names, "absorbing_end_"])
    outer = ", ".join(dialect.quote(c) for c in names)
    sql = (
        f"SELECT {outer} FROM (SELECT\n  {body}\nFROM (SELECT *, {columns.absorbing(dialect)} "
        f"AS absorbing_ FROM {table} WHERE {split_condition(side, eval_fraction, seed)}) AS s\n"
        "WINDOW w AS (PARTITION BY mdp_id ORDER BY sequence_number)) AS t\n"
        "WHERE NOT absorbing_end_"
    )
    if order:
        sql += "\nORDER BY mdp_id, sequence_number"
    return sql
