"""Horizon's conventions on the local engine's plan and in the SQL: absorbing steps end
their episode and give no transition; `--null-propensity one` reads a null as 1.0. The
local engine writes what `transitions_sql` gives executed as written, however the sorted
steps are cut into runs (an absorbing step is often the first or last row of one); bad uses are refused with the checks'
message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.errors import DataError
from reagent_lite.timeline import DuckSettings, build_training_table
from reagent_lite.timeline.duck import (
    DuckDialect,
    check_values,
    connect,
    open_steps,
    write_sides,
)
from reagent_lite.timeline.query import Side, transitions_sql
from tests.conftest import run_module
from tests.timeline.conftest import write_parts

FMAP = pa.map_(pa.string(), pa.float64())


def with_absorbing_ends(steps: pa.Table, *, parametric: bool = False) -> pa.Table:
    """Every third episode gets an absorbing step after its last one (null action, no
    possible actions, reward 0, null propensity), and every fifth row a null propensity."""
    rows = steps.to_pylist()
    last: dict[str, dict] = {}
    for r in rows:
        if r["mdp_id"] not in last or r["sequence_number"] > last[r["mdp_id"]]["sequence_number"]:
            last[r["mdp_id"]] = r
    for k, (_, r) in enumerate(sorted(last.items())):
        if k % 3 == 0:
            end = {**r, "sequence_number": r["sequence_number"] + 2, "action": None}
            end.update(reward=0.0, possible_actions=[], action_probability=None)
            rows.append(end)
    for k, r in enumerate(rows):
        if k % 5 == 0:
            r["action_probability"] = None
    table = pa.Table.from_pylist(rows, steps.schema)
    if parametric:  # actions as feature maps, candidates as lists of maps

        def as_map(a: str | None) -> list[tuple[str, float]] | None:
            return None if a is None else [("100", float(len(a))), ("101", 1.0)]

        actions = pa.array([as_map(a) for a in table.column("action").to_pylist()], FMAP)
        candidates = pa.array(
            [[as_map(a) for a in c] for c in table.column("possible_actions").to_pylist()],
            pa.list_(FMAP),
        )
        table = table.set_column(table.schema.get_field_index("action"), "action", actions)
        index = table.schema.get_field_index("possible_actions")
        table = table.set_column(index, "possible_actions", candidates)
    return table.take(np.random.default_rng(3).permutation(table.num_rows))


@pytest.mark.parametrize("parametric", [False, True])
@pytest.mark.parametrize("run_rows", [1, 7, 500])
def test_absorbing_ends_and_null_propensities_equal_the_sql(
    steps, tmp_path, parametric: bool, run_rows: int
) -> None:
    log = with_absorbing_ends(steps, parametric=parametric)
    src = write_parts(log, tmp_path / "steps")
    outputs: dict[Side, Path] = {"train": tmp_path / "t.parquet", "eval": tmp_path / "e.parquet"}
    settings = DuckSettings(memory_limit="256MB", threads=1)
    write_sides(
        src, outputs, eval_fraction=0.3, seed=5, settings=settings, run_rows=run_rows,
        null_propensity="one",
    )  # fmt: skip
    with connect(settings) as con:
        columns = open_steps(con, src, null_propensity="one")[0]
        want = {
            side: con.sql(
                transitions_sql(columns, DuckDialect(), side=side, eval_fraction=0.3, seed=5)
            ).to_arrow_table()
            for side in ("train", "eval")
        }
    got = {side: pq.read_table(outputs[side]) for side in ("train", "eval")}
    for side in ("train", "eval"):
        assert got[side].schema == want[side].schema, side
        assert got[side].to_pylist() == want[side].to_pylist(), side
    written = pa.concat_tables([got["train"], got["eval"]])
    absorbing = log.filter(pa.compute.is_null(log.column("action")))
    assert written.num_rows == log.num_rows - absorbing.num_rows > 0
    assert written.column("action").null_count == 0
    assert written.column("action_probability").null_count == 0
    assert 1.0 in written.column("action_probability").to_pylist()
    # The step before each absorbing step took its state and is terminal.
    by_key = {(r["mdp_id"], r["sequence_number"]): r for r in written.to_pylist()}
    for end in absorbing.to_pylist():
        before = by_key[(end["mdp_id"], end["sequence_number"] - 2)]
        assert before["next_state_features"] == end["state_features"]
        assert before["possible_next_actions"] == [] and before["time_diff"] == 2
        assert before["next_action"] == ([] if parametric else None)


def test_the_in_memory_api_takes_the_same_choice(steps) -> None:
    log = with_absorbing_ends(steps)
    with pytest.raises(DataError, match=r"'action_probability': \d+ rows are null"):
        build_training_table(log)
    train, evaluation = build_training_table(log, null_propensity="one")
    ends = log.column("action").null_count
    assert ends > 0 and train.num_rows + evaluation.num_rows == log.num_rows - ends


def run_cli(src: Path, tmp_path: Path, *flags: str) -> tuple[int, str]:
    result = run_module(
        "workflows.timeline", "--input", str(src), "--output", str(tmp_path / "t.parquet"),
        "--threads", "1", *flags, timeout=120,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def test_an_absorbing_step_before_the_end_of_its_episode_exits_3(steps, tmp_path) -> None:
    log = with_absorbing_ends(steps).to_pylist()
    end = next(r for r in log if r["action"] is None)
    log.append({**end, "sequence_number": end["sequence_number"] + 1, "action": "up"})
    log[-1].update(possible_actions=["up"], reward=1.0, action_probability=0.5)
    src = tmp_path / "s.parquet"
    pq.write_table(pa.Table.from_pylist(log, steps.schema), src)
    rc, text = run_cli(src, tmp_path, "--null-propensity", "one")
    assert rc == 3 and "Traceback" not in text, text
    assert "columns 'action', 'possible_actions': 1 absorbing steps" in text
    assert f"mdp_id={end['mdp_id']}, sequence_number={end['sequence_number']}" in text
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("engine_sql", [False, True])
def test_a_null_action_that_is_not_absorbing_is_still_a_bad_row(
    steps, tmp_path, engine_sql: bool
) -> None:
    log = steps.to_pylist()
    log[4]["action"] = None  # possible actions and a reward: a step whose action is lost
    log[9].update(action=None, possible_actions=None, reward=0.0)  # no list: not absorbing
    src = tmp_path / "s.parquet"
    pq.write_table(pa.Table.from_pylist(log, steps.schema), src)
    if not engine_sql:
        rc, text = run_cli(src, tmp_path, "--null-propensity", "one")
        assert rc == 3 and "column 'action': 2 rows are null" in text, text
        return
    # The SQL alone (as Spark runs it) neither passes nor drops them.
    with connect(DuckSettings(threads=1)) as con:
        columns = open_steps(con, src, null_propensity="one")[0]
        with pytest.raises(DataError, match="column 'action': 2 rows are null"):
            check_values(con, columns)
        table = con.sql(transitions_sql(columns, DuckDialect())).to_arrow_table()
    assert table.num_rows == len(log) and table.column("action").null_count == 2
