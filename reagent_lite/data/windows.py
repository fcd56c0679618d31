"""A rank's shard as units (one Parquet row group each) and windows of units loaded at once.

For `stream_from_disk: true` (`data/disk_stream.py` tells the method): `stream_units`
splits the shard into units whose row counts come from the footers; `scan_units` reads
only map keys (and list lengths) to find the feature ids (and K) before training; and
`load_units` loads a window of units through the ingest engine — up to `load_threads()`
units at a time (Parquet decoding, validation and the numpy scatter release the GIL for
their heavy parts), each read, validated and collected by its own builder straight into
its rows of the window's arrays (`UnitAssembly`, preallocated from the footers' counts);
then, in unit order, rows dropped as bad are closed up and episodes numbered. The window
is the one a single builder fed the units in order gives, bit for bit, and when several
units are bad the error is the first one's, as if they had loaded one by one.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch import Tensor
from torch.cuda import Stream

from reagent_lite.data.arrow import is_list, used_keys
from reagent_lite.data.ingest import Layout, feed, piece_batches
from reagent_lite.data.readers import (
    ShardPiece,
    file_format,
    iter_parquet_rows,
    open_parquet,
    parquet_file,
    shard_plan,
)
from reagent_lite.data.scatter import worker_pool
from reagent_lite.data.shard_builder import S, ShardBuilder
from reagent_lite.data.validate import ValidationReport
from reagent_lite.errors import DataError

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
        md = parquet_file(p.file).metadata
        groups = p.row_groups if p.kind == "row_groups" else range(md.num_row_groups)
        units += [
            ShardPiece(p.file, "row_groups", (g,), num_rows=md.row_group(g).num_rows)
            for g in groups
        ]
    return [u for u in units if u.num_rows]


def scan_units(
    units: Sequence[ShardPiece],
    features: dict[str, Sequence[str]],
    lists: Sequence[str] = (),
) -> tuple[dict[str, set[str]], int]:
    """What ingesting the whole shard would find, reading only map keys (as dictionary
    codes: cheap): for each entry of `features` (name → the column, or its alternatives,
    e.g. `schema.STATE_COLUMNS`) the feature ids in that column of `units`; and the
    longest list (at least 1) in the `lists` columns (candidate lists: read through their
    key leaf, which carries the list lengths)."""
    ids: dict[str, set[str]] = {name: set() for name in features}
    longest = 1
    files: dict[Path, pq.ParquetFile] = {}
    wanted = [*features.items(), *((c, (c,)) for c in lists)]
    for unit in units:
        pf = files.get(unit.file) or files.setdefault(unit.file, open_parquet(unit.file))
        chosen = {name: _column(unit, pf, name, alternatives) for name, alternatives in wanted}
        table = _read_keys(unit, pf, list(chosen.values()))
        for name, col in chosen.items():
            for chunk in table.column(col).chunks:
                if name in lists:
                    longest = max(longest, pc.max(pc.list_value_length(chunk)).as_py() or 0)
                elif pa.types.is_list(chunk.type) and pa.types.is_struct(chunk.type.value_type):
                    ids[name].update(used_keys(pc.list_flatten(chunk).field(0)))
                elif is_list(chunk.type):
                    width = pc.max(pc.list_value_length(chunk)).as_py() or 0
                    ids[name].update(str(i) for i in range(width))
        del table
        # Freed read buffers stay cached by Arrow's allocator otherwise (measured: +330 MiB
        # over 1e7 rows); the scan must not grow with the shard.
        pa.default_memory_pool().release_unused()
    return ids, longest


def _column(unit: ShardPiece, pf: pq.ParquetFile, name: str, alternatives: Sequence[str]) -> str:
    col = next((c for c in alternatives if c in pf.schema_arrow.names), None)
    if col is None:
        raise DataError(f"{unit.file}: no {name} column (expected one of {alternatives})")
    return col


def _read_keys(unit: ShardPiece, pf: pq.ParquetFile, columns: list[str]) -> pa.Table:
    """The unit's `columns`, only their map keys where they are maps (or lists of maps)."""
    leaves = [pf.schema.column(i).path for i in range(len(pf.schema))]
    cols = [next((p for p in leaves if _is_key_leaf(p, c)), c) for c in columns]
    try:
        if unit.kind == "rows":
            return pa.Table.from_batches(list(iter_parquet_rows(pf, unit, cols)))
        return pf.read_row_group(unit.row_groups[0], columns=cols)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{unit.file}: cannot read Parquet data ({e})") from e


def _is_key_leaf(path: str, column: str) -> bool:
    """Whether a Parquet leaf path is the map keys of `column` (a map, or a list of maps)."""
    return path.startswith(f"{column}.") and path.endswith(".key_value.key")


