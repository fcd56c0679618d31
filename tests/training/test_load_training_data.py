"""Workflow.load_training_data: the streaming ingest gives what the whole-table path gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.config.models import DQNWorkflowConfig, ParametricDQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.loop import Workflow
from reagent_lite.training.verify import EMULATE_ENV
from tests.data.test_ingest import ACTIONS, rows, write
from tests.data.test_ingest_parametric import parametric_rows, write_parametric


def _load(path: Path, tmp: Path, streaming: bool, kind: str = "dqn", **extra: Any) -> Workflow:
    settings: dict[str, Any] = {
        "training_data_path": str(path),
        "model_output_path": str(tmp / ("s" if streaming else "t")),
        "use_gpu": False,
        "use_all_avail_gpus": False,
        "normalization_sample_size": 150,  # fewer than the rows: the sampling is exercised
        **extra,
    }
    if kind == "dqn":
        cfg: Any = DQNWorkflowConfig(actions=ACTIONS, **settings)
    else:
        cfg = ParametricDQNWorkflowConfig(**settings)
    wf = Workflow(kind, cfg, DistContext.single("cpu"))
    wf.load_training_data(streaming=streaming)
    return wf


def _assert_same(new: Workflow, old: Workflow) -> None:
    assert new.space.to_json() == old.space.to_json()
    assert new.norm == old.norm
    assert new.emulated_shards == old.emulated_shards
    assert list(new.train_data.keys()) == list(old.train_data.keys())
    for name, t in old.train_data.items():
        got = new.train_data[name]
        assert got.dtype == t.dtype and got.shape == t.shape, name
        torch.testing.assert_close(got, t, rtol=0, atol=1e-6, msg=name)
    assert set(new.ingest_timings) >= {"read", "validate", "tensorize", "fit", "normalize"}


@pytest.mark.parametrize("emulate", [None, "3"])
def test_streaming_equals_table_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulate: str | None
) -> None:
    if emulate:
        monkeypatch.setenv(EMULATE_ENV, emulate)
    path = write(tmp_path / "t.parquet", rows(400, late_feature_at=250), 64)
    new, old = _load(path, tmp_path, True), _load(path, tmp_path, False)
    assert "11" in new.space.state_ids and "7" not in new.space.state_ids
    _assert_same(new, old)


@pytest.mark.parametrize(("emulate", "max_candidates"), [(None, None), ("3", None), (None, 9)])
def test_parametric_streaming_equals_table_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulate: str | None, max_candidates: int | None
) -> None:
    if emulate:
        monkeypatch.setenv(EMULATE_ENV, emulate)
    data = parametric_rows(400, late_feature_at=250, long_lists_at=300)
    path = write_parametric(tmp_path / "t.parquet", data, 64)
    kw: dict[str, Any] = {"kind": "parametric_dqn", "max_candidates": max_candidates}
    new, old = _load(path, tmp_path, True, **kw), _load(path, tmp_path, False, **kw)
    assert new.space.max_candidates == (max_candidates or 6)
    assert "11" in new.space.state_ids and "150" not in new.space.action_ids
    _assert_same(new, old)
