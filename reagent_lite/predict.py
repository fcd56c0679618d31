"""Score a table with an exported model: `python -m reagent_lite.predict`.

    python -m reagent_lite.predict --model outputs/cartpole_dqn --data eval.parquet \
        --output scores.parquet

dqn adds `q_values` (in the order of `actions`) and `best_action`; parametric_dqn adds
`candidate_scores` (one per entry of `possible_actions`), `ranked_candidates` (indices,
best first) and `best_candidate`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from reagent_lite.data.arrow import is_dense, is_feature_map, is_list, list_lengths
from reagent_lite.data.checks import candidate_problems, feature_problems
from reagent_lite.data.readers import read_table
from reagent_lite.data.scatter import candidate_tensor, feature_matrix
from reagent_lite.data.schema import (
    STATE_COLUMNS,
    Column,
    Field,
    TableSchema,
    check_columns,
    list_of,
)
from reagent_lite.data.validate import ShardValidation
from reagent_lite.errors import ConfigError, DataError, ReagentLiteError
from reagent_lite.io_utils import atomic_write


def _json_empty(t: pa.DataType) -> bool:
    """A JSON Lines column of nulls, or of empty lists, throughout: nothing to read."""
    return bool(pa.types.is_null(t) or (is_list(t) and pa.types.is_null(t.value_type)))


# What scoring reads, under the training rules of those columns (a NaN would become a silent
# NaN score): the state, and for a parametric model the candidates to rank.
STATE = Field(
    (
        Column(STATE_COLUMNS[0], lambda t: is_feature_map(t) or _json_empty(t),
               "a map of feature id → number"),
        Column(STATE_COLUMNS[1], lambda t: is_dense(t) or _json_empty(t),
               "a list of numbers (dense features)"),
    ),
    (feature_problems,),
)  # fmt: skip
CANDIDATES = Field(
    (
        Column("possible_actions", lambda t: list_of(is_feature_map)(t) or _json_empty(t),
               "a list of candidate maps (feature id → number)"),
    ),
    (candidate_problems,),
)  # fmt: skip


def _values_and_presence(values: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN-coded raw values as the serving inputs: (values, 0 where absent; presence)."""
    presence = ~np.isnan(values)
    return torch.from_numpy(np.where(presence, values, np.float32(0))), torch.from_numpy(
        presence.astype(np.float32)
    )


def scoring_schema(kind: str) -> TableSchema:
    """The columns a model of `kind` reads: the state, and for parametric_dqn the
    candidates (nothing else need be there)."""
    fields = (STATE,) if kind == "dqn" else (STATE, CANDIDATES)
    return TableSchema(f"scoring with a {kind} model", fields)


def check_scored(table: pa.Table, kind: str, source: str) -> str:
    """The state column of a table to score, once the columns a `kind` model reads pass
    the training rules; a `DataError` naming `source`, the column and the bad rows if not
    (a table of no rows passes)."""
    schema = scoring_schema(kind)
    used = check_columns(table, schema, source)  # (also when there are no rows)
    check = ShardValidation(schema, source=source)
    check.check(table)
    check.finish(allow_empty=True)
    return used[0][1]


def state_matrix(table: pa.Table, column: str, ids: list[str], source: str) -> np.ndarray:
    """The state features of `table` (its state column `column`) in the model's order
    (`ids`), NaN = absent; a `DataError` when the table cannot hold the model's features."""
    col = table.column(column)
    if is_dense(col.type) and len(col) and ids:
        width, last = int(list_lengths(col).max()), max(int(f) for f in ids)
        if 0 < width <= last:
            raise DataError(
                f"{source}: column '{column}': dense feature lists of {width} values; the"
                f" model reads feature ids up to {last}"
            )
    values = feature_matrix(col, ids)
    if len(values) and np.isnan(values).all():
        raise DataError(
            f"column '{column}': no row holds any of the model's state features (ids "
            f"{ids[:8]}{' ...' if len(ids) > 8 else ''}): is this data from another "
            "problem or feature set?"
        )
    return values


