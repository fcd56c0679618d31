"""Read-ahead of several windows (`DiskShardStream(read_ahead=d)`, issue 39): the same
chunks for every depth, at most `d` loads in flight, the first bad window's error, no
thread left by close(). Real Parquet row groups loaded through the ingest engine."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

from reagent_lite.config import DQNWorkflowConfig, load_config
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.windows import host_cores, load_threads, stream_units
from reagent_lite.errors import ConfigError, DataError
from tests.data.test_disk_stream import _bad_rows, load_window
from tests.data.test_ingest import rows, write


class Loads:
    """The stream's `load`: a real window load (rows identified by episode and step),
    counting the loads started and the most running at once. Until `hold` loads have
    started, each started load waits for them (at most 30 s): with a pool of `hold`
    workers they then all run at once, whatever the machine's speed."""

    def __init__(self, hold: int = 0, *, drop: bool = False) -> None:
        self.lock = threading.Condition()
        self.started = self.running = self.peak = 0
        self.hold = hold
        self.drop = drop  # drop_bad_rows: a window then has fewer rows than its footers

    def __call__(self, units: Sequence[ShardPiece]) -> dict[str, Tensor]:
        with self.lock:
            self.started += 1
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.started >= self.hold, timeout=30)
        try:
            shard = load_window(units, drop=self.drop, threads=2)
            return {k: torch.from_numpy(shard.fields[k]) for k in ("mdp_id", "sequence_number")}
        finally:
            with self.lock:
                self.running -= 1


def _stream(path: Path, depth: int, load: Loads, window: int = 100) -> DiskShardStream:
    units = stream_units(str(path), 0, 1)
    return DiskShardStream(units, load, window_rows=window, seed=7, rank=0, read_ahead=depth)


def _ids(columns: dict[str, Tensor]) -> np.ndarray:
    return (columns["mdp_id"] * 10 + columns["sequence_number"]).numpy()


def _threads(before: Sequence[threading.Thread] = ()) -> list[str]:
    """The stream threads alive, besides those of `before` (streams of other tests that
    were never closed keep their idle pools)."""
    prefixes = ("reagent-lite-disk", "reagent-lite-unit")
    return [
        t.name for t in threading.enumerate() if t.name.startswith(prefixes) and t not in before
    ]


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize(("step", "steps"), [(48, 14), (30, 6)])
def test_same_chunks_for_every_depth(tmp_path: Path, step: int, steps: int, drop: bool) -> None:
    """Windows of 80 rows (two row groups of 40) cut in steps of 48 carry rows from window
    to window; 14 steps (672 rows) wrap into a second pass of the 500 rows, 6 steps (180)
    end mid-pass, so the next epoch's first windows are read ahead. Epochs run in turn,
    then one again (its loads read ahead are for another epoch), then one abandoned after
    its first chunk (closed, and not closed) and started again. With `drop`, validation
    drops rows of most row groups: an epoch needs more windows than the footers promised,
    after the next epoch's first ones were queued."""
    data = rows(500)
    if drop:
        _bad_rows(data, 40, range(0, 13, 2))  # 2 bad rows in every other row group
        for i in range(120, 160):  # and row group 3 all bad
            data[i]["reward"] = float("nan")
    path = write(tmp_path / "t.parquet", data, 40)

    def alone(epoch: int) -> np.ndarray:
        """The epoch's rows as a fresh stream of one window at a time gives them."""
        stream = _stream(path, 1, Loads(drop=drop))
        stream.configure(step_rows=step, steps_per_epoch=steps)
        ids = np.concatenate([_ids(c) for c, _ in stream.epoch_chunks(epoch)])
        stream.close()
        return ids

    def run(depth: int) -> list[tuple[int, np.ndarray]]:
        """(epoch, its rows) for each epoch run: whole ones, and the first chunk of those
        abandoned."""
        stream = _stream(path, depth, Loads(drop=drop))
        stream.configure(step_rows=step, steps_per_epoch=steps)

        def whole(epoch: int) -> tuple[int, np.ndarray]:
            return epoch, np.concatenate([_ids(c) for c, _ in stream.epoch_chunks(epoch)])

        got = [whole(epoch) for epoch in (0, 1, 2, 3, 1, 2)]
        chunks = stream.epoch_chunks(4)
        got.append((4, _ids(next(chunks)[0])))
        chunks.close()
        got.append(whole(4))
        abandoned = stream.epoch_chunks(5)  # left open: its generator is not closed yet
        got.append((5, _ids(next(abandoned)[0])))
        again = stream.epoch_chunks(5)
        first = _ids(next(again)[0])
        abandoned.close()  # late, mid-way through the epoch run again: leaves its loads be
        got.append((5, np.concatenate([first, *(_ids(c) for c, _ in again)])))
        assert {q.epoch for q in stream._queue} == {6}  # read ahead
        got.append(whole(6))
        stream.close()
        return got

    want = {epoch: alone(epoch) for epoch in range(7)}
    assert all(len(ids) == step * steps for ids in want.values())
    for depth in (1, 2, 3, 5):
        got = run(depth)
        assert [e for e, _ in got] == [0, 1, 2, 3, 1, 2, 4, 4, 5, 5, 6]
        for i, (epoch, ids) in enumerate(got):
            if i in (6, 8):  # the first chunk of an abandoned epoch
                np.testing.assert_array_equal(ids, want[epoch][: len(ids)])
            else:
                np.testing.assert_array_equal(ids, want[epoch])


