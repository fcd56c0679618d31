"""Step logs → the training table, in memory (for small logs: samples, tests, notebooks).

The transformation lives in `reagent_lite.timeline` (SQL, run by DuckDB or Spark); this
module keeps the in-memory entry points: `build_training_table` on an Arrow table, and
`write_table` (Parquet, atomically, in row groups sized for sharding).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reagent_lite.io_utils import atomic_write
from reagent_lite.timeline import ROW_GROUP_SIZE, build_training_table, episode_hash

__all__ = ["ROW_GROUP_SIZE", "build_training_table", "episode_hash", "write_table"]


def write_table(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """Write `table` as Parquet atomically (temp file in the same directory, then rename)."""
    p = Path(path)
    atomic_write(p, lambda tmp: pq.write_table(table, tmp, row_group_size=ROW_GROUP_SIZE))
    return p
