"""Training data streamed from disk by Parquet row groups (`stream_from_disk: true`).

For a shard larger than host memory: a rank never holds its whole shard. Its rows are split
into units — one Parquet row group each (a row-range piece, when there are fewer row groups
than ranks, is one unit) — whose row counts come from the Parquet footers, so the number of
steps per epoch is known, and equal on every rank, before any row is read.

Each epoch the rank visits its units in an order drawn from (seed, rank, epoch, pass),
packs consecutive units into windows of at most `window_rows` rows (a single larger row
group is a window of its own), loads a window through the streaming ingest (same
validation, tensorization and in-place normalization as the resident path), shuffles the
window's rows and hands them out in chunks of whole steps while a background thread loads
the next window. Rows that do not fill a whole step at the end of a window are carried
into the next one; when the epoch needs more steps than the shard holds (a shorter shard
than the largest), a fresh pass with a new unit order follows, as `EpochSampler` wraps.

A window's units load in parallel (`load_units`: up to `load_threads()` at a time — the
process's cores, at most 4; Parquet decoding, validation and the numpy scatter release the
GIL for their heavy parts): each unit is read, validated and collected by its own builder
straight into its rows of the window's arrays, preallocated from the footers' counts;
then, in unit order, rows dropped as bad are closed up and episodes numbered. The window
is the one a single builder fed the units in order gives, bit for bit, and when several
units are bad the error is the first one's, as if they had loaded one by one. A window of
one large row group still loads on one thread: windows of many row groups go faster.

Both workflows stream: a window's columns are whatever the kind's loader makes of it —
`load_window` (dqn) or `load_parametric_window` (parametric_dqn: candidate tensors [rows,
K, G] and masks [rows, K], K fixed before training from a keys scan, `scan_units`, or from
`max_candidates`, so every window has the same column shapes) — all indexed by row.

The trade-off: shuffling is window-local. A minibatch only mixes rows of the few row groups
in its window, so row groups that each hold one slice of the data (one day, one episode
range) give batches less diverse than a full shuffle; smaller row groups and a larger
window bring it closer to a full shuffle. Peak memory is at most about three windows (the
one being trained on, the next one being loaded, and the chunk gathered from the current
one), whatever the shard's size; loading holds, besides the window's arrays, the Arrow
data of the row groups being decoded (one per loading thread).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch import Tensor

from reagent_lite.data import tensorize as tz
from reagent_lite.data.ingest import DiscreteShard, DiscreteShardBuilder, _piece_batches
from reagent_lite.data.ingest_parametric import ParametricShard, ParametricShardBuilder
from reagent_lite.data.readers import (
    ShardPiece,
    _parquet_file,
    _parquet_file_for_read,
    file_format,
    iter_parquet_rows,
    shard_plan,
)
from reagent_lite.data.shard_builder import S, ShardBuilder, UnitAssembly, _used_keys
from reagent_lite.data.validate import Kind, ShardValidation, ValidationReport
from reagent_lite.errors import DataError

# Rows validated and tensorized at a time inside a row group (bounds the temporaries).
_SLICE_ROWS = 32_768
T = TypeVar("T")


def stream_units(path: str, rank: int, world_size: int) -> list[ShardPiece]:
    """This rank's shard (`shard_plan`) as units of one Parquet row group each (row-range
    pieces stay whole), every unit with its row count from the footers."""
    spec = shard_plan(path, world_size)[rank]
    units: list[ShardPiece] = []
    for p in spec.pieces:
        if file_format(p.file) != "parquet":
            raise DataError(
                f"{p.file}: stream_from_disk needs Parquet files (row counts come from their "
                "footers); convert the JSON Lines data or set stream_from_disk: false"
            )
        if p.kind == "rows":
            units.append(p)
            continue
        md = _parquet_file(p.file).metadata
        groups = p.row_groups if p.kind == "row_groups" else range(md.num_row_groups)
        units += [
            ShardPiece(p.file, "row_groups", (g,), num_rows=md.row_group(g).num_rows)
            for g in groups
        ]
    return [u for u in units if u.num_rows]


def scan_state_ids(units: Sequence[ShardPiece]) -> set[str]:
    """The feature ids in the state column of `units` (`scan_units`)."""
    return scan_units(units, {"state": tz.STATE_COLUMNS})[0]["state"]


def scan_units(
    units: Sequence[ShardPiece],
    features: dict[str, Sequence[str]],
    lists: Sequence[str] = (),
) -> tuple[dict[str, set[str]], int]:
    """What the resident path would find in the whole shard, reading only map keys (as
    dictionary codes: cheap): for each entry of `features` (name → the column, or its
    alternatives, e.g. `tz.STATE_COLUMNS`) the feature ids in that column of `units`; and
    the longest list (at least 1) in the `lists` columns (candidate lists: read through
    their key leaf, which carries the list lengths)."""
    ids: dict[str, set[str]] = {name: set() for name in features}
    longest = 1
    files: dict[Path, pq.ParquetFile] = {}
    for unit in units:
        pf = files.get(unit.file) or files.setdefault(unit.file, _parquet_file_for_read(unit.file))
        names = pf.schema_arrow.names
        chosen = {}
        for name, alternatives in [*features.items(), *((c, (c,)) for c in lists)]:
            col = next((c for c in alternatives if c in names), None)
            if col is None:
                raise DataError(f"{unit.file}: no {name} column (expected one of {alternatives})")
            chosen[name] = col
        leaves = [pf.schema.column(i).path for i in range(len(pf.schema))]
        cols = [next((p for p in leaves if _is_key_leaf(p, c)), c) for c in chosen.values()]
        try:
            if unit.kind == "rows":
                table = pa.Table.from_batches(list(iter_parquet_rows(pf, unit, cols)))
            else:
                table = pf.read_row_group(unit.row_groups[0], columns=cols)
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{unit.file}: cannot read Parquet data ({e})") from e
        for name, col in chosen.items():
            for chunk in table.column(col).chunks:
                if name in lists:
                    longest = max(longest, pc.max(pc.list_value_length(chunk)).as_py() or 0)
                elif pa.types.is_list(chunk.type) and pa.types.is_struct(chunk.type.value_type):
                    ids[name].update(_used_keys(pc.list_flatten(chunk).field(0)))
                elif tz._is_listlike(chunk.type):
                    width = pc.max(pc.list_value_length(chunk)).as_py() or 0
                    ids[name].update(str(i) for i in range(width))
        del table
        # Freed read buffers stay cached by Arrow's allocator otherwise (measured: +330 MiB
        # over 1e7 rows); the scan must not grow with the shard.
        pa.default_memory_pool().release_unused()
    return ids, longest


def _is_key_leaf(path: str, column: str) -> bool:
    """Whether a Parquet leaf path is the map keys of `column` (a map, or a list of maps)."""
    return path.startswith(f"{column}.") and path.endswith(".key_value.key")


def _unit_source(unit: ShardPiece) -> str:
    """How errors name a unit: its file and, for a piece of it, which (row numbers in the
    messages count from that piece's first row)."""
    if unit.kind == "row_groups":
        return f"{unit.file} (row group {unit.row_groups[0]})"
    if unit.kind == "rows":
        return f"{unit.file} (rows {unit.row_start}..{unit.row_stop})"
    return str(unit.file)


def load_threads() -> int:
    """Threads loading a window's units by default: the cores this process may run on, at
    most 4. The loaders hold the GIL about a quarter of the time, so more threads only
    contend: on a 32-core H200 host a window of 16 row groups loaded at 1.9 / 4.5 / 5.5 /
    4.6M rows/s with 1 / 2 / 4 / 8 threads (benchmarks/RESULTS.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def load_units(
    units: Sequence[ShardPiece],
    make_builder: Callable[[int, str], ShardBuilder[S]],
    conform: Callable[[S], None],
    kind: Kind,
    *,
    actions: Sequence[str] | None = None,
    drop_bad_rows: bool,
    threads: int | None = None,
) -> S:
    """The rows of `units`, in that order, up to `threads` units at a time (default
    `load_threads()`): each unit read, validated on its own (so an error names the file and
    row group, and the row within it, that holds the bad row), collected by its own builder
    (`make_builder(rows, source)`, given the window's columns) into its rows of the
    window's arrays and `conform`ed (`UnitAssembly`). The result does not depend on
    `threads`; when units are bad, the error is the first one's in window order."""
    if not units:
        raise ValueError("a window needs at least one unit")
    source = _window_source(units)
    rows = [u.num_rows or 0 for u in units]
    window = UnitAssembly(rows, make_builder(sum(rows), source))

    def load(i: int) -> tuple[int, int]:
        label = _unit_source(units[i])
        check = ShardValidation(kind, actions=actions, source=label, drop_bad_rows=drop_bad_rows)
        builder = window.share(i, make_builder(rows[i], label))
        for batch in _piece_batches(units[i]):
            for start in range(0, batch.num_rows, _SLICE_ROWS):
                checked = check.check(batch.slice(start, _SLICE_ROWS))
                if not check.failing:
                    builder.add(checked)
        if check.failing:
            check.finish()  # raises, naming file, row group, column and bad rows
        part = builder.finish(ValidationReport(label, kind, check.rows_in, check.rows_out))
        conform(part)
        window.put(i, part)
        return check.rows_in, check.rows_out

    counts = _in_order(load, len(units), load_threads() if threads is None else threads)
    shard = window.finish(
        ValidationReport(
            source, kind, rows_in=sum(c[0] for c in counts), rows_out=sum(c[1] for c in counts)
        )
    )
    pa.default_memory_pool().release_unused()
    return shard


def _in_order(fn: Callable[[int], T], n: int, threads: int) -> list[T]:
    """[fn(0), ..., fn(n - 1)], up to `threads` calls at a time. When calls fail, the error
    raised is that of the first failing call (by index), as if they ran one by one; calls
    after a failed one are skipped once it has failed, those running are waited for."""
    if threads <= 1 or n <= 1:
        return [fn(i) for i in range(n)]
    tz._pool()  # created here, not by two of the calls at once
    failed = [n]  # a call that failed (racing updates keep one of them: any will do)

    def call(i: int) -> T:
        if i > failed[0]:
            raise _Skipped  # never seen: the failed call before it is raised first
        try:
            return fn(i)
        except BaseException:
            failed[0] = min(failed[0], i)
            raise

    pool = ThreadPoolExecutor(max_workers=min(threads, n), thread_name_prefix="reagent-lite-unit")
    try:
        futures = [pool.submit(call, i) for i in range(n)]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _Skipped(Exception):
    pass


def _window_source(units: Sequence[ShardPiece]) -> str:
    return str(units[0].file) if units else "table"


def load_window(
    units: Sequence[ShardPiece],
    actions: Sequence[str],
    feature_ids: Sequence[str],
    *,
    use_seq_num_diff_as_time_diff: bool,
    drop_bad_rows: bool,
    threads: int | None = None,
) -> DiscreteShard:
    """The dqn rows of `units` as a `DiscreteShard` (raw values, NaN = absent; `load_units`),
    columns in `feature_ids` order."""

    def builder(rows: int, source: str) -> DiscreteShardBuilder:
        return DiscreteShardBuilder(
            actions,
            capacity=rows,
            use_seq_num_diff_as_time_diff=use_seq_num_diff_as_time_diff,
            source=source,
            feature_ids=feature_ids,
        )

    def conform(shard: DiscreteShard) -> None:
        shard.reorder(feature_ids)

    return load_units(
        units, builder, conform, "dqn", actions=actions, drop_bad_rows=drop_bad_rows,
        threads=threads,
    )  # fmt: skip


def load_parametric_window(
    units: Sequence[ShardPiece],
    state_ids: Sequence[str],
    action_ids: Sequence[str],
    max_candidates: int,
    *,
    use_seq_num_diff_as_time_diff: bool,
    drop_bad_rows: bool,
    threads: int | None = None,
) -> ParametricShard:
    """The parametric rows of `units` as a `ParametricShard` (`load_units`), conformed to
    the agreed ids and `max_candidates` slots (a longer candidate list is a `DataError`)."""

    def builder(rows: int, source: str) -> ParametricShardBuilder:
        return ParametricShardBuilder(
            capacity=rows,
            max_candidates=max_candidates,
            use_seq_num_diff_as_time_diff=use_seq_num_diff_as_time_diff,
            source=source,
            state_feature_ids=state_ids,
            action_feature_ids=action_ids,
        )

    def conform(shard: ParametricShard) -> None:
        shard.conform(state_ids, action_ids, max_candidates)

    return load_units(
        units, builder, conform, "parametric_dqn", drop_bad_rows=drop_bad_rows, threads=threads
    )


def _rng(seed: int, rank: int, epoch: int, what: int, index: int) -> np.random.Generator:
    """Seeded by (seed, rank, epoch) and `what` (0: unit order of pass `index`, 1: row
    order of window `index`)."""
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, rank, epoch, what, index])


