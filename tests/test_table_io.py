"""Scored tables written in the format their file name names."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.errors import ConfigError
from reagent_lite.table_io import output_format, write_table

TABLE = pa.table(
    {
        "mdp_id": ["a", "b"],
        "state_features": pa.array([{"0": 1.0}, {}], type=pa.map_(pa.string(), pa.float64())),
        "q_values": pa.array([[0.5, float("-inf")], [1.0, 2.0]], type=pa.list_(pa.float32())),
        "best_action": ["0", None],
    }
)


def test_each_extension_writes_its_format(tmp_path: Path) -> None:
    write_table(TABLE, tmp_path / "s.parquet")
    assert pq.read_table(tmp_path / "s.parquet").equals(TABLE)

    write_table(TABLE, tmp_path / "s.csv")
    with (tmp_path / "s.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["mdp_id"] for r in rows] == ["a", "b"]
    # Nested cells are JSON text; JSON has no -inf, so it is null.
    assert json.loads(rows[0]["q_values"]) == [0.5, None]
    assert json.loads(rows[0]["state_features"]) == {"0": 1.0}

    write_table(TABLE, tmp_path / "s.jsonl")
    records = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert records[1] == {
        "mdp_id": "b",
        "state_features": [],
        "q_values": [1.0, 2.0],
        "best_action": None,
    }
    assert records[0]["state_features"] == {"0": 1.0}


@pytest.mark.parametrize("name", ["scores.txt", "scores", "scores.json.gz"])
def test_other_extensions_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=r"--output: cannot tell the format"):
        output_format(name)
