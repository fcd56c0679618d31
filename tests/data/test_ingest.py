"""The ingest engine (`data/ingest.py`) on dqn tables: each rank's rows, validated and
tensorized batch by batch, hold what the rows say (`tests/data/oracle.py`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.data.discrete_shard import DiscreteShard
from reagent_lite.data.ingest import ingest, shard_batches
from reagent_lite.data.readers import read_shard
from reagent_lite.data.validate import ShardValidation
from reagent_lite.errors import DataError
from tests.data.oracle import assert_shard, dqn_layout, expected_dqn
from tests.data.test_validate import ACTIONS, DQN_SCHEMA, SCHEMAS

INT_MDP_SCHEMA = DQN_SCHEMA.set(0, pa.field("mdp_id", pa.int64()))


def rows(n: int, seed: int = 0, *, late_feature_at: int | None = None) -> list[dict[str, Any]]:
    """n dqn rows: features 0..3 with holes; "7" only in next_state; "11" appears in state
    from row `late_feature_at` on (to be found in a later row group)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        last = i % 5 == 4
        state = {str(f): float(rng.normal()) for f in range(4) if rng.random() > 0.3}
        if late_feature_at is not None and i >= late_feature_at:
            state["11"] = float(i)
        nxt = {str(f): float(rng.normal()) for f in (0, 2, 7) if rng.random() > 0.3}
        out.append(
            {
                "mdp_id": i // 5,
                "sequence_number": i % 5,
                "state_features": state,
                "action": ACTIONS[int(rng.integers(2))],
                "reward": float(rng.normal()),
                "next_state_features": {} if last else nxt,
                "next_action": "" if last else ACTIONS[int(rng.integers(2))],
                "possible_actions": ["left", "right"] if i % 3 else ["right"],
                "possible_next_actions": [] if last else ["left", "right"],
                "action_probability": 0.5,
                "time_diff": int(1 + i % 2),
            }
        )
    return out


def write(path: Path, data: list[dict[str, Any]], row_group: int) -> Path:
    pq.write_table(
        pa.Table.from_pylist(data, schema=INT_MDP_SCHEMA), path, row_group_size=row_group
    )
    return path


def ingest_dqn(path: Path, parts: list[tuple[int, int]], **kw: Any) -> DiscreteShard:
    """The shard(s) of dqn rows, as the dqn kind ingests them before the space is agreed."""
    opts = {k: kw.pop(k) for k in ("drop", "time_diff") if k in kw}
    return ingest(path, parts, dqn_layout(**opts), **kw)


def map_keys(value: Any) -> list[str]:
    """The keys of a map as `rows` writes it (a dict) or the reader gives it back (pairs)."""
    pairs = (value.items() if isinstance(value, dict) else value) if value else []
    return [str(k) for k, _ in pairs]


def good(row: dict[str, Any]) -> bool:
    """Whether a row of `rows` passes validation (the bad rows the tests make)."""
    keys = map_keys(row.get("state_features"))
    return (
        math.isfinite(row["reward"])
        and row["action"] in ACTIONS
        and 0 < row["action_probability"] <= 1
        and all(k.isdigit() for k in keys)
    )


def state_ids(data: list[dict[str, Any]]) -> list[str]:
    """The ids of the rows' state maps, in numeric order."""
    found = {k for r in data for k in map_keys(r.get("state_features"))}
    return sorted(found, key=int)


def assert_same(path: Path, rank: int, world: int, *, drop: bool = False, **kw: Any) -> None:
    """Rank `rank`'s ingested shard holds what its rows (as the reader gives them) say."""
    shard = ingest_dqn(path, [(rank, world)], drop=drop, time_diff=True, slice_rows=7, **kw)
    every = read_shard(path, rank, world).to_pylist()
    want = [r for r in every if good(r)] if drop else every
    ids = state_ids(want)
    if "state" in read_shard(path, rank, world).column_names:  # dense lists
        ids = [str(i) for i in range(len(want[0]["state"]))]
    assert sorted(shard.state_ids, key=int) == ids
    shard.reorder(ids)
    assert_shard(shard, expected_dqn(want, ids, time_diff=True))
    assert (shard.report.rows_in, shard.report.rows_out) == (len(every), len(want))


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("row_group", [10, 1000])
@pytest.mark.parametrize("prefetch", [False, True])
def test_each_rank_ingests_its_rows(
    tmp_path: Path, world: int, row_group: int, prefetch: bool
) -> None:
    path = write(tmp_path / "t.parquet", rows(95, late_feature_at=60), row_group)
    for rank in range(world):
        assert_same(path, rank, world, prefetch=prefetch)


