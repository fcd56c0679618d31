"""MLflow tracking (the `mlflow` extra) against a local file store: params, per-epoch
metrics and the output files as artifacts, from a real tiny run; TensorBoard by config."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import reagent_lite
from tests.test_api import tiny_config

mlflow = pytest.importorskip("mlflow")


def test_run_logs_params_metrics_and_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MLflow 3 keeps the file store behind this switch (it prefers a database).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = (tmp_path / "mlruns").as_uri()
    cfg = tiny_config(tmp_path)
    cfg["mlflow"] = {"tracking_uri": store, "experiment_name": "tiny", "run_name": "r1"}
    result = reagent_lite.train(cfg, overrides={"epochs": 2, "training.steps_per_epoch": 4})

    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("tiny").experiment_id])
    assert run.info.run_name == "r1" and run.info.status == "FINISHED"
    assert run.data.params["epochs"] == "2"
    assert run.data.params["training.minibatch_size"] == "64"
    history = client.get_metric_history(run.info.run_id, "transitions_per_s")
    assert [m.step for m in history] == [r["steps"] for r in result.epoch_metrics] == [4, 8]
    dr = client.get_metric_history(run.info.run_id, "cpe/doubly_robust/normalized")
    assert len(dr) == 2
    names = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert {"model/model.pt2", "model/model_meta.json", "model/metrics.jsonl"} <= names
    assert "model/checkpoints" not in names


def test_tensorboard_is_switched_by_the_config(tmp_path: Path) -> None:
    # Off by default whether or not the package is installed; asked for without the
    # package, the run stops before training with a config error naming the key.
    result = reagent_lite.train(
        tiny_config(tmp_path), overrides={"epochs": 1, "training.steps_per_epoch": 2}
    )
    assert not (result.model_dir / "tensorboard").exists()
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(reagent_lite.ConfigError, match="tensorboard: true needs"):
            reagent_lite.train(tiny_config(tmp_path), overrides={"tensorboard": True})
