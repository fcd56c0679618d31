"""A run that ends with its Q-network diverged exports no model: exit 5 naming the epoch,
max|Q| and the remedy, the checkpoints kept; `training.export_diverged_model` exports it
anyway. A run that does not diverge exports as ever."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from reagent_lite.training import checkpoint as ckpt
from tests.conftest import run_module
from tests.data.test_ingest import ACTIONS, write
from tests.training.runs import run_workflow, tiny_dqn_config
from tests.workflows.nodes import Job


def _data(path: Path, growth: float) -> Path:
    """One-step episodes whose next state is the state times `growth`, reward 0.01: past
    growth × γ > 1 the bootstrapped targets feed on themselves (the Q-network extrapolates
    to next states beyond the states it is fitted on), and |Q| doubles every epoch."""
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for i in range(200):
        x = float(rng.uniform(1.0, 2.0))
        rows.append(
            {
                "mdp_id": i,
                "sequence_number": 0,
                "state_features": {"0": x},
                "action": ACTIONS[i % 2],
                "reward": 0.01,
                "next_state_features": {"0": growth * x},
                "next_action": ACTIONS[0],
                "possible_actions": ACTIONS,
                "possible_next_actions": ACTIONS,
                "action_probability": 0.5,
                "time_diff": 1,
            }
        )
    return write(path, rows, 100)


def _config(tmp: Path, growth: float) -> dict[str, Any]:
    return {
        "training_data_path": str(_data(tmp / "t.parquet", growth)),
        "model_output_path": str(tmp / "out"),
        "actions": ACTIONS,
        "use_gpu": False,
        "epochs": 3,
        "seed": 0,
        "checkpoint_every_epochs": 1,
        "rl": {"gamma": 0.99},
        "training": {
            "layers": [-1, 8, -1],
            "activations": ["relu", "linear"],
            "minibatch_size": 64,
            "learning_rate": 0.01,
            "steps_per_epoch": 30,
        },
        "evaluation": {"calc_cpe_in_training": False},
    }


def test_a_diverged_run_keeps_its_checkpoints_and_writes_no_model(tmp_path: Path) -> None:
    config = tmp_path / "dqn.json"
    config.write_text(json.dumps(_config(tmp_path, growth=4.0)))
    out = tmp_path / "out"
    done = run_module("workflows.dqn_workflow", "--config", str(config), timeout=240)
    assert done.returncode == 5, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    message = done.stderr
    assert "the Q-network diverged: from epoch 1 on" in message
    assert "max|Q|" in message and "(bound max|r| / (1 - gamma) = 1)" in message
    assert "e.g. training.cql_alpha=1.0" in message
    assert "training.export_diverged_model=true" in message
    assert not (out / "model.pt2").exists() and not (out / "model_meta.json").exists()
    newest = ckpt.latest_checkpoint(out)
    assert newest is not None and newest.name == "epoch_00002.pt"
    assert ckpt.load_checkpoint(newest)["history"][-1]["q_diverging"] is True

    # A user who knows: the finished run resumed (nothing left to train) and exported.
    again = run_module(
        "workflows.dqn_workflow",
        "--config",
        str(config),
        "--resume",
        "training.export_diverged_model=true",
        timeout=240,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "export_diverged_model is on: writing model.pt2 although" in again.stderr
    meta = json.loads((out / "model_meta.json").read_text())
    assert meta["final_metrics"]["q_diverging"] is True and (out / "model.pt2").exists()


def test_every_node_of_a_diverged_job_stops_with_the_same_error(tmp_path: Path) -> None:
    # Rank 0 alone evaluates the Q-values; every rank must still stop, and together.
    cfg = _config(tmp_path, growth=4.0)
    cfg.update(
        num_nodes=2,
        init_method=(tmp_path / "rdzv").as_uri(),
        rendezvous_timeout_s=60,
        collective_timeout_s=30,
    )
    config = tmp_path / "dqn.json"
    config.write_text(json.dumps(cfg))
    job = Job("dqn", config, tmp_path / "logs")
    try:
        nodes = [job.start(k) for k in (0, 1)]
        codes = [node.wait() for node in nodes]
    finally:
        job.close()
    logs = [node.text() for node in nodes]
    assert codes == [5, 5], logs[0][-3000:] + logs[1][-3000:]
    assert "the Q-network diverged: from epoch 1 on" in logs[0]
    assert all("Traceback" not in log for log in logs)
    assert not (tmp_path / "out" / "model.pt2").exists()


def test_a_run_that_does_not_diverge_exports_its_model(tmp_path: Path) -> None:
    # The same data with next states that shrink: the targets settle.
    config = _config(tmp_path, growth=0.5)
    cfg = tiny_dqn_config(
        tmp_path,
        epochs=3,
        rl=config["rl"],
        training=config["training"],
    )
    wf = run_workflow(cfg, save=True)
    assert [r.get("q_diverging", False) for r in wf.history] == [False] * 3
    assert (tmp_path / "out" / "model.pt2").exists()
