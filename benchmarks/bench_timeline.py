"""Timeline benchmark: step logs → train + eval tables, end to end through the real command.

Generates an unsorted step log (default 5M steps: episodes of 1–39 steps with sequence
gaps, 10 sparse state features as a map, 2–4 candidate actions per step, a metrics map;
rows shuffled over 8 Parquet part files, so every episode is spread over files), then
times `python -m workflows.timeline --input ... --output ... --eval-output ...` for each
engine, each run in a fresh process, and prints beside them the implementation the SQL
engines replaced (`benchmarks/timeline_baseline.py`: the whole log sorted in memory with
Arrow). For every run: wall seconds, steps/s, CPU seconds (user + system of the command's
processes: with other jobs on the machine, wall time says less than CPU time) and peak
RSS summed over the command's processes (for Spark, its JVM too), sampled every 0.1 s. The targets on a 2-core machine:
≥ 400k steps/s at 5M steps with a peak ≤ 1.5 GiB.

    python -m benchmarks.bench_timeline [--steps 5e6] [--engines baseline,duckdb,spark]
        [--spark-steps 1e6] [--memory-limit 1GB] [--dir DIR] [--check]

`--check` compares the tables every engine wrote, row for row (reads them into memory).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ACTIONS = np.array(["up", "down", "left", "right"])
FILES = 8


def _feature_map(rng: np.random.Generator, n: int, f: int, missing: float) -> pa.MapArray:
    present = rng.random((n, f)) >= missing
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    keys = np.array([str(i) for i in range(f)])[np.nonzero(present)[1]]
    values = rng.normal(size=len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys), pa.array(values))


def step_log(rng: np.random.Generator, first: int, count: int) -> pa.Table:
    """`count` episodes numbered from `first` (ids "ep-<n>"), their steps in random order."""
    lengths = rng.integers(1, 40, count)
    n = int(lengths.sum())
    episode = np.repeat(np.arange(first, first + count), lengths)
    steps = np.cumsum(rng.choice([1, 1, 1, 2, 3], size=n))  # sequence gaps of 2 and 3
    starts = np.cumsum(lengths) - lengths
    seq = steps - np.repeat(steps[starts], lengths)
    k = rng.integers(2, 5, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(k, out=offsets[1:])
    candidates = ACTIONS[(np.arange(offsets[-1]) - np.repeat(offsets[:-1], k)) % 4]
    metric_offsets = np.arange(0, 2 * n + 1, 2, dtype=np.int32)
    table = pa.table(
        {
            "mdp_id": pa.array(np.char.add("ep-", episode.astype(str))),
            "sequence_number": pa.array(seq.astype(np.int64)),
            "state_features": _feature_map(rng, n, 10, 0.2),
            "action": pa.array(ACTIONS[rng.integers(0, 4, n)]),
            "reward": pa.array(rng.normal(size=n)),
            "possible_actions": pa.ListArray.from_arrays(pa.array(offsets), pa.array(candidates)),
            "action_probability": pa.array(rng.uniform(0.1, 1.0, n)),
            "metrics": pa.MapArray.from_arrays(
                pa.array(metric_offsets),
                pa.array(np.tile(["clicks", "revenue"], n)),
                pa.array(rng.random(2 * n)),
            ),
        }
    )
    return table.take(rng.permutation(n))


def generate(path: Path, steps: int) -> None:
    """Write `steps` step rows, shuffled over FILES part files, into the directory `path`."""
    path.mkdir(parents=True)
    rng = np.random.default_rng(0)
    writers: list[pq.ParquetWriter] = []
    done = episode = 0
    while done < steps:
        table = step_log(rng, episode, 25_000)
        table = table.slice(0, min(table.num_rows, steps - done))
        episode += 25_000
        done += table.num_rows
        if not writers:
            writers = [
                pq.ParquetWriter(path / f"part-{i:05d}.parquet", table.schema) for i in range(FILES)
            ]
        dest = rng.integers(0, FILES, table.num_rows)
        for i, writer in enumerate(writers):
            writer.write_table(table.filter(pa.array(dest == i)))
    for writer in writers:
        writer.close()


def _run_baseline(src: str, train: str, evaluation: str) -> None:
    """The replaced implementation, as its command ran it: read all, pair in memory, write."""
    from benchmarks.timeline_baseline import build_training_table, read_steps, write_table

    tr, ev = build_training_table(read_steps(src), eval_fraction=0.1, source=src)
    write_table(tr, train)
    write_table(ev, evaluation)


def _tree(pid: int) -> list[int]:
    """`pid` and its live descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def _rss_and_cpu(pids: list[int]) -> tuple[int, dict[int, float]]:
    """Summed RSS (bytes) of `pids`, and each one's CPU seconds so far (self + reaped children)."""
    page, tick = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
    rss, cpu = 0, {}
    for p in pids:
        try:
            rss += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            cpu[p] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
    return rss, cpu


