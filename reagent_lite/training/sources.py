"""Where a training step's rows come from: the batch sources of `steps.StepRunner`.

A source hands out each optimizer step's `minibatches_per_step` micro-batches. For an
eager step it returns them (`batches()`); for a captured CUDA graph it keeps buffers at
fixed device addresses that the graph reads (`static()`, once) and puts the next step's
rows where the graph will find them before each replay (`stage()`).

* `ResidentRows`: the shard lives on the training device (`device_resident_data: true`,
  or a CPU run not streaming from disk) and a step's rows are gathered from it by index:
  eagerly from the sampler's index tensors; in a graph from the epoch's index table on the
  device, whose row a device counter picks at each replay.
* `HostStreamed`: the shard stays in host memory (`device_resident_data: false` on CUDA);
  chunks of whole steps, in epoch order, are gathered by the prefetcher's worker thread
  into pinned buffers and copied to the device on a side stream while the current chunk
  trains (`prefetch.ChunkPrefetcher.gathered`).
* `DiskStreamed` (`stream_from_disk: true`): `DiskShardStream` yields chunks (a
  shuffled window's rows); the same prefetcher cuts them to at most `chunk_rows` rows
  (`ChunkPrefetcher.ready`). On CUDA the stream's windows are copied to the device whole
  and shuffled there as they load, so the chunks are device rows, handed on as they are;
  on the CPU they are host rows, used where they are.

Streamed, an eager step's micro-batches are views of the current chunk, and a graph's
static buffers hold one chunk, which each chunk is copied into: device memory holds at
most two chunks (plus that static one), not the shard.

A streamed source's chunk stream runs from the epoch it starts at to the run's last one
(`epochs`): the next epoch's first chunk is gathered and copied while the current epoch's
last one trains, as any other chunk is, so an epoch does not begin by waiting for its
first chunk. `begin_epoch(e)` carries on with that stream when the previous epoch was
`e - 1` and was trained to its end; otherwise (the first epoch, a resumed run, an epoch
left early) it starts a new one at `e`. An epoch's chunks are the same either way: they
depend on the epoch alone.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator

import torch
from torch import Tensor

from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.rows import LazyBatch as LazyBatch
from reagent_lite.data.rows import RowPack, Rows
from reagent_lite.data.sampler import EpochSampler
from reagent_lite.kinds.base import EVAL_ONLY_FIELDS
from reagent_lite.training.budget import available_bytes
from reagent_lite.training.prefetch import ChunkPrefetcher


def training_columns(data: Rows) -> Rows:
    """The shard's columns that training steps may read (no copies)."""
    return data.without(EVAL_ONLY_FIELDS)


class StaticRows(Rows):
    """What a captured step reads: columns at fixed device addresses (this `Rows`) and,
    for each step, the row `order[pos]` of a device index table, `pos` a device counter
    that the step advances itself — so every replay of one graph reads the next step's
    rows, as `LazyBatch` views of these columns."""

    __slots__ = ("minibatches", "order", "pos")

    def __init__(self, columns: Rows, order: Tensor, minibatches: int):
        super().__init__(dict(columns.items()))
        self.order = order  # [steps, rows per step]
        self.minibatches = minibatches
        self.pos = torch.zeros(1, dtype=torch.int64, device=order.device)

    def rewind(self) -> None:
        self.pos.zero_()

    def batches(self) -> list[LazyBatch]:
        """The step's micro-batches, found by device operations only."""
        rows = self.order.index_select(0, self.pos).view(self.minibatches, -1)
        self.pos.add_(1)
        return [LazyBatch(self, rows[j]) for j in range(self.minibatches)]


# A streamed source between chunks: no rows held.
_NO_ROWS = Rows({})


class BatchSource(ABC):
    """A step's micro-batches of `batch` rows each, `minibatches` of them per step."""

    def __init__(self, minibatches: int, batch: int) -> None:
        self.minibatches = minibatches
        self.batch = batch
        self.step_rows = minibatches * batch
        self.static_rows: StaticRows | None = None
        # Seconds the training thread waited for rows since the epoch began: None for a
        # source that never waits (its rows are already where the step reads them).
        self.waited: float | None = None

    @abstractmethod
    def begin_epoch(self, epoch: int) -> None:
        """Starts the epoch's stream of steps."""

    @abstractmethod
    def batches(self) -> list[LazyBatch]:
        """The next step's micro-batches (an eager step)."""

    @abstractmethod
    def static(self) -> StaticRows:
        """Allocates the buffers a captured step reads (after `begin_epoch`)."""

    @abstractmethod
    def stage(self) -> None:
        """Before each replay: the next step's rows where the static buffers expect them."""

    def release_static(self) -> None:
        """The graph was not captured: its buffers are not needed."""
        self.static_rows = None

    @abstractmethod
    def close(self) -> None:
        """Ends the epoch's stream, if any; idempotent."""

    @abstractmethod
    def describe(self) -> str:
        """Where the rows are, for the log."""


