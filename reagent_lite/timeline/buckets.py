"""The timeline's one sort, in Arrow and out of core: steps → runs of whole episodes.

`transitions_sql` pairs each step with the next step of its episode; in an order sorted
by (mdp_id, sequence_number) that is simply the next row (`pairing.py`). This module
produces that order without sorting rows of maps and lists in a database (DuckDB's sort of
these rows cost ≈ 2.5 CPU-s per million steps beyond reading them; benchmarks/RESULTS.md):

* **Buckets by ranges of mdp_id.** A log that fits in half the memory limit is one bucket,
  held in memory. A larger one is split into buckets of about a quarter of the limit each:
  a first pass reads only `mdp_id` and takes bucket bounds from a sample of it; a second
  deals each batch's rows to their bucket's spill file (Arrow IPC in the temporary
  directory: written and read back at memory speed). A bucket that turns out too large
  (an uneven sample) is split the same way in turn.
* **Each bucket, in mdp_id order**: loaded, checked (`pairing.check_steps`), its rows
  ordered by their id's rank and sequence number (an integer sort of the row numbers,
  then one `take` per run), its episodes given their side (`EvalFlags`: the SQL's hash
  split, by DuckDB) and cut into runs of whole episodes of about `run_rows` rows.

A bucket holds whole episodes and buckets follow each other in id order, so each side's
runs, concatenated, are that side's steps sorted by (mdp_id, sequence_number): the order
of `transitions_sql`'s final `ORDER BY`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reagent_lite.errors import DataError
from reagent_lite.timeline.pairing import check_steps
from reagent_lite.timeline.query import Side
from reagent_lite.timeline.scan import ArrowScan, Scan, plain, rows_within

# Distinct episode ids (sorted, plain) → True for those on the eval side.
EvalFlags = Callable[[pa.Array], np.ndarray]
# Sampled ids per bucket for the bounds: each bucket's size is then within a few percent.
_SAMPLES_PER_BUCKET = 1024
# Buckets per pass: open spill files, and slices per batch, stay few; more levels beyond.
_MAX_BUCKETS = 256
# The most a bucket holds, whatever the memory limit: each of its columns becomes one
# Arrow array, whose 32-bit offsets address at most 2 GiB (a text column, say).
_MAX_BUCKET_BYTES = 2**30
# Bytes of steps per run, at most (unless one episode is larger).
_RUN_BYTES = 8 * 2**20


@dataclass(frozen=True)
class Run:
    """Whole episodes of one side, sorted by (mdp_id, sequence_number)."""

    side: Side
    steps: pa.RecordBatch
    has_next: np.ndarray  # bool per row: the next row is the same episode's next step


@dataclass(frozen=True)
class SortSettings:
    memory_limit: int  # bytes of steps the sort may hold (it spills beyond half of them)
    spill_dir: Path  # where buckets spill (the caller removes it)
    run_rows: int  # rows per run, at least (whole episodes), unless rows are wide
    stop: threading.Event | None = None  # set: stop at the next batch (`Stopped`)
    null_one: bool = False  # a null propensity is not a bad row (`--null-propensity one`)

    def check(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise Stopped("the timeline's sort was stopped")


class Stopped(Exception):
    """The sort's caller asked it to stop (Ctrl-C, an error elsewhere)."""


def sorted_runs(
    scan: Scan, sides: Collection[Side], eval_flags: EvalFlags | None, settings: SortSettings
) -> Iterator[Run]:
    """The steps of `sides` (`all`, or `train` and/or `eval`) as runs, each side's in
    (mdp_id, sequence_number) order; every row of the log is checked, written or not.
    `eval_flags` is needed unless `sides` is `all`."""
    for load in _buckets(scan, settings, depth=0):
        # Loaded here, so one bucket is held at a time (the last one freed before).
        table = load()
        # Wide rows make shorter runs: the runs in flight stay small.
        row_bytes = table.nbytes / max(table.num_rows, 1)
        run_rows = rows_within(_RUN_BYTES, row_bytes, settings.run_rows)
        yield from _runs(table, sides, eval_flags, run_rows, null_one=settings.null_one)
        del table


_Load = Callable[[], pa.Table]