def test_ingest_of_part_files_and_late_features(tmp_path: Path) -> None:
    d = tmp_path / "parts"
    d.mkdir()
    for k in range(3):
        write(d / f"part-{k:05d}.parquet", rows(40, seed=k, late_feature_at=30 if k else None), 16)
    assert_same(d, 0, 1)
    assert_same(d, 1, 2)
    shard = ingest_dqn(d, [(0, 1)])
    assert "11" in shard.state_ids and "7" not in shard.state_ids
    assert "7" in shard.columns.ids  # next_state-only ids are kept until reorder drops them


def test_parts_laid_end_to_end(tmp_path: Path) -> None:
    """Several (rank, world) parts (an emulated world size): their rows in part order."""
    path = write(tmp_path / "t.parquet", rows(95, late_feature_at=60), 10)
    shard = ingest_dqn(path, [(r, 3) for r in range(3)], time_diff=True)
    parts = [read_shard(path, r, 3).to_pylist() for r in range(3)]
    assert shard.rows_per_part == [len(p) for p in parts]
    ids = state_ids(rows(95, late_feature_at=60))
    shard.reorder(ids)
    assert_shard(shard, expected_dqn([r for p in parts for r in p], ids, time_diff=True))
    assert set(shard.timings) == {"read", "validate", "tensorize"}


