"""The disk stream's threads start no OpenMP team of their own (issue 41).

A parallel torch op in a loader or prefetch thread starts a second OpenMP team that lives
as long as that thread; with more OpenMP threads than cores, libgomp stops spinning between
parallel regions in every team, the training thread's included, and a small step's many
ops each wait for a sleeping worker. The property is checked, not a time: while chunks of
two epochs stream from a real Parquet file through the prefetcher, as `DiskStreamed` runs
them on the CPU, the process gains no thread besides the stream's Python threads. It runs
in a fresh process with two intra-op threads (the suite may run with one, which never
starts a team)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = """
import os, sys, threading
import numpy as np, pyarrow as pa, pyarrow.parquet as pq, torch
from reagent_lite.data.rows import Rows
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.windows import stream_units
from reagent_lite.training.prefetch import ChunkPrefetcher

path = sys.argv[1]
# Arrow's own pools may grow by a thread when reads overlap on a busy machine: one thread
# each, started by the baseline read below, so only the stream's threads can be new.
pa.set_io_thread_count(1)
pa.set_cpu_count(1)
n, cols = 90_000, 4
rng = np.random.default_rng(0)
table = pa.table({f"x{i}": rng.normal(size=n).astype(np.float32) for i in range(cols)})
pq.write_table(table, path, row_group_size=15_000)

def load(units):
    parts = [pq.ParquetFile(u.file, pre_buffer=False).read_row_groups(list(u.row_groups), use_threads=False) for u in units]
    t = pa.concat_tables(parts)
    x = np.stack([t.column(f"x{i}").to_numpy() for i in range(cols)], axis=1)
    return {"x": torch.from_numpy(np.ascontiguousarray(x)), "y": torch.from_numpy(x[:, 0].copy())}

load(stream_units(path, 0, 1)[:1])  # pyarrow's allocator thread, before the baseline
torch.randn(300_000, 4).relu()  # the training thread's own team
assert torch.get_num_threads() == 2, torch.get_num_threads()
before = set(os.listdir("/proc/self/task"))

def new_threads():
    python = {t.native_id for t in threading.enumerate()}
    return sorted(int(t) for t in set(os.listdir("/proc/self/task")) - before
                  if int(t) not in python)

stream = DiskShardStream(stream_units(path, 0, 1), load, window_rows=60_000, seed=1, rank=0)
stream.serial_threads = sys.argv[2] == "serial"
stream.configure(step_rows=512, steps_per_epoch=n // 512)
chunks = ChunkPrefetcher(Rows({"x": torch.zeros(1, cols), "y": torch.zeros(1)}),
                         torch.device("cpu"), 16_384)

def epochs():
    for epoch in range(2):
        yield from (Rows(columns) for columns, _ in stream.epoch_chunks(epoch))

def name(tid):
    try:
        return open(f"/proc/self/task/{tid}/comm").read().strip()
    except OSError:
        return "?"

rows, seen, names = 0, [], set()
for columns in chunks.ready(epochs()):
    rows += len(columns)
    new = new_threads()  # the prefetch worker and the disk thread are alive
    seen.append(len(new))
    names.update(name(t) for t in new)
stream.close()
assert rows == 2 * (n // 512) * 512, rows
print("NEW", max(seen), sorted(names), flush=True)  # names: for a failure's message
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.parametrize("threads", ["serial", "parallel"])
def test_streaming_starts_no_openmp_team_besides_the_training_threads(
    tmp_path: Path, threads: str
) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "t.parquet"), threads],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Without `one_omp_thread` the window gathers (prefetch thread) and the window's row
    # order (disk thread) each start a team: 1 or 2 threads more. With `serial_threads`
    # off (what a GPU run sets: its host gathers go faster on every core) they do.
    if threads == "serial":
        assert "NEW 0" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    else:
        assert "NEW 0" not in proc.stdout and "NEW" in proc.stdout, proc.stdout
