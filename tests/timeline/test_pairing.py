"""The local engine's plan (Arrow's bucket sort, then pairing neighbouring rows) writes what
the SQL of `transitions_sql` gives when DuckDB executes it as written: the same rows in
the same order, of the same types, however the sorted steps are cut into runs; and the
value checks it runs on the way give the checks' SQL's message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.errors import DataError
from reagent_lite.timeline import ROW_GROUP_SIZE, DuckSettings, build_training_table, duck
from reagent_lite.timeline.duck import (
    DuckDialect,
    check_values,
    connect,
    describe,
    open_steps,
    write_sides,
)
from reagent_lite.timeline.query import Side, transitions_sql
from tests.timeline.conftest import write_parts

FMAP = pa.map_(pa.string(), pa.float64())


def sql_tables(con, columns, sides: tuple[Side, ...], eval_fraction: float) -> dict[str, pa.Table]:
    """Each side's transitions from `transitions_sql` as written (window, then ORDER BY)."""
    return {
        side: con.sql(
            transitions_sql(columns, DuckDialect(), side=side, eval_fraction=eval_fraction, seed=5)
        ).to_arrow_table()
        for side in sides
    }


def dense_parametric_steps(rng: np.random.Generator, episodes: int) -> pa.Table:
    """Dense `state` lists (one null), map actions, the `propensity` alias, int ids and
    int32 sequence numbers with gaps, shuffled."""
    lengths = rng.integers(1, 6, episodes)
    n = int(lengths.sum())
    seq = np.concatenate([np.cumsum(rng.integers(1, 4, k)) for k in lengths]).astype(np.int32)
    states: list[list[float] | None] = [[float(i), -1.0, 0.5] for i in range(n)]
    states[3] = None
    actions = [{"100": float(i % 2), "101": float(1 - i % 2)} for i in range(n)]
    table = pa.table(
        {
            "mdp_id": pa.array(np.repeat(np.arange(episodes) * 7, lengths)),
            "sequence_number": pa.array(seq),
            "state": pa.array(states, pa.list_(pa.float32())),
            "action": pa.array(actions, FMAP),
            "reward": pa.array(rng.normal(size=n)),
            "possible_actions": pa.array([[a, a] for a in actions], pa.list_(FMAP)),
            "propensity": pa.array(rng.uniform(0.1, 1.0, n)),
        }
    )
    return table.take(rng.permutation(n))


@pytest.mark.parametrize("run_rows", [1, 7, 500])
def test_streamed_pairs_equal_the_sql_across_batches(steps, tmp_path, run_rows: int) -> None:
    # ~1,200 steps cut into batches of 1, 7 and 500 rows: episodes, and the train → eval
    # boundary, fall across batches and inside them.
    src = write_parts(steps, tmp_path / "steps")
    outputs: dict[Side, Path] = {
        "train": tmp_path / "train.parquet",
        "eval": tmp_path / "eval.parquet",
    }
    settings = DuckSettings(memory_limit="256MB", threads=2)
    written = write_sides(
        src, outputs, eval_fraction=0.3, seed=5, settings=settings, run_rows=run_rows
    )
    with connect(settings) as con:
        want = sql_tables(con, open_steps(con, src)[0], ("train", "eval"), 0.3)
    for side in ("train", "eval"):
        got = pq.read_table(outputs[side])
        assert got.schema == want[side].schema, side
        assert got.to_pylist() == want[side].to_pylist(), side
        assert written[side] == want[side].num_rows > 0


def test_dense_states_map_actions_and_the_alias_equal_the_sql(tmp_path) -> None:
    steps = dense_parametric_steps(np.random.default_rng(3), 40)
    src = tmp_path / "steps.parquet"
    pq.write_table(steps, src)
    settings = DuckSettings(threads=2)
    write_sides(
        src, {"all": tmp_path / "all.parquet"}, eval_fraction=0.0, seed=5, settings=settings,
        run_rows=5,
    )  # fmt: skip
    with connect(settings) as con:
        want = sql_tables(con, open_steps(con, src)[0], ("all",), 0.0)["all"]
    got = pq.read_table(tmp_path / "all.parquet")
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()
    terminal = [r for r in got.to_pylist() if r["time_diff"] == 1 and r["next_action"] == []]
    assert terminal and all(r["next_state"] in (None, [0.0, 0.0, 0.0]) for r in terminal)


def test_in_memory_fixed_size_states_equal_the_sql() -> None:
    # An Arrow table with fixed-size `state` lists (DuckDB's ARRAY type) in memory.
    steps = dense_parametric_steps(np.random.default_rng(4), 30)
    fixed = pa.array(
        [s if s is not None else None for s in steps.column("state").to_pylist()],
        pa.list_(pa.float32(), 3),
    )
    steps = steps.set_column(steps.schema.get_field_index("state"), "state", fixed)
    train, evaluation = build_training_table(steps, eval_fraction=0.4, seed=5)
    with connect(DuckSettings()) as con:
        con.register("steps_arrow", steps)
        con.execute("CREATE VIEW steps AS SELECT * FROM steps_arrow")
        want = sql_tables(con, describe(con, "<steps>"), ("train", "eval"), 0.4)
    assert train.schema.field("next_state").type == pa.list_(pa.float32(), 3)
    for side, got in (("train", train), ("eval", evaluation)):
        assert got.schema == want[side].schema, side
        assert got.to_pylist() == want[side].to_pylist(), side