class Predictor:
    """A loaded `model.pt2` plus the metadata that says how to feed it."""

    def __init__(self, model_dir: str | Path):
        directory = Path(model_dir)
        if directory.is_file():
            directory = directory.parent
        meta_path, model_path = directory / "model_meta.json", directory / "model.pt2"
        if not meta_path.is_file() or not model_path.is_file():
            raise ConfigError(
                f"--model: '{directory}' holds no model.pt2 + model_meta.json "
                "(expected the model_output_path of a finished run)"
            )
        self.meta: dict[str, Any] = json.loads(meta_path.read_text())
        self.kind: str = self.meta["workflow"]
        self.program = torch.export.load(str(model_path)).module()

    @torch.no_grad()
    def score(self, table: pa.Table, batch_size: int = 65_536, source: str = "data") -> pa.Table:
        """`table` with the scores appended; `source` names it in errors."""
        if batch_size < 1:
            raise ConfigError(
                f"--batch-size: expected a positive number of rows (got {batch_size})"
            )
        column = check_scored(table, self.kind, source)
        ids = self.meta["state_feature_ids"]
        state = _values_and_presence(state_matrix(table, column, ids, source))
        if self.kind == "dqn":
            return self._score_actions(table, state, batch_size)
        return self._score_candidates(table, state, batch_size, source)

    def _batches(self, inputs: tuple[torch.Tensor, ...], batch_size: int) -> list[torch.Tensor]:
        n = len(inputs[0])
        return [
            self.program(*(x[s : s + batch_size] for x in inputs)) for s in range(0, n, batch_size)
        ]

    def _score_actions(
        self, table: pa.Table, state: tuple[torch.Tensor, torch.Tensor], batch_size: int
    ) -> pa.Table:
        parts = self._batches(state, batch_size)
        n_actions = len(self.meta["actions"])
        q = torch.cat(parts).numpy() if parts else np.zeros((0, n_actions), np.float32)
        actions = np.asarray(self.meta["actions"], dtype=object)
        best = actions[q.argmax(axis=1)] if len(q) else np.asarray([], dtype=object)
        return table.append_column(
            "q_values", pa.array(list(q), type=pa.list_(pa.float32()))
        ).append_column("best_action", pa.array(best.tolist(), type=pa.string()))

    def _score_candidates(
        self,
        table: pa.Table,
        state: tuple[torch.Tensor, torch.Tensor],
        batch_size: int,
        source: str,
    ) -> pa.Table:
        col = table.column("possible_actions")
        k = max(1, int(list_lengths(col).max())) if len(col) else 1
        raw, mask = candidate_tensor(col, self.meta["action_feature_ids"], k, source)
        inputs = (*state, *_values_and_presence(raw), torch.from_numpy(mask))
        parts = self._batches(inputs, batch_size)
        scores = torch.cat(parts).numpy() if parts else np.zeros((0, k), np.float32)
        lengths = mask.sum(axis=1).astype(np.int64)
        order = np.argsort(-scores, axis=1, kind="stable")
        ranked = [order[i, : lengths[i]].tolist() for i in range(len(order))]
        per_row = [scores[i, : lengths[i]].tolist() for i in range(len(scores))]
        return (
            table.append_column("candidate_scores", pa.array(per_row, type=pa.list_(pa.float32())))
            .append_column("ranked_candidates", pa.array(ranked, type=pa.list_(pa.int64())))
            .append_column(
                "best_candidate", pa.array([r[0] if r else None for r in ranked], type=pa.int64())
            )
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reagent_lite.predict", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model", required=True, help="model_output_path of a finished run (or its model.pt2)"
    )
    parser.add_argument(
        "--data", required=True, help="table to score (Parquet or JSON Lines, file or dir)"
    )
    parser.add_argument("--output", required=True, help="Parquet file to write")
    parser.add_argument("--batch-size", type=int, default=65_536)
    args = parser.parse_args(argv)
    try:
        predictor = Predictor(args.model)
        scored = predictor.score(
            read_table(args.data), batch_size=args.batch_size, source=args.data
        )
        atomic_write(Path(args.output), lambda tmp: pq.write_table(scored, tmp))
    except ReagentLiteError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    print(f"scored {scored.num_rows} rows into {args.output}")


if __name__ == "__main__":
    main()
