"""The Python API (`reagent_lite.train`, `load_config`, `load_model`), used as a notebook
or pipeline would: a real tiny CartPole run in-process, typed errors, logging left alone."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import reagent_lite
from reagent_lite.config.loader import load_config as load_config_file
from reagent_lite.config.models import DQNWorkflowConfig

REPO = Path(__file__).resolve().parents[1]


def tiny_config(tmp_path: Path) -> dict[str, Any]:
    cfg = json.loads((REPO / "sample_configs/ci/dqn_1node.json").read_text())
    cfg.pop("$schema")
    cfg["training_data_path"] = str(tmp_path / "data/train.parquet")
    cfg["eval_data_path"] = str(tmp_path / "data/eval.parquet")
    cfg["model_output_path"] = str(tmp_path / "model")
    cfg["evaluation"] = {"bootstrap_samples": 5, "online_episodes": 0}
    return cfg


def test_train_returns_the_run_and_the_model_scores_frames_tables_and_tensors(
    tmp_path: Path,
) -> None:
    result = reagent_lite.train(
        tiny_config(tmp_path), overrides={"epochs": 1, "training.steps_per_epoch": 5}
    )
    assert isinstance(result, reagent_lite.RunResult)
    with pytest.raises(AttributeError):
        result.selected_epoch = 3  # type: ignore[misc]  # a frozen record
    assert result.model_dir == tmp_path / "model"
    assert result.model_path.is_file()
    assert result.selected_epoch == 0
    # The overrides reached the run: one epoch of 5 steps.
    (epoch,) = result.epoch_metrics
    assert epoch["epoch"] == 0 and epoch["steps"] == 5
    assert result.metrics[-1] == epoch
    assert "doubly_robust" in result.final_metrics["cpe"]
    saved = json.loads((tmp_path / "model/config.json").read_text())
    assert saved["epochs"] == 1 and saved["training"]["steps_per_epoch"] == 5

    model = reagent_lite.load_model(result.model_dir)
    frame = pd.read_parquet(tmp_path / "data/eval.parquet").head(7)
    scored = model.score(frame)
    assert isinstance(scored, pd.DataFrame) and len(scored) == 7
    assert set(scored["best_action"]) <= {"0", "1"}
    table = pq.read_table(tmp_path / "data/eval.parquet").slice(0, 7)
    from_table = model.score(table)
    q_frame = np.stack(list(scored["q_values"]))
    np.testing.assert_allclose(np.array(from_table.column("q_values").to_pylist()), q_frame)
    f = len(model.state_feature_ids)
    q = model(torch.zeros(3, f), torch.ones(3, f))
    assert q.shape == (3, len(model.actions))


def test_errors_are_typed_never_system_exit(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    with pytest.raises(reagent_lite.ConfigError, match="did you mean 'learning_rate'"):
        reagent_lite.train(cfg, overrides=["training.learning_rat=1e-4"])
    with pytest.raises(reagent_lite.ConfigError, match="--node_index: must be in"):
        reagent_lite.train(cfg, node_index=1)
    missing = {**cfg, "sample_data": None, "eval_data_path": None}
    with pytest.raises(
        reagent_lite.ReagentLiteError, match=r"training_data_path: .* does not exist"
    ):
        reagent_lite.train(missing)
    with pytest.raises(reagent_lite.ConfigError, match=r"holds no model\.pt2"):
        reagent_lite.load_model(tmp_path)
    assert issubclass(reagent_lite.DataError, reagent_lite.ReagentLiteError)
    assert reagent_lite.TrainingError.exit_code == 5


def test_load_config_from_path_dict_or_object_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(tiny_config(tmp_path)))
    from_path = reagent_lite.load_config(path, overrides=["training.learning_rate=1e-4"])
    assert isinstance(from_path, DQNWorkflowConfig)
    assert from_path.training.learning_rate == 1e-4
    from_dict = reagent_lite.load_config(tiny_config(tmp_path), overrides={"rl.gamma": 0.5})
    assert from_dict.rl.gamma == 0.5
    again = reagent_lite.load_config(from_dict, overrides={"epochs": 7})
    assert again.epochs == 7 and again.rl.gamma == 0.5
    assert load_config_file(path, DQNWorkflowConfig).epochs == from_path.epochs
    with pytest.raises(reagent_lite.ConfigError, match=r"cfg.json \+ overrides: rl.gamma: input"):
        reagent_lite.load_config(path, overrides=["rl.gamma=2"])


def test_importing_the_library_leaves_logging_alone() -> None:
    # Importing and configuring must not detach the library's loggers from the user's root
    # handlers (the command line configures logging, a program keeps its own).
    for name in ("reagent_lite", "reagent_lite.config", "reagent_lite.training"):
        logger = logging.getLogger(name)
        assert logger.propagate
        assert not logger.handlers


def test_train_takes_a_dataframe_and_an_arrow_table_instead_of_paths(tmp_path: Path) -> None:
    from tests.data.test_ingest import ACTIONS, rows

    # Dict cells (feature maps) in a DataFrame; the eval rows as an Arrow table; the config
    # names no data path at all.
    frame = pd.DataFrame(rows(300))
    eval_table = pa.Table.from_pylist(rows(100, seed=1))
    config = {"actions": ACTIONS, "model_output_path": str(tmp_path / "model"), "epochs": 1}
    result = reagent_lite.train(
        config, training_data=frame, eval_data=eval_table, overrides=["training.minibatch_size=32"]
    )
    (epoch,) = result.epoch_metrics
    assert epoch["steps"] == 10  # ceil(300 / 32): every row of the frame was read
    assert "eval_td_loss" in epoch  # and the eval table was evaluated
    saved = json.loads((tmp_path / "model/config.json").read_text())
    inputs = tmp_path / "model/input_data"
    assert saved["training_data_path"] == str(inputs / "training_data.node0.parquet")
    assert saved["eval_data_path"] == str(inputs / "eval_data.node0.parquet")
    assert pq.read_metadata(saved["training_data_path"]).num_rows == 300
    scored = reagent_lite.load_model(result.model_dir).score(frame.head(4))
    assert len(scored) == 4 and set(scored["best_action"]) <= set(ACTIONS)
    # Again into the finished run's directory: refused before its inputs are replaced.
    before = Path(saved["training_data_path"]).read_bytes()
    with pytest.raises(reagent_lite.ConfigError, match="holds the finished model"):
        reagent_lite.train(config, training_data=frame.head(50))
    assert Path(saved["training_data_path"]).read_bytes() == before


def test_train_refuses_data_that_is_not_a_table(tmp_path: Path) -> None:
    config = {"actions": ["a", "b"], "model_output_path": str(tmp_path / "model")}
    with pytest.raises(reagent_lite.ConfigError, match=r"training_data: expected a pandas"):
        reagent_lite.train(config, training_data=[{"reward": 1.0}])
