"""Step logs for the engine tests: unsorted, with sequence gaps, maps, candidates, metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.bench_timeline import step_log
from benchmarks.timeline_baseline import build_training_table as baseline


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows of a table in (mdp_id, sequence_number) order, as Python values."""
    keys = [("mdp_id", "ascending"), ("sequence_number", "ascending")]
    return table.sort_by(keys).to_pylist()


def oracle(steps: pa.Table, eval_fraction: float, seed: int = 0) -> tuple[list, list]:
    """What every engine must write: the replaced in-memory implementation's rows."""
    train, evaluation = baseline(steps, eval_fraction=eval_fraction, seed=seed)
    return sorted_rows(train), sorted_rows(evaluation)


def write_parts(table: pa.Table, directory: Path, parts: int = 3) -> Path:
    """`table` over `parts` Parquet files, rows dealt round-robin (episodes span files)."""
    directory.mkdir(parents=True)
    idx = np.arange(table.num_rows)
    for k in range(parts):
        pq.write_table(table.take(idx[k::parts]), directory / f"part-{k:05d}.parquet")
    return directory


def write_jsonl(table: pa.Table, path: Path) -> Path:
    """`table` as JSON Lines: maps become JSON objects, as a logging system writes them."""

    def plain(v: Any) -> Any:
        if isinstance(v, list) and v and isinstance(v[0], tuple):
            return dict(v)
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    with open(path, "w") as fh:
        for row in table.to_pylist():
            fh.write(json.dumps({k: plain(v) for k, v in row.items()}) + "\n")
    return path


@pytest.fixture(scope="session")
def steps() -> pa.Table:
    """~1,200 steps of 60 episodes, shuffled, plus a partition-like extra column."""
    table = step_log(np.random.default_rng(7), 0, 60)
    return table.append_column("day", pa.array(["2026-11-27"] * table.num_rows))
