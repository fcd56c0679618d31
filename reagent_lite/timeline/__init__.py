"""Step logs → the training table, on DuckDB (default, one machine) or Spark (a cluster).

The transformation is written once, as SQL (`query.py`); `duck.py` and `spark.py` run it.
"""

from reagent_lite.timeline.duck import (
    DEFAULT_MEMORY_LIMIT,
    ROW_GROUP_SIZE,
    DuckSettings,
    build_training_table,
)
from reagent_lite.timeline.query import episode_hash

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "ROW_GROUP_SIZE",
    "DuckSettings",
    "build_training_table",
    "episode_hash",
]
