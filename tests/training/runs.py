"""Tiny real runs on CPU: a dqn run for the tests of what a run writes, owns and loads, and
a set-up run with the CPE models for the tests of the training step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reagent_lite.config import config_from_dict
from reagent_lite.config.models import DQNWorkflowConfig, ParametricDQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.loop import Workflow
from tests.conftest import REPO_ROOT
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


_TINY_CPE = {"layers": [-1, 32, -1], "activations": ["relu", "linear"], "minibatch_size": 64}


def sample_data(root: Path, kind: str) -> Path:
    """Generated sample data for `kind` (gym CartPole for dqn, the synthetic environment for
    parametric_dqn) under `root`, made once per directory."""
    from reagent_lite.samples.generate import generate_sample_data

    data = root / f"data_{kind}"
    if not (data / "train.parquet").exists():
        if kind == "dqn":
            generate_sample_data(kind="gym", episodes=40, seed=1, output_dir=data)
        else:
            generate_sample_data(kind="synthetic_parametric", episodes=400, seed=1, output_dir=data)
    return data


def tiny_cpe_workflow(
    tmp: Path, kind: str, name: str, device: str = "cpu", **training: Any
) -> Workflow:
    """A set-up (not trained) run of `kind` with the CPE models on: a 32-unit network, two
    micro-batches per step, 2 epochs of 12 steps; `training` overrides training keys."""
    cfg: dict[str, Any] = {
        "training_data_path": str(sample_data(tmp, kind) / "train.parquet"),
        "model_output_path": str(tmp / name),
        "epochs": 2,
        "seed": 3,
        "checkpoint_every_epochs": 0,
        "use_gpu": device != "cpu",
        "training": {**_TINY_CPE, "minibatches_per_step": 2, "steps_per_epoch": 12, **training},
        "evaluation": {"calc_cpe_in_training": True},
    }
    cls: Any = DQNWorkflowConfig
    if kind == "dqn":
        cfg["actions"] = ["0", "1"]
    else:
        cls = ParametricDQNWorkflowConfig
    wf = Workflow(kind, config_from_dict(cfg, cls), DistContext.single(device))
    wf.setup()
    return wf


def run_in_mount_namespace(
    script: str, arg: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`python -c script arg` in a private mount namespace (where the script may mount a
    tmpfs and remount it read-only: a filesystem that really fails, even for root); the
    test is skipped where mount namespaces are not allowed (probed on the folder `arg`)."""
    probe = subprocess.run(["unshare", "-m", "mount", "-t", "tmpfs", "none", str(arg)],
                           capture_output=True, timeout=30, check=False)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip("needs mount namespaces (root): " + probe.stderr.decode()[-200:])
    cmd = ["unshare", "-m", "--propagation", "private", sys.executable, "-c", script, str(arg)]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip
