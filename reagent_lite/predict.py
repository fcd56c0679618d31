"""Score a table with an exported model: `python -m reagent_lite.predict`.

    python -m reagent_lite.predict --model outputs/cartpole_dqn --data eval.parquet \
        --output scores.parquet        # or .csv / .jsonl: the extension picks the format

dqn adds `q_values` (in the order of `actions`) and `best_action` (the best of the row's
`possible_actions` when the table has them, else of all actions); parametric_dqn adds
`candidate_scores` (one per entry of `possible_actions`), `ranked_candidates` (indices,
best first) and `best_candidate`.

The table is read, scored and written batch by batch (`--batch-size` rows; Parquet input
by row group, JSON Lines a file at a time), so memory does not grow with the row count;
the output appears whole (a temp file renamed) or not at all.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from reagent_lite.cli import predict_parser
from reagent_lite.data.arrow import is_dense, list_lengths
from reagent_lite.data.scatter import feature_matrix
from reagent_lite.data.schema import TableSchema, check_columns
from reagent_lite.data.scoring import values_and_presence
from reagent_lite.data.validate import ShardValidation
from reagent_lite.errors import ConfigError, DataError, ReagentLiteError
from reagent_lite.io_utils import atomic_write, file_sha256
from reagent_lite.kinds import FeatureSpace, Kind, get_kind
from reagent_lite.safe_load import load_program
from reagent_lite.table_io import TableWriter, output_format, read_batches


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


def state_matrix(
    table: pa.Table, column: str, ids: list[str], source: str, *, require_any: bool = True
) -> np.ndarray:
    """The state features of `table` (its state column `column`) in the model's order
    (`ids`), NaN = absent; a `DataError` when the table cannot hold the model's features
    (with `require_any`, also when no row holds any of them)."""
    col = table.column(column)
    if is_dense(col.type) and len(col) and ids:
        width, last = int(list_lengths(col).max()), max(int(f) for f in ids)
        if 0 < width <= last:
            raise DataError(
                f"{source}: column '{column}': dense feature lists of {width} values; the"
                f" model reads feature ids up to {last}"
            )
    values = feature_matrix(col, ids)
    if require_any and len(values) and np.isnan(values).all():
        raise _no_state_features(column, ids)
    return values


def _no_state_features(column: str, ids: list[str]) -> DataError:
    return DataError(
        f"column '{column}': no row holds any of the model's state features (ids "
        f"{ids[:8]}{' ...' if len(ids) > 8 else ''}): is this data from another "
        "problem or feature set?"
    )


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
        check_pair(model_path, self.meta)  # before torch reads a byte of model.pt2
        program = load_program(model_path, "--model")
        check_signature(program, self.kind, self.space, model_path)
        self.program = program.module()

    @torch.no_grad()
    def score(self, table: pa.Table, batch_size: int = 65_536, source: str = "data") -> pa.Table:
        """`table` with the scores appended (the kind says which columns); `source` names
        it in errors."""
        check_batch_size(batch_size)
        slices = (table.slice(s, batch_size) for s in range(0, max(1, len(table)), batch_size))
        return pa.concat_tables(self.score_batches(slices, source))

    @torch.no_grad()
    def score_batches(self, batches: Iterable[pa.Table], source: str) -> Iterator[pa.Table]:
        """Each batch of `batches` with the scores appended, as it comes: one batch is held
        at a time. The rules of the columns scoring reads apply to all the rows at once:
        after a bad row nothing more is scored, the rest is only checked, and the
        `DataError` at the end counts every bad row."""
        schema = TableSchema(f"scoring with a {self.kind.name} model", self.kind.scoring_fields)
        check = ShardValidation(schema, source=source)
        rows, any_feature, column = 0, False, ""
        for table in batches:
            column = check_columns(table, schema, source)[0][1]  # (also when there are no rows)
            start = check.rows_in
            check.check(table)
            if check.failing:
                continue
            ids = self.space.state_ids
            values = state_matrix(table, column, ids, source, require_any=False)
            any_feature = any_feature or (bool(len(values)) and not np.isnan(values).all())
            rows += len(values)
            # Rows the kind names in errors count from this batch's first row.
            where = source if start == 0 else f"{source} (rows counted from row {start})"
            state = values_and_presence(values)
            yield self.kind.score_rows(
                self.program, table, state, self.space, max(1, len(table)), where
            )
        check.finish(allow_empty=True)
        if rows and not any_feature:
            raise _no_state_features(column, self.space.state_ids)


def check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ConfigError(f"--batch-size: expected a positive number of rows (got {batch_size})")


def read_meta(path: Path) -> dict[str, Any]:
    """model_meta.json as a dict; a damaged one is a `ConfigError`."""
    try:
        meta = json.loads(path.read_text())
    except (ValueError, RecursionError, OSError) as err:
        raise ConfigError(f"--model: '{path}' cannot be read as JSON ({_short(err)})") from err
    if not isinstance(meta, dict):
        raise ConfigError(f"--model: '{path}' is not a JSON object")
    return meta


_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_pair(model_path: Path, meta: dict[str, Any]) -> None:
    """`ConfigError` unless model.pt2 is the file model_meta.json was written for: the meta
    must name its digest (without one, a model.pt2 copied over another run's would be
    scored with the other run's feature order and action names), and the digest must
    match (a run stopped between the two files, or files from different runs)."""
    meta_path = model_path.parent / "model_meta.json"
    want = meta.get("model_sha256")
    if not isinstance(want, str) or not _SHA256.fullmatch(want):
        raise ConfigError(
            f"--model: '{meta_path}' names no model_sha256 (got {str(want)[:80]!r}; expected"
            " the 64 hex digits of model.pt2's SHA-256, which every export writes), so nothing"
            f" shows that '{model_path}' is the model it describes: refused"
        )
    if file_sha256(model_path) != want:
        raise ConfigError(
            f"--model: '{model_path}' is not the model '{meta_path}'"
            f" describes (run {meta.get('run_id', '?')}): the files come from different runs"
        )


# Which model_meta.json list sizes each served input's feature dimension.
_META_LISTS = {
    "state_values": "state_feature_ids",
    "state_presence": "state_feature_ids",
    "action_values": "action_feature_ids",
    "action_presence": "action_feature_ids",
}


def check_signature(program: Any, kind: Kind[Any], space: FeatureSpace, model_path: Path) -> None:
    """`ConfigError` unless the exported program takes the inputs model_meta.json implies
    (names, count and every fixed dimension, as the kind's example inputs have them) and,
    for named actions, returns one score per action: a meta that lists a feature fewer
    would otherwise fail inside the program's shape guards."""
    meta_path = model_path.parent / "model_meta.json"
    want = dict(zip(kind.dynamic_shapes(), kind.example_inputs(space, batch=1), strict=True))
    dynamic = kind.dynamic_shapes()
    names = list(program.graph_signature.user_inputs)
    if names != list(want):
        raise ConfigError(
            f"--model: '{model_path}' takes inputs {names[:8]}, not the {kind.name} model's"
            f" {list(want)} that '{meta_path}' describes: the files do not belong together"
        )
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for name, example in want.items():
        got = list(nodes[name].meta["val"].shape)
        for dim, size in enumerate(example.shape):
            if dim in dynamic[name] or dim >= len(got) or got[dim] == size:
                continue
            listed = _META_LISTS.get(name, "its feature lists")
            raise ConfigError(
                f"--model: '{model_path}' input '{name}' has {got[dim]} entries in dimension"
                f" {dim}, but '{meta_path}' implies {size} ({listed}): the meta does not"
                " describe this model"
            )
        if len(got) != example.dim():
            raise ConfigError(
                f"--model: '{model_path}' input '{name}' has {len(got)} dimensions, not the"
                f" {example.dim()} that '{meta_path}' implies"
            )
    actions = space.to_json().get("actions")  # a kind with named actions lists them
    if actions:
        out = program.graph.output_node().args[0][0].meta["val"].shape
        if out[-1] != len(actions):
            raise ConfigError(
                f"--model: '{model_path}' scores {out[-1]} actions, but '{meta_path}' names"
                f" {len(actions)} (actions): the meta does not describe this model"
            )


def _short(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]


def main(argv: list[str] | None = None, prog: str = "python -m reagent_lite.predict") -> None:
    args = predict_parser(prog).parse_args(argv)
    output = Path(args.output)
    try:
        if output.is_dir():
            raise ConfigError(f"--output: '{args.output}' is a directory (expected a file path)")
        fmt = output_format(output)  # a bad extension fails before the model is loaded
        check_batch_size(args.batch_size)
        predictor = Predictor(args.model)
        rows = 0

        def write(tmp: Path) -> None:
            nonlocal rows
            scored = predictor.score_batches(read_batches(args.data, args.batch_size), args.data)
            with TableWriter(tmp, fmt) as writer:
                for table in scored:
                    writer.write(table)
            rows = writer.rows

        try:
            atomic_write(output, write)
        except OSError as err:
            raise ConfigError(f"--output: cannot write '{args.output}' ({_short(err)})") from err
    except ReagentLiteError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    print(f"scored {rows} rows into {args.output}")


if __name__ == "__main__":
    main()
