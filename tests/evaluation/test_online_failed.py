"""A policy that times out on most online episodes is reported as failed, not "within
noise" of a logger that never reached the goal either: one real Acrobot run on all-random
logs, and the rule on its own."""

from __future__ import annotations

import json
from pathlib import Path

from reagent_lite.evaluation.online import failed
from tests.conftest import run_module
from tests.workflows.test_end_to_end import make_config


def test_a_run_whose_policy_times_out_is_reported_failed(tmp_path: Path) -> None:
    # Acrobot charges -1 a step until the goal; uniformly random logs of 6 episodes never
    # reach it (the logger's mean is the time-out's, -500), and 2 updates teach nothing:
    # every online episode runs into the 500-step limit.
    config = make_config(
        tmp_path,
        "dqn",
        actions=["0", "1", "2"],
        epochs=1,
        sample_data={
            "kind": "gym",
            "env": "Acrobot-v1",
            "episodes": 6,
            "policy": "random",
            "eval_fraction": 0.5,
        },
        training={"steps_per_epoch": 2},
        evaluation={"calc_cpe_in_training": False, "online_episodes": 2},
    )
    proc = run_module("workflows.dqn_workflow", "--config", str(config), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    online = json.loads((out / "model_meta.json").read_text())["online_evaluation"]
    assert online["mean_return"] == -500.0 and online["timed_out"] == 2
    lines = (out / "summary.txt").read_text().splitlines()
    (verdict,) = [line for line in lines if line.startswith("verdict:")]
    assert verdict == "verdict:   FAILED (2 of 2 online episodes timed out short of the goal)"
    assert lines[-1].startswith("next:      do not serve it; the logs may show too few")


def test_failed_means_more_than_half_of_the_episodes_timed_out() -> None:
    assert failed({"episodes": 30, "timed_out": 15}) is None
    assert failed({"episodes": 30, "timed_out": 16}) == (
        "16 of 30 online episodes timed out short of the goal"
    )
    # A result written before the count (or no online check at all) says nothing.
    assert failed({"episodes": 30, "mean_return": -500.0}) is None
    assert failed(None) is None
