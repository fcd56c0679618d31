"""MLflow tracking (the `mlflow` extra) against a local file store: params, per-epoch
metrics and the output files as artifacts, from a real tiny run; TensorBoard by config."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import pytest

import reagent_lite
from tests.conftest import REPO_ROOT
from tests.test_api import tiny_config
from tests.training.runs import run_in_mount_namespace

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
            reagent_lite.train(
                tiny_config(tmp_path), overrides={"tensorboard": True, "overwrite": True}
            )


def test_a_store_that_cannot_be_written_at_setup_warns_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    # A store directory that exists (so the pre-run check passes) but whose `.trash` is a
    # regular file: MLflow fails to start a run there, even as root. (A store under a
    # regular file is refused before the run: tests/test_extras.py.)
    (tmp_path / "mlruns").mkdir()
    (tmp_path / "mlruns" / ".trash").write_text("")
    store = (tmp_path / "mlruns").as_uri()
    cfg = tiny_config(tmp_path)
    cfg["mlflow"] = {"tracking_uri": store, "experiment_name": "tiny"}
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        result = reagent_lite.train(cfg, overrides={"epochs": 2, "training.steps_per_epoch": 4})
    assert (result.model_dir / "model_meta.json").is_file() and len(result.epoch_metrics) == 2
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mlflow:")]
    assert len(warned) == 1 and "starting a run failed on the tracking store" in warned[0]
    assert store in warned[0] and "training goes on without tracking" in warned[0]


# In a mount namespace of its own: the store on a tmpfs turned read-only once the first
# metrics are in it, while the run trains on.
_READ_ONLY_STORE = """
import logging, subprocess, sys, threading, time
from pathlib import Path
import reagent_lite
from tests.conftest import REPO_ROOT
from tests.test_api import tiny_config

logging.basicConfig(level=logging.WARNING)
tmp = Path(sys.argv[1])
store = tmp / "store"
subprocess.run(["mount", "-t", "tmpfs", "none", str(store)], check=True)


def freeze() -> None:
    while not any(store.rglob("metrics/*")):
        time.sleep(0.002)
    while subprocess.run(["mount", "-o", "remount,ro", str(store)]).returncode != 0:
        time.sleep(0.005)  # busy while a file there is open for writing
    print("read-only", flush=True)


threading.Thread(target=freeze, daemon=True).start()
cfg = tiny_config(tmp)
cfg["mlflow"] = {"tracking_uri": store.as_uri(), "experiment_name": "tiny"}
result = reagent_lite.train(cfg, overrides={"epochs": 6, "training.steps_per_epoch": 20})
print("epochs", len(result.epoch_metrics), (result.model_dir / "model_meta.json").is_file())
"""


def test_a_store_turning_read_only_mid_run_warns_once_and_training_goes_on(
    tmp_path: Path,
) -> None:
    (tmp_path / "store").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MLFLOW_ALLOW_FILE_STORE": "true"}
    done = run_in_mount_namespace(_READ_ONLY_STORE, tmp_path, env, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["read-only", "epochs 6 True"], done.stdout
    warned = [x for x in done.stderr.splitlines() if "mlflow:" in x]
    assert len(warned) == 1 and "failed on the tracking store" in warned[0], warned
    assert "Read-only file system" in warned[0]
