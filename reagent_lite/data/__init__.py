"""reagent_lite.data: reading, sharding, validating and ingesting logged transitions.

One ingest engine (`ingest.py`) serves every table: a table's rows are validated against
the kind's `TableSchema` (`validate.ShardValidation`) and scattered (`scatter.py`) by the
kind's builder into NaN-coded arrays (`shard_builder.IngestedShard`) — a rank's training
shard (`ingest`), a window streamed from disk (`windows.load_units`), an eval table; the
same scatter tensorizes the tables `predict` scores.
"""

from __future__ import annotations

import importlib
from typing import Any

# Name → module, loaded on first use (PEP 562): reading a table (`readers`, `timeline`) or
# checking its columns needs no torch, so `--help` and dry runs stay quick.
_EXPORTS = {
    "Layout": "ingest",
    "ingest": "ingest",
    "ShardPiece": "readers",
    "ShardSpec": "readers",
    "list_data_files": "readers",
    "read_shard": "readers",
    "read_table": "readers",
    "shard_plan": "readers",
    "EpochSampler": "sampler",
    "steps_for": "sampler",
    "TableSchema": "schema",
    "check_columns": "schema",
    "IngestedShard": "shard_builder",
    "ShardValidation": "validate",
    "ValidationReport": "validate",
    "load_units": "windows",
    "scan_units": "windows",
    "stream_units": "windows",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"reagent_lite.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'reagent_lite.data' has no attribute {name!r}")
