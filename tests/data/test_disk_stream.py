"""Disk streaming (`data/disk_stream.py`, `data/windows.py`): windows of row groups, every
row once per pass."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import Tensor

from reagent_lite.data import disk_stream
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.readers import ShardPiece, read_table
from reagent_lite.data.schema import STATE_COLUMNS
from reagent_lite.data.windows import in_order, load_units, scan_units, stream_units
from reagent_lite.errors import DataError
from tests.data.oracle import dqn_layout, parametric_layout
from tests.data.test_ingest import ingest_dqn, rows, write

IDS = ["0", "1", "2", "3", "7"]  # the state and next_state ids of `rows`


def load_window(
    units: Sequence[ShardPiece],
    ids: Sequence[str] = IDS,
    *,
    drop: bool = False,
    time_diff: bool = False,
    threads: int | None = None,
) -> Any:
    """A dqn window of `units` in the space of state ids `ids`, as the dqn kind loads it."""
    return load_units(units, dqn_layout(ids, drop=drop, time_diff=time_diff), threads=threads)


def load_parametric_window(
    units: Sequence[ShardPiece],
    state_ids: Sequence[str],
    action_ids: Sequence[str],
    k: int,
    *,
    drop: bool = False,
    time_diff: bool = False,
    threads: int | None = None,
) -> Any:
    """A parametric window of `units` in the space of those ids and `k` candidate slots."""
    layout = parametric_layout(state_ids, action_ids, k, drop=drop, time_diff=time_diff)
    return load_units(units, layout, threads=threads)


def _stream(path: Path, rank: int, world: int, window: int, seed: int = 3) -> DiskShardStream:
    def load(units: Sequence[ShardPiece]) -> dict[str, Tensor]:
        shard = load_window(units)
        return {"reward": torch.from_numpy(shard.fields["reward"])}

    units = stream_units(str(path), rank, world)
    return DiskShardStream(units, load, window_rows=window, seed=seed, rank=rank)


def _epoch(stream: DiskShardStream, epoch: int) -> tuple[np.ndarray, list[int]]:
    chunks = list(stream.epoch_chunks(epoch))
    sizes = [rows for _, rows in chunks]
    return torch.cat([c["reward"] for c, _ in chunks]).numpy(), sizes


@pytest.mark.parametrize(("window", "step"), [(100, 32), (64, 48), (1000, 7)])
def test_one_pass_visits_every_row_once(tmp_path: Path, window: int, step: int) -> None:
    path = write(tmp_path / "t.parquet", rows(500), 40)  # 13 row groups, the last short
    want = np.sort(read_table(path).column("reward").to_numpy().astype(np.float32))
    stream = _stream(path, 0, 1, window)
    steps = -(-500 // step)
    stream.configure(step_rows=step, steps_per_epoch=steps)
    got, sizes = _epoch(stream, 0)
    assert len(got) == steps * step
    assert all(s % step == 0 and 0 < s <= stream.chunk_rows for s in sizes)
    # The first 500 rows are one pass: each row exactly once; the rest wraps into a new pass.
    np.testing.assert_array_equal(np.sort(got[:500]), want)
    assert set(got[500:]) <= set(want)
    again, _ = _epoch(stream, 0)
    np.testing.assert_array_equal(again, got)  # seeded: the same epoch is the same stream
    other, _ = _epoch(stream, 1)
    assert not np.array_equal(other, got)  # and another epoch is another order
    np.testing.assert_array_equal(np.sort(other[:500]), want)
    stream.close()


def test_several_passes_when_steps_exceed_the_shard(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", rows(200), 50)
    want = np.sort(read_table(path).column("reward").to_numpy().astype(np.float32))
    stream = _stream(path, 0, 1, 100)
    stream.configure(step_rows=20, steps_per_epoch=30)  # 3 passes
    got, _ = _epoch(stream, 0)
    assert len(got) == 600
    for p in range(3):
        np.testing.assert_array_equal(np.sort(got[p * 200 : (p + 1) * 200]), want)


def test_chunks_are_slices_of_each_window_shuffled_once_as_it_loads(tmp_path: Path) -> None:
    """An epoch is each window's rows in the order drawn from (seed, rank, epoch, window),
    gathered once as the window loads (in the background): its chunks are slices of that
    window, no gather on the way of a step (issue 39); a row carried to the next window is
    a copy, not a view that would keep the whole window alive."""
    path = write(tmp_path / "t.parquet", rows(500), 40)
    stream = _stream(path, 0, 1, 200, seed=5)
    stream.configure(step_rows=30, steps_per_epoch=10)
    chunks = list(stream.epoch_chunks(2))
    windows = stream.windows(2)
    want = []
    for k in range(3):  # 300 rows: the first windows of the epoch
        window = _stream(path, 0, 1, 200).load(next(windows))["reward"]
        seed = int(disk_stream._rng(5, 0, 2, 1, k).integers(1 << 62))
        want.append(
            window[torch.randperm(len(window), generator=torch.Generator().manual_seed(seed))]
        )
    got = torch.cat([c["reward"] for c, _ in chunks])
    assert torch.equal(got, torch.cat(want)[:300])
    first = chunks[0][0]["reward"]  # 180 rows (6 steps) of the first window's 200
    assert first.untyped_storage().nbytes() == 200 * first.element_size()  # a view of it
    assert chunks[1][0]["reward"].untyped_storage().nbytes() == 30 * first.element_size()
    stream.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_shuffled_is_index_select_of_every_column(threads: int) -> None:
    g = torch.Generator().manual_seed(0)
    columns = {
        "x": torch.randn(101, 3, 2, generator=g),
        "b": torch.rand(101, 4, generator=g) > 0.5,
        "i": torch.randint(0, 9, (101,), generator=g),
        "h": torch.randn(101, 2, generator=g).to(torch.bfloat16),  # no numpy dtype
        "t": torch.randn(2, 101, generator=g).t(),  # not contiguous
    }
    order = torch.randperm(101, generator=g)
    got = disk_stream.shuffled(dict(columns), order, threads)
    assert list(got) == list(columns)
    for k, v in columns.items():
        assert torch.equal(got[k], v.index_select(0, order)), k
        assert got[k].is_contiguous(), k


DEVICES = [
    pytest.param("cpu"),
    pytest.param("cuda:0", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("device", DEVICES)
def test_shuffled_on_a_device_is_the_host_shuffle_bit_for_bit(device: str) -> None:
    """A GPU run's windows are copied whole and gathered on the device (issue 39): the same
    rows as the host's gather, of every dtype, contiguous, where they were asked for."""
    g = torch.Generator().manual_seed(1)
    columns = {
        "x": torch.randn(257, 3, 2, generator=g),
        "b": torch.rand(257, 4, generator=g) > 0.5,
        "i": torch.randint(0, 9, (257,), generator=g),
        "h": torch.randn(257, 2, generator=g).to(torch.bfloat16),
        "t": torch.randn(2, 257, generator=g).t(),  # not contiguous
    }
    order = torch.randperm(257, generator=g)
    want = disk_stream.shuffled(dict(columns), order, 2)
    got = disk_stream.shuffled_on(dict(columns), order, torch.device(device))
    assert list(got) == list(columns)
    for k in columns:
        assert got[k].device == torch.device(device), k
        assert got[k].is_contiguous(), k
        assert torch.equal(got[k].cpu(), want[k]), k