@pytest.mark.parametrize("depth", [1, 3])
def test_at_most_depth_loads_in_flight_and_queued(tmp_path: Path, depth: int) -> None:
    """The first `depth` loads wait for each other: they must all be running at once for
    the first chunk to come, and no more than `depth` ever run; loads queued ahead of the
    consumer (each a window in memory once loaded) never exceed `depth`."""
    path = write(tmp_path / "t.parquet", rows(480), 40)  # 12 row groups, windows of one
    load = Loads(hold=depth)
    stream = _stream(path, depth, load, window=40)
    stream.configure(step_rows=40, steps_per_epoch=12)
    for epoch in range(3):
        for taken, _ in enumerate(stream.epoch_chunks(epoch), 1):
            assert len(stream._queue) <= depth
            # Loads are handed out in order: at most `depth` started past the one in use.
            assert load.started <= 12 * epoch + taken + depth
    stream.close()
    assert load.peak == depth
    assert load.started >= 36


def test_the_first_bad_window_raises_its_error(tmp_path: Path) -> None:
    """Two bad windows among the three loaded at once: the one handed out first is the
    one whose error is raised, whichever fails first."""
    data = rows(400)
    path = write(tmp_path / "t.parquet", data, 40)
    probe = _stream(path, 1, Loads(), window=40)
    order = [w[0].row_groups[0] for w in _first(probe.windows(0), 4)]
    _bad_rows(data, 40, [order[1], order[2]])  # the epoch's 2nd and 3rd windows
    write(path, data, 40)
    for depth in (1, 3):
        before = threading.enumerate()
        stream = _stream(path, depth, Loads(), window=40)
        stream.configure(step_rows=40, steps_per_epoch=10)
        got = []
        with pytest.raises(DataError) as err:
            for columns, _ in stream.epoch_chunks(0):
                got.append(_ids(columns))
        assert f"(row group {order[1]})" in str(err.value), str(err.value)
        assert len(got) == 1  # the first window's chunk came before the error
        stream.close()
        assert _threads(before) == []


def _first(windows: Iterator[list[ShardPiece]], n: int) -> list[list[ShardPiece]]:
    return [next(windows) for _ in range(n)]


def _gated(
    tmp_path: Path, *, depth: int, free: int, step: int, steps: int
) -> tuple[DiskShardStream, Loads, threading.Event, list[threading.Thread]]:
    """A stream of 12 windows of 40 rows whose loads after the first `free` wait for the
    returned gate; with the threads alive before it."""
    path = write(tmp_path / "t.parquet", rows(480), 40)
    load = Loads()
    gate = threading.Event()
    real = load.__call__

    def gated(units: Sequence[ShardPiece]) -> dict[str, Tensor]:
        if load.started >= free:
            gate.wait(30)
        return real(units)

    before = threading.enumerate()
    stream = DiskShardStream(
        stream_units(str(path), 0, 1), gated, window_rows=40, seed=7, rank=0, read_ahead=depth
    )
    stream.configure(step_rows=step, steps_per_epoch=steps)
    return stream, load, gate, before


def test_close_mid_epoch_leaves_no_thread_and_starts_no_load(tmp_path: Path) -> None:
    """An epoch abandoned after its first chunk while loads run ahead, then close(): the
    loads queued are cancelled, the running ones waited for, the pool's threads gone."""
    stream, load, gate, before = _gated(tmp_path, depth=3, free=1, step=40, steps=12)
    chunks = stream.epoch_chunks(0)
    next(chunks)
    assert len(stream._queue) == 3 and _threads(before)
    gate.set()
    chunks.close()  # the epoch's loads ahead: cancelled or waited for
    stream.close()
    assert _threads(before) == []
    started = load.started
    assert started <= 4  # the first window and at most the three running ahead
    time.sleep(0.2)  # nothing left to start a load later
    assert load.started == started


