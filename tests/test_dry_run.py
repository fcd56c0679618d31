"""--dry_run checks a sample of rows as training would (Parquet and JSON Lines alike) and
prints the effective hyperparameters, global batch, steps per epoch and feature types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite import runner
from reagent_lite.errors import DataError
from tests.data.test_ingest import ACTIONS, INT_MDP_SCHEMA, rows


def write_table(path: Path, data: list[dict[str, Any]]) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(data, schema=INT_MDP_SCHEMA), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


def config(tmp_path: Path, data: Path, **changes: Any) -> Path:
    cfg = {
        "training_data_path": str(data),
        "model_output_path": str(tmp_path / "out"),
        "actions": ACTIONS,
        "use_gpu": False,
        "training": {"minibatch_size": 8, "minibatches_per_step": 2},
        **changes,
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_dry_run_prints_batch_steps_and_feature_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    data = rows(40)
    for i, r in enumerate(data):  # feature 9: a weekday-like code, identified as ENUM
        r["state_features"]["9"] = float(i % 4 + 1)
    path = config(tmp_path, write_table(tmp_path / f"t.{fmt}", data))
    runner.main("dqn", ["--config", str(path), "--dry_run", "training.learning_rate=0.01"])
    out = capsys.readouterr().out
    assert "overrides: training.learning_rate=0.01" in out
    assert "learning_rate: 0.01" in out
    assert "global batch: 16 = minibatch_size 8 per process × minibatches_per_step 2" in out
    if fmt == "parquet":
        assert "steps per epoch: 3 (one pass over the largest shard, 40 rows)" in out
    else:
        assert "steps per epoch: one pass over the largest shard (JSON Lines" in out
    assert f"t.{fmt}: first 40 rows pass the training checks" in out
    assert "state features (identified from 40 sample rows):" in out
    assert "  9: ENUM" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        ({"action": "jump"}, "column 'action': 1 bad row: unknown action name"),
        ({"reward": float("nan")}, "column 'reward': 1 bad row"),
        ({"action_probability": 0.0}, "column 'action_probability': 1 bad row"),
    ],
)
def test_dry_run_refuses_bad_rows_like_training(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    spoil: dict[str, Any],
    expected: str,
) -> None:
    data = rows(30)
    data[17] = {**data[17], **spoil}
    if fmt == "jsonl" and "reward" in spoil:
        data[17]["reward"] = None  # JSON has no NaN: a null reward
    path = config(tmp_path, write_table(tmp_path / f"t.{fmt}", data))
    with pytest.raises(SystemExit) as info:
        runner.main("dqn", ["--config", str(path), "--dry_run"])
    assert info.value.code == DataError.exit_code
    err = capsys.readouterr().err
    assert f"t.{fmt}: {expected}" in err, err
    assert "(e.g. row 17" in err


def test_dry_run_shows_forced_normalization_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = rows(40)
    for i, r in enumerate(data):
        r["state_features"]["9"] = float(i % 4 + 1)
    overrides = {"state": {"9": "CONTINUOUS"}}
    path = config(
        tmp_path, write_table(tmp_path / "t.parquet", data), normalization_overrides=overrides
    )
    runner.main("dqn", ["--config", str(path), "--dry_run"])
    out = capsys.readouterr().out
    assert "forced by normalization_overrides.state: ['9']" in out
    assert "  9: CONTINUOUS" in out
