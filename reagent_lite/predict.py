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

from reagent_lite.data.readers import read_table
from reagent_lite.data.tensorize import candidates_to_dense, max_candidates_in, sparse_to_dense
from reagent_lite.data.validate import check_feature_column
from reagent_lite.errors import ConfigError, DataError, ReagentLiteError
from reagent_lite.io_utils import atomic_write

_STATE_COLUMNS = ("state_features", "state")


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

    def _state(self, table: pa.Table, source: str) -> tuple[torch.Tensor, torch.Tensor]:
        column = next((c for c in _STATE_COLUMNS if c in table.column_names), None)
        if column is None:
            raise DataError(f"table has no state column (expected one of {list(_STATE_COLUMNS)})")
        check_feature_column(table, column, source)
        ids = self.meta["state_feature_ids"]
        values, presence = sparse_to_dense(table.column(column), ids)
        if len(presence) and not presence.any():
            raise DataError(
                f"column '{column}': no row holds any of the model's state features (ids "
                f"{ids[:8]}{' ...' if len(ids) > 8 else ''}): is this data from another "
                "problem or feature set?"
            )
        return torch.from_numpy(values), torch.from_numpy(presence)

    @torch.no_grad()
    def score(self, table: pa.Table, batch_size: int = 65_536, source: str = "data") -> pa.Table:
        """`table` with the scores appended; `source` names it in errors."""
        if batch_size < 1:
            raise ConfigError(
                f"--batch-size: expected a positive number of rows (got {batch_size})"
            )
        state, presence = self._state(table, source)
        if self.kind == "dqn":
            parts = [
                self.program(state[s : s + batch_size], presence[s : s + batch_size])
                for s in range(0, len(state), batch_size)
            ]
            n_actions = len(self.meta["actions"])
            q = torch.cat(parts).numpy() if parts else np.zeros((0, n_actions), np.float32)
            actions = np.asarray(self.meta["actions"], dtype=object)
            best = actions[q.argmax(axis=1)] if len(q) else np.asarray([], dtype=object)
            return table.append_column(
                "q_values", pa.array(list(q), type=pa.list_(pa.float32()))
            ).append_column("best_action", pa.array(best.tolist(), type=pa.string()))
        if "possible_actions" not in table.column_names:
            raise DataError("table has no 'possible_actions' column (the candidates to rank)")
        check_feature_column(table, "possible_actions", source, candidates=True)
        k = max_candidates_in(table)
        cands, cand_presence, mask = candidates_to_dense(
            table.column("possible_actions"), self.meta["action_feature_ids"], k
        )
        parts = []
        for s in range(0, len(state), batch_size):
            e = s + batch_size
            parts.append(
                self.program(
                    state[s:e],
                    presence[s:e],
                    torch.from_numpy(cands[s:e]),
                    torch.from_numpy(cand_presence[s:e]),
                    torch.from_numpy(mask[s:e]),
                )
            )
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