def test_row_groups_are_full_whatever_the_batches(tmp_path) -> None:
    from benchmarks.bench_timeline import step_log

    big = step_log(np.random.default_rng(1), 0, 2_500)  # ~50k steps
    pq.write_table(big, tmp_path / "steps.parquet")
    write_sides(
        tmp_path / "steps.parquet", {"all": tmp_path / "t.parquet"}, eval_fraction=0.0, seed=0,
        settings=DuckSettings(threads=2), run_rows=5_000,
    )  # fmt: skip
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes[:-1] == [ROW_GROUP_SIZE] * (len(sizes) - 1) and 0 < sizes[-1] <= ROW_GROUP_SIZE
    assert sum(sizes) == big.num_rows


def test_a_gap_beyond_64_bits_is_a_data_error(tmp_path) -> None:
    # Steps 2^63 apart: fine in two episodes (never subtracted), an error within one,
    # naming that episode.
    steps = dense_parametric_steps(np.random.default_rng(5), 3).slice(0, 3)
    far = [-(2**62 + 2**61), 2**62 + 2**61, 2**62 + 2**61]
    steps = steps.set_column(1, "sequence_number", pa.array(far, pa.int64()))
    src, out = tmp_path / "steps.parquet", tmp_path / "t.parquet"
    settings = DuckSettings(threads=1)
    pq.write_table(steps.set_column(0, "mdp_id", pa.array([0, 1, 2])), src)
    write_sides(src, {"all": out}, eval_fraction=0.0, seed=0, settings=settings)
    assert pq.read_table(out).column("time_diff").to_pylist() == [1, 1, 1]
    out.unlink()
    pq.write_table(steps.set_column(0, "mdp_id", pa.array([7, 7, 9])), src)
    with pytest.raises(DataError) as err:
        write_sides(src, {"all": out}, eval_fraction=0.0, seed=0, settings=settings)
    assert str(err.value).startswith(f"{src}: column 'sequence_number': the gap")
    assert f"mdp_id=7, sequence_number={far[0]}" in str(err.value)
    assert not list(tmp_path.glob("*t.parquet*"))  # neither the table nor its temporary file


def test_a_caller_that_stops_early_leaves_no_thread_behind(steps, tmp_path) -> None:
    import threading
    import time

    from reagent_lite.timeline.duck import stream_transitions

    src = write_parts(steps, tmp_path / "steps")
    before = threading.active_count()
    with connect(DuckSettings(threads=2)) as con:
        columns, scan = open_steps(con, src)
        _, stream = stream_transitions(
            con, columns, scan, ["all"], eval_fraction=0.0, seed=0, run_rows=3
        )
        side, batch = next(stream)
        assert side == "all" and 3 <= batch.num_rows < steps.num_rows
        start = time.monotonic()
        stream.close()
        assert time.monotonic() - start < 10
        assert threading.active_count() == before
        assert con.execute("SELECT count(*) FROM steps").fetchall() == [(steps.num_rows,)]


def _set(table: pa.Table, name: str, row: int, value: object) -> pa.Table:
    values = table.column(name).to_pylist()
    values[row] = value
    index = table.schema.get_field_index(name)
    return table.set_column(index, name, pa.array(values, table.schema.field(name).type))


def counted_checks(monkeypatch) -> list[object]:
    """Count the runs of the checks' SQL (`duck.check_values`), which still run."""
    calls: list[object] = []

    def counted(con, columns) -> None:
        calls.append(columns)
        check_values(con, columns)

    monkeypatch.setattr(duck, "check_values", counted)
    return calls


BAD_LOGS = {
    "repeated pair": lambda t: pa.concat_tables([t, t.slice(5, 1)]),
    "null sequence_number": lambda t: _set(t, "sequence_number", 9, None),
    "null reward": lambda t: _set(t, "reward", 9, None),
    "propensity above 1": lambda t: _set(t, "action_probability", 9, 1.5),
}


@pytest.mark.parametrize("run_rows", [1, 7])
@pytest.mark.parametrize("bad", sorted(BAD_LOGS))
def test_the_stream_finds_bad_rows_and_gives_the_checks_message(
    steps, tmp_path, monkeypatch, bad: str, run_rows: int
) -> None:
    # Batches of one row: a repeated pair always falls across two batches.
    src = tmp_path / "steps.parquet"
    pq.write_table(BAD_LOGS[bad](steps), src)
    # The checks' SQL alone gives the message users read.
    with connect(DuckSettings(threads=1)) as con, pytest.raises(DataError) as want:
        check_values(con, open_steps(con, src)[0])
    calls = counted_checks(monkeypatch)
    outputs: dict[Side, Path] = {
        "train": tmp_path / "train.parquet",
        "eval": tmp_path / "eval.parquet",
    }
    with pytest.raises(DataError) as got:
        write_sides(
            src, outputs, eval_fraction=0.3, seed=5, settings=DuckSettings(threads=2),
            run_rows=run_rows,
        )  # fmt: skip
    assert str(got.value) == str(want.value)
    assert len(calls) == 1  # the SQL ran once, after the stream stopped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.parquet"]  # nothing written