def _buckets(scan: Scan, settings: SortSettings, depth: int) -> Iterator[_Load]:
    """The log's buckets in id order, each as the function that loads it. Rows are held
    until they outgrow the budget; then the log is split (read again) and spilled."""
    budget = min(settings.memory_limit / 2, _MAX_BUCKET_BYTES)
    held: list[pa.RecordBatch] = []
    size = seen = 0
    batches = scan.batches()
    for batch in batches:
        settings.check()
        held.append(batch)
        size, seen = size + batch.nbytes, seen + batch.num_rows
        # Stop holding once over the budget, or as soon as the rows so far say the log is
        # larger (rather than read up to half of the limit twice).
        if size > budget or size / seen * scan.rows > budget:
            break
    else:
        if held:
            yield _loader(held)
        return
    batches.close()
    held.clear()
    # Buckets of half the budget (a bucket twice the estimate still fits).
    estimate = size / seen * scan.rows
    count = min(_MAX_BUCKETS, max(2, math.ceil(estimate / (budget / 2))))
    bounds = _bounds(scan, count, settings)
    if len(bounds) == 0:  # one id (one huge episode): nothing to split it by
        yield _loader(list(scan.batches()))
        return
    for path, rows in _partition(scan, bounds, settings, depth):
        bucket = _spilled(path, rows, scan.schema)
        if rows == scan.rows:  # the bounds did not split it (one dominant id): hold it
            yield _loader(list(bucket.batches()))
        else:
            yield from _buckets(bucket, settings, depth + 1)


def _loader(batches: list[pa.RecordBatch]) -> _Load:
    """Loads `batches` as one table, each column one array (a `take` from many chunks is
    ~3× slower), letting go of the batches as it does."""

    def load() -> pa.Table:
        table = pa.Table.from_batches(batches)
        batches.clear()
        return table.combine_chunks()

    return load


