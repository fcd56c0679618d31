"""The Python API: read a config, train a workflow, load the model it exported.

    import reagent_lite

    result = reagent_lite.train("cfg.json", overrides={"epochs": 2})
    print(result.final_metrics["cpe"]["doubly_robust"]["normalized"])
    model = reagent_lite.load_model(result.model_dir)
    scores = model.score(dataframe)          # or an Arrow table; or model(values, presence)
    with reagent_lite.Policy(result.model_dir, exploration="epsilon:0.1", log_dir="logs") as p:
        decision = p.act({"0": 0.1, "1": -0.2})   # explores, logs with its propensity

Errors are the typed `reagent_lite.ReagentLiteError` subclasses (`ConfigError`,
`DataError`, `DistributedError`, `TrainingError`), never `SystemExit`. The library leaves
logging alone: configure it (e.g. `logging.basicConfig(level=logging.INFO)`) to see the
run's progress lines.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reagent_lite.cli import WorkflowArgs, log_level_from_env
from reagent_lite.config.loader import config_from_dict, read_config_file
from reagent_lite.config.models import BaseWorkflowConfig, WorkflowConfig
from reagent_lite.config.overrides import Overrides, apply_overrides, as_pairs
from reagent_lite.errors import ConfigError, DataError
from reagent_lite.kinds.registry import KindSpec, infer_kind, resolve_kind, spec_of_config
from reagent_lite.runner import check_node_index

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from reagent_lite.predict import Predictor
    from reagent_lite.serving.policy import Policy  # noqa: F401  (`__getattr__` serves it)

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | BaseWorkflowConfig
# A table given to `train`: a pandas DataFrame or a pyarrow Table (pandas is typed loosely).
TableData = Any


def load_config(
    config: ConfigSource, *, overrides: Overrides | None = None, workflow: str | None = None
) -> WorkflowConfig:
    """A validated config from a JSON file path, a dict or a config object, with `overrides`
    (`{"training.learning_rate": 1e-4}` or `["epochs=5"]`) applied first. The workflow is
    `workflow`, else the config's `workflow` key, else dqn when it lists `actions`.
    `ConfigError` names the key path, the bad value and what was expected."""
    config_, _, _ = _load(config, overrides, workflow)
    return config_


def _load(
    config: ConfigSource, overrides: Overrides | None, workflow: str | None
) -> tuple[WorkflowConfig, str, KindSpec]:
    """The config, where it came from, and its kind: resolved here, once."""
    if isinstance(config, BaseWorkflowConfig):
        own = spec_of_config(type(config))
        if own is None:
            raise ConfigError(
                f"config: {type(config).__name__} is not the config of a registered kind"
            )
        if not overrides and workflow in (None, own.name):
            return config, "<config object>", own
        data: Any = config.model_dump(mode="json")
        source = "<config object>"
    elif isinstance(config, Mapping):
        data, source = dict(config), "<config dict>"
    elif isinstance(config, str | os.PathLike):
        data, source = read_config_file(config), str(config)
    else:
        raise ConfigError(
            f"config: expected a path, a dict or a config object (got {type(config).__name__})"
        )
    if overrides and isinstance(data, dict):
        data = apply_overrides(data, overrides)
        source += " + overrides"
    spec = resolve_kind(workflow or infer_kind(data))
    return config_from_dict(data, spec.config, source=source), source, spec


@dataclass(frozen=True)
class RunResult:
    """What a finished `train` call left in `model_dir` (read back from its files)."""

    model_dir: Path
    workflow: str
    # Every record of metrics.jsonl in order: per-step loss records and one per epoch.
    metrics: tuple[dict[str, Any], ...]
    # The exported epoch's record (loss, eval_td_loss, cpe ...), as in model_meta.json.
    final_metrics: dict[str, Any]
    # The exported epoch, counted from 0 as in the files; None where this node wrote none.
    selected_epoch: int | None
    # The node that wrote the outputs (node 0); other nodes' results hold no files.
    wrote_outputs: bool = True
    online_evaluation: dict[str, Any] | None = field(default=None)

    @property
    def model_path(self) -> Path:
        return self.model_dir / "model.pt2"

    @property
    def epoch_metrics(self) -> tuple[dict[str, Any], ...]:
        """The per-epoch records of `metrics` (those with `transitions_per_s`)."""
        return tuple(r for r in self.metrics if "transitions_per_s" in r)

    @classmethod
    def read(cls, model_dir: str | os.PathLike[str]) -> RunResult:
        """The result of the finished run whose `model_output_path` is `model_dir`."""
        directory = Path(model_dir)
        meta_path, metrics_path = directory / "model_meta.json", directory / "metrics.jsonl"
        if not meta_path.is_file():
            raise ConfigError(
                f"model_dir: '{directory}' holds no model_meta.json (expected the "
                "model_output_path of a finished run)"
            )
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        records: list[dict[str, Any]] = []
        if metrics_path.is_file():
            lines = metrics_path.read_text(encoding="utf-8").splitlines()
            records = [json.loads(line) for line in lines if line.strip()]
        return cls(
            model_dir=directory,
            workflow=str(meta["workflow"]),
            metrics=tuple(records),
            final_metrics=dict(meta.get("final_metrics") or {}),
            selected_epoch=meta.get("selected_epoch"),
            online_evaluation=meta.get("online_evaluation"),
        )


def train(
    config: ConfigSource,
    *,
    overrides: Overrides | None = None,
    training_data: TableData | None = None,
    eval_data: TableData | None = None,
    node_index: int = 0,
    resume: bool = False,
    run_id: str | None = None,
) -> RunResult:
    """Runs the workflow `config` describes (see `load_config`) to the end, as
    `python -m workflows.<kind>_workflow` would, and returns what it wrote.

    `training_data` / `eval_data`: a pandas DataFrame or a pyarrow Table in the training
    table's layout (dict cells are feature maps) to train / evaluate on instead of the
    config's `training_data_path` / `eval_data_path`, which are then unused (and may be left
    out of the config). The table is written to `<model_output_path>/input_data/` as Parquet
    and the run reads that file, so every process of the run (on every node, with a
    `model_output_path` they all see) reads the same rows.

    `node_index`, `resume` and `run_id` mean what the command-line flags of the same names
    mean. Raises `ConfigError` / `DataError` / `DistributedError` / `TrainingError`."""
    # REAGENT_LITE_LOG_LEVEL is read here, once (models and training never read it).
    level = log_level_from_env()
    if level is not None:
        logging.getLogger("reagent_lite").setLevel(level)
    given = {"training_data_path": training_data, "eval_data_path": eval_data}
    given = {key: data for key, data in given.items() if data is not None}
    # A placeholder satisfies the config's required path until the table is written.
    if given:
        apply_overrides({}, overrides)  # a setting given twice is still refused
        overrides = {**dict(as_pairs(overrides)), **{key: f"<{key}>" for key in given}}
    cfg, source, spec = _load(config, overrides, None)
    check_node_index(cfg, node_index, source)
    # Relative paths resolve against the working directory, as on the command line.
    cfg = cfg.resolved()
    from reagent_lite.training.entry import check_finished_model, run_training

    if given:
        if node_index == 0:  # refused before the tables replace the finished run's inputs
            check_finished_model(cfg, resume=resume, overwrite=False)
        inputs = Path(cfg.model_output_path) / "input_data"
        written = {
            key: str(
                write_input(data, inputs / f"{key[: -len('_path')]}.node{node_index}.parquet", key)
            )
            for key, data in given.items()
        }
        cfg = cfg.model_copy(update=written)

    args = WorkflowArgs(config=Path(source), node_index=node_index, resume=resume, run_id=run_id)
    out = run_training(spec.load(), cfg, args)
    if out is None:
        return RunResult(
            model_dir=Path(cfg.model_output_path),
            workflow=spec.name,
            metrics=(),
            final_metrics={},
            selected_epoch=None,
            wrote_outputs=False,
        )
    return RunResult.read(out)


class Model:
    """An exported model (`model.pt2` + `model_meta.json`) ready to score data."""

    def __init__(self, predictor: Predictor) -> None:
        self._predictor = predictor
        self.meta: dict[str, Any] = predictor.meta
        self.workflow: str = predictor.kind.name
        # Column order of the tensors `__call__` takes and of the scores it returns.
        self.state_feature_ids: list[str] = predictor.space.state_ids
        # The kind's own ids as model_meta.json holds them (a kind without named actions or
        # action features has none).
        self.actions: list[str] = list(self.meta.get("actions") or [])
        self.action_feature_ids: list[str] = list(self.meta.get("action_feature_ids") or [])

    def score(self, data: Any, *, batch_size: int = 65_536) -> Any:
        """`data` (a pandas DataFrame or a pyarrow Table in the training table's layout;
        only the state column and `possible_actions` (required for parametric models; for
        dqn, when present, `best_action` is the best of each row's candidates) are read)
        with the score columns appended, of the same type: dqn adds `q_values` and
        `best_action`, parametric_dqn `candidate_scores`, `ranked_candidates` and
        `best_candidate`. Bad rows raise `DataError`, as `predict` does."""
        import pyarrow as pa

        if isinstance(data, pa.Table):
            return self._predictor.score(data, batch_size=batch_size, source="table")
        if _is_dataframe(data):
            scored = self._predictor.score(
                _frame_to_table(data), batch_size=batch_size, source="DataFrame"
            )
            return scored.to_pandas()
        raise ConfigError(
            f"data: expected a pandas DataFrame or a pyarrow Table (got {type(data).__name__}); "
            "call the model with tensors to score tensors"
        )

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        """Q values from raw tensors, in `model.pt2`'s signature: dqn `(state_values,
        state_presence) -> q [B, A]`; parametric `(state_values, state_presence,
        action_values, action_presence, candidate_mask) -> q [B, K]`."""
        import torch

        with torch.no_grad():
            out: torch.Tensor = self._predictor.program(*tensors)
        return out


def load_model(model_dir: str | os.PathLike[str]) -> Model:
    """The model a run exported to `model_dir` (its `model_output_path`, or `model.pt2`)."""
    from reagent_lite.predict import Predictor

    return Model(Predictor(Path(model_dir)))


def __getattr__(name: str) -> Any:
    # `Policy` (torch, numpy) loads on first use, as `load_model`'s modules do.
    if name == "Policy":
        from reagent_lite.serving.policy import Policy

        return Policy
    raise AttributeError(f"module 'reagent_lite.api' has no attribute {name!r}")


def write_input(data: TableData, path: Path, key: str) -> Path:
    """`data` (a DataFrame or an Arrow table given to `train`) written to the Parquet file
    `path`, atomically: the processes of one node may write the same rows at once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = key[: -len("_path")]
    if _is_dataframe(data):
        try:
            # Dict cells become struct columns, which the readers take as feature maps.
            table = pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowException, ValueError, TypeError):
            table = _frame_to_table(data)  # mixed cells: through Python records
    elif isinstance(data, pa.Table):
        table = data
    else:
        raise ConfigError(
            f"{name}: expected a pandas DataFrame or a pyarrow Table (got {type(data).__name__})"
        )
    if table.num_rows == 0:
        raise DataError(f"{name}: the table has no rows (expected logged transitions)")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        pq.write_table(table, partial)
        os.replace(partial, path)
    except OSError as err:
        partial.unlink(missing_ok=True)
        raise ConfigError(f"{name}: cannot write '{path}' ({err.strerror or err})") from err
    return path


def _is_dataframe(data: Any) -> bool:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        return False
    return isinstance(data, pd.DataFrame)


def _frame_to_table(frame: Any) -> pa.Table:
    from reagent_lite.data.jsonl import table_from_records

    # Through Python records so that dict cells become feature maps (Arrow's pandas
    # conversion would make them structs); array cells (from Parquet) become lists.
    records = [
        {key: _plain(value) for key, value in row.items()}
        for row in frame.to_dict(orient="records")
    ]
    return table_from_records(records, "DataFrame")


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None  # pandas' missing value (a null string is NaN in a `str` column)
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if (
        isinstance(value, list)
        and value
        and all(isinstance(e, tuple) and len(e) == 2 for e in value)
    ):
        # pandas holds an Arrow map cell as a list of (key, value) pairs.
        return {str(k): v for k, v in value}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
