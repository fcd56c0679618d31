"""Readers and sharding on real Parquet / JSON Lines files."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.data.readers import list_data_files, read_shard, read_table, shard_plan
from reagent_lite.data.scatter import feature_matrix
from reagent_lite.errors import DataError
from tests.data.test_validate import dqn_rows, dqn_table


def _ids_table(n: int, start: int = 0) -> pa.Table:
    """A table whose `row_id` column identifies every row, plus a sparse map column."""
    ids = list(range(start, start + n))
    return pa.table(
        {
            "row_id": pa.array(ids, pa.int64()),
            "state_features": pa.array(
                [{"0": float(i)} for i in ids], type=pa.map_(pa.string(), pa.float64())
            ),
        }
    )


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    elif path.name.endswith(".bz2"):
        path.write_bytes(bz2.compress(text.encode()))
    else:
        path.write_text(text)


# ----------------------------------------------------------------------------- formats


def test_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(dqn_table(), path)
    t = read_table(path)
    assert t.num_rows == 6 and "state_features" in t.column_names
    values = feature_matrix(t["state_features"], ["0", "1", "2"])
    assert (~np.isnan(values[0])).tolist() == [False, True, False]
    assert values[1].tolist()[::2] == [1.0, 0.5] and np.isnan(values[1, 1])


def test_directory_of_parts_skips_markers(tmp_path: Path) -> None:
    d = tmp_path / "table"
    d.mkdir()
    pq.write_table(_ids_table(5), d / "part-00000-abc.snappy.parquet")
    pq.write_table(_ids_table(5, 5), d / "part-00001-abc.snappy.parquet")
    pq.write_table(_ids_table(3, 10), d / "part-00002")  # Spark without suffix
    (d / "_SUCCESS").write_text("")
    (d / ".part-00000-abc.snappy.parquet.crc").write_bytes(b"junk")
    (d / "_temporary").mkdir()
    (d / "_temporary" / "part-9.parquet").write_bytes(b"junk")
    files = list_data_files(d)
    assert [f.name for f in files] == [
        "part-00000-abc.snappy.parquet",
        "part-00001-abc.snappy.parquet",
        "part-00002",
    ]
    assert sorted(read_table(d)["row_id"].to_pylist()) == list(range(13))


def test_hive_partitioned_directory(tmp_path: Path) -> None:
    for day in ("2024-01-01", "2024-01-02"):
        sub = tmp_path / f"ds={day}"
        sub.mkdir()
        pq.write_table(_ids_table(2), sub / "part-0.parquet")
    assert read_table(tmp_path).num_rows == 4


@pytest.mark.parametrize("name", ["t.jsonl", "t.json", "t.jsonl.gz", "t.json.bz2"])
def test_json_lines(tmp_path: Path, name: str) -> None:
    rows = dqn_rows()
    path = tmp_path / name
    _write_jsonl(path, rows)
    t = read_table(path)
    assert t.num_rows == 6
    assert pa.types.is_map(t.schema.field("state_features").type)
    assert t["action"].to_pylist() == [r["action"] for r in rows]
    values = feature_matrix(t["state_features"], ["0", "1", "2"])
    np.testing.assert_array_equal(values[3], [3.0, np.nan, 0.5])
    np.testing.assert_array_equal(values[0], [np.nan, -1.0, np.nan])


def test_jsonl_parametric_lists_of_maps(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"possible_actions": [{"1": 1}, {"2": 0.5}], "next_action": None},
        {"possible_actions": [], "next_action": {"1": 2}},
    ]
    path = tmp_path / "p.jsonl"
    _write_jsonl(path, rows)
    t = read_table(path)
    assert t.schema.field("possible_actions").type == pa.list_(pa.map_(pa.string(), pa.float64()))
    assert t["possible_actions"][0].as_py() == [[("1", 1.0)], [("2", 0.5)]]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_propensity_alias(tmp_path: Path, fmt: str) -> None:
    rows = [
        {k if k != "action_probability" else "propensity": v for k, v in r.items()}
        for r in dqn_rows()
    ]
    path = tmp_path / f"t.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        _write_jsonl(path, rows)
    t = read_table(path)
    assert "action_probability" in t.column_names and "propensity" not in t.column_names
    t = read_table(path, columns=["mdp_id", "action_probability"])
    assert t.column_names == ["mdp_id", "action_probability"]


def test_corrupt_parquet_names_the_file(tmp_path: Path) -> None:
    d = tmp_path / "t"
    d.mkdir()
    pq.write_table(_ids_table(3), d / "part-0.parquet")
    (d / "part-1.parquet").write_bytes(b"PAR1 definitely not parquet")
    with pytest.raises(DataError, match=r"part-1\.parquet"):
        read_table(d)


def test_corrupt_jsonl_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(DataError, match=r"t\.jsonl.*not valid JSON"):
        read_table(path)
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match=r"t\.jsonl\.gz"):
        read_table(gz)


def test_mixed_json_types_name_the_column(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _write_jsonl(path, [{"reward": 1.0}, {"reward": "high"}])
    with pytest.raises(DataError, match=r"t\.jsonl: column 'reward'"):
        read_table(path)


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        read_table(tmp_path / "nope.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no data files"):
        read_table(tmp_path / "empty")
    with pytest.raises(DataError, match="unknown data file type"):
        (tmp_path / "x.csv").write_text("a\n1\n")
        read_table(tmp_path / "x.csv")


# ----------------------------------------------------------------------------- sharding


def _layout(tmp_path: Path, layout: str) -> tuple[Path, int]:
    """Write a table in one of several layouts; returns (path, total rows)."""
    d = tmp_path / layout
    d.mkdir()
    if layout == "many_files":  # 5 files → whole files for W <= 5
        for i in range(5):
            pq.write_table(_ids_table(7 + i, 100 * i), d / f"part-{i:05d}.parquet")
        return d, sum(7 + i for i in range(5))
    if layout == "row_groups":  # 2 files of 3 row groups each
        pq.write_table(_ids_table(30), d / "part-0.parquet", row_group_size=10)
        pq.write_table(_ids_table(25, 1000), d / "part-1.parquet", row_group_size=10)
        return d, 55
    if layout == "one_group":  # one file, one row group → row ranges
        pq.write_table(_ids_table(50), d / "t.parquet")
        return d / "t.parquet", 50
    if layout == "jsonl":  # 2 JSON Lines files → row parts of a file for W > 2
        _write_jsonl(d / "a.jsonl", [{"row_id": i} for i in range(9)])
        _write_jsonl(d / "b.jsonl.gz", [{"row_id": 100 + i} for i in range(4)])
        return d, 13
    raise AssertionError(layout)


@pytest.mark.parametrize("layout", ["many_files", "row_groups", "one_group", "jsonl"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_partition_the_table(tmp_path: Path, layout: str, world_size: int) -> None:
    path, total = _layout(tmp_path, layout)
    plan = shard_plan(path, world_size)
    seen: list[int] = []
    for rank in range(world_size):
        shard = read_shard(path, rank, world_size)
        if plan[rank].num_rows is not None:
            assert shard.num_rows == plan[rank].num_rows
        if shard.num_rows:
            seen.extend(shard["row_id"].to_pylist())
    assert len(seen) == len(set(seen)) == total  # no overlap, nothing missing
    assert sorted(seen) == sorted(read_table(path)["row_id"].to_pylist())
    kinds = {p.kind for spec in plan for p in spec.pieces}
    if world_size > 1 and layout == "row_groups":
        assert kinds == ({"file"} if world_size <= 2 else {"row_groups"})
    if world_size > 1 and layout == "one_group":
        assert kinds == {"rows"}
    assert f"rank 0/{world_size}" in repr(plan[0])


def test_1001_rows_over_3_ranks(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(_ids_table(1001), path)
    plan = shard_plan(path, 3)
    assert [s.num_rows for s in plan] == [333, 334, 334]
    shards = [read_shard(path, r, 3)["row_id"].to_pylist() for r in range(3)]
    assert shards[0] == list(range(333)) and shards[2] == list(range(667, 1001))


def test_row_ranges_only_touch_their_row_groups(tmp_path: Path) -> None:
    # 3 row groups, 4 ranks → row ranges; rank 3 must read rows from the last group only.
    path = tmp_path / "t.parquet"
    pq.write_table(_ids_table(30), path, row_group_size=10)
    spec = shard_plan(path, 4)[3]
    assert [(p.kind, p.row_start, p.row_stop) for p in spec.pieces] == [("rows", 22, 30)]
    assert read_shard(path, 3, 4)["row_id"].to_pylist() == list(range(22, 30))


def test_more_ranks_than_rows_gives_empty_shards(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(_ids_table(2), path)
    sizes = [read_shard(path, r, 4).num_rows for r in range(4)]
    assert sum(sizes) == 2 and 0 in sizes
    empty = read_shard(path, sizes.index(0), 4)
    assert empty.column_names == ["row_id", "state_features"]
    assert "empty shard" in repr(shard_plan(path, 4)[sizes.index(0)])


def test_column_selection(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(dqn_table(), path, row_group_size=2)
    t = read_shard(path, 1, 2, columns=["reward", "action", "not_there"])
    assert t.column_names == ["action", "reward"] and t.num_rows == 2  # row group 1 of 3


def test_empty_spark_part_files_are_left_out_of_the_shards(tmp_path: Path) -> None:
    # Spark writes a part file per task, empty ones included; sorted, they alternate here,
    # so round-robin over all files would give rank 1 only empty ones.
    table = pa.table({"row_id": list(range(10)), "x": [float(i) for i in range(10)]})
    for i in range(4):
        part = table.slice(5 * (i // 2), 5) if i % 2 == 0 else table.slice(0, 0)
        pq.write_table(part, tmp_path / f"part-{i:05d}-abc.snappy.parquet")
    plan = shard_plan(tmp_path, 2)
    rows = [sum(p.num_rows or 0 for p in spec.pieces) for spec in plan]
    assert rows == [5, 5]
    assert sorted(read_shard(tmp_path, r, 2).num_rows for r in range(2)) == [5, 5]


def test_jsonl_nested_past_the_parser_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text('{"a": 1}\n{"metrics": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(DataError, match="line 2 of the shard is nested deeper"):
        read_table(path)