class ResidentRows(BatchSource):
    """The shard on the training device, rows gathered by index (see the module notes)."""

    def __init__(
        self,
        columns: Rows,
        pack: RowPack | None,
        sampler: EpochSampler,
        steps_per_epoch: int,
        minibatches: int,
        batch: int,
    ) -> None:
        super().__init__(minibatches, batch)
        self.columns = columns
        self.pack = pack
        self.sampler = sampler
        self.steps_per_epoch = steps_per_epoch
        self.device = next(iter(columns.values())).device
        self._indices: Iterator[Tensor] = iter(())
        self._epoch = 0

    def begin_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        self.sampler.set_epoch(epoch)
        self._indices = iter(self.sampler)  # lazy: no indices are drawn until asked for
        if self.static_rows is not None:
            self.static_rows.order.copy_(self._order())
            self.static_rows.rewind()

    def _order(self) -> Tensor:
        return self.sampler.epoch_indices(self._epoch).view(self.steps_per_epoch, self.step_rows)

    def batches(self) -> list[LazyBatch]:
        return [
            LazyBatch(self.columns, next(self._indices), self.pack) for _ in range(self.minibatches)
        ]

    def static(self) -> StaticRows:
        order = self._order().to(self.device).contiguous()
        self.static_rows = StaticRows(self.columns, order, self.minibatches)
        return self.static_rows

    def stage(self) -> None:
        pass  # the epoch's index table is in place; the graph advances its own counter

    def close(self) -> None:
        pass  # no stream, no worker

    def describe(self) -> str:
        return f"resident on {self.device}"


class StreamedRows(BatchSource):
    """Chunks of whole steps reaching the device through a `ChunkPrefetcher`, one stream
    from an epoch to the run's last (`epochs`; see the module notes)."""

    def __init__(
        self,
        template: Rows,
        device: torch.device,
        chunk_rows: int,
        minibatches: int,
        batch: int,
        epochs: int | None = None,
    ) -> None:
        super().__init__(minibatches, batch)
        self.template = template
        self.device = device
        self.chunk_rows = chunk_rows
        self.epochs = epochs  # the stream ends after epoch `epochs - 1` (None: never)
        self.prefetcher = ChunkPrefetcher(template, device, chunk_rows)
        self._chunks: Generator[Rows, None, None] | None = None
        self._chunk = _NO_ROWS
        self._steps_left = 0  # in the current chunk
        self._start = 0  # its next step's first row
        self._epoch = -1  # the epoch being trained
        self._epoch_rows_left = 0  # its rows not yet handed to a step
        self.waited = 0.0

    @property
    @abstractmethod
    def rows_per_epoch(self) -> int:
        """The rows an epoch's chunks hold (whole steps)."""

    @abstractmethod
    def _stream(self, epochs: Iterator[int]) -> Generator[Rows, None, None]:
        """The chunks of `epochs`, one after the other, from the prefetcher."""

    def _epochs_from(self, first: int) -> Iterator[int]:
        last = self.epochs if self.epochs is not None else 1 << 62
        return iter(range(first, max(last, first + 1)))

    def begin_epoch(self, epoch: int) -> None:
        carry_on = (
            self._chunks is not None and epoch == self._epoch + 1 and self._epoch_rows_left == 0
        )
        if not carry_on:
            self.close()  # the last stream: its worker is gone before a new one starts
            self._chunks = self._stream(self._epochs_from(epoch))
            self._steps_left = 0
        self._epoch, self._epoch_rows_left = epoch, self.rows_per_epoch
        self.waited = 0.0

    def _next_chunk(self) -> Rows:
        assert self._chunks is not None
        self._chunk = _NO_ROWS  # done with it: the prefetcher may stage the chunk after the next
        start = time.perf_counter()
        chunk = next(self._chunks)
        # What the epoch record reports as `data_wait_s` (on CUDA the device may still have
        # had queued steps to run meanwhile: an upper bound on its idle time).
        self.waited = (self.waited or 0.0) + time.perf_counter() - start
        self._steps_left, self._start = len(chunk) // self.step_rows, 0
        return chunk

    def _take_step(self) -> int:
        self._steps_left -= 1
        self._epoch_rows_left -= self.step_rows
        self._start += self.step_rows
        return self._start - self.step_rows

    def batches(self) -> list[LazyBatch]:
        if self._steps_left == 0:
            self._chunk = self._next_chunk()
        start, b = self._take_step(), self.batch
        return [
            LazyBatch(self._chunk, slice(start + j * b, start + (j + 1) * b))
            for j in range(self.minibatches)
        ]

    def stage(self) -> None:
        if self._steps_left == 0:
            assert self.static_rows is not None
            chunk = self._next_chunk()
            rows = len(chunk)
            for k, t in chunk.items():
                self.static_rows[k][:rows].copy_(t)
            self.static_rows.rewind()
        self._take_step()

    def static(self) -> StaticRows:
        columns = Rows(
            {
                k: torch.zeros((self.chunk_rows, *v.shape[1:]), dtype=v.dtype, device=self.device)
                for k, v in self.template.items()
            }
        )
        order = torch.arange(self.chunk_rows, device=self.device).view(-1, self.step_rows)
        self.static_rows = StaticRows(columns, order, self.minibatches)
        return self.static_rows

    def close(self) -> None:
        chunks, self._chunks, self._chunk = self._chunks, None, _NO_ROWS
        self._steps_left = 0
        if chunks is not None:
            chunks.close()  # joins the prefetcher's worker

    def _copies(self) -> str:
        if not self.prefetcher.cuda:
            return ""
        return (
            f"; chunks of {self.chunk_rows} rows copied to {self.device} from pinned "
            "buffers on a side stream while the previous chunk trains"
        )


