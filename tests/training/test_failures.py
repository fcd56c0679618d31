"""A run that cannot go on stops with a clear error and leaves earlier outputs intact."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from reagent_lite.training.checkpoint import latest_checkpoint, load_checkpoint
from tests.conftest import run_module
from tests.workflows.test_end_to_end import make_config


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_loss_overflow_stops_and_keeps_last_good_checkpoint(tmp_path: Path) -> None:
    config = make_config(tmp_path, "dqn", epochs=1, evaluation={"calc_cpe_in_training": False})
    first = run_module("workflows.dqn_workflow", "--config", str(config), timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "out"
    model_digest = _digest(out / "model.pt2")
    checkpoint = latest_checkpoint(out)
    assert checkpoint is not None

    # Finite but absurd rewards pass validation and overflow the squared TD error.
    train_path = tmp_path / "data" / "train.parquet"
    table = pq.read_table(train_path)
    rewards = pa.array([3.0e38] * table.num_rows, type=table.schema.field("reward").type)
    pq.write_table(
        table.set_column(table.schema.get_field_index("reward"), "reward", rewards), train_path
    )
    # A fresh run on that data (--resume refuses a table changed since its checkpoint),
    # allowed to replace the finished model: it fails before it does.
    second = run_module(
        "workflows.dqn_workflow", "--config", str(config), "--overwrite", timeout=240
    )
    assert second.returncode == 5, second.stderr[-3000:]
    assert "loss became" in second.stderr
    assert "Last good checkpoint: none yet" in second.stderr
    assert "Traceback" not in second.stderr
    # The earlier model is untouched and the earlier run's checkpoint still loads.
    assert _digest(out / "model.pt2") == model_digest
    assert checkpoint.exists()
    state = load_checkpoint(checkpoint)
    assert state["epoch"] == 0
    assert all(torch.isfinite(v).all() for v in state["q_net"].values())


def test_warm_start_from_previous_run_and_mismatch_is_a_config_error(tmp_path: Path) -> None:
    first_cfg = make_config(
        tmp_path / "a", "dqn", epochs=1, evaluation={"calc_cpe_in_training": False}
    )
    assert (
        run_module("workflows.dqn_workflow", "--config", str(first_cfg), timeout=240).returncode
        == 0
    )
    previous = tmp_path / "a" / "out"

    warm = make_config(
        tmp_path / "b",
        "dqn",
        epochs=1,
        evaluation={"calc_cpe_in_training": False},
        training={"warm_start_model_path": str(previous)},
    )
    result = run_module("workflows.dqn_workflow", "--config", str(warm), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warm-started the Q-network" in result.stderr

    wider = make_config(
        tmp_path / "c",
        "dqn",
        epochs=1,
        evaluation={"calc_cpe_in_training": False},
        training={
            "layers": [-1, 48, -1],
            "activations": ["relu", "linear"],
            "warm_start_model_path": str(previous),
        },
    )
    result = run_module("workflows.dqn_workflow", "--config", str(wider), timeout=240)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "training.warm_start_model_path" in result.stderr
    assert "size mismatch" in result.stderr  # which tensors differ, not just that some do
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "c" / "out" / "model.pt2").exists()

    # Files that are not a previous run's model state: named, never a traceback.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "empty.pt").write_bytes(b"")
    torch.save(torch.load(previous / "model_state.pt")["q_net"], bad / "bare_state_dict.pt")
    files = [
        bad / "empty.pt",
        bad / "bare_state_dict.pt",
        tmp_path / "a" / "data" / "train.parquet",
    ]
    for i, file in enumerate(files):
        cfg = make_config(
            tmp_path / f"d{i}", "dqn", epochs=1, evaluation={"calc_cpe_in_training": False},
            training={"warm_start_model_path": str(file)},
        )  # fmt: skip
        result = run_module("workflows.dqn_workflow", "--config", str(cfg), timeout=240)
        assert result.returncode == 2, (file, result.stderr[-3000:])
        assert f"training.warm_start_model_path: '{file}'" in result.stderr
        assert "model_state.pt" in result.stderr and "Traceback" not in result.stderr


def test_resume_from_a_checkpoint_that_does_not_fit_or_is_damaged(tmp_path: Path) -> None:
    config = make_config(tmp_path, "dqn", epochs=1, evaluation={"calc_cpe_in_training": False})
    first = run_module("workflows.dqn_workflow", "--config", str(config), timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    checkpoint = latest_checkpoint(tmp_path / "out")
    assert checkpoint is not None
    cfg = json.loads(config.read_text())
    cfg["epochs"] = 2
    cfg["training"] = {**cfg.get("training", {}), "layers": [-1, 24, -1],
                       "activations": ["relu", "linear"]}  # fmt: skip
    config.write_text(json.dumps(cfg))
    other = run_module("workflows.dqn_workflow", "--config", str(config), "--resume", timeout=240)
    assert other.returncode == 2, other.stderr[-3000:]
    assert f"--resume: checkpoint {checkpoint}: the config changes what" in other.stderr
    assert "training.layers" in other.stderr and "Traceback" not in other.stderr

    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])  # truncated (a full disk, a kill)
    damaged = run_module("workflows.dqn_workflow", "--config", str(config), "--resume", timeout=240)
    assert damaged.returncode == 2, damaged.stderr[-3000:]
    assert f"--resume: checkpoint {checkpoint} cannot be read" in damaged.stderr
    assert "Traceback" not in damaged.stderr
