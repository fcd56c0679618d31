"""training/steps.py `plan_steps`: the steps per epoch, and the warning when they are few."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.steps import plan_steps
from tests.data.test_ingest import ACTIONS


def _config(tmp: Path, **training: object) -> DQNWorkflowConfig:
    return DQNWorkflowConfig(
        training_data_path=str(tmp / "t.parquet"),
        model_output_path=str(tmp / "out"),
        actions=ACTIONS,
        use_gpu=False,
        use_all_avail_gpus=False,
        training={"layers": [-1, 8, -1], "activations": ["relu", "linear"], **training},
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_few_steps_per_epoch_warn_once_with_rows_batch_and_the_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reagent_lite")
    # The case: 2,009 rows at 1,024 rows per step are 2 steps an epoch.
    steps, _ = plan_steps(
        _config(tmp_path, minibatch_size=1024), DistContext.single("cpu"), 2009, None
    )
    assert steps == 2
    (message,) = _warnings(caplog)
    for part in ("only 2 optimizer steps per epoch", "2009 rows", "1024 rows per step"):
        assert part in message, message
    assert "training.minibatch_size" in message and "training.steps_per_epoch" in message


def test_a_fixed_small_steps_per_epoch_warns_naming_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reagent_lite")
    cfg = _config(tmp_path, minibatch_size=16, steps_per_epoch=3)
    steps, _ = plan_steps(cfg, DistContext.single("cpu"), 2009, None)
    assert steps == 3
    (message,) = _warnings(caplog)
    assert "training.steps_per_epoch is 3" in message, message


def test_ten_or_more_steps_say_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reagent_lite")
    steps, _ = plan_steps(
        _config(tmp_path, minibatch_size=200), DistContext.single("cpu"), 2000, None
    )
    assert steps == 10
    assert _warnings(caplog) == []
