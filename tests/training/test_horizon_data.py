"""Horizon's own sample data: integer action indices when the actions are named "0", "1",
..., read exactly as the same table with the names as strings; null propensities as the
config says (a bad row by default, or 1.0 with a logged count)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import DataError
from reagent_lite.training.loop import Workflow


def _load(path: Path, tmp: Path, actions: list[str], **extra: Any) -> Workflow:
    cfg = DQNWorkflowConfig(
        training_data_path=str(path),
        model_output_path=str(tmp / "out"),
        use_gpu=False,
        actions=actions,
        **extra,
    )
    wf = Workflow("dqn", cfg, DistContext.single("cpu"))
    wf.load_training_data()
    return wf


def horizon_rows(n: int, as_int: bool) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        a, nxt = int(rng.integers(2)), int(rng.integers(2))
        last = i % 4 == 3
        out.append(
            {
                "mdp_id": str(i // 4),
                "sequence_number": i % 4,
                "state_features": {"0": float(rng.normal()), "1": float(rng.normal())},
                "action": a if as_int else str(a),
                "reward": float(rng.normal()),
                "next_state_features": {"0": float(rng.normal())},
                "next_action": None if last else (nxt if as_int else str(nxt)),
                "possible_actions": ["0", "1"],
                "possible_next_actions": [] if last else ["0", "1"],
                "action_probability": 0.5,
            }
        )
    return out


def write(path: Path, data: list[dict[str, Any]]) -> Path:
    table = pa.Table.from_pylist(data)
    for name in ("state_features", "next_state_features"):
        i = table.column_names.index(name)
        maps = pa.array(
            [list(r[name].items()) for r in data], type=pa.map_(pa.string(), pa.float64())
        )
        table = table.set_column(i, name, maps)
    pq.write_table(table, path)
    return path


def test_integer_actions_read_as_their_decimal_names(tmp_path: Path) -> None:
    names = write(tmp_path / "names.parquet", horizon_rows(40, as_int=False))
    ints = write(tmp_path / "ints.parquet", horizon_rows(40, as_int=True))
    assert pa.types.is_integer(pq.read_schema(ints).field("action").type)
    by_name = _load(names, tmp_path, actions=["0", "1"])
    by_int = _load(ints, tmp_path, actions=["0", "1"])
    for key in ("action", "next_action", "possible_actions_mask", "reward"):
        assert np.array_equal(
            by_name.train_data[key].cpu().numpy(), by_int.train_data[key].cpu().numpy()
        ), key


def test_integer_actions_need_decimal_action_names(tmp_path: Path) -> None:
    ints = write(tmp_path / "ints.parquet", horizon_rows(40, as_int=True))
    with pytest.raises(DataError, match=r"column 'action': expected action names \(strings\)"):
        _load(ints, tmp_path, actions=["left", "right"])
    with pytest.raises(DataError, match=r"column 'action': .* unknown action name"):
        _load(ints, tmp_path, actions=["1", "2"])


def test_null_propensity_is_an_error_unless_the_config_says_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = horizon_rows(40, as_int=False)
    for i in (3, 8, 9):
        data[i]["action_probability"] = None
    path = write(tmp_path / "t.parquet", data)
    with pytest.raises(DataError, match="column 'action_probability': 3 bad rows"):
        _load(path, tmp_path, ["0", "1"])
    with caplog.at_level("WARNING", logger="reagent_lite"):
        wf = _load(path, tmp_path, ["0", "1"], null_propensity="one")
    assert "3 rows with a null action_probability read as 1.0" in caplog.text
    propensity = wf.train_data["propensity"].cpu().numpy()
    assert sorted(np.flatnonzero(propensity == 1.0).tolist()) == [3, 8, 9]
