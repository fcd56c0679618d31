"""Step logs → the training table, on this machine (default: DuckDB and Arrow) or Spark.

The transformation is written once, as SQL (`query.py`); `spark.py` runs it as written,
`duck.py` as a sort in Arrow (`buckets.py`) and the pairing of neighbouring rows
(`pairing.py`), which the tests hold to the SQL's rows.
"""

from reagent_lite.timeline.connection import DEFAULT_MEMORY_LIMIT, DuckSettings
from reagent_lite.timeline.duck import ROW_GROUP_SIZE, build_training_table
from reagent_lite.timeline.query import episode_hash

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "ROW_GROUP_SIZE",
    "DuckSettings",
    "build_training_table",
    "episode_hash",
]
