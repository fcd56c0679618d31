"""The timeline command on DuckDB: the replaced implementation's rows, from Parquet and JSON
Lines, out of core, in row groups sized for sharding; bad input and bad flags."""

from __future__ import annotations

import gzip
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.errors import ConfigError, DataError
from reagent_lite.timeline import ROW_GROUP_SIZE, DuckSettings, build_training_table
from reagent_lite.timeline.duck import write_sides
from tests.conftest import run_module
from tests.timeline.conftest import oracle, sorted_rows, write_jsonl, write_parts


def run_cli(*args: str) -> tuple[int, str]:
    result = run_module("workflows.timeline", *args, timeout=120)
    return result.returncode, result.stdout + result.stderr


def test_cli_writes_the_same_rows_as_the_in_memory_implementation(steps, tmp_path) -> None:
    src = write_parts(steps, tmp_path / "steps")
    train, evaluation = tmp_path / "train.parquet", tmp_path / "eval.parquet"
    rc, out = run_cli(
        "--input", str(src), "--output", str(train), "--eval-output", str(evaluation),
        "--eval-fraction", "0.25", "--seed", "3", "--threads", "2",
    )  # fmt: skip
    assert rc == 0, out
    want_train, want_eval = oracle(steps, 0.25, seed=3)
    got_train, got_eval = pq.read_table(train), pq.read_table(evaluation)
    assert sorted_rows(got_train) == want_train
    assert sorted_rows(got_eval) == want_eval
    assert 0 < len(want_eval) < len(want_train)
    assert f"wrote {len(want_train)} transitions to {train}" in out
    # Sorted as written, extra columns last, time_diff from the gaps (2 and 3 occur).
    assert got_train.to_pylist() == want_train
    assert got_train.column_names[-2:] == ["metrics", "day"]
    assert {2, 3} <= set(got_train.column("time_diff").to_pylist())
    meta = pq.ParquetFile(train).metadata
    assert all(meta.row_group(i).num_rows <= ROW_GROUP_SIZE for i in range(meta.num_row_groups))
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary file left behind


def test_row_groups_are_small_enough_for_sharding(tmp_path) -> None:
    import numpy as np

    from benchmarks.bench_timeline import step_log

    big = step_log(np.random.default_rng(1), 0, 2_500)  # ~50k steps
    pq.write_table(big, tmp_path / "steps.parquet")
    written = write_sides(
        tmp_path / "steps.parquet", {"all": tmp_path / "t.parquet"}, eval_fraction=0.0, seed=0,
        settings=DuckSettings(memory_limit="64MB", threads=2),
    )  # fmt: skip
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert written == {"all": big.num_rows} and sum(sizes) == big.num_rows
    assert max(sizes) <= ROW_GROUP_SIZE and len(sizes) >= 3


def test_small_memory_limit_gives_the_same_rows(tmp_path) -> None:
    """A small memory limit on one thread (how a shared machine runs it): the same rows."""
    import numpy as np

    from benchmarks.bench_timeline import step_log

    big = step_log(np.random.default_rng(2), 0, 1_000)  # ~20k steps
    src = write_parts(big, tmp_path / "steps", parts=4)
    spill = tmp_path / "spill"
    spill.mkdir()
    settings = DuckSettings(memory_limit="4MB", threads=1, temp_dir=str(spill))  # spills
    write_sides(src, {"all": tmp_path / "t.parquet"}, eval_fraction=0.0, seed=0, settings=settings)
    assert sorted_rows(pq.read_table(tmp_path / "t.parquet")) == oracle(big, 0.0)[0]
    assert not list(spill.iterdir())  # its private spill directory is removed afterwards


