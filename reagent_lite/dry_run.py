"""What `--dry_run` shows beyond the launch plan: the effective hyperparameters, the global
batch and steps per epoch, and a check of a sample of the data's rows.

The sample (the first `SAMPLE_ROWS` rows of the first file of each table, Parquet or JSON
Lines alike) goes through the same row validation as training (`ShardValidation` with the
workflow's schema: column types, unknown action names, NaN rewards, bad propensities...),
so most of what a run would refuse is found in a second. Each state (and, parametric,
action) feature of the sample is shown with the normalization type it would get — fitted
from the sample, or read from `state_norm_data_path` / `action_norm_data_path`.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.config import WorkflowConfig
from reagent_lite.config.overrides import describe as describe_overrides
from reagent_lite.data.arrow import is_dense
from reagent_lite.data.jsonl import open_text, table_from_records
from reagent_lite.data.readers import ShardSpec, apply_aliases, file_format, list_data_files
from reagent_lite.errors import DataError

if TYPE_CHECKING:
    from reagent_lite.kinds.base import Kind

SAMPLE_ROWS = 1000


def hyperparameter_lines(
    cfg: WorkflowConfig, world_size: int, shards: list[ShardSpec] | None, overrides: list[str]
) -> list[str]:
    """The settings that shape training, after overrides, with the derived batch figures."""
    t, rl = cfg.training, cfg.rl
    lr = t.learning_rate * (world_size if t.scale_lr_with_world_size else 1)
    global_batch = t.minibatch_size * t.minibatches_per_step * world_size
    lines = []
    if overrides:
        lines.append("overrides: " + " ".join(describe_overrides(overrides)))
    lines += [
        "hyperparameters:",
        f"  epochs: {cfg.epochs}  seed: {cfg.seed}",
        f"  rl: gamma: {rl.gamma}  target_update_rate: {rl.target_update_rate}  "
        f"maxq_learning: {rl.maxq_learning}  q_network_loss: {rl.q_network_loss}  "
        f"temperature: {rl.temperature}  reward_boost: {json.dumps(rl.reward_boost)}",
        f"  rainbow: double_q_learning: {cfg.rainbow.double_q_learning}  "
        f"dueling_architecture: {cfg.rainbow.dueling_architecture}",
        f"  training: layers: {t.layers}  activations: {t.activations}",
        f"  optimizer: {t.optimizer}  learning_rate: {lr:g}"
        + (f" (= {t.learning_rate:g} × world size {world_size})" if lr != t.learning_rate else "")
        + f"  l2_decay: {t.l2_decay}  lr_decay: {t.lr_decay}  cql_alpha: {t.cql_alpha}"
        + (f" ({t.cql_weighting})" if t.cql_weighting != "constant" else ""),
        f"  global batch: {global_batch} = minibatch_size {t.minibatch_size} per process × "
        f"minibatches_per_step {t.minibatches_per_step} × world size {world_size}",
        f"  steps per epoch: {_steps_per_epoch(cfg, shards)}",
    ]
    return lines


def _steps_per_epoch(cfg: WorkflowConfig, shards: list[ShardSpec] | None) -> str:
    t = cfg.training
    if t.steps_per_epoch:
        return f"{t.steps_per_epoch} (training.steps_per_epoch)"
    if shards is None:
        return "one pass over the largest shard (known once the sample data is generated)"
    rows = [s.num_rows for s in shards]
    if any(r is None for r in rows):
        return "one pass over the largest shard (JSON Lines: counted when read)"
    largest = max(r or 0 for r in rows)
    steps = max(1, math.ceil(largest / (t.minibatch_size * t.minibatches_per_step)))
    return f"{steps} (one pass over the largest shard, {largest:,} rows)"


def read_sample(path: str | Path, rows: int = SAMPLE_ROWS) -> tuple[pa.Table, Path]:
    """The first `rows` rows of the first data file at `path`, and that file."""
    first = list_data_files(path)[0]
    if file_format(first) == "parquet":
        from reagent_lite.data.readers import open_parquet

        pf, batches, left = open_parquet(first), [], rows
        try:
            # Row group by row group: pyarrow cannot return dictionary-keyed maps in one
            # batch spanning several row groups.
            for g in range(pf.num_row_groups):
                for batch in pf.iter_batches(batch_size=left, row_groups=[g]):
                    batches.append(pa.Table.from_batches([batch]))
                    left -= batch.num_rows
                    break
                if left <= 0:
                    break
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{first}: cannot read Parquet data ({e})") from e
        table = pa.concat_tables(batches) if batches else pf.schema_arrow.empty_table()
    else:
        records = []
        try:
            with open_text(first) as fh:
                for i, line in enumerate(itertools.islice((ln for ln in fh if ln.strip()), rows)):
                    record = json.loads(line)
                    if not isinstance(record, dict):
                        raise DataError(f"{first}: line {i + 1} is not a JSON object")
                    records.append(record)
        except json.JSONDecodeError as e:
            raise DataError(f"{first}: line {len(records) + 1} is not valid JSON ({e})") from e
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise DataError(f"{first}: cannot read file ({e})") from e
        table = table_from_records(records, str(first))
    return apply_aliases(table, first), first


def check_sample(kind: Kind[Any], cfg: WorkflowConfig, path: str) -> tuple[pa.Table, str]:
    """The sample of `path` once it passed the training rules (a `DataError` as training
    would give otherwise), and a line saying what was checked."""
    from reagent_lite.data.validate import ShardValidation

    table, first = read_sample(path)
    check = ShardValidation(
        kind.schema(cfg),
        source=str(first),
        drop_bad_rows=cfg.drop_bad_rows,
        null_propensity_as_one=cfg.null_propensity == "one",
    )
    table = check.check(table)
    report = check.finish()
    dropped = report.rows_in - report.rows_out
    note = f", {dropped} bad rows would be dropped" if dropped else ""
    return table, f"{first.name}: first {report.rows_in} rows pass the training checks{note}"


def feature_type_lines(kind: Kind[Any], cfg: WorkflowConfig, sample: pa.Table) -> list[str]:
    """`  <group> feature <id>: <TYPE>` for each feature of the sample: of each group the
    kind normalizes (state; parametric: action), from its normalization file if given."""
    given = kind.norm_files(cfg)
    lines = []
    for group, path in given.items():
        # A group other than the state is read from the column of its name (the action
        # features of a parametric table).
        column = _state_column(sample) if group == "state" else group
        if column is None or column not in sample.column_names:
            continue
        if path:
            from reagent_lite.normalization.params import load_normalization

            params = load_normalization(path)
            source = f"from {Path(path).name}"
        else:
            forced = cfg.normalization_overrides.for_group(group)
            params = _fit(sample.column(column), action=(group == "action"), overrides=forced)
            source = f"identified from {sample.num_rows} sample rows"
            if forced:
                source += f"; forced by normalization_overrides.{group}: {sorted(forced)}"
        lines.append(f"{group} features ({source}):")
        lines += [f"  {fid}: {p.feature_type.value}" for fid, p in params.items()]
    return lines


def _state_column(sample: pa.Table) -> str | None:
    for name in ("state_features", "state"):
        if name in sample.column_names:
            return name
    return None


def _fit(col: pa.ChunkedArray, *, action: bool, overrides: dict[str, str]) -> dict[str, Any]:
    from reagent_lite.data.scatter import feature_matrix
    from reagent_lite.normalization.identify import fit_normalization
    from reagent_lite.normalization.params import sorted_feature_ids

    if is_dense(col.type):
        width = int(pc.max(pc.list_value_length(col)).as_py() or 0)
        ids = [str(i) for i in range(width)]
    else:
        keys = pc.unique(col.combine_chunks().keys).to_pylist()
        ids = sorted_feature_ids([str(k) for k in keys])
    values = feature_matrix(col, ids) if ids else np.zeros((len(col), 0), np.float32)
    return fit_normalization(values, ids, action=action, feature_overrides=overrides)
