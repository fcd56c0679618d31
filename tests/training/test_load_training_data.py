"""Workflow.load_training_data: the streaming ingest gives what the whole-table path gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.loop import Workflow
from reagent_lite.training.verify import EMULATE_ENV
from tests.data.test_ingest import ACTIONS, rows, write


def _load(path: Path, tmp: Path, streaming: bool) -> Workflow:
    cfg = DQNWorkflowConfig(
        training_data_path=str(path),
        model_output_path=str(tmp / ("s" if streaming else "t")),
        actions=ACTIONS,
        use_gpu=False,
        use_all_avail_gpus=False,
        normalization_sample_size=150,  # fewer than the rows: the sampling is exercised
    )
    wf = Workflow("dqn", cfg, DistContext.single("cpu"))
    wf.load_training_data(streaming=streaming)
    return wf


@pytest.mark.parametrize("emulate", [None, "3"])
def test_streaming_equals_table_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulate: str | None
) -> None:
    if emulate:
        monkeypatch.setenv(EMULATE_ENV, emulate)
    path = write(tmp_path / "t.parquet", rows(400, late_feature_at=250), 64)
    new, old = _load(path, tmp_path, True), _load(path, tmp_path, False)
    assert new.space.to_json() == old.space.to_json()
    assert "11" in new.space.state_ids and "7" not in new.space.state_ids
    assert new.norm == old.norm
    assert new.emulated_shards == old.emulated_shards
    assert list(new.train_data.keys()) == list(old.train_data.keys())
    for name, t in old.train_data.items():
        got = new.train_data[name]
        assert got.dtype == t.dtype and got.shape == t.shape, name
        torch.testing.assert_close(got, t, rtol=0, atol=1e-6, msg=name)
    assert set(new.ingest_timings) >= {"read", "validate", "tensorize", "fit", "normalize"}
