"""The host side of prepared disk streaming alone (`bench_stream --modes units`).

A real `Workflow` (`stream_from_disk`, `stream_prepare`) is set up on the CPU and its
disk stream's producer run as a GPU run drives it, with no training step: the stream's
threads parallel (`serial_threads` off, as `DiskStreamed` sets it for CUDA), each chunk
it yields cut to the step runner's chunk size and copied into one of two preallocated
staging buffers (pinned when this host has CUDA), as the chunk prefetcher does before its
host-to-device copy. Its rows/s is the most a GPU run of this table could be fed through
host memory: a GPU run now copies each window whole and shuffles it on the device instead
(`windows.shuffled_on`), so this measures the host path that CPU runs and
`device_resident_data: false` keep, not a GPU run's.

Beside it, in the same process, epochs interleaved (on a shared box only ratios within
one run mean anything), three floors over the same data:

* `read`: the prepared unit files' bytes read whole, one `readinto` per file into one
  reusable buffer (what the page cache gives a reader);
* `sha256`: the same bytes hashed (the per-read check of `data/prepared_format.py`);
* `gather`: a window's columns, resident, gathered by a random permutation into the
  staging buffers (`index_select(out=)`: the host cost a resident-on-host run pays).

The stream's rows per CPU-second of the process (all its threads: the background loads
included) is the figure a loaded box distorts least: the rate a core would give.

And where the stream's time went, summed over the epochs (seconds of wall time of each
stage, in whatever thread ran it): `load` (a window's units read, `DiskShardStream.load`:
in the background, hidden when it is faster than the rest), `gather` (a window's rows
gathered in shuffled order: in the background as the window loads, `disk_stream.shuffled`),
`window` (a window's whole background load: `load`, its row order, its gather),
`stage` (copied into the staging buffers, on the path of every chunk). Host memory: the
process's RSS before the stream, its peak, and the window size in bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

from reagent_lite.data import disk_stream
from reagent_lite.training.steps import DEFAULT_CHUNK_ROWS

F = TypeVar("F", bound=Callable[..., Any])


_SPENT = threading.Lock()  # window loads run on several threads at once (read-ahead)


def _timed(spent: dict[str, float], name: str, fn: F) -> F:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with _SPENT:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t

    return wrapped  # type: ignore[return-value]


def _staging(template: dict[str, Tensor], rows: int) -> list[dict[str, Tensor]]:
    pin = torch.cuda.is_available()
    return [
        {
            k: torch.empty((rows, *v.shape[1:]), dtype=v.dtype, pin_memory=pin)
            for k, v in template.items()
        }
        for _ in range(2)
    ]


def _stream_epoch(
    chunks: Iterator[tuple[dict[str, Tensor], int]],
    buffers: list[dict[str, Tensor]],
    spent: dict[str, float],
) -> int:
    """The epoch's chunks staged as the chunk prefetcher stages them; rows delivered."""
    size = next(iter(buffers[0].values())).shape[0]
    rows_in = slot = 0
    for columns, rows in chunks:
        for start in range(0, rows, size):
            n = min(size, rows - start)
            t = time.perf_counter()
            for k, v in columns.items():
                buffers[slot][k][:n].copy_(v[start : start + n])
            spent["stage"] = spent.get("stage", 0.0) + time.perf_counter() - t
            slot, rows_in = 1 - slot, rows_in + n
        del columns
    return rows_in


def _read_floor(files: list[Path], rows_per_file: list[int], want: int, buf: bytearray) -> float:
    """Rows/s of reading whole unit files (`want` rows' worth, cycling through them)."""
    view, done, i = memoryview(buf), 0, 0
    t = time.perf_counter()
    while done < want:
        path = files[i % len(files)]
        with path.open("rb", buffering=0) as f:
            f.readinto(view[: path.stat().st_size])
        done, i = done + rows_per_file[i % len(files)], i + 1
    return done / (time.perf_counter() - t)