@pytest.mark.parametrize("name", ["steps.jsonl", "steps.json.gz"])
def test_json_lines_step_logs(steps, tmp_path, name: str) -> None:
    src = write_jsonl(steps, tmp_path / "steps.jsonl")
    if name.endswith(".gz"):
        with open(src, "rb") as fh, gzip.open(tmp_path / name, "wb") as gz:
            shutil.copyfileobj(fh, gz)
        src.unlink()
        src = tmp_path / name
    out = tmp_path / "train.parquet"
    rc, text = run_cli("--input", str(src), "--output", str(out))
    assert rc == 0, text
    table = pq.read_table(out)
    assert table.schema.field("next_state_features").type == pa.map_(pa.string(), pa.float64())
    assert table.to_pylist() == oracle(steps, 0.0)[0]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda t: t.drop_columns(["reward"]), ["missing column(s) 'reward'"]),
        (
            lambda t: t.set_column(
                1, "sequence_number", pa.compute.cast(t["sequence_number"], pa.float64())
            ),
            ["column 'sequence_number' has type DOUBLE; expected an integer"],
        ),
        (
            lambda t: pa.concat_tables([t, t.slice(5, 1)]),
            ["columns 'mdp_id', 'sequence_number'", "1 rows repeat", "e.g. mdp_id="],
        ),
        (
            lambda t: t.set_column(0, "mdp_id", pa.array([None, *t["mdp_id"].to_pylist()[1:]])),
            ["column 'mdp_id': 1 rows are null", "e.g. mdp_id=null, sequence_number="],
        ),
        (
            lambda t: t.set_column(
                6, "action_probability", pa.array([0.0, *t["action_probability"].to_pylist()[1:]])
            ),
            ["column 'action_probability': 1 rows outside (0, 1]", ", value=0.0"],
        ),
    ],
)
def test_bad_step_logs_exit_3_naming_file_column_and_a_row(steps, tmp_path, change, words) -> None:
    src = tmp_path / "logs.parquet"
    pq.write_table(change(steps), src)
    rc, text = run_cli("--input", str(src), "--output", str(tmp_path / "t.parquet"))
    assert rc == 3, text
    assert text.startswith(f"error: {src}: ") and "Traceback" not in text
    for w in words:
        assert w in text
    assert not (tmp_path / "t.parquet").exists()
    assert not list(tmp_path.glob(".*tmp*"))  # nor its temporary file
    if "1 rows repeat" in words:  # the example names the repeated pair itself
        dup = steps.slice(5, 1).to_pylist()[0]
        assert f"mdp_id={dup['mdp_id']}, sequence_number={dup['sequence_number']}" in text


def test_bad_flags_exit_2(steps, tmp_path) -> None:
    pq.write_table(steps, tmp_path / "s.parquet")
    base = ("--input", str(tmp_path / "s.parquet"), "--output", str(tmp_path / "t.parquet"))
    rc, text = run_cli(*base, "--memory-limit", "lots")
    assert rc == 2 and "--memory-limit" in text and "'lots'" in text, text
    rc, text = run_cli(
        *base, "--eval-output", str(tmp_path / "e.parquet"), "--eval-fraction", "1.5"
    )
    assert rc == 2 and "--eval-fraction" in text, text
    rc, text = run_cli(*base, "--engine", "flink")
    assert rc == 2 and "invalid choice" in text


def test_in_memory_api_checks_like_the_command(steps) -> None:
    with pytest.raises(DataError, match="in_memory: eval_fraction"):
        build_training_table(steps, eval_fraction=1.0, source="in_memory")
    train, evaluation = build_training_table(steps, eval_fraction=0.3, seed=1)
    want_train, want_eval = oracle(steps, 0.3, seed=1)
    assert (train.to_pylist(), evaluation.to_pylist()) == (want_train, want_eval)
    with pytest.raises(ConfigError, match="--memory-limit"):
        build_training_table(steps, settings=DuckSettings(memory_limit="lots"))


