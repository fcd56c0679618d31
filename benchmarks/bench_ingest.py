"""Ingest benchmark: Parquet → validated Arrow table → tensors (→ normalized features).

Generates a dqn training table (default 1M rows, 10 sparse state features stored as
map<string, float> with ~20% missing, in both state and next_state) into a temporary
directory or `--dir`, then times each stage of the data path a workflow rank runs:

    read (read_shard) → validate → tensorize (tensorize_discrete) → normalize (Preprocessor)

and prints rows/s per stage and for read+tensorize (the target: ≥ 1M rows/s), plus the peak
RSS of this process against the bytes of the resulting tensors. The table is generated in a
child process so that its memory does not count in the peak. Normalization runs only when
`reagent_lite.normalization` is importable (otherwise it says so and skips the stage).

    .venv/bin/python benchmarks/bench_ingest.py [--rows 1000000] [--dir DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import sys
import tempfile
import time
from pathlib import Path

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


def _normalizer(sample: np.ndarray, feature_ids: list[str]) -> object | None:
    try:
        from reagent_lite.normalization.identify import fit_normalization
        from reagent_lite.normalization.module import Preprocessor
    except ImportError as e:
        print(f"normalize: skipped (reagent_lite.normalization not importable: {e})")
        return None
    params = fit_normalization(sample, feature_ids)
    return Preprocessor(feature_ids, params)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=10)
    ap.add_argument("--missing", type=float, default=0.2)
    ap.add_argument("--row-group-size", type=int, default=131_072)
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to write the table (default: a temp dir)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="timed runs; the best is reported")
    args = ap.parse_args(argv)

    import torch

    from reagent_lite.data import read_shard, tensorize_discrete, validate

    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.dir or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "bench_train.parquet"
        t0 = time.perf_counter()
        child = mp.get_context("spawn").Process(
            target=generate,
            args=(path, args.rows, args.features, args.missing, args.row_group_size),
        )
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"data generation failed (exit {child.exitcode})")
        size_mb = path.stat().st_size / 2**20
        print(
            f"generated {args.rows:,} rows, {args.features} sparse features ({args.missing:.0%}"
            f" missing) → {path} ({size_mb:.1f} MiB) in {time.perf_counter() - t0:.1f}s"
        )
        feature_ids = [str(i) for i in range(args.features)]
        rss_before = _peak_rss_bytes()

        best: dict[str, float] = {}
        batch = None
        for _ in range(args.repeat):
            times: dict[str, float] = {}
            t = time.perf_counter()
            table = read_shard(path, rank=0, world_size=1)
            times["read"] = time.perf_counter() - t
            t = time.perf_counter()
            table, _report = validate(table, "dqn", actions=ACTIONS, source=str(path))
            times["validate"] = time.perf_counter() - t
            t = time.perf_counter()
            batch = tensorize_discrete(table, feature_ids, ACTIONS)
            times["tensorize"] = time.perf_counter() - t
            del table
            for k, v in times.items():
                best[k] = min(best.get(k, v), v)
        assert batch is not None
        n = len(batch)
        sample = np.where(
            batch.state_presence[:100_000].numpy() > 0, batch.state[:100_000].numpy(), np.nan
        )
        pre = _normalizer(sample, feature_ids)
        if pre is not None:
            t = time.perf_counter()
            chunk = 262_144
            for s in range(0, n, chunk):
                pre(batch.state[s : s + chunk], batch.state_presence[s : s + chunk])  # type: ignore[operator]
                pre(batch.next_state[s : s + chunk], batch.next_state_presence[s : s + chunk])  # type: ignore[operator]
            best["normalize"] = time.perf_counter() - t

        print(f"\nstage timings (best of {args.repeat}), {n:,} rows:")
        for k, v in best.items():
            print(f"  {k:<10} {v:7.3f}s  {n / v / 1e6:6.2f} M rows/s")
        core = best["read"] + best["tensorize"]
        print(
            f"  {'read+tensorize':<18} {core:7.3f}s  {n / core / 1e6:6.2f} M rows/s  (target ≥ 1.00)"
        )
        total = sum(best.values())
        print(f"  {'all stages':<18} {total:7.3f}s  {n / total / 1e6:6.2f} M rows/s")
        tensor_mb = batch.nbytes() / 2**20
        peak = _peak_rss_bytes()
        print(
            f"\npeak RSS {peak / 2**20:.0f} MiB (before reading: {rss_before / 2**20:.0f} MiB, "
            f"growth {(peak - rss_before) / 2**20:.0f} MiB) vs tensors {tensor_mb:.0f} MiB "
            f"→ growth / tensors = {(peak - rss_before) / 2**20 / tensor_mb:.2f}x"
        )


if __name__ == "__main__":
    main()
