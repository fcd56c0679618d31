"""Chunks of training rows moved to the training device ahead of the step that reads them.

Both streamed batch sources of the training step end here (`sources.HostStreamed`: rows
gathered from a shard held in host memory, `device_resident_data: false`,
`ChunkPrefetcher.gathered`; `sources.DiskStreamed`: chunks read from disk,
`stream_from_disk: true`, `ChunkPrefetcher.ready`). A worker thread prepares chunk
c+1 while the training thread trains on chunk c. On CUDA it writes the rows into one of two
pinned host buffers (sized to `chunk_rows`, sliced for a shorter chunk) and copies them to
the device on a side stream (`non_blocking`); the training thread's stream waits on the
copy's event before reading, and `record_stream` keeps the caching allocator from handing
the chunk's memory back to the side stream while the training stream may still read it.
At most two chunks are alive (the one trained on, the one staged), so device and pinned
memory stay bounded whatever the shard's size.

On the CPU there is nothing to copy, and a chunk prepared ahead would cost host memory —
what disk streaming exists to save — for a gather that is a small part of a CPU step: no
chunk is prepared ahead, but chunks still pass through the worker, so errors, order and
shutdown behave as on CUDA.

An error raised while preparing a chunk (a `DataError` for bad rows in a window) is raised
again, the same object, in the training thread. Closing the stream (end of epoch, an error
in training) stops the worker and joins it, waiting at most `_JOIN_S` seconds.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Generator, Iterable, Iterator

import torch
from torch import Tensor

from reagent_lite.data.rows import Rows

log = logging.getLogger("reagent_lite")

# Prepares one chunk's host rows: written into the given buffers (pinned slices of the
# chunk's size) or, given None (nothing to copy), in whatever host memory suits.
Fill = Callable[[Rows | None], Rows]
# A chunk on its way to the training thread, with the event its copy recorded (CUDA).
Staged = tuple[Rows, "torch.cuda.Event | None"]
# How long closing a stream waits for a worker busy preparing a chunk (reading a window).
_JOIN_S = 60.0


def _gather(columns: Rows, idx: Tensor, out: Rows | None) -> Rows:
    if out is None:
        return columns.index(idx)
    return Rows({k: torch.index_select(v, 0, idx, out=out[k]) for k, v in columns.items()})


def _place(columns: Rows, out: Rows | None) -> Rows:
    if out is None:
        return columns
    return Rows({k: out[k].copy_(v) for k, v in columns.items()})


def _as_is(columns: Rows, out: Rows | None) -> Rows:
    """A chunk already on the training device: no staging copy."""
    return columns


class ChunkPrefetcher:
    """Streams chunks of at most `chunk_rows` rows to `device`, one at a time per stream
    (the pinned buffers are shared). `template` gives the columns' names, dtypes and row
    shapes; `ahead` is how many chunks are prepared ahead of the one trained on (default:
    1 on CUDA, 0 on the CPU — see the module notes)."""

    def __init__(
        self,
        template: Rows,
        device: torch.device,
        chunk_rows: int,
        *,
        ahead: int | None = None,
    ) -> None:
        self.device = device
        self.chunk_rows = chunk_rows
        self.cuda = device.type == "cuda"
        self.ahead = (1 if self.cuda else 0) if ahead is None else ahead
        self._template = {k: (v.shape[1:], v.dtype) for k, v in template.items()}
        self._pinned: list[Rows] = []
        self._copied: list[torch.cuda.Event | None] = [None, None]
        if self.cuda:
            self._side = torch.cuda.Stream(device)
            self._fresh_buffers()

    def _fresh_buffers(self) -> None:
        """Two pinned host buffers of `chunk_rows` rows per column (CUDA only)."""
        if not self.cuda:
            return
        self._pinned = [
            Rows(
                {
                    k: torch.empty((self.chunk_rows, *shape), dtype=dtype, pin_memory=True)
                    for k, (shape, dtype) in self._template.items()
                }
            )
            for _ in range(2)
        ]
        self._copied = [None, None]

    def gathered(self, columns: Rows, orders: Iterable[Tensor]) -> Generator[Rows, None, None]:
        """Rows `order` (host indices) of the host `columns`, `chunk_rows` at a time, for
        each order of `orders` in turn (a chunk never spans two); `orders` is advanced by
        the worker."""

        def pieces() -> Generator[tuple[int, Fill], None, None]:
            for order in orders:
                for idx in order.split(self.chunk_rows):
                    yield idx.numel(), functools.partial(_gather, columns, idx)

        return self._stream(pieces())

    def ready(self, chunks: Iterator[Rows]) -> Generator[Rows, None, None]:
        """The `chunks`, in order, a chunk longer than `chunk_rows` cut into views of at
        most that many rows (whole steps, when both sizes are whole steps). `chunks` is
        advanced, and closed, by the worker. Host chunks are copied to the device; chunks
        already there (a disk stream's device windows, ready on any stream:
        `windows.settled`) are handed on as they are, and recorded on the reading stream
        as a copied chunk is."""

        def pieces() -> Generator[tuple[int, Fill], None, None]:
            try:
                for columns in chunks:
                    rows = len(columns)
                    there = self.cuda and next(columns.values()).device == self.device
                    for start in range(0, rows, self.chunk_rows):
                        n = min(self.chunk_rows, rows - start)
                        part = columns.slice(start, start + n)
                        yield n, functools.partial(_as_is if there else _place, part)
                        del part
                    del columns  # not held while the source prepares the next chunk
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()  # e.g. the disk stream's generator: cancels its pending read

        return self._stream(pieces())

    def _stage(self, n: int, rows: int, fill: Fill) -> Staged:
        """Chunk `n` of a stream on its way to the device, with the event its copy records."""
        if not self.cuda:
            return fill(None), None
        # A new thread starts on GPU 0: without this, a rank on another GPU would create a
        # context there (and wait on events) from the worker.
        with torch.cuda.device(self.device):
            return self._stage_cuda(n, rows, fill)

    def _stage_cuda(self, n: int, rows: int, fill: Fill) -> Staged:
        slot = n % 2
        done = self._copied[slot]
        if done is not None:
            done.synchronize()  # the pinned buffer's last copy has landed
        host = fill(self._pinned[slot].slice(0, rows))
        with torch.cuda.stream(self._side):
            dev = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._side)
        self._copied[slot] = event
        return dev, event

    def _stream(
        self, pieces: Generator[tuple[int, Fill], None, None]
    ) -> Generator[Rows, None, None]:
        # None: the stream's end; an exception: raised again here.
        staged: queue.SimpleQueue[Staged | BaseException | None] = queue.SimpleQueue()
        stop = threading.Event()
        # One permit per chunk that may be alive: the caller's and those prepared ahead.
        room = threading.Semaphore(self.ahead + 1)

        def work() -> None:
            try:
                for n in itertools.count():
                    room.acquire()
                    if stop.is_set():
                        return
                    piece = next(pieces, None)
                    if stop.is_set():  # closed while the source was being read
                        return
                    if piece is None:
                        staged.put(None)
                        return
                    staged.put(self._stage(n, *piece))
                    del piece  # its host rows are staged: don't hold them while preparing more
            except BaseException as err:  # raised again in the caller's thread
                staged.put(err)
            finally:
                pieces.close()

        worker = threading.Thread(target=work, name="reagent-lite-prefetch", daemon=True)
        worker.start()
        try:
            while True:
                item = staged.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                columns, event = item
                del item
                if event is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event)
                    for t in columns.values():
                        # Allocated on the side stream, read on this one: keep the allocator
                        # from reusing the memory before this stream is done with it.
                        t.record_stream(current)
                yield columns
                del columns  # the caller asks for the next chunk: it is done with this one
                room.release()
        finally:
            stop.set()
            room.release()  # wakes a worker waiting for room, which then sees `stop`
            worker.join(_JOIN_S)
            if worker.is_alive():
                log.warning(
                    "chunk prefetch: the worker is still preparing a chunk after %g s; "
                    "leaving it to finish in the background",
                    _JOIN_S,
                )
                # It stops before staging anything, but give the next stream buffers of its
                # own anyway: the straggler may be inside `_stage` already.
                self._fresh_buffers()
