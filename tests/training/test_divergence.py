"""The end-of-epoch divergence check: Q-values within what the rewards allow are recorded
quietly; a Q-network far beyond max|r| / (1 − γ) is flagged and warned about once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.config import DQNWorkflowConfig, config_from_dict
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.divergence import check_q_values
from reagent_lite.training.loop import Workflow


def _workflow(tmp: Path) -> Workflow:
    from reagent_lite.samples.generate import generate_sample_data

    data = tmp / "data"
    generate_sample_data(kind="gym", episodes=40, seed=1, output_dir=data)
    cfg: dict[str, Any] = {
        "training_data_path": str(data / "train.parquet"),
        "eval_data_path": str(data / "eval.parquet"),
        "model_output_path": str(tmp / "out"),
        "actions": ["0", "1"],
        "epochs": 2,
        "seed": 3,
        "checkpoint_every_epochs": 0,
        "rl": {"gamma": 0.9},
        "training": {
            "layers": [-1, 16, -1],
            "activations": ["relu", "linear"],
            "minibatch_size": 64,
            "steps_per_epoch": 10,
        },
        "evaluation": {"calc_cpe_in_training": False},
    }
    wf = Workflow("dqn", config_from_dict(cfg, DQNWorkflowConfig), DistContext.single("cpu"))
    wf.setup()
    return wf


def test_q_values_are_checked_against_the_reward_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wf = _workflow(tmp_path)
    # CartPole: reward 1 per step, γ = 0.9 → no return beyond 10.
    assert wf.run.q_bound == pytest.approx(10.0)
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        wf.train()
    records = wf.history
    assert len(records) == 2
    for record in records:
        assert 0.0 < record["max_abs_q"] <= 10.0 * 2 and "q_diverging" not in record
    assert "diverging" not in caplog.text

    # A network whose values run away (as a diverged one's do): flagged, warned once.
    last = [m for m in wf.q_net.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.bias.fill_(1e4)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        run = wf.run
        first = check_q_values(run.kind, run.q_net, run.probe, run.q_bound, 2, warned=False)
        again = check_q_values(run.kind, run.q_net, run.probe, run.q_bound, 3, warned=True)
    assert first["q_diverging"] and again["q_diverging"] and first["max_abs_q"] > 1e3
    warnings = [r for r in caplog.records if "diverging" in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "cql_alpha" in text and "bcq_drop_threshold" in text and "epoch 3" in text
