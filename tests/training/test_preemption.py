"""Preemption in one process: SIGTERM mid-epoch stops at a step with a checkpoint, and
`--resume` from it ends with exactly the weights of an uninterrupted run."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.training import checkpoint as ckpt
from reagent_lite.training.loop import Workflow
from reagent_lite.training.metrics import read_metrics
from reagent_lite.training.preemption import Preempted, StopSignals
from tests.data.test_ingest import ACTIONS, rows, write


def _config(tmp: Path, out: str = "out", **extra: Any) -> DQNWorkflowConfig:
    data = tmp / "t.parquet"
    if not data.exists():
        write(data, rows(300), 100)
    return DQNWorkflowConfig(
        training_data_path=str(data),
        eval_data_path=str(data),
        model_output_path=str(tmp / out),
        actions=ACTIONS,
        use_gpu=False,
        use_all_avail_gpus=False,
        epochs=extra.pop("epochs", 2),
        log_every_steps=1,
        # Dropout draws from the RNG and the CPE side models train too: both must resume.
        training={
            "layers": [-1, 16, -1],
            "activations": ["relu", "linear"],
            "minibatch_size": 32,
            "dropout_ratio": 0.3,
        },
        evaluation={"calc_cpe_in_training": True, "bootstrap_samples": 0},
        **extra,
    )


def _run(
    cfg: DQNWorkflowConfig,
    *,
    resume: bool = False,
    kill_at: int = 0,
    signum: signal.Signals = signal.SIGTERM,
) -> Workflow:
    """One run; with `kill_at`, `signum` arrives during that global step."""
    with StopSignals() as stop:
        wf = Workflow("dqn", cfg, DistContext.single("cpu"), resume=resume, stop=stop)
        try:
            wf.setup()
            if kill_at:
                runner = wf.step_runner()
                plain, taken = runner.step, [0]

                def step() -> None:
                    plain()
                    taken[0] += 1  # a fresh run: its global step
                    if taken[0] == kill_at:
                        os.kill(os.getpid(), signum)

                runner.step = step  # type: ignore[method-assign]
            wf.train()
        finally:
            wf.cleanup()
    return wf


def _weights(wf: Workflow) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in wf.q_net.state_dict().items()}


def test_sigterm_mid_epoch_checkpoints_and_resume_is_bit_for_bit(tmp_path: Path) -> None:
    want = _weights(_run(_config(tmp_path, "full")))
    cfg = _config(tmp_path, "cut")
    with pytest.raises(Preempted) as stopped:
        _run(cfg, kill_at=14)  # 10 steps per epoch: step 4 of epoch 2
    assert stopped.value.exit_code == 143
    message = str(stopped.value)
    assert "SIGTERM" in message and "--resume" in message and "\n" not in message
    newest = ckpt.latest_checkpoint(tmp_path / "cut")
    assert newest is not None and newest.name == "epoch_00001_step_000000004.pt", newest
    assert str(newest) in message
    assert ckpt.load_checkpoint(newest)["global_step"] == 14

    resumed = _run(cfg, resume=True)
    assert resumed.global_step == 20
    got = _weights(resumed)
    for name in want:
        assert torch.equal(want[name], got[name]), name
    # Each step's record once, in order, across the stop.
    records = read_metrics(tmp_path / "cut" / "metrics.jsonl")
    step_records = [r["steps"] for r in records if "transitions_per_s" not in r]
    assert step_records == list(range(1, 21))
    # The resumed epoch's throughput counts the 6 steps it ran and timed, not all 10.
    epochs = [r for r in records if "transitions_per_s" in r]
    assert [(r["epoch"], r["steps_timed"]) for r in epochs] == [(0, 10), (1, 6)]


def test_a_resumed_streamed_epoch_counts_only_its_timed_wait_for_rows(tmp_path: Path) -> None:
    """`data_wait_s` of an epoch resumed at its last step: the skipped steps' waits for
    windows (read while the stream caught up, before the clock started) are not counted,
    so the wait is within the time the epoch's record measured."""
    cfg = _config(
        tmp_path, "cut", stream_from_disk=True, stream_prepare=False, stream_window_rows=64
    )
    with pytest.raises(Preempted):
        _run(cfg, kill_at=19)  # 10 steps per epoch: step 9 of epoch 2
    _run(cfg, resume=True)
    epochs = [r for r in read_metrics(tmp_path / "cut" / "metrics.jsonl") if "loss" in r]
    last = [r for r in epochs if "transitions_per_s" in r][-1]
    assert (last["epoch"], last["steps_timed"]) == (1, 1)
    timed = last["steps_timed"] * 32 / last["transitions_per_s"]
    assert 0 < last["data_wait_s"] <= timed, (last["data_wait_s"], timed)


def test_checkpoints_on_a_step_cadence(tmp_path: Path) -> None:
    cfg = _config(tmp_path, checkpoint_every_steps=3, checkpoint_every_epochs=0, epochs=1)
    _run(cfg)
    names = [p.name for p in ckpt.list_checkpoints(tmp_path / "out")]
    # Steps 3, 6 and 9 of 10; three kept.
    assert names == [f"epoch_00000_step_{s:09d}.pt" for s in (3, 6, 9)]


def test_sigint_exits_130_and_a_clock_cadence_checkpoints(tmp_path: Path) -> None:
    # A cadence of a few microseconds: due at every step.
    cfg = _config(tmp_path, checkpoint_every_minutes=1e-7, checkpoint_every_epochs=0, epochs=1)
    with pytest.raises(Preempted) as stopped:
        _run(cfg, kill_at=6, signum=signal.SIGINT)
    assert stopped.value.exit_code == 130 and "SIGINT" in str(stopped.value)
    names = [p.name for p in ckpt.list_checkpoints(tmp_path / "out")]
    assert names == [f"epoch_00000_step_{s:09d}.pt" for s in (4, 5, 6)]