@pytest.mark.parametrize("device", DEVICES)
def test_device_windows_give_the_host_windows_chunks(tmp_path: Path, device: str) -> None:
    """Windows kept on a device (`window_device`) hand out the chunks host windows do, rows
    carried across windows included (steps of 30 over windows of 80), epoch after epoch;
    the chunks are on that device."""
    path = write(tmp_path / "t.parquet", rows(500), 40)
    runs = {}
    for where in (None, torch.device(device)):
        stream = _stream(path, 0, 1, 80, seed=9)
        stream.window_device = where
        stream.configure(step_rows=30, steps_per_epoch=9)
        chunks = [c for e in (0, 1) for c, _ in stream.epoch_chunks(e)]
        stream.close()
        assert list(stream.stage_s) == ["read", "order", "shuffle"]  # where loads' time went
        assert all(seconds > 0 for seconds in stream.stage_s.values())
        assert all(c["reward"].device == (where or torch.device("cpu")) for c in chunks)
        runs[where] = torch.cat([c["reward"].cpu() for c in chunks])
    host, dev = runs.values()
    assert len(host) == 2 * 9 * 30
    assert torch.equal(host, dev)


def test_directory_of_parts_sharded_by_rank(tmp_path: Path) -> None:
    data = rows(600)
    table = pa.Table.from_pylist(
        data, schema=pq.read_schema(write(tmp_path / "s.parquet", data[:1], 1))
    )
    parts = tmp_path / "parts"
    parts.mkdir()
    for i in range(3):
        pq.write_table(
            table.slice(i * 200, 200), parts / f"part-{i:05d}.parquet", row_group_size=64
        )
    want = np.sort(table.column("reward").to_numpy().astype(np.float32))
    seen = []
    for rank in range(2):
        stream = _stream(parts, rank, 2, 150)
        n = stream.num_rows
        stream.configure(step_rows=10, steps_per_epoch=-(-n // 10))
        got, _ = _epoch(stream, 0)
        seen.append(got[:n])
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), want)