def test_batches_concatenate_to_the_shard(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", rows(50), 8)
    for world in (1, 2, 4):
        for rank in range(world):
            n, batches = shard_batches(path, rank, world)
            got = pa.concat_tables([b.cast(b.schema) for b in batches])
            want = read_shard(path, rank, world)
            assert n == want.num_rows == got.num_rows
            assert got.to_pylist() == want.to_pylist()


def test_jsonl_shard(tmp_path: Path) -> None:
    import json

    path = tmp_path / "t.jsonl"
    with open(path, "w") as fh:
        for r in rows(30):
            fh.write(json.dumps(r) + "\n")
    assert_same(path, 0, 1)
    assert_same(path, 1, 2)


def test_validation_in_batches_matches_validating_at_once(tmp_path: Path) -> None:
    data = rows(60)
    for i in (3, 25, 41):
        data[i]["reward"] = float("nan")
    data[33]["action"] = "jump"
    data[50]["state_features"] = {"x": 1.0}
    path = write(tmp_path / "t.parquet", data, 10)
    at_once = ShardValidation(SCHEMAS["dqn"], source=str(path))
    at_once.check(read_shard(path, 0, 1))
    with pytest.raises(DataError) as whole_err:
        at_once.finish()
    with pytest.raises(DataError) as stream_err:
        ingest_dqn(path, [(0, 1)])
    assert sorted(str(stream_err.value).splitlines()) == sorted(str(whole_err.value).splitlines())
    assert "3 bad rows" in str(stream_err.value) and "row 3:" in str(stream_err.value)
    # Dropping: the bad rows go, counted.
    assert_same(path, 0, 1, drop=True)
    report = ingest_dqn(path, [(0, 1)], drop=True, slice_rows=7).report
    assert report.rows_dropped == 5
    assert {(p.column, p.count) for p in report.dropped} == {
        ("reward", 3),
        ("action", 1),
        ("state_features", 1),
    }


def test_empty_shard_and_all_bad(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", rows(2), 10)
    with pytest.raises(DataError, match="no rows"):
        ingest_dqn(path, [(0, 3)])  # rows [0, 0) of 2
    # A file of no rows (its one row group empty) and a JSONL file of none: the same error.
    empty = write(tmp_path / "empty.parquet", [], 10)
    (tmp_path / "empty.jsonl").write_text("")
    for file in (empty, tmp_path / "empty.jsonl"):
        with pytest.raises(DataError, match="no rows"):
            ingest_dqn(file, [(0, 1)])
    v = ShardValidation(SCHEMAS["dqn"], source="s", drop_bad_rows=True)
    bad = read_shard(path, 0, 1).set_column(4, "reward", pa.array([float("nan")] * 2))
    assert v.check(bad).num_rows == 0
    with pytest.raises(DataError, match="every row is bad"):
        v.finish()


def test_dense_list_features(tmp_path: Path) -> None:
    data = rows(30)
    for i, r in enumerate(data):
        r["state"] = [float(i), -float(i), 0.5]
        r["next_state"] = [1.0, 2.0, float(i)]
        r["mdp_id"] = f"ep{(i * 7) % 6}"  # string ids, not in order of appearance
        del r["state_features"], r["next_state_features"]
    path = tmp_path / "dense.parquet"
    pq.write_table(pa.Table.from_pylist(data), path, row_group_size=8)
    assert_same(path, 0, 1)
    assert ingest_dqn(path, [(0, 1)]).state_ids == {"0", "1", "2"}


def test_big_slices_scatter_in_two_threads(tmp_path: Path) -> None:
    data = rows(40_000, late_feature_at=39_000)
    path = write(tmp_path / "big.parquet", data, 20_000)
    shard = ingest_dqn(path, [(0, 1)], time_diff=True)
    ids = sorted(shard.state_ids, key=int)
    shard.reorder(ids)
    want = expected_dqn(data, ids, time_diff=True)
    for name in ("state", "next_state"):
        np.testing.assert_array_equal(shard.features[name], want[name])


@pytest.mark.parametrize("size", [3, 300])  # Python lookup of small dictionaries, kernels else
def test_dictionary_lookups_equal_plain_strings(size: int) -> None:
    from reagent_lite.data.arrow import string_index
    from reagent_lite.data.checks import bad_key_entries
    from reagent_lite.data.scatter import key_columns

    rng = np.random.default_rng(0)
    words = [str(i) for i in range(size - 2)] + ["", "x1"]
    plain = pa.array([words[i] for i in rng.integers(0, size, 2000)] + [None])
    encoded = plain.dictionary_encode()
    names = ["1", "0", "", "7"][: 2 if size == 3 else 4]
    np.testing.assert_array_equal(string_index(encoded, names), string_index(plain, names))
    ids = ["2", "0", "x1"]
    valid = plain.drop_null()
    np.testing.assert_array_equal(
        key_columns(valid.dictionary_encode(), ids), key_columns(valid, ids)
    )
    np.testing.assert_array_equal(
        bad_key_entries(valid.dictionary_encode()), bad_key_entries(valid)
    )


def test_an_error_in_a_directory_of_part_files_names_the_part(tmp_path: Path) -> None:
    """The data path is a directory: the bad row's file is named beside the shard's row."""
    parts = tmp_path / "train"
    parts.mkdir()
    write(parts / "part-0.parquet", rows(10), 10)
    bad = rows(10, seed=1)
    bad[3]["action_probability"] = -1.0
    write(parts / "part-1.parquet", bad, 10)
    with pytest.raises(DataError) as err:
        ingest_dqn(parts, [(0, 1)])
    msg = str(err.value)
    assert f"{parts}: column 'action_probability': 1 bad row" in msg
    assert f"row 13 of the shard, in {parts / 'part-1.parquet'}" in msg
    # One file: the message as before (the source is the file).
    with pytest.raises(DataError) as one:
        ingest_dqn(parts / "part-1.parquet", [(0, 1)])
    assert "(e.g. row 3: -1.0)" in str(one.value)


def test_row_range_across_row_groups_with_dictionary_read_lists(tmp_path: Path) -> None:
    """A rank's row range that spans row groups, on columns read as dictionaries (action
    names, candidate lists): read one row group per call — a batch across row groups fails
    in pyarrow ("Nested data conversions not implemented for chunked array outputs")."""
    from reagent_lite.data.ingest import piece_batches
    from reagent_lite.data.readers import shard_plan

    n = 30
    table = pa.table(
        {
            "row_id": pa.array(range(n), pa.int64()),
            "action": pa.array([ACTIONS[i % 2] for i in range(n)]),
            "possible_actions": pa.array([list(ACTIONS[: 1 + i % 2]) for i in range(n)]),
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=10)
    plan = shard_plan(path, 4)
    seen = []
    for spec in plan:
        (piece,) = spec.pieces
        assert piece.kind == "rows"
        seen += [r for t in piece_batches(piece) for r in t["row_id"].to_pylist()]
    assert seen == list(range(n))