def unit_source(unit: ShardPiece) -> str:
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
    return max(1, min(4, host_cores()))


@contextlib.contextmanager
def one_omp_thread(serial: bool = True) -> Iterator[None]:
    """Torch ops of the calling thread on one OpenMP thread inside, its count restored
    after (`disk_stream`'s module notes). The count is the calling thread's: the training thread's
    own team is left alone (a thread started meanwhile starts at one too)."""
    threads = torch.get_num_threads()
    if threads == 1 or not serial:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def host_cores() -> int:
    """The cores this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_units(units: Sequence[ShardPiece], layout: Layout[S], *, threads: int | None = None) -> S:
    """The rows of `units`, in that order, up to `threads` units at a time (default
    `load_threads()`): each unit read, validated on its own (so an error names the file and
    row group, and the row within it, that holds the bad row), collected by its own builder
    (`layout.builder`, which must know the window's feature space) into its rows of the
    window's arrays and conformed (`layout.conform`). The result does not depend on
    `threads`; when units are bad, the error is the first one's in window order."""
    if not units:
        raise ValueError("a window needs at least one unit")
    if layout.conform is None:
        raise ValueError("a window's units are conformed to a known feature space")
    conform = layout.conform
    source = str(units[0].file)
    rows = [u.num_rows or 0 for u in units]
    window = UnitAssembly(rows, layout.builder(sum(rows), source))

    def load(i: int) -> ValidationReport:
        label = unit_source(units[i])
        check = layout.validation(label)
        builder = window.share(i, layout.builder(rows[i], label))
        feed(piece_batches(units[i]), check, builder, {}, release=False)
        if check.failing:
            check.finish()  # raises, naming file, row group, column and bad rows
        report = check.report()
        part = builder.finish(report)
        conform(part)
        window.put(i, part)
        return report

    reports = in_order(load, len(units), load_threads() if threads is None else threads)
    rows_in, rows_out = sum(r.rows_in for r in reports), sum(r.rows_out for r in reports)
    shard = window.finish(ValidationReport(source, layout.schema.kind, rows_in, rows_out))
    pa.default_memory_pool().release_unused()
    return shard


def in_order(fn: Callable[[int], T], n: int, threads: int) -> list[T]:
    """[fn(0), ..., fn(n - 1)], up to `threads` calls at a time. When calls fail, the error
    raised is that of the first failing call (by index), as if they ran one by one; calls
    after a failed one are skipped once it has failed, those running are waited for."""
    if threads <= 1 or n <= 1:
        return [fn(i) for i in range(n)]
    worker_pool()  # created here, not by two of the calls at once
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


def shuffled(columns: dict[str, Tensor], order: Tensor, threads: int) -> dict[str, Tensor]:
    """`columns`' rows in `order`, gathered once as the window loads (in the background).
    numpy's `take` copies a row per index (torch's `index_select` goes element by element
    for rows of several values: 2-5x slower) and releases the GIL; with `threads` > 1 each
    column's rows are split between that many threads."""
    idx = order.numpy()
    no_numpy = (torch.bfloat16, torch.complex32)  # dtypes numpy has no match for
    src = {k: v.numpy() for k, v in columns.items() if v.dtype not in no_numpy}
    dst = {k: np.empty(v.shape, v.dtype) for k, v in src.items()}
    bounds = np.linspace(0, len(idx), max(1, threads) + 1).astype(int).tolist()
    parts = [(k, lo, hi) for k in src for lo, hi in itertools.pairwise(bounds)]

    def take(i: int) -> None:
        k, lo, hi = parts[i]
        np.take(src[k], idx[lo:hi], axis=0, out=dst[k][lo:hi])

    in_order(take, len(parts), threads)
    return {
        k: torch.from_numpy(dst[k]) if k in dst else v.index_select(0, order)
        for k, v in columns.items()
    }


def shuffled_on(
    columns: dict[str, Tensor], order: Tensor, device: torch.device, stream: Stream | None = None
) -> dict[str, Tensor]:
    """`columns`' rows in `order`, on `device`: each column copied there whole, in one
    contiguous copy, and gathered there — the same rows as `shuffled`, bit for bit. On a
    GPU the gather takes microseconds where the host's took most of a window's load
    (issue 39). `stream`: see `settled`."""
    with settled(device, stream):
        idx = order.to(device, non_blocking=True)
        return {k: v.to(device, non_blocking=True).index_select(0, idx) for k, v in columns.items()}


@contextlib.contextmanager
def settled(device: torch.device, stream: Stream | None = None) -> Iterator[None]:
    """On CUDA, the work inside runs on `stream` (one side stream per disk stream: the
    allocator reuses freed memory only on the stream that allocated it, so a fresh stream
    per window would keep freed windows cached apart) and is waited for on leaving: what
    it made is then ready for any stream, and the host tensors it read may be freed (a
    reader on another stream must still `record_stream` what it reads, so that the
    allocator does not hand the memory back early). Elsewhere, nothing."""
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device):
        side = stream if stream is not None else torch.cuda.Stream(device)
        done = torch.cuda.Event()
        try:
            with torch.cuda.stream(side):
                yield
        finally:  # waited for even when the work failed: nothing left in flight
            done.record(side)
            done.synchronize()  # this work only, not other threads' on the same stream