def test_scan_finds_ids_of_late_row_groups_only_from_keys(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", rows(300, late_feature_at=250), 64)
    ids, _ = scan_units(stream_units(str(path), 0, 1), {"state": STATE_COLUMNS})
    assert ids == {"state": {"0", "1", "2", "3", "11"}}


def test_bad_rows_in_a_window_name_file_and_column(tmp_path: Path) -> None:
    data = rows(100)
    data[70]["action"] = "jump"
    path = write(tmp_path / "t.parquet", data, 20)
    units = stream_units(str(path), 0, 1)
    with pytest.raises(DataError, match="action"):
        load_window(units)


def test_json_lines_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\n')
    with pytest.raises(DataError, match="Parquet"):
        stream_units(str(path), 0, 1)


def test_bad_row_in_a_later_file_of_the_window_names_that_file(tmp_path: Path) -> None:
    # A window packs units of several part files: the error must name the file (and row
    # group) holding the bad row, not the window's first file.
    data = rows(120)
    data[100]["action"] = "jump"  # in the second file, its second row group
    schema = pq.read_schema(write(tmp_path / "s.parquet", data[:1], 1))
    parts = tmp_path / "parts"
    parts.mkdir()
    for i in range(2):
        table = pa.Table.from_pylist(data[i * 60 : (i + 1) * 60], schema=schema)
        pq.write_table(table, parts / f"part-{i:05d}.parquet", row_group_size=30)
    units = stream_units(str(parts), 0, 1)
    assert units[0].file.name == "part-00000.parquet"
    with pytest.raises(DataError) as err:
        load_window(units)
    message = str(err.value)
    assert "part-00001.parquet" in message and "part-00000" not in message, message
    assert "row group 1" in message and "row 10" in message, message


# ----------------------------------------------------------------------------- parametric


def test_parametric_scan_finds_what_the_whole_table_holds(tmp_path: Path) -> None:
    from reagent_lite.data.parametric_shard import CANDIDATE_COLUMNS
    from tests.data.test_ingest import map_keys
    from tests.data.test_ingest_parametric import parametric_rows, write_parametric

    data = parametric_rows(200, late_feature_at=190, long_lists_at=180)
    path = write_parametric(tmp_path / "t.parquet", data, 32)
    units = stream_units(str(path), 0, 1)
    ids, longest = scan_units(
        units, {"state": STATE_COLUMNS, "action": ("action",)}, CANDIDATE_COLUMNS
    )
    assert ids["state"] == {k for r in data for k in map_keys(r["state_features"])}
    assert "11" in ids["state"]
    assert ids["action"] == {k for r in data for k in map_keys(r["action"])}
    lists = [r[c] for r in data for c in CANDIDATE_COLUMNS]
    assert longest == max(len(x) for x in lists) == 6
    assert scan_units(units[:1], {"action": ("action",)}, CANDIDATE_COLUMNS)[1] == 3


def test_parametric_window_equals_the_streaming_ingest(tmp_path: Path) -> None:
    from tests.data.test_ingest_parametric import (
        ingest_parametric,
        parametric_rows,
        write_parametric,
    )

    path = write_parametric(tmp_path / "t.parquet", parametric_rows(160, long_lists_at=100), 20)
    whole = ingest_parametric(path, [(0, 1)])
    state_ids, action_ids = sorted(whole.state_ids, key=int), sorted(whole.action_ids, key=int)
    whole.conform(state_ids, action_ids, 7)
    units = stream_units(str(path), 0, 1)
    window = load_parametric_window(units[::-1], state_ids, action_ids, 7)
    # The window holds the units back to front: compare row groups of 20 rows.
    order = np.concatenate([np.arange(s, s + 20) for s in range(len(units) * 20 - 20, -1, -20)])
    for name, arr in whole.features.items():
        np.testing.assert_array_equal(window.features[name], arr[order], err_msg=name)
    for name in ("possible_actions_mask", "possible_next_actions_mask", "action_index", "reward"):
        np.testing.assert_array_equal(window.fields[name], whole.fields[name][order], err_msg=name)
    with pytest.raises(DataError, match="more than max_candidates=5"):
        load_parametric_window(units, state_ids, action_ids, 5)


def test_parametric_bad_value_in_a_late_row_group_names_it(tmp_path: Path) -> None:
    from tests.data.test_ingest_parametric import parametric_rows, write_parametric

    data = parametric_rows(100)
    data[93]["possible_next_actions"][0]["102"] = float("nan")
    path = write_parametric(tmp_path / "t.parquet", data, 20)
    units = stream_units(str(path), 0, 1)
    load_parametric_window(units[:4], ["0"], ["100"], 3)  # the good row groups load
    with pytest.raises(DataError) as err:
        load_parametric_window(units, ["0"], ["100"], 3)
    message = str(err.value)
    assert "column 'possible_next_actions'" in message and "row group 4" in message, message
    assert "row 13" in message, message


# ----------------------------------------------------------------------------- parallel loading


def _in_window_order(path: Path, units: Sequence[ShardPiece], out: Path) -> Path:
    """The row groups of `units`, in that order, as one file: what a single builder fed the
    window's units in order sees (the streaming ingest of this file)."""
    pf = pq.ParquetFile(path)
    with pq.ParquetWriter(out, pf.schema_arrow) as writer:
        for u in units:
            table = pf.read_row_group(u.row_groups[0])
            writer.write_table(table, row_group_size=table.num_rows)
    return out


def _assert_same_shard(got: Any, want: Any) -> None:
    assert list(got.features) == list(want.features) and list(got.fields) == list(want.fields)
    for name in [*want.features, *want.fields]:
        a = {**got.features, **got.fields}[name]
        b = {**want.features, **want.fields}[name]
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert got.columns.ids == want.columns.ids
    assert got.state_ids == want.state_ids and got.episodes == want.episodes
    assert (got.report.rows_in, got.report.rows_out) == (want.report.rows_in, want.report.rows_out)


def _bad_rows(data: list[dict[str, Any]], rows_per_group: int, groups: Sequence[int]) -> None:
    """A bad action in the 3rd row and a NaN reward in the 5th row of each of `groups`."""
    for g in groups:
        data[g * rows_per_group + 2]["action"] = "jump"
        data[g * rows_per_group + 4]["reward"] = float("nan")


@pytest.mark.parametrize("ids", [IDS, ["0", "1", "2", "3", "11"]])  # "7": next_state only
@pytest.mark.parametrize("drop", [False, True])
def test_parallel_window_equals_one_builder_over_its_units(
    tmp_path: Path, ids: list[str], drop: bool
) -> None:
    data = rows(230, late_feature_at=150)  # 12 row groups of 20 (the last of 10)
    if drop:
        _bad_rows(data, 20, [1, 6])
        for i in range(80, 100):  # row group 4: every row bad
            data[i]["reward"] = float("nan")
    path = write(tmp_path / "t.parquet", data, 20)
    units = stream_units(str(path), 0, 1)
    window = [units[i] for i in (7, 1, 11, 4, 0, 9, 2, 5, 10, 3, 8, 6)]
    one_file = _in_window_order(path, window, tmp_path / "w.parquet")
    want = ingest_dqn(one_file, [(0, 1)], time_diff=True, drop=drop)
    want.reorder(ids)
    for threads in (1, 2, 5):
        got = load_window(window, ids, time_diff=True, drop=drop, threads=threads)
        _assert_same_shard(got, want)
        assert got.report.source == str(path)
    if drop:  # a window of only bad rows is empty
        empty = load_window([units[4], units[4]], ids, time_diff=True, drop=True, threads=2)
        assert len(empty) == 0 and empty.report.rows_in == 40 and empty.episodes == []


@pytest.mark.parametrize("threads", [1, 3])
def test_bad_rows_in_two_row_groups_name_the_earlier_in_the_window(
    tmp_path: Path, threads: int
) -> None:
    data = rows(200)
    _bad_rows(data, 20, [3, 8])
    path = write(tmp_path / "t.parquet", data, 20)
    units = stream_units(str(path), 0, 1)
    for window, first in ((units, 3), (units[::-1], 8)):
        with pytest.raises(DataError) as alone:
            load_window([units[first]])
        with pytest.raises(DataError) as err:
            load_window(window, threads=threads)
        assert str(err.value) == str(alone.value)
        assert f"row group {first})" in str(err.value) and "row 2" in str(err.value)


def test_in_order_raises_the_first_failing_call() -> None:
    import threading
    import time

    started: list[int] = []
    lock = threading.Lock()

    def fn(i: int) -> int:
        with lock:
            started.append(i)
        if i == 1:
            time.sleep(0.2)  # fails last
            raise ValueError("call 1")
        if i == 3:
            raise KeyError("call 3")
        return i * i

    assert in_order(lambda i: i * i, 5, 3) == [0, 1, 4, 9, 16]
    with pytest.raises(ValueError, match="call 1"):
        in_order(fn, 40, 4)
    assert len(started) < 40  # the calls still queued were cancelled


@pytest.mark.parametrize("action_ids", [["100", "101", "102", "103"], ["100", "103", "150"]])
@pytest.mark.parametrize("drop", [False, True])
def test_parallel_parametric_window_equals_one_builder_over_its_units(
    tmp_path: Path, action_ids: list[str], drop: bool
) -> None:
    from tests.data.test_ingest_parametric import (
        ingest_parametric,
        parametric_rows,
        write_parametric,
    )

    data = parametric_rows(170, late_feature_at=120, long_lists_at=100)
    if drop:
        for i in (25, 90, 91, 150):
            data[i]["reward"] = float("nan")
    path = write_parametric(tmp_path / "t.parquet", data, 20)
    units = stream_units(str(path), 0, 1)
    window = [units[i] for i in (4, 8, 0, 6, 2, 7, 1, 5, 3)]
    state_ids = ["0", "1", "2", "3", "11"]
    one_file = _in_window_order(path, window, tmp_path / "w.parquet")
    want = ingest_parametric(one_file, [(0, 1)], max_candidates=7, drop=drop)
    want.conform(state_ids, action_ids, 7)
    for threads in (1, 4):
        got = load_parametric_window(window, state_ids, action_ids, 7, drop=drop, threads=threads)
        _assert_same_shard(got, want)
        assert got.action_ids == want.action_ids
        if drop:
            assert got.report.rows_out == 166


@pytest.mark.parametrize("threads", [1, 4])
def test_parametric_bad_rows_in_two_row_groups_name_the_earlier(
    tmp_path: Path, threads: int
) -> None:
    from tests.data.test_ingest_parametric import parametric_rows, write_parametric

    data = parametric_rows(120)
    data[45]["possible_actions"][0]["101"] = float("nan")  # row group 2, row 5
    data[103]["reward"] = float("inf")  # row group 5, row 3
    path = write_parametric(tmp_path / "t.parquet", data, 20)
    units = stream_units(str(path), 0, 1)
    for window, want in ((units, "row group 2)"), (units[::-1], "row group 5)")):
        with pytest.raises(DataError) as err:
            load_parametric_window(window, ["0"], ["100"], 3, threads=threads)
        assert want in str(err.value), str(err.value)
