"""Training data streamed from disk by Parquet row groups (`stream_from_disk: true`).

A rank never holds its whole shard. Its rows are split into units — one Parquet row group
each (a row-range piece, when there are fewer row groups than ranks, is one unit) — whose
row counts, from the footers, fix the steps per epoch on every rank before a row is read.

Each epoch the rank visits its units in an order drawn from (seed, rank, epoch, pass),
packs consecutive units into windows of at most `window_rows` rows (a single larger row
group is a window of its own), loads a window through the streaming ingest (same
validation, tensorization and in-place normalization as the resident path; its units in
parallel, `windows.load_units`), gathers the window's rows in a shuffled order once, in
that background thread (`windows.shuffled`), and hands them out in chunks of whole steps —
slices of it, no copy — while the next windows load. A GPU run (`window_device`) copies
the window to the device whole and gathers it there instead (`windows.shuffled_on`: the
same rows, bit for bit): the host's gather was most of a window's load, and the chunks are
then read where they are. Rows that do not fill a whole step at the end of a window are
carried into the next one; an epoch that needs more steps than the shard holds starts a
fresh pass with a new unit order, as `EpochSampler` wraps.

Read-ahead (`read_ahead`, the config's `stream_read_ahead`): up to `depth` window loads
run at once on a pool of that many threads, queued in the order they are handed out — the
epoch's next windows until their rows by the footers cover it, then the next epoch's first
ones. Each window's rows and order come from (seed, rank, epoch, window index) alone and
windows are handed out in order, so the chunks, and the first bad window's error, are the
same at every depth. An epoch that ends (or is abandoned) cancels its queued loads and
waits for its running ones; `close` does the same for all and stops the pool. When
validation drops rows, an epoch may need one window more than the footers promised.

Both workflows stream (`Kind.load_window`; parametric_dqn's K is fixed before training,
by `scan_units` or `max_candidates`, so every window has the same column shapes).

The trade-off: shuffling is window-local: a minibatch mixes only rows of the row groups
in its window (smaller row groups and a larger window bring it closer to a full shuffle).
Memory is about `depth` + 2 windows whatever the shard's size (the one trained on, `depth`
loaded or loading, a shuffled copy being made; at worst 2 `depth` + 1), plus the Arrow
data of the row groups being decoded. A GPU run holds them in device memory (`DiskStreamed`
falls back to host windows where they would not fit) and its host only the windows being
loaded (prepared ones in page-locked memory, which torch caches for reuse).

The stream's threads run torch on one OpenMP thread (`one_omp_thread`) in a CPU run: a
second OpenMP team makes libgomp stop spinning in every team, the training thread's
included (streamed dqn ran at a quarter of resident speed on 2 cores, issue 41). A GPU run
sets `serial_threads` off: its host work goes faster on `load_threads()` threads.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from reagent_lite.data.readers import ShardPiece
from reagent_lite.data.window_cut import Left, Window
from reagent_lite.data.windows import (
    host_cores,
    load_threads,
    one_omp_thread,
    shuffled,
    shuffled_on,
)
from reagent_lite.errors import DataError

if TYPE_CHECKING:
    from reagent_lite.data.prepared import PreparedUnits


def _rng(seed: int, rank: int, epoch: int, what: int, index: int) -> np.random.Generator:
    """Seeded by (seed, rank, epoch) and `what` (0: unit order of pass `index`, 1: row
    order of window `index`)."""
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, rank, epoch, what, index])


@dataclass
class _Plan:
    """An epoch's window loads: its windows (in order), how many were `submitted` and
    their rows by the footers (`rows`, less what validation dropped from those loaded), and
    how many were `taken` (handed to the epoch's consumer)."""

    epoch: int
    windows: Iterator[list[ShardPiece]]
    submitted: int = 0
    rows: int = 0
    taken: int = 0


@dataclass
class _Queued:
    epoch: int
    rows: int  # by the footers
    load: Future[Window]


class DiskShardStream:
    """The chunks of an epoch, read from disk window by window (see the module docstring).

    `prepare` turns a loaded window (`load(units)`) into training columns (normalized
    tensors). `configure` sets the step geometry before the first epoch; `epoch_chunks`
    then yields (host columns, rows) pieces of whole steps, `rows_per_epoch` in all; the
    step runner's prefetcher moves them to the training device. `read_ahead`: windows
    loaded at once ahead of the one being trained on (an int >= 1, or "auto": see
    `depth`).
    """

    def __init__(
        self,
        units: Sequence[ShardPiece],
        load: Callable[[Sequence[ShardPiece]], dict[str, Tensor]],
        *,
        window_rows: int,
        seed: int,
        rank: int,
        prepared: PreparedUnits | None = None,
        read_ahead: int | Literal["auto"] = "auto",
        cores: int | None = None,
    ) -> None:
        if not units:
            raise DataError("stream_from_disk: this rank's shard has no rows")
        if read_ahead != "auto" and read_ahead < 1:
            raise ValueError(f"read_ahead must be 'auto' or >= 1, got {read_ahead!r}")
        self.units = list(units)
        self.load = load
        self.window_rows = window_rows
        self.seed = seed
        self.rank = rank
        self.prepared = prepared  # `load` reads prepared units (for the log and counts)
        self.read_ahead = read_ahead
        self.cores = host_cores() if cores is None else cores  # this rank's share ("auto")
        self.num_rows = sum(u.num_rows or 0 for u in self.units)
        self.step_rows = 1
        self.rows_per_epoch = self.num_rows
        self.chunk_rows = window_rows
        # Made on the first epoch: its size is `depth`, which `serial_threads` decides.
        self._pool: ThreadPoolExecutor | None = None
        self.windows_loaded = 0
        # Seconds the window loads spent reading, drawing their row order and shuffling
        # (on a GPU: copying there and gathering), summed over loads that may overlap.
        self.stage_s = {"read": 0.0, "order": 0.0, "shuffle": 0.0}
        # Window loads submitted and not yet handed out, in the order they are consumed:
        # the epoch's next windows, then (past its last one) the next epoch's first ones.
        self._queue: deque[_Queued] = deque()
        self._plans: dict[int, _Plan] = {}  # per epoch: its windows, how many submitted
        self._lock = threading.Lock()
        self._closed = False  # close() ran: no load starts after it (`_open_pool`)
        # The stream's own torch ops on one OpenMP thread: for CPU training (see the module
        # notes). A GPU run trains on the device, and its host gathers go faster on many.
        self.serial_threads = True
        self.last_epoch: int | None = None  # the run's last: nothing is read ahead past it
        # Where windows are shuffled and kept (None: host memory, for the prefetcher to copy).
        self.window_device: torch.device | None = None
        self._side: torch.cuda.Stream | None = None  # their copies' stream (`settled`)

    @property
    def depth(self) -> int:
        """Window loads kept in flight. "auto": 1 where `serial_threads` is on (CPU
        training: the loaders would take the training thread's cores); on a GPU as many as
        this rank's share of the cores (`cores`: the mask and quota over the node's ranks)
        runs at `load_threads()` threads each, at most 3 — one load runs at
        about 9M rows/s whatever the cores (its threads hold the GIL a quarter of the
        time), a GPU step consumes about twice that, and a third load covers a slow one."""
        if self.read_ahead != "auto":
            return self.read_ahead
        if self.serial_threads:
            return 1
        return max(1, min(3, self.cores // load_threads()))

    def configure(self, *, step_rows: int, steps_per_epoch: int) -> None:
        self.step_rows = step_rows
        self.rows_per_epoch = step_rows * steps_per_epoch
        # A chunk is at most a window's worth of whole steps.
        self.chunk_rows = max(step_rows, min(self.window_rows, self.rows_per_epoch))
        self.chunk_rows -= self.chunk_rows % step_rows

    def describe(self) -> str:
        prepared = "" if self.prepared is None else f" ({self.prepared.describe()})"
        auto = " (auto)" if self.read_ahead == "auto" else ""
        where = "" if self.window_device is None else f" on {self.window_device}"
        ahead = f"{self.depth} window{'s' if self.depth > 1 else ''} read ahead{auto}"
        return (
            f"streamed from disk: {len(self.units)} row groups{prepared}, {self.num_rows:,} "
            f"rows, windows of <= {self.window_rows:,} rows shuffled within{where}, {ahead}, "
            f"chunks of {self.chunk_rows:,} rows"
        )

    def windows(self, epoch: int) -> Iterator[list[ShardPiece]]:
        """The epoch's windows of units, pass after pass (endless; the caller stops)."""
        for pass_ in range(1 << 62):
            order = _rng(self.seed, self.rank, epoch, 0, pass_).permutation(len(self.units))
            window: list[ShardPiece] = []
            rows = 0
            for i in order:
                unit = self.units[int(i)]
                n = unit.num_rows or 0
                if window and rows + n > self.window_rows:
                    yield window
                    window, rows = [], 0
                window.append(unit)
                rows += n
            if window:
                yield window

    def _load(self, units: list[ShardPiece], epoch: int, k: int) -> Window:
        # randperm fills its arange in parallel beyond 32k rows: on one thread here (the
        # permutation itself is drawn serially, the same either way).
        t0 = time.perf_counter()
        with one_omp_thread(self.serial_threads):
            columns = self.load(units)
            t1 = time.perf_counter()
            n = int(next(iter(columns.values())).shape[0]) if columns else 0
            g = torch.Generator().manual_seed(
                int(_rng(self.seed, self.rank, epoch, 1, k).integers(1 << 62))
            )
            order = torch.randperm(n, generator=g)
            t2 = time.perf_counter()
            # Shuffled here, in the background, once: chunks are then slices of it. Gathering
            # each chunk in the chunk prefetcher's thread put the gather on the path of every
            # step (issue 39). Serial threads: one gathering thread, as for the rest.
            if self.window_device is not None:
                columns = shuffled_on(columns, order, self.window_device, self._side_stream())
            else:
                columns = shuffled(columns, order, 1 if self.serial_threads else load_threads())
        with self._lock:
            self.windows_loaded += 1
            took = (t1 - t0, t2 - t1, time.perf_counter() - t2)
            for stage, seconds in zip(self.stage_s, took, strict=True):
                self.stage_s[stage] += seconds
        return Window(columns, self.serial_threads, self._side)

    def _side_stream(self) -> torch.cuda.Stream | None:
        dev = self.window_device
        with self._lock:
            if self._side is None and dev is not None and dev.type == "cuda":
                self._side = torch.cuda.Stream(dev)
            return self._side

    def _submit(self, plan: _Plan) -> _Queued:
        """Starts loading `plan`'s next window (the pool runs loads in submission order)."""
        pool = self._open_pool()
        units = next(plan.windows)
        rows = sum(u.num_rows or 0 for u in units)
        plan.rows += rows
        plan.submitted += 1
        load = pool.submit(self._load, units, plan.epoch, plan.submitted - 1)
        return _Queued(plan.epoch, rows, load)

    def _open_pool(self) -> ThreadPoolExecutor:
        """The loaders' pool (made on the first load: its size is `depth`). After `close`
        a consumer still reading an epoch (one that outlived its join) gets a clear error
        instead of a new pool that nothing would shut down."""
        with self._lock:
            self._check_open()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.depth, thread_name_prefix="reagent-lite-disk")
            return self._pool

    def _check_open(self) -> None:
        if self._closed:
            raise DataError("stream_from_disk: the stream was closed while an epoch was read")

    def _fill(self, epoch: int) -> None:
        """Up to `depth` loads queued: the epoch's windows until their rows (by the
        footers) cover it, then the next epoch's first ones (never further ahead)."""
        while len(self._queue) < self.depth:
            plan = self._plans.get(epoch)
            if plan is None:  # dropped by close(), or by a restart of this epoch
                self._check_open()
                return
            if plan.rows >= self.rows_per_epoch:
                if self.last_epoch is not None and epoch >= self.last_epoch:
                    return
                plan = self._plans.setdefault(epoch + 1, _Plan(epoch + 1, self.windows(epoch + 1)))
                if plan.rows >= self.rows_per_epoch:
                    return
            self._queue.append(self._submit(plan))

    def _take(self, plan: _Plan) -> _Queued:
        """The epoch's next window load: the first of its queued ones, else (the footers
        promised rows that validation dropped) one started now."""
        for i, queued in enumerate(self._queue):
            if queued.epoch == plan.epoch:
                del self._queue[i]
                return queued
        return self._submit(plan)

    def _drop(self, keep: Callable[[_Queued], bool]) -> None:
        """Cancels the queued loads not kept; those already running are waited for (not
        left running into the next epoch), their errors dropped: a window's error shows
        again when it is loaded again."""
        with self._lock:  # close() may run while a straggling consumer's epoch ends
            kept = [q for q in self._queue if keep(q)]
            dropped = [q for q in self._queue if not keep(q)]
            self._queue = deque(kept)
        for q in dropped:
            if not q.load.cancel():
                with contextlib.suppress(Exception):
                    q.load.result()
        for epoch in {q.epoch for q in dropped} - {q.epoch for q in kept}:
            self._plans.pop(epoch, None)

    def _start(self, epoch: int) -> _Plan:
        """The epoch's plan: the one its predecessor read ahead, if its windows are still
        all to come, else a fresh one (everything else queued is dropped)."""
        plan = self._plans.get(epoch)
        if plan is None or plan.taken:
            self._drop(lambda q: False)
            plan = _Plan(epoch, self.windows(epoch))
        else:
            self._drop(lambda q: q.epoch == epoch)
        self._plans = {epoch: plan}
        return plan

    def epoch_chunks(self, epoch: int) -> Iterator[tuple[dict[str, Tensor], int]]:
        """(columns, rows) chunks of whole steps, `rows_per_epoch` rows in all. Up to
        `depth` windows load in the background (after the epoch's last one: the next
        epoch's first ones) while the caller trains on the current one; they are handed
        out in order, so the chunks, and the first bad window's error, do not depend on
        `depth`."""
        plan = self._start(epoch)
        left = Left(self.rows_per_epoch)
        empty_run = 0
        try:
            self._fill(epoch)
            while left.rows > 0:
                queued = self._take(plan)
                plan.taken += 1
                win = queued.load.result()
                n = win.num_rows
                plan.rows += n - queued.rows  # what validation dropped is still to come
                self._fill(epoch)
                if n == 0:
                    empty_run += 1
                    if empty_run > len(self.units):
                        raise DataError("stream_from_disk: no valid rows left in the shard")
                    continue
                empty_run = 0
                yield from win.cut(left, self.step_rows, self.chunk_rows)
                del win
        finally:
            # Don't leave a load of this epoch running into the next one (unless a later
            # call restarted this epoch: its loads are that call's).
            if self._plans.get(epoch) is plan:
                self._drop(lambda q: q.epoch != epoch)
                self._plans.pop(epoch, None)

    def close(self) -> None:
        """Cancels the loads read ahead and waits for the running ones: no stream thread
        is left."""
        with self._lock:
            self._closed = True
        self._drop(lambda q: False)
        self._plans.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