# ----------------------------------------------------------------------------- assembly

B = TypeVar("B", bound=ShardBuilder[Any])


class UnitAssembly(Generic[S]):
    """The shards of consecutive units (row groups), each collected by its own builder and
    conformed to the same columns, as one shard equal to what a single builder fed the
    units in order gives.

    The arrays of the whole are allocated once, for the units' rows as their footers count
    them (by a builder for them all, `whole`); each unit's builder writes straight into
    that unit's rows (`share`), from any thread, units in any order; `put` copies what a
    unit's builder had to put elsewhere (new columns, fields computed afterwards) and
    drops the unit's arrays. `finish` then, in unit order, closes the gaps that rows
    dropped as bad leave, numbers episodes by first appearance over the whole, and merges
    the ids the units saw.
    """

    def __init__(self, unit_rows: Sequence[int], whole: ShardBuilder[S]) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(unit_rows, dtype=np.int64)])
        self._arrays = dict(whole.shaped_arrays())
        self._shared = list(self._arrays)  # (`put` may add fields computed afterwards)
        self._parts: list[S | None] = [None] * len(unit_rows)
        self._rows = [0] * len(unit_rows)
        self._lock = threading.Lock()

    def share(self, i: int, builder: B) -> B:
        """`builder` (of unit `i`, with the whole's columns), writing into its rows."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        builder.write_into({k: self._arrays[k][lo:hi] for k in self._shared})
        return builder

    def put(self, i: int, part: S) -> None:
        """Unit `i`'s rows, in place; `part` keeps only what its rows showed."""
        lo, n = int(self.offsets[i]), len(part)
        if n > self.offsets[i + 1] - lo:
            raise ValueError(f"unit {i}: {n} rows, more than its {self.offsets[i + 1] - lo}")
        for k, a in {**part.features, **part.fields}.items():
            with self._lock:  # fields computed after collecting (action_index): first seen
                out = self._arrays.get(k)
                if out is None:
                    shape = (int(self.offsets[-1]), *a.shape[1:])
                    out = self._arrays[k] = np.empty(shape, a.dtype)
            if a.base is not out:  # not written in place (a view of `out` is of its rows)
                out[lo : lo + n] = a
        part.features = dict.fromkeys(part.features, _NO_ROWS)
        part.fields = dict.fromkeys(part.fields, _NO_ROWS)
        self._rows[i] = n
        self._parts[i] = part

    def finish(self, report: ValidationReport) -> S:
        """The whole, once every unit is in, as the first unit's shard."""
        parts = [p for p in self._parts if p is not None]
        if not parts or len(parts) < len(self._parts):
            raise ValueError(f"{len(parts)} of {len(self._parts)} units assembled")
        arrays, mdp = self._arrays, self._arrays["mdp_id"]
        # The units' episodes end to end, coded by first appearance (as one builder codes).
        episodes = pa.array([e for p in parts for e in p.episodes]).dictionary_encode()
        codes = np.asarray(episodes.indices)
        n = first = 0  # rows so far; the unit's first entry in `codes`
        for part, lo, rows in zip(parts, self.offsets.tolist(), self._rows, strict=False):
            if lo != n:  # rows dropped before this unit: move it up (numpy copes with overlap)
                for a in arrays.values():
                    a[n : n + rows] = a[lo : lo + rows]
            if rows:
                lut = codes[first : first + len(part.episodes)]
                mdp[n : n + rows] = lut[mdp[n : n + rows]]
            n, first = n + rows, first + len(part.episodes)
        shard = parts[0]
        for part in parts[1:]:
            shard.merge_seen(part)
        shard.report, shard.episodes = report, episodes.dictionary.to_pylist()
        shard.features = {k: arrays[k][:n] for k in shard.features}
        shard.fields = {k: arrays[k][:n] for k in shard.fields}
        self._parts, self._arrays = [], {}
        return shard


_NO_ROWS = np.empty(0, np.float32)  # what an assembled unit keeps of its arrays
