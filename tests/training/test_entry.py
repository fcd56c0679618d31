"""training/entry.py: the launch plan the workflow derives from its config."""

from __future__ import annotations

from pathlib import Path

import pytest

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.distributed import plan as plan_module
from reagent_lite.training.entry import make_plan


def _cfg(tmp_path: Path, **kw: object) -> DQNWorkflowConfig:
    return DQNWorkflowConfig.model_validate(
        {
            "training_data_path": str(tmp_path / "t.parquet"),
            "model_output_path": str(tmp_path / "out"),
            "actions": ["a", "b"],
            **kw,
        }
    )


@pytest.mark.parametrize(("mode", "procs"), [("ddp", 4), ("dp", 1)])
def test_data_parallel_mode_sets_processes_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, procs: int
) -> None:
    # dp is one process driving every GPU through DataParallel; spawning one process per
    # GPU for it would train G replicas that never exchange gradients.
    monkeypatch.setattr(plan_module, "_visible_gpus", lambda: 4)
    plan = make_plan(_cfg(tmp_path, data_parallel=mode), 0, None)
    assert plan.procs_per_node == procs
    assert plan.world_size == procs
    assert plan.devices[0] == "cuda:0"
    assert plan.mode == ("single" if procs == 1 else "spawn")