@dataclass
class _Window:
    columns: dict[str, Tensor]
    order: Tensor  # a permutation of the window's rows

    def gather(self, idx: Tensor) -> dict[str, Tensor]:
        return {k: v.index_select(0, idx) for k, v in self.columns.items()}


class DiskShardStream:
    """The chunks of an epoch, read from disk window by window (see the module docstring).

    `prepare` turns a loaded window (`load(units)`) into training columns (normalized
    tensors). `configure` sets the step geometry before the first epoch; `epoch_chunks`
    then yields (host columns, rows) pieces of whole steps, `rows_per_epoch` in all; the
    step runner's prefetcher moves them to the training device.
    """

    def __init__(
        self,
        units: Sequence[ShardPiece],
        load: Callable[[Sequence[ShardPiece]], dict[str, Tensor]],
        *,
        window_rows: int,
        seed: int,
        rank: int,
    ) -> None:
        if not units:
            raise DataError("stream_from_disk: this rank's shard has no rows")
        self.units = list(units)
        self.load = load
        self.window_rows = window_rows
        self.seed = seed
        self.rank = rank
        self.num_rows = sum(u.num_rows or 0 for u in self.units)
        self.step_rows = 1
        self.rows_per_epoch = self.num_rows
        self.chunk_rows = window_rows
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reagent-lite-disk")
        self.windows_loaded = 0
        # (epoch, its windows, the load of its first window) read ahead at an epoch's end.
        self._ahead: tuple[int, Iterator[list[ShardPiece]], Future[_Window]] | None = None
        self._lock = threading.Lock()

    def configure(self, *, step_rows: int, steps_per_epoch: int) -> None:
        self.step_rows = step_rows
        self.rows_per_epoch = step_rows * steps_per_epoch
        # A chunk is at most a window's worth of whole steps.
        self.chunk_rows = max(step_rows, min(self.window_rows, self.rows_per_epoch))
        self.chunk_rows -= self.chunk_rows % step_rows

    def describe(self) -> str:
        return (
            f"streamed from disk: {len(self.units)} row groups, {self.num_rows:,} rows, "
            f"windows of <= {self.window_rows:,} rows shuffled within, chunks of "
            f"{self.chunk_rows:,} rows"
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

    def _load(self, units: list[ShardPiece], epoch: int, k: int) -> _Window:
        columns = self.load(units)
        n = int(next(iter(columns.values())).shape[0]) if columns else 0
        g = torch.Generator().manual_seed(
            int(_rng(self.seed, self.rank, epoch, 1, k).integers(1 << 62))
        )
        with self._lock:
            self.windows_loaded += 1
        return _Window(columns, torch.randperm(n, generator=g))

    def _start(self, epoch: int) -> tuple[Iterator[list[ShardPiece]], Future[_Window]]:
        """The epoch's windows and the load of its first one (prefetched at the end of the
        previous epoch when that was this one's predecessor)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == epoch:
            return ahead[1], ahead[2]
        if ahead is not None and not ahead[2].cancel():
            with contextlib.suppress(Exception):
                ahead[2].result()
        windows = self.windows(epoch)
        return windows, self._pool.submit(self._load, next(windows), epoch, 0)

    def epoch_chunks(self, epoch: int) -> Iterator[tuple[dict[str, Tensor], int]]:
        """(columns, rows) chunks of whole steps, `rows_per_epoch` rows in all. The next
        window (after the epoch's last one: the next epoch's first) is loaded in the
        background while the caller trains on the current one."""
        step, need = self.step_rows, self.rows_per_epoch
        windows, first = self._start(epoch)
        pending: Future[_Window] | None = first
        k = 0
        carry: dict[str, Tensor] | None = None  # < one step of rows from the last window
        empty_run = 0
        try:
            while need > 0:
                assert pending is not None
                win = pending.result()
                k += 1
                n, pos = int(win.order.numel()), 0
                have = 0 if carry is None else int(next(iter(carry.values())).shape[0])
                if n + have < need:
                    pending = self._pool.submit(self._load, next(windows), epoch, k)
                else:  # this window ends the epoch: read ahead into the next one
                    pending = None
                    following = self.windows(epoch + 1)
                    self._ahead = (
                        epoch + 1,
                        following,
                        self._pool.submit(self._load, next(following), epoch + 1, 0),
                    )
                if n == 0:
                    empty_run += 1
                    if empty_run > len(self.units):
                        raise DataError("stream_from_disk: no valid rows left in the shard")
                    continue
                empty_run = 0
                if carry is not None:
                    take = min(step - have, n)
                    head = win.gather(win.order[:take])
                    carry = {c: torch.cat([carry[c], head[c]]) for c in carry}
                    pos = take
                    if have + take == step:
                        need -= step
                        yield carry, step
                        carry = None
                while need > 0 and n - pos >= step:
                    rows = min(self.chunk_rows, (n - pos) // step * step, need)
                    need -= rows
                    yield win.gather(win.order[pos : pos + rows]), rows
                    pos += rows
                if need > 0 and pos < n:
                    rest = win.gather(win.order[pos:])
                    carry = (
                        rest
                        if carry is None
                        else {c: torch.cat([carry[c], rest[c]]) for c in carry}
                    )
                del win
        finally:
            # Don't leave a load of this epoch running into the next one.
            if pending is not None and not pending.cancel():
                # The epoch is over: an error of that load shows again when it is retried.
                with contextlib.suppress(Exception):
                    pending.result()

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead[2].cancel()
            self._ahead = None
        self._pool.shutdown(wait=True)
