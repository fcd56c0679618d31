"""Dict cells written by `df.to_parquet()` (struct columns, one field per key of any row)
are read as feature maps: a key a row's dict lacks is absent from that row's map."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from reagent_lite.data.readers import empty_like, read_table
from tests.data.test_ingest import rows


def test_pandas_dict_cells_read_as_feature_maps(tmp_path: Path) -> None:
    data = rows(40)
    path = tmp_path / "frame.parquet"
    pd.DataFrame(data).to_parquet(path)
    assert pa.types.is_struct(pq.read_schema(path).field("state_features").type)

    table = read_table(path)
    for column in ("state_features", "next_state_features"):
        assert pa.types.is_map(table.schema.field(column).type), column
        got = [dict(cell) for cell in table.column(column).to_pylist()]
        assert got == [row[column] for row in data], column
    # The schema alone (as --dry_run reads it) says map too.
    empty, _ = empty_like(path)
    assert pa.types.is_map(empty.schema.field("state_features").type)


def test_a_null_struct_is_a_null_map_and_integer_fields_are_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    struct = pa.array(
        [{"1": 2, "5": None}, None, {"1": None, "5": 7}],
        pa.struct([("1", pa.int64()), ("5", pa.int64())]),
    )
    pq.write_table(pa.table({"state_features": struct}), path)
    got = read_table(path).column("state_features").to_pylist()
    assert got == [[("1", 2.0)], None, [("5", 7.0)]]


def test_lists_of_dicts_read_as_lists_of_maps_also_from_a_slice(tmp_path: Path) -> None:
    # parametric_dqn's candidates: a list of action feature maps per row.
    cells = [[{"1": 1.0}, {"2": 3.0}], None, [], [{"1": 5.0, "2": 6.0}]]
    path = tmp_path / "p.parquet"
    pd.DataFrame({"possible_actions": cells}).to_parquet(path)
    column = read_table(path).column("possible_actions")
    assert pa.types.is_map(column.type.value_type)
    want = [None if c is None else [sorted(d.items()) for d in c] for c in cells]
    got = [None if c is None else [sorted(m) for m in c] for c in column.to_pylist()]
    assert got == want
    # A sliced chunk (rows pieces of a shard are slices of a batch) converts the same.
    from reagent_lite.data.arrow import structs_as_maps

    raw = pq.read_table(path).slice(1)
    assert structs_as_maps(raw).column(0).to_pylist() == column.to_pylist()[1:]
