"""training/loop.py: the Workflow object in one CPU process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.checkpoint import list_checkpoints
from reagent_lite.training.loop import Workflow
from reagent_lite.training.metrics import read_metrics
from tests.data.test_ingest import ACTIONS, rows, write
from tests.training.runs import run_workflow as _run


def test_resume_drops_metrics_of_the_epochs_it_redoes(tmp_path: Path) -> None:
    data = write(tmp_path / "t.parquet", rows(300), 100)
    cfg = DQNWorkflowConfig(
        training_data_path=str(data),
        model_output_path=str(tmp_path / "out"),
        actions=ACTIONS,
        use_gpu=False,
        use_all_avail_gpus=False,
        epochs=2,
        log_every_steps=1,
        training={"layers": [-1, 8, -1], "activations": ["relu", "linear"], "minibatch_size": 64},
        evaluation={"calc_cpe_in_training": False},
    )
    wf = _run(cfg, resume=False)
    out = tmp_path / "out"
    # As if the job died after epoch 2's metrics but before its checkpoint landed.
    last = list_checkpoints(out)[-1]
    assert last.name == "epoch_00001.pt" and last.parent.name == wf.run_id
    last.unlink()
    before = read_metrics(out / "metrics.jsonl")
    assert any(r["epoch"] == 1 for r in before)

    wf = _run(cfg, resume=True)
    assert wf.start_epoch == 1
    records = read_metrics(out / "metrics.jsonl")
    per_epoch = [r["epoch"] for r in records if "transitions_per_s" in r]
    assert per_epoch == [0, 1]
    steps = [r["steps"] for r in records if "transitions_per_s" not in r]
    assert steps == sorted(steps) and len(steps) == len(set(steps)), "step records repeated"
    # Epoch 0's records are those of the first run, untouched.
    assert [r for r in records if r["epoch"] == 0] == [r for r in before if r["epoch"] == 0]


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)
def test_data_parallel_trains_with_cpe_side_models(tmp_path: Path) -> None:
    # dp: one process, the Q-network under DataParallel. The CPE models take a batch object
    # DataParallel cannot scatter, so they must stay unwrapped.
    data = write(tmp_path / "t.parquet", rows(300), 100)
    cfg = DQNWorkflowConfig(
        training_data_path=str(data),
        eval_data_path=str(data),
        model_output_path=str(tmp_path / "out"),
        actions=ACTIONS,
        data_parallel="dp",
        epochs=1,
        training={"layers": [-1, 8, -1], "activations": ["relu", "linear"], "minibatch_size": 64},
        evaluation={"bootstrap_samples": 0},
    )
    wf = Workflow("dqn", cfg, DistContext.single("cuda:0"))
    try:
        wf.setup()
        assert isinstance(wf.q_net_ddp, nn.DataParallel)
        assert wf.cpe is not None and not isinstance(wf.cpe.nets, nn.DataParallel)
        wf.train()
    finally:
        wf.cleanup()
    assert [r["epoch"] for r in wf.history] == [0]