def test_a_good_log_is_checked_on_the_stream_alone(steps, tmp_path, monkeypatch) -> None:
    src = tmp_path / "steps.parquet"
    pq.write_table(steps, src)
    calls = counted_checks(monkeypatch)
    settings = DuckSettings(threads=2)
    write_sides(
        src, {"all": tmp_path / "all.parquet"}, eval_fraction=0.0, seed=0, settings=settings
    )
    outputs: dict[Side, Path] = {"train": tmp_path / "t.parquet", "eval": tmp_path / "e.parquet"}
    write_sides(src, outputs, eval_fraction=0.3, seed=0, settings=settings)
    # A run writing one side still sorts and checks every row: no pass of its own either.
    write_sides(
        src, {"eval": tmp_path / "e2.parquet"}, eval_fraction=0.3, seed=0, settings=settings
    )
    assert calls == []
    assert pq.read_table(tmp_path / "e2.parquet").equals(pq.read_table(tmp_path / "e.parquet"))


@pytest.mark.parametrize("written", ["train", "eval"])
def test_a_bad_row_on_the_side_not_written_is_refused(steps, tmp_path, written: Side) -> None:
    from reagent_lite.timeline import episode_hash

    # A bad propensity in an episode of the other side than the one written.
    threshold = 0.3 * 2**64
    other_side = [
        i for i, m in enumerate(steps.column("mdp_id").to_pylist())
        if (episode_hash(m, 0) < threshold) == (written == "train")
    ]  # fmt: skip
    src = tmp_path / "steps.parquet"
    pq.write_table(_set(steps, "action_probability", other_side[0], 1.5), src)
    with pytest.raises(DataError, match=r"column 'action_probability': 1 rows outside \(0, 1\]"):
        write_sides(
            src, {written: tmp_path / "out.parquet"}, eval_fraction=0.3, seed=0,
            settings=DuckSettings(threads=2),
        )  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.parquet"]


@pytest.mark.parametrize("outputs", [("all",), ("train",), ("eval",), ("train", "eval")])
def test_a_nan_propensity_is_refused(steps, tmp_path, outputs) -> None:
    # NaN is outside (0, 1], whichever sides are written: the stream checks every row when
    # it holds them all, and the checks' SQL (which runs beforehand for one side) says NaN
    # explicitly — its comparison alone can be answered from the Parquet statistics, which
    # leave NaN out.
    src = tmp_path / "steps.parquet"
    bad = _set(steps, "action_probability", 9, float("nan"))
    pq.write_table(bad, src)
    row = bad.slice(9, 1).to_pylist()[0]
    with pytest.raises(DataError) as got:
        write_sides(
            src, {side: tmp_path / f"{side}.parquet" for side in outputs}, eval_fraction=0.5,
            seed=0, settings=DuckSettings(threads=2), run_rows=7,
        )  # fmt: skip
    message = str(got.value)
    assert message.startswith(f"{src}: ") and "column 'action_probability'" in message
    assert "outside (0, 1]" in message
    assert f"mdp_id={row['mdp_id']}, sequence_number={row['sequence_number']}" in message
    assert "value=nan" in message.lower()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.parquet"]


@pytest.mark.parametrize("memory_limit", ["1GB", "4MB"])
def test_null_maps_and_lists_of_the_next_step_stay_null(steps, tmp_path, memory_limit) -> None:
    # A step whose state_features or possible_actions is null: the step before it has a
    # null next value (LEAD of a null), not an empty one; terminal rows stay empty.
    logs = _set(steps, "state_features", 10, None)
    logs = _set(logs, "possible_actions", 20, None)
    logs = _set(logs, "possible_actions", 30, None)
    src = write_parts(logs, tmp_path / "steps")
    out = tmp_path / "all.parquet"
    settings = DuckSettings(memory_limit=memory_limit, threads=2)
    write_sides(src, {"all": out}, eval_fraction=0.0, seed=5, settings=settings, run_rows=7)
    with connect(DuckSettings(threads=2)) as con:  # the SQL's window needs more than 4MB
        want = sql_tables(con, open_steps(con, src)[0], ("all",), 0.0)["all"]
    got = pq.read_table(out)
    assert got.to_pylist() == want.to_pylist()
    rows = got.to_pylist()
    assert sum(r["next_state_features"] is None for r in rows) >= 1
    assert sum(r["possible_next_actions"] is None for r in rows) >= 1
    assert any(r["possible_next_actions"] == [] for r in rows)  # terminal rows
