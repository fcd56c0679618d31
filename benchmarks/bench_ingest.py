"""Ingest benchmark: Parquet → normalized training tensors, exactly as a workflow rank does it.

Generates a dqn training table (default 1M rows, 10 sparse state features stored as
map<string, float> with ~20% missing, in both state and next_state) into a temporary
directory or `--dir`, then runs `Workflow.load_training_data()` — the method
`Workflow.setup` calls: read → validate → tensorize → fit normalization → normalize state
and next_state — and prints rows/s per stage and overall (target ≥ 1M rows/s) and the
peak RSS growth of the ingest against the bytes of the training tensors it produced
(target ≤ ~2x).

The table is read row group by row group through the ingest engine (`data/ingest.py`).
Every run is a fresh child process (as a workflow rank is), so its peak RSS is its own;
the child imports everything first, so import time is not counted. `--repeat` runs are
made and the fastest is shown.

    .venv/bin/python benchmarks/bench_ingest.py [--rows 1000000] [--dir DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ACTIONS = ["left", "right"]


def _feature_map(rng: np.random.Generator, n: int, f: int, missing: float) -> pa.MapArray:
    present = rng.random((n, f)) >= missing
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    cols = np.nonzero(present)[1]
    keys = pa.DictionaryArray.from_arrays(
        pa.array(cols.astype(np.int32)), pa.array([str(i) for i in range(f)])
    ).cast(pa.string())
    values = pa.array(rng.normal(size=len(cols)).astype(np.float32))  # Hive `float`
    return pa.MapArray.from_arrays(pa.array(offsets), keys, values)


def generate(path: Path, rows: int, features: int, missing: float, row_group: int) -> None:
    """Write a synthetic dqn table (episodes of 20 steps, last step terminal)."""
    rng = np.random.default_rng(0)
    ep_len = 20
    seq = np.arange(rows) % ep_len
    last = seq == ep_len - 1
    action = rng.integers(0, 2, rows)
    next_action = np.where(last, "", np.array(ACTIONS)[rng.integers(0, 2, rows)])
    both = pa.array(ACTIONS * rows)
    pa_offsets = pa.array(np.arange(0, 2 * rows + 1, 2, dtype=np.int32))
    pna_len = np.where(last, 0, 2).astype(np.int32)
    pna_offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(pna_len, out=pna_offsets[1:])
    table = pa.table(
        {
            "mdp_id": pa.array(np.arange(rows) // ep_len),
            "sequence_number": pa.array(seq),
            "state_features": _feature_map(rng, rows, features, missing),
            "action": pa.array(np.array(ACTIONS)[action]),
            "reward": pa.array(rng.normal(size=rows)),
            "next_state_features": _feature_map(rng, rows, features, missing),
            "next_action": pa.array(next_action),
            "possible_actions": pa.ListArray.from_arrays(pa_offsets, both),
            "possible_next_actions": pa.ListArray.from_arrays(
                pa.array(pna_offsets), both.slice(0, int(pna_offsets[-1]))
            ),
            "action_probability": pa.array(np.full(rows, 0.5)),
            "time_diff": pa.array(np.ones(rows, np.int64)),
        }
    )
    pq.write_table(table, path, row_group_size=row_group)


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _current_rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_once(path: str, out_dir: str) -> dict[str, Any]:
    """One ingest in this (fresh) process: the timings, RSS and tensor bytes."""
    import torch

    from reagent_lite.config.models import DQNWorkflowConfig
    from reagent_lite.distributed.context import DistContext
    from reagent_lite.training.loop import Workflow

    pa.array([True, None]).fill_null(False)  # pyarrow's lazy imports happen here, not below
    cfg = DQNWorkflowConfig(
        training_data_path=path,
        model_output_path=out_dir,
        actions=ACTIONS,
        use_gpu=False,
        use_all_avail_gpus=False,
    )
    wf = Workflow("dqn", cfg, DistContext.single("cpu"))
    rss_before = max(_current_rss_bytes(), _peak_rss_bytes())
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    wf.load_training_data()
    wall = time.perf_counter() - t
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    data = wf.train_data
    return {
        "rows": len(data),
        "timings": wf.ingest_timings,
        "wall": wall,
        "cpu": cpu,
        "rss_before": rss_before,
        "rss_peak": _peak_rss_bytes(),
        "tensor_bytes": sum(v.element_size() * v.nelement() for _, v in data.items()),
        "threads": torch.get_num_threads(),
    }


def _child(path: str, out_dir: str, conn: Any) -> None:
    conn.send(run_once(path, out_dir))
    conn.close()


def _spawn(path: Path, out_dir: Path) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(str(path), str(out_dir), send))
    proc.start()
    result: dict[str, Any] = recv.recv()
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(f"benchmark child failed (exit {proc.exitcode})")
    return result


def _report(name: str, runs: list[dict[str, Any]]) -> None:
    best = min(runs, key=lambda r: r["wall"])
    n, mib = best["rows"], 2**20
    print(f"\n{name}: best of {len(runs)} runs, {n:,} rows ({best['threads']} torch threads)")
    for stage, sec in best["timings"].items():
        rate = f"{n / sec / 1e6:8.2f} M rows/s" if sec > 0 else ""
        print(f"  {stage:<14} {sec:7.3f}s {rate}")
    walls = ", ".join(f"{r['wall']:.3f}" for r in runs)
    print(
        f"  overall        {best['wall']:7.3f}s {n / best['wall'] / 1e6:8.2f} M rows/s "
        f"(target >= 1.00; all runs: {walls} s)"
    )
    print(
        f"  CPU time       {best['cpu']:7.3f}s (all threads of the process; {best['cpu'] / best['wall']:.2f}"
        " cores busy on average)"
    )
    growth = best["rss_peak"] - best["rss_before"]
    ratios = ", ".join(f"{(r['rss_peak'] - r['rss_before']) / r['tensor_bytes']:.2f}" for r in runs)
    print(
        f"  peak RSS {best['rss_peak'] / mib:.0f} MiB, before ingest {best['rss_before'] / mib:.0f}"
        f" MiB: growth {growth / mib:.0f} MiB vs training tensors "
        f"{best['tensor_bytes'] / mib:.0f} MiB -> {growth / best['tensor_bytes']:.2f}x "
        f"(target <= ~2; all runs: {ratios})"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=10)
    ap.add_argument("--missing", type=float, default=0.2)
    ap.add_argument("--row-group-size", type=int, default=131_072)
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to write the table (default: a temp dir)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs; the best is shown")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.dir or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"bench_{args.rows}x{args.features}_{args.row_group_size}.parquet"
        if not path.exists():
            t0 = time.perf_counter()
            child = mp.get_context("spawn").Process(
                target=generate,
                args=(path, args.rows, args.features, args.missing, args.row_group_size),
            )
            child.start()
            child.join()
            if child.exitcode != 0:
                raise SystemExit(f"data generation failed (exit {child.exitcode})")
            print(f"generated in {time.perf_counter() - t0:.1f}s")
        size_mb = path.stat().st_size / 2**20
        print(
            f"table: {args.rows:,} rows, {args.features} sparse features ({args.missing:.0%}"
            f" missing), row groups of {args.row_group_size:,} → {path} ({size_mb:.1f} MiB)"
        )
        print(
            f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
            f" ({os.cpu_count()} CPUs)"
        )
        runs = [_spawn(path, Path(tmp) / "out") for _ in range(args.repeat)]
        _report("ingest", runs)
        print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
