"""The chunk prefetcher (`training/prefetch.py`): order, chunk sizes, how far it reads ahead,
errors and shutdown on the CPU (the code every device runs); pinned copies on CUDA."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator

import pytest
import torch
from torch import Tensor

from reagent_lite.data.rows import Rows
from reagent_lite.errors import DataError
from reagent_lite.training import prefetch
from reagent_lite.training.prefetch import ChunkPrefetcher

CPU = torch.device("cpu")


def _columns(n: int, start: int = 0) -> Rows:
    rows = torch.arange(start, start + n)
    return Rows({"reward": rows.float(), "state": torch.stack([rows, -rows], 1).float()})


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "reagent-lite-prefetch"]


class Source:
    """Chunks of the given sizes (consecutive row numbers), counting what was taken."""

    def __init__(self, sizes: list[int], fail_after: int | None = None) -> None:
        self.sizes = sizes
        self.fail_after = fail_after
        self.taken = 0
        self.closed = False
        self.error = DataError("t.parquet (row group 3): column action: 1 bad row (row 7)")
        # Per chunk after the first: was the previous one still referenced when it was made?
        self.previous_alive: list[bool] = []

    def __iter__(self) -> Iterator[Rows]:
        start = 0
        last: weakref.ref[Tensor] | None = None
        try:
            for n in self.sizes:
                if self.fail_after is not None and self.taken == self.fail_after:
                    raise self.error
                if last is not None:
                    self.previous_alive.append(last() is not None)
                self.taken += 1
                columns = _columns(n, start)
                last = weakref.ref(columns["state"])
                yield columns
                del columns
                start += n
        finally:
            self.closed = True


@pytest.mark.parametrize("ahead", [0, 1])
def test_ready_chunks_in_order_cut_to_chunk_rows(ahead: int) -> None:
    source = Source([96, 32, 160])
    chunks = list(ChunkPrefetcher(_columns(1), CPU, 64, ahead=ahead).ready(iter(source)))
    assert all(type(c) is Rows for c in chunks)  # the one row container, not a tuple
    assert [len(c) for c in chunks] == [64, 32, 32, 64, 64, 32]
    got = torch.cat([c["state"] for c in chunks])
    torch.testing.assert_close(got, _columns(288)["state"])
    assert source.closed and not _workers()


def test_cpu_default_reads_nothing_ahead() -> None:
    # The CPU gains little from a chunk ahead and would pay a window of host memory for it.
    assert ChunkPrefetcher(_columns(1), CPU, 8).ahead == 0
    source = Source([8] * 6)
    stream = ChunkPrefetcher(_columns(1), CPU, 8).ready(iter(source))
    for i, _ in enumerate(stream):
        time.sleep(0.02)  # time for the worker to run ahead, if it would
        assert source.taken == i + 1


def test_a_chunk_is_let_go_before_the_next_is_read() -> None:
    # Host memory: a chunk (up to a window of rows) must not outlive its use on the CPU.
    source = Source([16, 8, 24, 8])
    stream = ChunkPrefetcher(_columns(1), CPU, 8).ready(iter(source))
    sizes = []
    for _ in range(7):
        chunk = next(stream)
        sizes.append(len(chunk))
        del chunk  # as the step runner does before it asks for the next
    assert sizes == [8] * 7
    stream.close()
    assert source.previous_alive == [False, False, False]


def test_one_chunk_ahead_is_prepared_while_the_caller_works() -> None:
    source = Source([8] * 6)
    stream = ChunkPrefetcher(_columns(1), CPU, 8, ahead=1).ready(iter(source))
    for i, _ in enumerate(stream):
        deadline = time.monotonic() + 5
        want = min(i + 2, 6)
        while source.taken < want and time.monotonic() < deadline:
            time.sleep(0.005)
        assert source.taken == want  # the next chunk is ready before it is asked for
        time.sleep(0.01)
        assert source.taken == want  # and no further: memory stays bounded


def test_source_error_is_raised_in_the_caller_unchanged() -> None:
    source = Source([8] * 4, fail_after=2)
    stream = ChunkPrefetcher(_columns(1), CPU, 8, ahead=1).ready(iter(source))
    assert len(next(stream)) == 8
    assert len(next(stream)) == 8
    with pytest.raises(DataError) as err:
        next(stream)
    assert err.value is source.error  # same type, same message, same object
    assert source.closed and not _workers()


@pytest.mark.parametrize("ahead", [0, 1])
def test_stopping_early_stops_the_worker_and_closes_the_source(ahead: int) -> None:
    source = Source([8] * 1000)
    stream = ChunkPrefetcher(_columns(1), CPU, 8, ahead=ahead).ready(iter(source))
    with pytest.raises(RuntimeError, match="training failed"), contextlib.closing(stream):
        for i, _ in enumerate(stream):
            if i == 2:
                raise RuntimeError("training failed")
    assert source.closed and not _workers()
    assert source.taken <= 4


def test_closing_waits_a_bounded_time_for_a_busy_worker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prefetch, "_JOIN_S", 0.2)
    release = threading.Event()

    def slow() -> Iterator[Rows]:
        yield _columns(8)
        release.wait(30)  # a window read that takes long
        yield _columns(8)

    stream = ChunkPrefetcher(_columns(1), CPU, 8, ahead=1).ready(slow())
    next(stream)
    t = time.monotonic()
    stream.close()
    assert time.monotonic() - t < 5
    assert "still preparing a chunk" in caplog.text
    release.set()  # the worker then sees the stop and ends
    for worker in _workers():
        worker.join(5)
    assert not _workers()


def test_a_worker_left_behind_stages_nothing_after_the_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A straggler (closed while reading a slow window) must not stage its chunk into the
    buffers the next stream uses."""
    monkeypatch.setattr(prefetch, "_JOIN_S", 0.2)
    staged: list[float] = []
    place = prefetch._place

    def recording(columns: Rows, out: object) -> Rows:
        staged.append(float(columns["reward"][0]))
        return place(columns, out)  # type: ignore[arg-type]

    monkeypatch.setattr(prefetch, "_place", recording)
    release = threading.Event()

    def slow() -> Iterator[Rows]:
        yield _columns(8)
        release.wait(30)
        yield _columns(8, start=1000)  # the straggler's chunk

    prefetcher = ChunkPrefetcher(_columns(1), CPU, 8, ahead=1)
    old = prefetcher.ready(slow())
    next(old)
    old.close()  # the worker is still inside the slow read
    new = list(prefetcher.ready(iter(Source([8, 8]))))
    release.set()
    for worker in _workers():
        worker.join(5)
    assert len(new) == 2 and not _workers()
    assert 1000.0 not in staged


