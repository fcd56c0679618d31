"""The timeline on Spark (local[2], one session for the module): the same rows as DuckDB and
the replaced implementation, through the DataFrame function and the command's writer.

Skipped without pyspark or Java, except where REAGENT_LITE_REQUIRE_SPARK=1 (CI) makes
that a failure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.errors import ConfigError, DataError
from reagent_lite.timeline import build_training_table
from reagent_lite.timeline import spark as engine
from tests.timeline.conftest import oracle, sorted_rows, write_jsonl, write_parts


def _spark_or_skip() -> None:
    try:
        engine.require_spark()
    except ConfigError as err:
        if os.environ.get("REAGENT_LITE_REQUIRE_SPARK") == "1":
            raise
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    _spark_or_skip()
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("reagent-lite-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Tiny tables: compiling generated code and re-planning would take longer than running.
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.adaptive.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def read_dir(path: Path) -> pa.Table:
    return pq.read_table(path)


def test_dataframe_function_matches_duckdb_and_the_oracle(spark, steps, tmp_path) -> None:
    src = write_parts(steps, tmp_path / "steps")
    df = engine.read_steps(spark, src)
    for side, want in zip(("train", "eval"), oracle(steps, 0.25, seed=3), strict=True):
        out = tmp_path / side
        table = engine.timeline(df, side=side, eval_fraction=0.25, seed=3, check=side == "train")
        table.write.parquet(str(out))
        got = read_dir(out)
        assert sorted_rows(got) == want, side
    duck_train, _ = build_training_table(steps, eval_fraction=0.25, seed=3)
    assert sorted_rows(read_dir(tmp_path / "train")) == duck_train.to_pylist()


def test_command_writer_json_lines_and_dense_states(spark, steps, tmp_path) -> None:
    # JSON Lines in, dense `state` lists (zeros on terminal rows) carried too.
    dense = steps.append_column("state", pa.array([[float(i), 1.0] for i in range(steps.num_rows)]))
    dense = dense.drop_columns(["state_features"])
    src = write_jsonl(dense, tmp_path / "steps.jsonl")
    outputs = {"all": str(tmp_path / "all.parquet")}
    written = engine.write_sides(src, outputs, eval_fraction=0.0, seed=0)
    assert written == {"all": dense.num_rows}
    got = read_dir(outputs["all"])
    assert sorted_rows(got) == oracle(dense, 0.0)[0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bad_input_is_one_data_error(spark, steps, tmp_path) -> None:
    dup = pa.concat_tables([steps, steps.slice(5, 1)])
    pq.write_table(dup, tmp_path / "logs.parquet")
    with pytest.raises(DataError) as info:
        engine.write_sides(
            tmp_path / "logs.parquet", {"all": str(tmp_path / "t")}, eval_fraction=0.0, seed=0
        )
    row = steps.slice(5, 1).to_pylist()[0]
    assert str(info.value).startswith(f"{tmp_path / 'logs.parquet'}: columns 'mdp_id', ")
    assert f"e.g. mdp_id={row['mdp_id']}, sequence_number={row['sequence_number']}" in str(
        info.value
    )
    assert not (tmp_path / "t").exists()
    missing = spark.read.parquet(str(tmp_path / "logs.parquet")).drop("reward")
    with pytest.raises(DataError, match="missing column\\(s\\) 'reward'"):
        engine.timeline(missing)


def test_missing_pyspark_or_java_is_exit_2(monkeypatch, steps, tmp_path) -> None:
    from workflows.timeline import main

    pq.write_table(steps, tmp_path / "s.parquet")
    args = [
        "--input",
        str(tmp_path / "s.parquet"),
        "--output",
        str(tmp_path / "t"),
        "--engine",
        "spark",
    ]
    monkeypatch.setitem(sys.modules, "pyspark", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'reagent-lite\[spark\]'"):
        engine.require_spark()
    assert main(args) == 2
    monkeypatch.delitem(sys.modules, "pyspark")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    try:
        import pyspark  # noqa: F401
    except ImportError:
        pytest.skip("pyspark is not installed: the Java check comes after it")
    with pytest.raises(ConfigError, match="needs a Java runtime"):
        engine.require_spark()
    assert main(args) == 2
