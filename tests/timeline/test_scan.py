"""Which reader the local engine uses for a step log, and that either gives DuckDB's types."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pyarrow.parquet as pq

from reagent_lite.timeline.duck import DuckDialect, DuckSettings, connect, open_steps, write_sides
from reagent_lite.timeline.query import transitions_sql
from reagent_lite.timeline.scan import ArrowScan, DuckScan, plain_schema
from tests.timeline.conftest import oracle, sorted_rows, write_parts


def test_parquet_is_read_by_arrow_with_string_leaves_as_dictionaries(steps, tmp_path) -> None:
    src = write_parts(steps, tmp_path / "steps")
    with connect(DuckSettings(threads=1)) as con:
        _, scan = open_steps(con, src)
        duck = con.sql("SELECT * FROM steps LIMIT 0").to_arrow_table().schema
    assert isinstance(scan, ArrowScan)
    types = {f.name: f.type for f in scan.schema}
    assert pa.types.is_dictionary(types["state_features"].key_type)
    assert pa.types.is_dictionary(types["possible_actions"].value_type)
    assert pa.types.is_dictionary(types["action"])
    assert types["mdp_id"] == pa.string()  # many distinct values: plain
    assert plain_schema(scan.schema) == duck


def test_hive_partition_folders_are_read_by_duckdb_as_typed_columns(steps, tmp_path) -> None:
    # `day=.../` folders: a column only DuckDB sees (a DATE), so DuckDB reads the rows.
    logs = steps.drop_columns(["day"])
    half = logs.num_rows // 2
    for day, part in (("2026-11-27", logs.slice(0, half)), ("2026-11-28", logs.slice(half))):
        folder = tmp_path / "steps" / f"day={day}"
        folder.mkdir(parents=True)
        pq.write_table(part, folder / "part-0.parquet")
    out = tmp_path / "train.parquet"
    with connect(DuckSettings(threads=1)) as con:
        columns, scan = open_steps(con, tmp_path / "steps")
        want = con.sql(transitions_sql(columns, DuckDialect())).to_arrow_table()
    assert isinstance(scan, DuckScan)
    write_sides(
        tmp_path / "steps", {"all": out}, eval_fraction=0.0, seed=0, settings=DuckSettings()
    )
    got = pq.read_table(out)
    assert got.schema == want.schema and got.schema.field("day").type == pa.date32()
    assert got.to_pylist() == want.to_pylist()
    assert {r["day"] for r in got.to_pylist()} == {
        datetime.date(2026, 11, 27),
        datetime.date(2026, 11, 28),
    }
    # Without the day, the rows of the replaced in-memory implementation.
    assert sorted_rows(got.drop_columns(["day"])) == oracle(logs, 0.0)[0]


def test_written_tables_read_back_with_plain_types(steps, tmp_path) -> None:
    # The writer is given dictionaries; readers get the log's own types back.
    src = write_parts(steps, tmp_path / "steps")
    out = tmp_path / "t.parquet"
    write_sides(src, {"all": out}, eval_fraction=0.0, seed=0, settings=DuckSettings())
    schema = pq.read_schema(out)
    fmap = pa.map_(pa.string(), pa.float64())
    assert schema.field("state_features").type == fmap
    assert schema.field("next_state_features").type == fmap
    assert schema.field("possible_next_actions").type == pa.list_(pa.string())
    assert schema.field("next_action").type == pa.string()
    assert not any(pa.types.is_dictionary(f.type) for f in pq.read_table(out).schema)


def test_feature_ids_past_the_dictionary_page_read_like_the_others(tmp_path) -> None:
    # Many distinct feature ids: the writer's dictionary fills up and later pages of a
    # column chunk are plain; Arrow's dictionaries change within a row group.
    import numpy as np

    from benchmarks.bench_timeline import step_log

    steps = step_log(np.random.default_rng(4), 0, 300)
    maps = [[(f"{i * 7 + j}", float(j)) for j in range(3)] for i in range(steps.num_rows)]
    steps = steps.set_column(2, "state_features", pa.array(maps, steps.schema.field(2).type))
    src = tmp_path / "steps.parquet"
    pq.write_table(steps, src, dictionary_pagesize_limit=2048, data_page_size=2048)
    encodings = pq.ParquetFile(src).metadata.row_group(0).column(2).encodings
    assert "PLAIN" in encodings and "RLE_DICTIONARY" in encodings
    out = tmp_path / "t.parquet"
    write_sides(src, {"all": out}, eval_fraction=0.0, seed=0, settings=DuckSettings())
    assert pq.read_table(out).to_pylist() == oracle(steps, 0.0)[0]
