"""The Parquet tables the timeline writes (DuckDB engine): Arrow's writer, one file per side.

Written into a temporary name beside the target and renamed when complete, in row groups of
exactly ROW_GROUP_SIZE rows whatever the sizes of the batches (the last one fewer),
Snappy-compressed, dictionaries for the string leaves only, statistics for the keys only.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

# Row-group size of written tables: small enough that a few thousand episodes still give
# every rank of a multi-GPU job its own row groups (docs/DISTRIBUTED.md).
ROW_GROUP_SIZE = 16_384
# Parquet statistics only for the key columns (a reader may prune row groups by episode):
# min/max of every map key and value was a fifth of the writer's CPU time.
_STATISTICS = ["mdp_id", "sequence_number"]


class TableFile:
    """One side's Parquet file, written into a temporary name beside it, in row groups of
    ROW_GROUP_SIZE rows (the last one fewer) whatever the sizes of the batches."""

    def __init__(self, path: Path, schema: pa.Schema, plain: pa.Schema | None = None) -> None:
        """`schema`: of the batches; `plain`: the types readers get back, where string
        leaves of `schema` are dictionaries (written as Parquet's dictionary pages either
        way, and cheaper for the writer as dictionaries)."""
        self.path, self.schema = path, schema
        self.tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self.writer = pq.ParquetWriter(
            self.tmp,
            schema,
            compression="snappy",
            use_dictionary=string_columns(schema),
            write_statistics=[c for c in _STATISTICS if c in schema.names],
            store_schema=plain is None,
            # Encoded a row group at a time rather than 1,024 rows: ~7% less writer CPU.
            write_batch_size=ROW_GROUP_SIZE,
        )
        if plain is not None:
            # The Arrow schema readers restore the columns' types from (what store_schema
            # writes): the plain types, so dictionaries stay this writer's business.
            serialized = base64.b64encode(plain.serialize().to_pybytes()).decode()
            self.writer.add_key_value_metadata({"ARROW:schema": serialized})
        self.pending: list[pa.RecordBatch] = []
        self.buffered = self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.buffered += batch.num_rows
        if self.buffered >= ROW_GROUP_SIZE:
            self._flush(self.buffered - self.buffered % ROW_GROUP_SIZE)

    def _flush(self, rows: int) -> None:
        table = pa.Table.from_batches(self.pending, self.schema)
        self.writer.write_table(table.slice(0, rows), row_group_size=ROW_GROUP_SIZE)
        self.pending = table.slice(rows).to_batches()
        self.buffered -= rows
        self.rows += rows

    def finish(self) -> None:
        """The last rows written and the file closed, still under its temporary name."""
        if self.buffered:
            self._flush(self.buffered)
        self.writer.close()

    def publish(self) -> None:
        """The finished file takes its name (a rename: readers see all of it or none)."""
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.writer.close()
        self.tmp.unlink(missing_ok=True)


def string_columns(schema: pa.Schema) -> list[str]:
    """Parquet paths of the string leaves (map keys, action names, ids): dictionary-encoded,
    which keeps files small and lets readers decode feature ids as dictionaries; numbers
    are not (their dictionaries fill up and are dropped, after costing the writer time)."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    meta = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    leaves = (meta.column(i) for i in range(len(meta)))
    return [c.path for c in leaves if c.physical_type == "BYTE_ARRAY"]