def test_close_while_a_consumer_waits_on_a_load_ends_it_with_a_clear_error(
    tmp_path: Path,
) -> None:
    """close() from another thread (a prefetch worker that outlived its join) while the
    consumer waits on a window: the consumer ends with a DataError saying so, not a
    KeyError, and no pool is made again after close()."""
    stream, _, gate, before = _gated(tmp_path, depth=2, free=0, step=20, steps=24)
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for _ in stream.epoch_chunks(0):
                pass
        except BaseException as e:
            errors.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(0.3)  # the consumer waits on its first window
    closer = threading.Thread(target=stream.close)
    closer.start()
    time.sleep(0.2)
    gate.set()  # the running loads finish while close() waits for them
    closer.join(30)
    consumer.join(30)
    assert not consumer.is_alive() and not closer.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], DataError), errors
    assert "closed" in str(errors[0])
    assert stream._pool is None and _threads(before) == []


def test_nothing_is_read_ahead_past_the_runs_last_epoch(tmp_path: Path) -> None:
    """The last epoch's loads stop at its own windows: none of an epoch that never runs
    loads while the run evaluates and exports (the stream's `last_epoch`)."""
    path = write(tmp_path / "t.parquet", rows(480), 40)
    counts: dict[int | None, int] = {}
    for last in (None, 1):
        load = Loads()
        stream = _stream(path, 3, load, window=40)
        stream.configure(step_rows=40, steps_per_epoch=12)  # an epoch: all 12 windows
        stream.last_epoch = last
        for epoch in (0, 1):
            for _ in stream.epoch_chunks(epoch):
                pass
        with load.lock:  # give loads read ahead time to start (5 s at most)
            load.lock.wait_for(lambda done=load: done.started > 24, timeout=0.5 if last else 5)
        stream.close()
        counts[last] = load.started
    assert counts[1] == 24  # the two epochs' windows, nothing more
    assert counts[None] > 24  # without it, the next epoch's first windows were read ahead


def test_depth_and_description() -> None:
    units = [ShardPiece(Path("x.parquet"), "row_groups", (0,), num_rows=10)]

    def load(_: Sequence[ShardPiece]) -> dict[str, Tensor]:
        return {}

    auto = DiskShardStream(units, load, window_rows=10, seed=0, rank=0)
    assert auto.depth == 1 and "1 window read ahead (auto)" in auto.describe()
    auto.serial_threads = False  # as a GPU run sets it
    assert auto.depth == max(1, min(3, host_cores() // load_threads()))
    # "auto" counts this rank's share of the cores, not the host's: 8 ranks on 32 cores
    # get 4 each, one load of up to 4 threads; alone on 64 cores, three.
    for cores, depth in ((4, 1), (8, 2), (64, 3)):
        share = DiskShardStream(units, load, window_rows=10, seed=0, rank=0, cores=cores)
        share.serial_threads = False
        assert share.depth == max(1, min(3, cores // load_threads())), cores
        if load_threads() == 4:
            assert share.depth == depth
    three = DiskShardStream(units, load, window_rows=10, seed=0, rank=0, read_ahead=3)
    assert three.depth == 3 and ", 3 windows read ahead, " in three.describe()
    with pytest.raises(ValueError, match="read_ahead must be 'auto' or >= 1, got 0"):
        DiskShardStream(units, load, window_rows=10, seed=0, rank=0, read_ahead=0)


@pytest.mark.parametrize("value", [0, -2, 65, 2.5, True, "3", "fast", None])
def test_config_key_refuses_what_is_not_auto_or_a_count(tmp_path: Path, value: object) -> None:
    path = tmp_path / "c.json"
    settings = {**_MINIMAL, "stream_from_disk": True, "stream_read_ahead": value}
    path.write_text(json.dumps(settings))
    with pytest.raises(ConfigError) as err:
        load_config(path, DQNWorkflowConfig)
    assert err.value.exit_code == 2
    got = json.dumps(value)
    want = f'{path}: stream_read_ahead: expected "auto" or an integer from 1 to 64 (got {got})'
    assert str(err.value) == want


@pytest.mark.parametrize("value", [1, 3, 64, "auto"])
def test_config_key_takes_auto_or_a_count(tmp_path: Path, value: object) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**_MINIMAL, "stream_read_ahead": value}))
    assert load_config(path, DQNWorkflowConfig).stream_read_ahead == value


_MINIMAL = {"training_data_path": "t.parquet", "model_output_path": "out", "actions": ["l", "r"]}
