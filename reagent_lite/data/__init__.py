"""reagent_lite.data: reading, sharding, validating and ingesting logged transitions.

One ingest engine (`ingest.py`) serves every table: a table's rows are validated against
the kind's `TableSchema` (`validate.ShardValidation`) and scattered (`scatter.py`) by the
kind's builder into NaN-coded arrays (`shard_builder.IngestedShard`) — a rank's training
shard (`ingest`), a window streamed from disk (`windows.load_units`), an eval table; the
same scatter tensorizes the tables `predict` scores.
"""

from reagent_lite.data.ingest import Layout, ingest
from reagent_lite.data.readers import (
    ShardPiece,
    ShardSpec,
    list_data_files,
    read_shard,
    read_table,
    shard_plan,
)
from reagent_lite.data.sampler import EpochSampler, steps_for
from reagent_lite.data.schema import TableSchema, check_columns
from reagent_lite.data.shard_builder import IngestedShard
from reagent_lite.data.validate import ShardValidation, ValidationReport
from reagent_lite.data.windows import load_units, scan_units, stream_units

__all__ = [
    "EpochSampler",
    "IngestedShard",
    "Layout",
    "ShardPiece",
    "ShardSpec",
    "ShardValidation",
    "TableSchema",
    "ValidationReport",
    "check_columns",
    "ingest",
    "list_data_files",
    "load_units",
    "read_shard",
    "read_table",
    "scan_units",
    "shard_plan",
    "steps_for",
    "stream_units",
]
