"""Score a table with an exported model: `python -m reagent_lite.predict`.

    python -m reagent_lite.predict --model outputs/cartpole_dqn --data eval.parquet \
        --output scores.parquet        # or .csv / .jsonl: the extension picks the format

dqn adds `q_values` (in the order of `actions`) and `best_action` (the best of the row's
`possible_actions` when the table has them, else of all actions); parametric_dqn adds
`candidate_scores` (one per entry of `possible_actions`), `ranked_candidates` (indices,
best first) and `best_candidate`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from reagent_lite.cli import predict_parser
from reagent_lite.data.arrow import is_dense, list_lengths
from reagent_lite.data.readers import read_table
from reagent_lite.data.scatter import feature_matrix
from reagent_lite.data.schema import TableSchema, check_columns
from reagent_lite.data.scoring import values_and_presence
from reagent_lite.data.validate import ShardValidation
from reagent_lite.errors import ConfigError, DataError, ReagentLiteError
from reagent_lite.io_utils import file_sha256
from reagent_lite.kinds import get_kind
from reagent_lite.safe_load import load_program
from reagent_lite.table_io import output_format, write_table


def check_scored(table: pa.Table, kind: str, source: str) -> str:
    """The state column of a table to score, once the columns a model of the kind called
    `kind` reads pass the training rules; a `DataError` naming `source`, the column and the
    bad rows if not (a table of no rows passes)."""
    schema = TableSchema(f"scoring with a {kind} model", get_kind(kind).scoring_fields)
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
        self.meta: dict[str, Any] = read_meta(meta_path)
        try:
            self.kind = get_kind(self.meta["workflow"])
            self.space = self.kind.space_type.from_json(self.meta)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ConfigError(
                f"--model: '{meta_path}' is not a complete model_meta.json ({_short(err)})"
            ) from err
        check_pair(model_path, self.meta)
        self.program = load_program(model_path, "--model").module()

    @torch.no_grad()
    def score(self, table: pa.Table, batch_size: int = 65_536, source: str = "data") -> pa.Table:
        """`table` with the scores appended (the kind says which columns); `source` names
        it in errors."""
        if batch_size < 1:
            raise ConfigError(
                f"--batch-size: expected a positive number of rows (got {batch_size})"
            )
        column = check_scored(table, self.kind.name, source)
        state = values_and_presence(state_matrix(table, column, self.space.state_ids, source))
        return self.kind.score_rows(self.program, table, state, self.space, batch_size, source)


def read_meta(path: Path) -> dict[str, Any]:
    """model_meta.json as a dict; a damaged one is a `ConfigError`."""
    try:
        meta = json.loads(path.read_text())
    except (ValueError, RecursionError, OSError) as err:
        raise ConfigError(f"--model: '{path}' cannot be read as JSON ({_short(err)})") from err
    if not isinstance(meta, dict):
        raise ConfigError(f"--model: '{path}' is not a JSON object")
    return meta


def check_pair(model_path: Path, meta: dict[str, Any]) -> None:
    """`ConfigError` when model.pt2 is not the file model_meta.json was written for (a run
    stopped between the two, or a model copied over another run's)."""
    want = meta.get("model_sha256")
    if want is None:
        return  # written before the digest was recorded
    if file_sha256(model_path) != want:
        raise ConfigError(
            f"--model: '{model_path}' is not the model '{model_path.parent / 'model_meta.json'}'"
            f" describes (run {meta.get('run_id', '?')}): the files come from different runs"
        )


def _short(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]


def main(argv: list[str] | None = None, prog: str = "python -m reagent_lite.predict") -> None:
    args = predict_parser(prog).parse_args(argv)
    try:
        if Path(args.output).is_dir():
            raise ConfigError(f"--output: '{args.output}' is a directory (expected a file path)")
        output_format(args.output)  # a bad extension fails before the model is loaded
        predictor = Predictor(args.model)
        scored = predictor.score(
            read_table(args.data), batch_size=args.batch_size, source=args.data
        )
        try:
            write_table(scored, args.output)
        except OSError as err:
            raise ConfigError(f"--output: cannot write '{args.output}' ({_short(err)})") from err
    except ReagentLiteError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    print(f"scored {scored.num_rows} rows into {args.output}")


if __name__ == "__main__":
    main()