def measure(command: list[str]) -> dict[str, Any]:
    """Run `command`; its wall time, CPU time and peak RSS summed over its process tree
    (Spark's JVM included), sampled every 0.1 s."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    peak, cpu_seen = 0, {}
    while proc.poll() is None:
        rss, cpu = _rss_and_cpu(_tree(proc.pid))
        peak = max(peak, rss)
        cpu_seen.update(cpu)
        time.sleep(0.1)
    wall = time.perf_counter() - start
    # The child's CPU time, exact, covers what it reaped; the samples cover processes it
    # does not wait for (Spark's JVM).
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    cpu_total = max(reaped, sum(cpu_seen.values()))
    return {"rc": proc.returncode, "wall": wall, "cpu": cpu_total, "peak": peak}


def command(engine: str, src: Path, out: Path, memory_limit: str) -> list[str]:
    train, evaluation = str(out / "train.parquet"), str(out / "eval.parquet")
    if engine == "baseline":
        return [
            sys.executable,
            "-m",
            "benchmarks.bench_timeline",
            "--baseline-child",
            str(src),
            train,
            evaluation,
        ]
    args = ["--input", str(src), "--output", train, "--eval-output", evaluation, "--engine", engine]
    if engine == "duckdb":
        args += ["--memory-limit", memory_limit]
    return [sys.executable, "-m", "workflows.timeline", *args]


def _rows(path: Path) -> list[dict[str, Any]]:
    table = pq.read_table(path)
    return table.sort_by([("mdp_id", "ascending"), ("sequence_number", "ascending")]).to_pylist()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=float, default=5e6)
    parser.add_argument("--spark-steps", type=float, default=None, help="default: --steps")
    parser.add_argument("--engines", default="baseline,duckdb,spark")
    parser.add_argument("--memory-limit", default="1GB", help="duckdb's --memory-limit")
    parser.add_argument("--dir", default=None, help="keep data here (reused when present)")
    parser.add_argument("--check", action="store_true", help="compare the engines' tables")
    parser.add_argument("--baseline-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.baseline_child:
        _run_baseline(*args.baseline_child)
        return
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-timeline-"))
    results = []
    for engine in args.engines.split(","):
        steps = int(args.spark_steps or args.steps) if engine == "spark" else int(args.steps)
        src = root / f"steps_{steps}"
        if not src.exists():
            t = time.perf_counter()
            generate(src, steps)
            print(f"generated {steps} steps in {time.perf_counter() - t:.0f} s: {src}", flush=True)
        out = root / f"out_{engine}_{steps}"
        out.mkdir(exist_ok=True)
        r = measure(command(engine, src, out, args.memory_limit))
        if r["rc"]:
            print(f"{engine}: exit code {r['rc']}", flush=True)
            continue
        results.append((engine, steps, r))
        print(
            f"{engine:9s} {steps:>11,d} steps  {r['wall']:7.1f} s  {steps / r['wall'] / 1e3:6.0f}k steps/s"
            f"  cpu {r['cpu']:7.1f} s  peak {r['peak'] / 2**30:5.2f} GiB",
            flush=True,
        )
    if args.check:
        by_size: dict[int, list[str]] = {}
        for engine, steps, _ in results:
            by_size.setdefault(steps, []).append(engine)
        for steps, engines in by_size.items():
            for side in ("train", "eval"):
                tables = {e: _rows(root / f"out_{e}_{steps}" / f"{side}.parquet") for e in engines}
                first = tables[engines[0]]
                same = all(t == first for t in tables.values())
                print(
                    f"{steps:,d} steps, {side}: {' = '.join(engines)}: {'same rows' if same else 'DIFFERENT'}"
                )
    print(
        f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    )


if __name__ == "__main__":
    main()
