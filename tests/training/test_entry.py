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


def test_sample_data_never_replaces_an_existing_eval_file(tmp_path: Path) -> None:
    """Training data missing, eval data present: generating would overwrite the user's eval
    file with sample rows, so the run stops first, naming both paths."""
    from reagent_lite.errors import ConfigError
    from reagent_lite.training.entry import preflight

    mine = tmp_path / "my_eval.parquet"
    mine.write_bytes(b"the user's own eval data")
    cfg = _cfg(
        tmp_path,
        training_data_path=str(tmp_path / "new" / "train.parquet"),
        eval_data_path=str(mine),
        sample_data={"kind": "gym", "episodes": 20},
    )
    with pytest.raises(ConfigError, match=r"eval_data_path: .* exists but training_data_path"):
        preflight(cfg, make_plan(cfg, 0, None))
    assert mine.read_bytes() == b"the user's own eval data"
    assert not (tmp_path / "new" / "train.parquet").exists()
