"""The local engine's DuckDB connection: its memory limit, threads and spill directory.

Every value the user gives reaches DuckDB as a bound parameter, never pasted into SQL
text: `--memory-limit` is checked against the sizes DuckDB accepts first (a flag error
naming the value otherwise), and `--temp-dir`'s private subdirectory is a parameter too,
so a quote in a path is just a character.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import duckdb

from reagent_lite.errors import ConfigError

DEFAULT_MEMORY_LIMIT = "1GB"
_UNITS = {"B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}  # fmt: skip
# A size as DuckDB writes one (`1GB`, `512 MiB`, `1.5GB`): a positive number and a unit.
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*", re.IGNORECASE)
# Memory each DuckDB thread needs for this workload (sorts of rows with nested columns):
# on a 64-core host, every core under the default 1GB limit ran out of memory.
_BYTES_PER_THREAD = 128 * 2**20


@dataclass(frozen=True)
class DuckSettings:
    """How DuckDB may use the machine."""

    memory_limit: str = DEFAULT_MEMORY_LIMIT  # e.g. "1GB", "16GB"
    threads: int | None = None  # None: every core
    temp_dir: str | None = None  # where sorts spill; None: the system's temp directory


def check_memory_limit(value: str) -> None:
    """Raise `ConfigError` (naming `--memory-limit`) unless `value` is a positive size
    with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (of 1024)."""
    match = _SIZE.fullmatch(value)
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(
            f"--memory-limit: bad value {value!r}; expected a positive size with a unit "
            "(B, KB, MB, GB, TB, KiB, MiB, GiB or TiB), such as 1GB or 512MB"
        )


def setting(con: duckdb.DuckDBPyConnection, name: str) -> Any:
    """A DuckDB setting's value (fetched to the end: DuckDB 2 refuses another query on a
    connection whose last result is unfinished)."""
    return con.execute("SELECT current_setting(?)", [name]).fetchall()[0][0]


def memory_limit_bytes(con: duckdb.DuckDBPyConnection) -> int | None:
    """The connection's memory limit in bytes (None if DuckDB spells it unexpectedly)."""
    limit = setting(con, "memory_limit")
    match = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?I?B)\s*", str(limit).upper())
    return None if match is None else int(float(match.group(1)) * _UNITS[match.group(2)])


def default_threads(con: duckdb.DuckDBPyConnection) -> int:
    """Every core DuckDB sees, but no more than the memory limit gives 128 MiB each."""
    cores = setting(con, "threads")
    size = memory_limit_bytes(con)
    if size is None:  # a limit DuckDB spells otherwise: keep its own choice
        return int(cores)
    return max(1, min(int(cores), int(size // _BYTES_PER_THREAD)))


@contextmanager
def connect(settings: DuckSettings) -> Iterator[duckdb.DuckDBPyConnection]:
    """An in-memory DuckDB connection that spills to a private temporary directory."""
    check_memory_limit(settings.memory_limit)
    try:
        spill = tempfile.mkdtemp(prefix="reagent-timeline-", dir=settings.temp_dir)
    except OSError as err:
        raise flag_error(
            "--temp-dir", settings.temp_dir, "a directory it can write in", err
        ) from err
    con = duckdb.connect(":memory:")
    try:
        try:
            con.execute("SET memory_limit = ?", [settings.memory_limit])
        except duckdb.Error as err:
            raise flag_error(
                "--memory-limit", settings.memory_limit, "a size such as 1GB or 512MB", err
            ) from err
        threads = settings.threads if settings.threads is not None else default_threads(con)
        con.execute("SET threads = ?", [int(threads)])
        con.execute("SET temp_directory = ?", [spill])
        # Row order inside a query is not needed (the output is sorted); this lets DuckDB
        # stream and spill more freely.
        con.execute("SET preserve_insertion_order = false")
        yield con
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def flag_error(flag: str, value: object, expected: str, err: Exception) -> ConfigError:
    return ConfigError(f"{flag}: bad value {value!r}; expected {expected} ({err})")


def sql_string(text: str) -> str:
    """`text` as the body of a single-quoted SQL string literal (for the few places a
    value cannot be bound, such as a view's file list)."""
    return text.replace("'", "''")
