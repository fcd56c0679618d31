"""A tiny real dqn run on CPU, for the tests of what a run writes, owns and loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.loop import Workflow
from tests.data.test_ingest import ACTIONS, rows, write


def tiny_dqn_config(tmp: Path, **extra: Any) -> DQNWorkflowConfig:
    """200 logged rows in `tmp/t.parquet` (written once), an 8-unit network, no CPE;
    `extra` overrides top-level keys (`training` is merged)."""
    data = tmp / "t.parquet"
    if not data.exists():
        write(data, rows(200), 100)
    training = {"layers": [-1, 8, -1], "activations": ["relu", "linear"], "minibatch_size": 64}
    return DQNWorkflowConfig(
        training_data_path=str(data),
        model_output_path=str(tmp / "out"),
        actions=ACTIONS,
        use_gpu=False,
        use_all_avail_gpus=False,
        epochs=extra.pop("epochs", 2),
        training={**training, **extra.pop("training", {})},
        evaluation={"calc_cpe_in_training": False},
        **extra,
    )


def run_workflow(cfg: DQNWorkflowConfig, *, resume: bool = False, save: bool = False) -> Workflow:
    """setup, train, (save), cleanup — what a rank of the command runs."""
    wf = Workflow("dqn", cfg, DistContext.single("cpu"), resume=resume)
    try:
        wf.setup()
        wf.train()
        if save:
            wf.save()
    finally:
        wf.cleanup()
    return wf