class HostStreamed(StreamedRows):
    """The shard in host memory, gathered chunk by chunk in epoch order."""

    def __init__(
        self,
        columns: Rows,
        sampler: EpochSampler,
        device: torch.device,
        chunk_rows: int,
        minibatches: int,
        batch: int,
        epochs: int | None = None,
    ) -> None:
        super().__init__(columns, device, chunk_rows, minibatches, batch, epochs)
        self.columns = columns
        self.sampler = sampler

    @property
    def rows_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch * self.sampler.batch_size

    def begin_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        super().begin_epoch(epoch)

    def _stream(self, epochs: Iterator[int]) -> Generator[Rows, None, None]:
        # The epoch's row order is drawn in the worker thread, as late as it is needed.
        orders = (self.sampler.epoch_indices(e).cpu() for e in epochs)
        return self.prefetcher.gathered(self.columns, orders)

    def describe(self) -> str:
        return "streamed from host" + self._copies()


class DiskStreamed(StreamedRows):
    """The disk stream's windows, chunk by chunk; `template` (the normalized sample) gives
    the columns' names, dtypes and row shapes."""

    def __init__(
        self,
        disk: DiskShardStream,
        template: Rows,
        device: torch.device,
        chunk_rows: int,
        minibatches: int,
        batch: int,
        epochs: int | None = None,
    ) -> None:
        # The disk's chunks (whole steps, up to a window's worth) are cut to `chunk_rows` on
        # the way to the device: device and pinned memory don't grow with windows.
        super().__init__(
            template, device, min(chunk_rows, disk.chunk_rows), minibatches, batch, epochs
        )
        self.disk = disk
        # Serial stream threads protect a CPU training thread's OpenMP team; on a GPU the
        # host gathers are better parallel (disk_stream's module notes).
        disk.serial_threads = device.type != "cuda"
        # On a GPU the windows are shuffled there and chunks read in place (no pinned copy),
        # where they fit; prepared windows are then read into pinned memory (async copies).
        on_device = device.type == "cuda" and windows_fit(
            template, disk.window_rows, disk.depth, available_bytes(device)
        )
        disk.window_device = device if on_device else None
        if disk.prepared is not None:
            disk.prepared.pin_memory = on_device
        disk.last_epoch = None if epochs is None else epochs - 1

    @property
    def rows_per_epoch(self) -> int:
        return self.disk.rows_per_epoch

    def _stream(self, epochs: Iterator[int]) -> Generator[Rows, None, None]:
        def chunks() -> Generator[Rows, None, None]:
            for epoch in epochs:
                pieces = self.disk.epoch_chunks(epoch)  # (columns, rows) pairs
                try:
                    for columns, _ in pieces:
                        yield Rows(columns)
                        del columns  # not held while the disk prepares the next chunk
                finally:
                    # Closing this generator closes the epoch's: its pending window load stops.
                    if isinstance(pieces, Generator):
                        pieces.close()

        return self.prefetcher.ready(chunks())

    def describe(self) -> str:
        if self.disk.window_device is not None:
            return self.disk.describe() + f"; chunks of {self.chunk_rows} rows read in place"
        return self.disk.describe() + self._copies()


def windows_fit(template: Rows, window_rows: int, depth: int, free: int | None) -> bool:
    """Whether a disk stream's windows (`depth` + 2 of `window_rows` rows of `template`'s
    columns: `disk_stream`'s module notes) fit in half of `free` device memory, the other
    half left to the step; unknown free memory: no."""
    row = sum(t.element_size() * (t[0].numel() if len(t) else 0) for t in template.values())
    return free is not None and (depth + 2) * window_rows * row <= free // 2