@pytest.mark.gpu
def test_cuda_chunks_match_the_host_rows() -> None:
    cuda = torch.device("cuda:0")
    host = _columns(300)
    pf = ChunkPrefetcher(host, cuda, 64)
    assert pf.ahead == 1 and all(b.is_pinned() for b in pf._pinned[0].values())
    # Ready chunks of varying length (pinned buffers sliced), more chunks than buffers.
    source = Source([96, 32, 160, 12])
    seen = []
    for chunk in pf.ready(iter(source)):
        assert chunk["state"].device.type == "cuda" and chunk["state"].shape[0] == len(chunk)
        torch.cuda._sleep(1_000_000)  # a slow consumer: staging must still not clobber
        seen.append(chunk)  # kept alive past the pinned buffer's reuse
    got = torch.cat([c["state"] for c in seen]).cpu()
    torch.testing.assert_close(got, _columns(300)["state"])
    assert source.previous_alive == [False, False, False]  # host rows not held once copied
    # Gathers straight into the pinned buffers: rows in `order`.
    order = torch.randperm(300)
    chunks = list(pf.gathered(host, [order]))
    assert [len(c) for c in chunks] == [64, 64, 64, 64, 44]
    got = torch.cat([c["reward"] for c in chunks]).cpu()
    torch.testing.assert_close(got, host["reward"][order])
    assert not _workers()


@pytest.mark.gpu
def test_cuda_chunks_already_on_the_device_are_handed_on_without_a_copy() -> None:
    """A disk stream's device windows (issue 39): chunks cut to `chunk_rows` as views of
    them, no pinned staging, the reading stream recorded on them."""
    cuda = torch.device("cuda:0")
    pf = ChunkPrefetcher(_columns(1), cuda, 64)
    windows = [_columns(n, start).to(cuda) for n, start in [(96, 0), (160, 96)]]
    chunks = list(pf.ready(iter(windows)))
    assert [len(c) for c in chunks] == [64, 32, 64, 64, 32]
    starts = [(0, 0), (0, 64), (1, 0), (1, 64), (1, 128)]
    for chunk, (w, row) in zip(chunks, starts, strict=True):  # views of the windows
        assert chunk["state"].data_ptr() == windows[w]["state"][row:].data_ptr()
    got = torch.cat([c["state"] for c in chunks]).cpu()
    torch.testing.assert_close(got, _columns(256)["state"])
    assert not _workers()