def _bounds(scan: Scan, count: int, settings: SortSettings) -> pa.Array:
    """Up to `count - 1` distinct ids, ascending, that cut a sample of the rows' ids into
    `count` parts of about equal size (a bucket holds the ids from one bound to the next)."""
    step = max(1, scan.rows // (count * _SAMPLES_PER_BUCKET))
    samples, seen = [], 0
    for batch in scan.batches(["mdp_id"]):
        settings.check()
        ids = batch.column(0)
        picked = plain(ids.take(pa.array(np.arange((-seen) % step, len(ids), step))))
        if pa.types.is_floating(picked.type):
            picked = picked.filter(pc.invert(pc.is_nan(picked)))  # NaN: its own last bucket
        samples.append(picked.drop_null())
        seen += len(ids)
    ids = pa.concat_arrays(samples) if samples else pa.array([])
    ids = ids.take(pc.sort_indices(ids))
    cuts = [ids[(i * len(ids)) // count] for i in range(1, count)] if len(ids) else []
    # A cut at the smallest id would leave its bucket empty.
    useful = pa.array([c for c in cuts if c != ids[0]], ids.type)
    return pc.unique(useful)


def _bucket_of(ids: pa.Array, bounds: pa.Array) -> np.ndarray:
    """Each id's bucket: how many bounds are at most it (a null's: 0)."""
    if pa.types.is_dictionary(ids.type):
        per_entry = _bucket_of(ids.dictionary, bounds)
        indices = ids.indices
        bucket = per_entry[indices.fill_null(0).to_numpy(zero_copy_only=False)]
        if indices.null_count:
            bucket[indices.is_null().to_numpy(zero_copy_only=False)] = 0
        return bucket
    lo = np.zeros(len(ids), np.int64)
    hi = np.full(len(ids), len(bounds), np.int64)
    while (active := lo < hi).any():  # a binary search, vectorised over the ids
        mid = (lo + hi) // 2
        probe = bounds.take(pa.array(np.minimum(mid, len(bounds) - 1)))
        above = pc.fill_null(pc.greater_equal(ids, probe), False).to_numpy(zero_copy_only=False)
        lo = np.where(active & above, mid + 1, lo)
        hi = np.where(active & ~above, mid, hi)
    if pa.types.is_floating(ids.type):  # NaN sorts after every number: the last bucket
        lo[pc.fill_null(pc.is_nan(ids), False).to_numpy(zero_copy_only=False)] = len(bounds)
    return lo


def _partition(
    scan: Scan, bounds: pa.Array, settings: SortSettings, depth: int
) -> Iterator[tuple[Path, int]]:
    """Deal the log's rows to one spill file per bucket; each file and its row count, in
    bucket order (the files are deleted as they are read back)."""
    folder = settings.spill_dir / f"level-{depth}"
    folder.mkdir(parents=True, exist_ok=True)
    count = len(bounds) + 1
    paths = [folder / f"bucket-{k:05d}.arrow" for k in range(count)]
    rows = np.zeros(count, np.int64)
    sinks = [pa.OSFile(str(p), "wb") for p in paths]
    try:
        writers = [pa.ipc.new_stream(sink, scan.schema) for sink in sinks]
        for batch in scan.batches():
            settings.check()
            bucket = _bucket_of(batch.column("mdp_id"), bounds)
            sizes = np.bincount(bucket, minlength=count)
            dealt = batch.take(pa.array(np.argsort(bucket, kind="stable")))
            start = 0
            for k in np.flatnonzero(sizes):
                writers[k].write_batch(dealt.slice(start, int(sizes[k])))
                start += int(sizes[k])
            rows += sizes
        for writer in writers:
            writer.close()
    finally:
        for sink in sinks:
            sink.close()
    for path, n in zip(paths, rows, strict=True):
        if n:
            yield path, int(n)
        path.unlink(missing_ok=True)


def _spilled(path: Path, rows: int, schema: pa.Schema) -> ArrowScan:
    """A spill file as a scan (read through a memory map)."""

    def read(names: list[str]) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(str(path)) as source:
            for batch in pa.ipc.open_stream(source):
                yield batch.select(names)

    return ArrowScan(read, {n: n for n in schema.names}, rows, schema)


def _runs(
    table: pa.Table,
    sides: Collection[Side],
    eval_flags: EvalFlags | None,
    run_rows: int,
    *,
    null_one: bool,
) -> Iterator[Run]:
    n = table.num_rows
    ids = table.column("mdp_id").combine_chunks()
    codes = _id_ranks(ids)
    try:
        seq = pc.fill_null(pc.cast(table.column("sequence_number"), pa.int64()), 0).to_numpy()
    except pa.ArrowInvalid as err:  # an unsigned 64-bit number beyond 2^63
        raise DataError(
            f"column 'sequence_number': a value beyond the 64-bit signed range ({err}); "
            "expected sequence numbers below 2^63"
        ) from err
    order = _order(codes, seq)
    codes, seq = codes[order], seq[order]
    check_steps(table, order, codes, seq, null_one=null_one)
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if n else np.zeros(0, int)
    lengths = np.diff(np.r_[starts, n])
    if set(sides) == {"all"}:
        episode_side = {"all": np.ones(len(starts), bool)}
    else:
        assert eval_flags is not None, "eval_flags is needed to split the sides"
        is_eval = eval_flags(plain(ids.take(pa.array(order[starts]))))
        episode_side = {"train": ~is_eval, "eval": is_eval}
    for side in sides:
        keep = np.repeat(episode_side[side], lengths)
        yield from _cut(
            table, side, order[keep], codes[keep], lengths[episode_side[side]], run_rows
        )


def _cut(
    table: pa.Table, side: Side, rows: np.ndarray, codes: np.ndarray, lengths: np.ndarray,
    run_rows: int,
) -> Iterator[Run]:  # fmt: skip
    """`rows` (sorted, whole episodes of `lengths`) as runs of at least `run_rows` rows
    each (the last one fewer), cut between episodes."""
    if not len(rows):
        return
    ends = np.cumsum(lengths)
    start = 0
    while start < len(rows):
        # The first episode end at least run_rows rows on (or the last end).
        end = int(ends[min(int(np.searchsorted(ends, start + run_rows)), len(ends) - 1)])
        steps = table.take(pa.array(rows[start:end])).combine_chunks().to_batches()[0]
        has_next = np.zeros(end - start, bool)
        has_next[:-1] = codes[start + 1 : end] == codes[start : end - 1]
        yield Run(side, steps, has_next)
        start = end


def _id_ranks(ids: pa.Array) -> np.ndarray:
    """Each row's rank of its id among the distinct ids, ascending (strings byte-wise, as
    the engines order them); -1 for a null."""
    encoded = ids if pa.types.is_dictionary(ids.type) else pc.dictionary_encode(ids)
    values = encoded.dictionary
    order = pc.sort_indices(values).to_numpy()
    first = np.ones(len(values), bool)  # a dictionary may repeat a value: equal ids, one rank
    if len(values) > 1:
        ordered = values.take(pa.array(order))
        first[1:] = pc.fill_null(
            pc.not_equal(ordered.slice(1), ordered.slice(0, len(values) - 1)), True
        ).to_numpy(zero_copy_only=False)
    rank = np.empty(len(values), np.int64)
    rank[order] = np.cumsum(first) - 1
    indices = encoded.indices
    codes = np.full(len(indices), -1, np.int64)  # nulls
    valid = indices.is_valid().to_numpy(zero_copy_only=False)
    codes[valid] = rank[indices.drop_null().to_numpy()]
    return codes


def _order(codes: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Row numbers sorted by (code, sequence number)."""
    if not len(codes):
        return np.zeros(0, np.int64)
    low, high = int(seq.min()), int(seq.max())
    if int(codes.max()) < 2**30 and high - low < 2**32:  # one 64-bit key: a single sort
        # The keys of a good log are distinct (repeats fail `check_steps`), so any sort
        # gives one order; numpy's default (introsort) is the fastest.
        return np.argsort(((codes + 1) << 32) | (seq - low))
    return np.lexsort((seq, codes))
