"""Validation of a table against a `TableSchema`, before anything is tensorized.

Structural problems (a missing column, a column of the wrong type, an empty table) always
raise `DataError`. Row problems (NaN rewards, unknown action names, propensities outside
(0, 1], time_diff < 1, ...: the schema's rules, `data/checks.py`) raise too — one message
line per problem, naming the file, the column, the number of bad rows and an example —
unless `drop_bad_rows` is set, in which case those rows are dropped and counted in the
`ValidationReport` (and logged).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from reagent_lite.data.readers import ALIASES
from reagent_lite.data.schema import TableSchema, check_columns
from reagent_lite.errors import DataError

log = logging.getLogger(__name__)

_FILE_KEY = b"reagent_lite.file"


def tag_file(table: pa.Table, file: str | Path) -> pa.Table:
    """`table` marked as read from `file` (schema metadata): problems found in its rows
    name that file beside the shard's row (a shard of several part files)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), _FILE_KEY: str(file)})


def file_of(table: pa.Table) -> str | None:
    """The file `tag_file` marked `table` as read from."""
    raw = (table.schema.metadata or {}).get(_FILE_KEY)
    return raw.decode() if raw else None


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


def _example(table: pa.Table, column: str, mask: np.ndarray) -> tuple[int, str]:
    row = int(np.argmax(mask))
    text = repr(table.column(column)[row].as_py())
    return row, text if len(text) <= 80 else text[:77] + "..."


class ShardValidation:
    """Validation of a table (a shard, a window's unit, an eval table, a table to score)
    that arrives in batches (row groups, or slices of them): `check` each batch in order —
    it returns the batch, bad rows dropped if asked — then `finish`, which raises on
    problems unless dropping. Counts, messages and example rows are those of validating
    the rows at once: example row numbers count from the first row checked."""

    def __init__(
        self,
        schema: TableSchema,
        *,
        source: str,
        drop_bad_rows: bool = False,
        null_propensity_as_one: bool = False,
    ) -> None:
        self.schema = schema
        self.source = source
        self.drop_bad_rows = drop_bad_rows
        # Horizon logged deterministic policies with a null propensity: read it as 1.0
        # (counted and logged by `finish`) instead of a bad row, when the config says so.
        self.null_propensity_as_one = null_propensity_as_one
        self.null_propensities = 0
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
        if self.null_propensity_as_one:
            table = self._fill_null_propensity(table)
        masks = []
        for f, name in check_columns(table, self.schema, self.source):
            for rule in f.rules:
                for mask, what in rule(table.column(name)):
                    if mask.any():
                        self._count(table, name, mask, what)
                        masks.append(mask)
        self.rows_in += n
        if masks and self.drop_bad_rows:
            table = table.filter(pa.array(~np.logical_or.reduce(masks)))
        self.rows_out += table.num_rows
        return table

    def _fill_null_propensity(self, table: pa.Table) -> pa.Table:
        name = "action_probability"
        if name not in table.column_names or table.column(name).null_count == 0:
            return table
        col = table.column(name)
        self.null_propensities += col.null_count
        if pa.types.is_null(col.type):
            col = col.cast(pa.float64())
        return table.set_column(table.column_names.index(name), name, col.fill_null(1.0))

    def _count(self, table: pa.Table, column: str, mask: np.ndarray, what: str) -> None:
        entry = self._found.get((column, what))
        if entry is None:
            row, example = _example(table, column, mask)
            self._found[(column, what)] = [
                int(mask.sum()),
                row + self.rows_in,
                example,
                file_of(table),
            ]
        else:
            entry[0] += int(mask.sum())

    @property
    def failing(self) -> bool:
        """Whether `finish` is going to raise for the rows checked so far."""
        return bool(self._found) and not self.drop_bad_rows

    def report(self) -> ValidationReport:
        """What was found so far (`dropped`: every problem, dropped or not)."""
        problems = [
            Problem(column, count, what, row, example, file)
            for (column, what), (count, row, example, file) in self._found.items()
        ]
        return ValidationReport(
            self.source, self.schema.kind, self.rows_in, self.rows_out, dropped=problems
        )

    def finish(self, *, allow_empty: bool = False) -> ValidationReport:
        """The report; a `DataError` for bad rows (unless dropped), and for no rows at all
        (unless `allow_empty`) or none left after dropping."""
        source, report = self.source, self.report()
        if self.null_propensities:
            log.warning(
                "%s: %d rows with a null action_probability read as 1.0 (null_propensity: "
                "one, a deterministic logging policy)",
                source,
                self.null_propensities,
            )
        if self.rows_in == 0 and not allow_empty:
            raise DataError(
                f"{source}: no rows (empty table, or an empty shard: more ranks than rows?)"
            )
        problems = report.dropped
        if problems and not self.drop_bad_rows:
            raise DataError("\n".join(p.message(source) for p in problems))
        for p in problems:
            log.warning("dropping bad rows: %s", p.message(source))
        if problems and self.rows_out == 0:
            raise DataError(
                f"{source}: every row is bad; nothing left after dropping them\n{report}"
            )
        return report