def test_unreadable_or_mixed_inputs_exit_3(tmp_path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.parquet").write_bytes(b"not parquet")
    rc, text = run_cli("--input", str(tmp_path / "d"), "--output", str(tmp_path / "t.parquet"))
    assert rc == 3 and "cannot read as parquet" in text, text
    (tmp_path / "d" / "b.jsonl").write_text("{}\n")
    rc, text = run_cli("--input", str(tmp_path / "d"), "--output", str(tmp_path / "t.parquet"))
    assert rc == 3 and "mixes Parquet and JSON Lines" in text, text
    rc, text = run_cli("--input", str(tmp_path / "nope"), "--output", str(tmp_path / "t.parquet"))
    assert rc == 3 and "no such file" in text, text


def test_default_threads_leave_each_thread_128_mib_of_the_memory_limit() -> None:
    """On a many-core host, every core under the default 1GB limit ran out of memory
    while sorting; the default thread count is capped by the limit instead."""
    import duckdb

    from reagent_lite.timeline.connection import default_threads

    con = duckdb.connect()
    con.execute("SET threads = 64")
    con.execute("SET memory_limit = '1GB'")  # 953.6 MiB: 7 threads of 128 MiB
    assert default_threads(con) == 7
    con.execute("SET memory_limit = '100GB'")
    assert default_threads(con) == 64
    con.execute("SET memory_limit = '10MB'")
    assert default_threads(con) == 1


def test_a_damaged_data_page_exits_3_naming_the_file_and_row_group(steps, tmp_path) -> None:
    src = tmp_path / "steps.parquet"
    pq.write_table(steps, src, row_group_size=300)
    meta = pq.ParquetFile(src).metadata
    offset = meta.row_group(2).column(2).data_page_offset
    data = bytearray(src.read_bytes())
    data[offset + 10 : offset + 200] = b"\x5a" * 190
    src.write_bytes(bytes(data))
    rc, text = run_cli("--input", str(src), "--output", str(tmp_path / "t.parquet"))
    assert rc == 3, text
    assert (
        text.startswith(f"error: {src}: row group 2 cannot be read (") and "Traceback" not in text
    )
    assert not (tmp_path / "t.parquet").exists() and not list(tmp_path.glob(".*tmp*"))


def test_the_same_path_for_both_tables_is_refused(steps, tmp_path) -> None:
    pq.write_table(steps, tmp_path / "s.parquet")
    out = str(tmp_path / "t.parquet")
    rc, text = run_cli(
        "--input", str(tmp_path / "s.parquet"), "--output", out, "--eval-output", out
    )
    assert rc == 2 and "--eval-output" in text and "--output" in text, text
    assert not (tmp_path / "t.parquet").exists()


def test_a_missing_temp_dir_is_a_flag_error(steps, tmp_path) -> None:
    pq.write_table(steps, tmp_path / "s.parquet")
    rc, text = run_cli(
        "--input", str(tmp_path / "s.parquet"), "--output", str(tmp_path / "t.parquet"),
        "--temp-dir", str(tmp_path / "nowhere"),
    )  # fmt: skip
    assert rc == 2 and "--temp-dir" in text and "nowhere" in text and "Traceback" not in text, text


@pytest.mark.parametrize(
    "limit", ["1GB'; COPY (SELECT 42) TO '{target}'; SET memory_limit='1GB", "0GB", "80%", "1 GB x"]
)
def test_a_memory_limit_that_is_not_a_size_exits_2_and_runs_nothing(steps, tmp_path, limit) -> None:
    """The value was pasted into `SET memory_limit = '...'`: a quote in it ran SQL."""
    pq.write_table(steps, tmp_path / "s.parquet")
    limit = limit.format(target=tmp_path / "injected.csv")
    rc, text = run_cli(
        "--input", str(tmp_path / "s.parquet"), "--output", str(tmp_path / "t.parquet"),
        "--memory-limit", limit,
    )  # fmt: skip
    assert rc == 2 and "--memory-limit" in text and repr(limit) in text, text
    assert "Traceback" not in text and "KiB" in text
    assert not (tmp_path / "t.parquet").exists()
    assert not (tmp_path / "injected.csv").exists()


def test_sizes_duckdb_writes_are_accepted(steps) -> None:
    for limit in ("512MB", "1.5gb", "1 GiB", "2048 kib"):
        train, _ = build_training_table(steps, settings=DuckSettings(memory_limit=limit))
        assert train.num_rows > 0


def test_paths_with_quotes_work(steps, tmp_path) -> None:
    """Paths reach DuckDB as parameters or escaped literals: a quote is just a character."""
    folder = tmp_path / "it's here"
    src = write_parts(steps, folder / "st'eps")
    spill = folder / "sp'ill"
    spill.mkdir()
    out = folder / "tr'ain.parquet"
    rc, text = run_cli(
        "--input", str(src), "--output", str(out), "--temp-dir", str(spill),
        "--memory-limit", "4MB", "--threads", "1",
    )  # fmt: skip
    assert rc == 0, text
    assert sorted_rows(pq.read_table(out)) == oracle(steps, 0.0)[0]
    assert list(spill.iterdir()) == []  # the private spill directory is removed
    jsonl = write_jsonl(steps, folder / "st'eps.jsonl")
    rc, text = run_cli("--input", str(jsonl), "--output", str(out))
    assert rc == 0, text


def test_an_output_that_would_replace_the_input_is_refused(steps, tmp_path) -> None:
    """`--output` equal to `--input` replaced the step log with the table (exit 0)."""
    src = tmp_path / "s.parquet"
    pq.write_table(steps, src)
    before = src.read_bytes()
    (tmp_path / "link.parquet").symlink_to(src)
    os.link(src, tmp_path / "hard.parquet")
    parts = write_parts(steps, tmp_path / "parts")
    other = str(tmp_path / "t.parquet")
    cases = [
        (str(src), ["--output", str(src)], "--output"),
        (str(src), ["--output", str(tmp_path / "link.parquet")], "--output"),
        (str(src), ["--output", str(tmp_path / "hard.parquet")], "--output"),
        (str(src), ["--output", other, "--eval-output", str(src)], "--eval-output"),
        (f"file://{src}", ["--output", other, "--eval-output", str(src)], "--eval-output"),
        (str(parts), ["--output", str(parts / "t.parquet")], "--output"),
        (str(parts / "part-00000.parquet"), ["--output", str(parts)], "--output"),
    ]
    for input_path, flags, flag in cases:
        rc, text = run_cli("--input", input_path, *flags)
        assert rc == 2 and f"{flag}: " in text and "--input" in text, (flags, text)
        assert "Traceback" not in text
    assert src.read_bytes() == before and not (tmp_path / "t.parquet").exists()
    assert sorted(p.name for p in parts.iterdir()) == [f"part-{k:05d}.parquet" for k in range(3)]
