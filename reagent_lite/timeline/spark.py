"""The timeline on Spark: the same SQL (`query.py`) for step logs that outgrow one machine.

`timeline(steps_df)` takes and returns a Spark DataFrame, for use inside a pipeline;
`write_sides` is what `python -m workflows.timeline --engine spark` runs (under
`spark-submit` on a cluster, or in local mode on every core of this machine). Needs the
`spark` extra (pyspark) and a Java runtime; without them `require_spark` says what to
install (exit code 2).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reagent_lite.errors import ConfigError, DataError
from reagent_lite.timeline.files import file_format, step_files
from reagent_lite.timeline.query import (
    Kind,
    NullPropensity,
    Side,
    StepColumns,
    checks_sql,
    duplicates_sql,
    raise_for_checks,
    transitions_sql,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType

_VIEW_PREFIX = "reagent_timeline_steps_"


class SparkDialect:
    def empty(self, type_name: str, kind: Kind) -> str:
        return f"CAST({'map()' if kind == 'map' else 'array()'} AS {type_name})"

    def zeros_like(self, column: str, type_name: str) -> str:
        return f"CAST(transform({self.quote(column)}, x -> 0D) AS {type_name})"

    def quote(self, name: str) -> str:
        return "`" + name.replace("`", "``") + "`"


def require_spark() -> None:
    """Raise `ConfigError` (exit 2) naming what to install when pyspark or Java is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            "--engine spark needs pyspark: pip install 'reagent-lite[spark]'"
        ) from err
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and Path(java_home, "bin", "java").exists()) and not shutil.which("java"):
        raise ConfigError(
            "--engine spark needs a Java runtime (17 or newer) on PATH or in JAVA_HOME: "
            "e.g. apt-get install openjdk-17-jre-headless"
        )


def spark_kind(dtype: DataType) -> Kind:
    from pyspark.sql import types as T

    if isinstance(dtype, T.IntegralType):
        return "integer"
    if isinstance(dtype, T.FractionalType):
        return "float"
    if isinstance(dtype, T.StringType):
        return "string"
    if isinstance(dtype, T.MapType):
        return "map"
    if isinstance(dtype, T.ArrayType):
        return "list"
    return "other"


def step_columns(
    df: DataFrame, source: str, null_propensity: NullPropensity = "error"
) -> StepColumns:
    """The DataFrame's columns as the queries see them, checked."""
    columns = StepColumns(
        {f.name: (f.dataType.simpleString(), spark_kind(f.dataType)) for f in df.schema.fields},
        source,
        null_propensity,
    )
    columns.check()
    return columns


def _with_view(df: DataFrame) -> tuple[SparkSession, str]:
    """Register `df` under a fresh temporary view name; the session and the name."""
    name = _VIEW_PREFIX + uuid.uuid4().hex
    df.createOrReplaceTempView(name)
    return df.sparkSession, name


def check_steps(
    df: DataFrame, source: str = "<steps>", null_propensity: NullPropensity = "error"
) -> StepColumns:
    """Check a step-log DataFrame as the CLI does (two Spark jobs); raises `DataError`."""
    columns = step_columns(df, source, null_propensity)
    spark, view = _with_view(df)
    try:
        for sql in (checks_sql(columns, SparkDialect(), view), duplicates_sql(view)):
            row = spark.sql(sql).collect()[0]
            raise_for_checks(source, row.asDict())
    finally:
        spark.catalog.dropTempView(view)
    return columns


def timeline(
    steps: DataFrame,
    *,
    side: Side = "all",
    eval_fraction: float = 0.0,
    seed: int = 0,
    check: bool = True,
    order: bool = True,
    null_propensity: NullPropensity = "error",
) -> DataFrame:
    """The transition table of a step-log DataFrame, lazily (nothing runs until an action).

    `side`: every episode (`all`), or the `train` / `eval` side of the hashed split at
    `eval_fraction` and `seed`. `check`: first check columns and values (runs two Spark
    jobs; raises `DataError`). `order`: sort by (mdp_id, sequence_number).
    `null_propensity`: "one" reads a null propensity as 1.0 (Horizon's absorbing steps are
    always taken as their episode's end, as the local engine does).
    """
    if check:
        columns = check_steps(steps, null_propensity=null_propensity)
    else:
        columns = step_columns(steps, "<steps>", null_propensity)
    spark, view = _with_view(steps)
    sql = transitions_sql(
        columns,
        SparkDialect(),
        side=side,
        eval_fraction=eval_fraction,
        seed=seed,
        order=order,
        table=view,
    )
    # The view stays registered: the returned DataFrame's plan refers to it by name.
    return spark.sql(sql)


def read_steps(spark: SparkSession, path: str | os.PathLike[str]) -> DataFrame:
    """A step log (Parquet, or JSON Lines whose objects are read as feature maps)."""
    from pyspark.sql import types as T

    text = str(path)
    if is_uri(text):  # hdfs://, s3a://, ...: Spark lists it; the name tells the format
        fmt = "json" if file_format(Path(text.rstrip("/"))) == "json" else "parquet"
        paths = [text]
    else:
        fmt, files = step_files(path)
        paths = [str(f) for f in files]
    if fmt == "parquet":
        return spark.read.parquet(*paths)
    inferred = spark.read.json(paths).schema
    feature_map = T.MapType(T.StringType(), T.DoubleType())

    def as_maps(dtype: Any) -> Any:
        if isinstance(dtype, T.StructType | T.MapType):
            return feature_map
        if isinstance(dtype, T.ArrayType) and isinstance(
            dtype.elementType, T.StructType | T.MapType
        ):
            return T.ArrayType(feature_map)
        return dtype

    schema = T.StructType([T.StructField(f.name, as_maps(f.dataType)) for f in inferred.fields])
    return spark.read.schema(schema).json(paths)


def session() -> SparkSession:
    """The active Spark session (spark-submit's), else a local one on every core."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    # No master here: under spark-submit the session is the cluster's, and a plain Python
    # process gets Spark's default, local mode on every core.
    builder = SparkSession.builder.appName("reagent-lite-timeline")
    return builder.config("spark.ui.showConsoleProgress", "false").getOrCreate()


def is_uri(path: str) -> bool:
    """A path with a scheme (`hdfs://...`, `s3a://...`), not one on this machine."""
    return "://" in path and not path.startswith("file://")


def write_sides(
    input_path: str | os.PathLike[str],
    outputs: dict[Side, str],
    *,
    eval_fraction: float,
    seed: int,
    null_propensity: NullPropensity = "error",
) -> dict[Side, int]:
    """Check the step log, then write each side as a directory of Parquet part files: a
    local path into a temporary directory beside it, renamed into place when complete; a
    URI (`hdfs://...`) by Spark's own committer, replacing what is there."""
    require_spark()
    from pyspark.errors import PySparkException

    spark = session()
    try:
        steps = read_steps(spark, input_path)
        check_steps(steps, str(input_path), null_propensity)
    except PySparkException as err:
        raise DataError(f"{input_path}: cannot read step logs ({_first_line(err)})") from err
    written: dict[Side, int] = {}
    for side, target in outputs.items():
        table = timeline(
            steps, side=side, eval_fraction=eval_fraction, seed=seed, check=False,
            null_propensity=null_propensity,
        )  # fmt: skip
        try:
            if is_uri(target):
                table.write.mode("overwrite").parquet(target)
            else:
                _write_local(table, Path(target))
        except PySparkException as err:
            raise DataError(f"{input_path}: {_first_line(err)}") from err
        written[side] = spark.read.parquet(target).count()
    return written


def _write_local(table: DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        table.write.parquet(str(tmp))
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