def _sha_floor(files: list[Path], rows_per_file: list[int], want: int) -> float:
    blobs = [p.read_bytes() for p in files[:64]]
    done, i = 0, 0
    t = time.perf_counter()
    while done < want:
        hashlib.sha256(blobs[i % len(blobs)]).digest()
        done, i = done + rows_per_file[i % len(blobs)], i + 1
    return done / (time.perf_counter() - t)


def _gather_floor(window: dict[str, Tensor], buffers: list[dict[str, Tensor]], want: int) -> float:
    n = next(iter(window.values())).shape[0]
    size = next(iter(buffers[0].values())).shape[0]
    done, slot = 0, 0
    t = time.perf_counter()
    while done < want:
        for idx in torch.randperm(n).split(size):
            for k, v in window.items():
                torch.index_select(v, 0, idx, out=buffers[slot][k][: idx.numel()])
            done, slot = done + idx.numel(), 1 - slot
    return done / (time.perf_counter() - t)


def _cpu_s() -> float:
    """CPU seconds of this process, all its threads (the stream's background ones too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def host_only(args: argparse.Namespace, workflow: Callable[..., Any]) -> dict[str, Any]:
    """The `units` child of bench_stream (see the module notes): its RESULT dict."""
    wf = workflow(args, "prepared", args.out)
    wf.setup()
    disk = wf.disk
    assert disk is not None and disk.prepared is not None
    step_rows = wf.sampler.batch_size * wf.cfg.training.minibatches_per_step
    disk.configure(step_rows=step_rows, steps_per_epoch=wf.steps_per_epoch)
    disk.serial_threads = False  # as on a GPU (DiskStreamed)
    spent: dict[str, float] = {}
    disk.load = _timed(spent, "load", disk.load)
    disk._load = _timed(spent, "window", disk._load)  # type: ignore[method-assign]
    # The window's rows gathered in shuffled order as it loads (`shuffled`, inside `_load`).
    disk_stream.shuffled = _timed(spent, "gather", disk_stream.shuffled)
    chunk = max(1, DEFAULT_CHUNK_ROWS // step_rows) * step_rows
    chunk = min(chunk, disk.chunk_rows)
    first = disk.load(disk.units[: max(1, disk.window_rows // (disk.units[0].num_rows or 1))])
    template = {k: v[:1] for k, v in first.items()}
    window_bytes = sum(v.element_size() * v.numel() for v in first.values())
    row_bytes = window_bytes / next(iter(first.values())).shape[0]
    buffers = _staging(template, chunk)
    # Every unit opened (prepared first where missing): the floors read their files.
    rows_per_file = [disk.prepared._open(u).rows for u in disk.units]
    files = [disk.prepared.path(u)[0] for u in disk.units]
    buf = bytearray(max(p.stat().st_size for p in files))
    base = _rss_mib()
    rates: dict[str, list[float]] = {"stream": [], "read": [], "sha256": [], "gather": []}
    spent.clear()
    per_cpu: list[float] = []
    for epoch in range(args.epochs):
        t, cpu = time.perf_counter(), _cpu_s()
        rows = _stream_epoch(disk.epoch_chunks(epoch), buffers, spent)
        rates["stream"].append(rows / (time.perf_counter() - t))
        per_cpu.append(rows / (_cpu_s() - cpu))
        rates["read"].append(_read_floor(files, rows_per_file, rows, buf))
        rates["sha256"].append(_sha_floor(files, rows_per_file, rows // 4))
        rates["gather"].append(_gather_floor(first, buffers, rows))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "rates": {k: statistics.median(v[1:] or v) for k, v in rates.items()},
        "epochs": rates,
        "stream_per_cpu_s": statistics.median(per_cpu[1:] or per_cpu),
        "spent_s": spent,
        "rows_per_epoch": disk.rows_per_epoch,
        "row_bytes": row_bytes,
        "window_mib": window_bytes / 2**20,
        "staging_mib": 2 * chunk * row_bytes / 2**20,
        "rss_before_stream_mib": base,
        "peak_rss_mib": peak,
        "threads": torch.get_num_threads(),
        "data": disk.describe(),
    }
    wf.cleanup()
    return out
