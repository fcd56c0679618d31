"""Step logs → training table: pairing, gaps, terminal rows, split, errors, the CLI."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.data.timeline import build_training_table, episode_hash, write_table
from reagent_lite.errors import DataError
from tests.conftest import run_module

FMAP = pa.map_(pa.string(), pa.float64())


def discrete_steps() -> pa.Table:
    # Two episodes, rows shuffled; episode "a" has a gap (sequence numbers 0, 1, 3).
    return pa.table(
        {
            "mdp_id": ["b", "a", "a", "a", "b"],
            "sequence_number": [0, 3, 0, 1, 2],
            "state_features": pa.array(
                [{"0": 10.0}, {"0": 4.0}, {"0": 1.0}, {"0": 2.0}, {"0": 11.0, "1": 1.0}], FMAP
            ),
            "action": ["L", "R", "R", "L", "L"],
            "reward": [0.5, 4.0, 1.0, 2.0, 0.7],
            "possible_actions": [["L", "R"], ["L", "R"], ["L", "R"], ["L"], ["L", "R"]],
            "action_probability": [0.5, 0.5, 0.5, 1.0, 0.5],
        }
    )


def rows(table: pa.Table) -> dict[tuple[str, int], dict]:
    return {(r["mdp_id"], r["sequence_number"]): r for r in table.to_pylist()}


def test_pairs_consecutive_steps_with_gaps_and_terminal_rows() -> None:
    train, evaluation = build_training_table(discrete_steps(), eval_fraction=0.0)
    assert evaluation.num_rows == 0
    assert train.column("mdp_id").to_pylist() == ["a", "a", "a", "b", "b"]
    assert train.column("sequence_number").to_pylist() == [0, 1, 3, 0, 2]
    r = rows(train)
    assert r[("a", 0)]["next_state_features"] == [("0", 2.0)]
    assert r[("a", 0)]["next_action"] == "L"
    assert r[("a", 0)]["possible_next_actions"] == ["L"]
    assert r[("a", 0)]["time_diff"] == 1
    assert r[("a", 1)]["next_state_features"] == [("0", 4.0)]
    assert r[("a", 1)]["time_diff"] == 2  # sequence numbers 1 → 3
    assert r[("b", 0)]["next_state_features"] == [("0", 11.0), ("1", 1.0)]
    assert r[("b", 0)]["time_diff"] == 2
    for terminal in (("a", 3), ("b", 2)):
        assert r[terminal]["next_action"] is None
        assert r[terminal]["possible_next_actions"] == []
        assert r[terminal]["next_state_features"] == []
        assert r[terminal]["time_diff"] == 1
    # The per-step columns are carried over unchanged.
    assert r[("a", 3)]["reward"] == 4.0 and r[("a", 3)]["action"] == "R"
    assert train.schema.field("next_state_features").type == FMAP
    assert train.column_names[:4] == ["mdp_id", "sequence_number", "state_features", "action"]


def test_parametric_actions_give_empty_map_when_terminal() -> None:
    one_hot = [{"100": 1.0, "101": 0.0}, {"100": 0.0, "101": 1.0}]
    steps = pa.table(
        {
            "mdp_id": pa.array([7, 7, 8], pa.int64()),
            "sequence_number": [0, 1, 0],
            "state_features": pa.array([{"0": 1.0}, {"0": 2.0}, {"0": 3.0}], FMAP),
            "action": pa.array([one_hot[1], one_hot[0], one_hot[0]], FMAP),
            "reward": [1.0, 1.0, 1.0],
            "possible_actions": pa.array([one_hot] * 3, pa.list_(FMAP)),
            "propensity": [0.5, 0.5, 0.5],  # the alias is accepted and renamed
            "metrics": pa.array([{"m": 1.0}] * 3, FMAP),
        }
    )
    train, _ = build_training_table(steps, eval_fraction=0.0)
    r = {(x["mdp_id"], x["sequence_number"]): x for x in train.to_pylist()}
    assert r[(7, 0)]["next_action"] == [("100", 1.0), ("101", 0.0)]
    assert len(r[(7, 0)]["possible_next_actions"]) == 2
    assert r[(7, 1)]["next_action"] == []
    assert r[(8, 0)]["possible_next_actions"] == []
    assert train.schema.field("next_action").type == FMAP
    assert "action_probability" in train.column_names
    assert "metrics" in train.column_names


def test_dense_state_lists_get_zero_next_state_when_terminal() -> None:
    steps = pa.table(
        {
            "mdp_id": ["x", "x"],
            "sequence_number": [0, 1],
            "state": [[1.0, 2.0], [3.0, 4.0]],
            "action": ["0", "1"],
            "reward": [1.0, 0.0],
            "possible_actions": [["0", "1"], ["0", "1"]],
            "action_probability": [0.5, 0.5],
        }
    )
    train, _ = build_training_table(steps, eval_fraction=0.0)
    assert train.column("next_state").to_pylist() == [[3.0, 4.0], [0.0, 0.0]]


def many_episodes(n_episodes: int = 400, length: int = 3) -> pa.Table:
    n = n_episodes * length
    return pa.table(
        {
            "mdp_id": np.repeat(np.arange(n_episodes), length).astype(str),
            "sequence_number": np.tile(np.arange(length), n_episodes),
            "state_features": pa.array([{"0": float(i)} for i in range(n)], FMAP),
            "action": ["0"] * n,
            "reward": np.ones(n),
            "possible_actions": [["0", "1"]] * n,
            "action_probability": np.full(n, 0.5),
        }
    )


def test_split_is_deterministic_disjoint_and_by_episode() -> None:
    steps = many_episodes()
    train, evaluation = build_training_table(steps, eval_fraction=0.25, seed=3)
    train_ids = set(train.column("mdp_id").to_pylist())
    eval_ids = set(evaluation.column("mdp_id").to_pylist())
    assert not train_ids & eval_ids
    assert len(train_ids | eval_ids) == 400
    assert train.num_rows + evaluation.num_rows == steps.num_rows
    assert 0.15 < len(eval_ids) / 400 < 0.35
    # Same answer whatever the row order of the input, and on every call.
    shuffled = steps.take(np.random.default_rng(0).permutation(steps.num_rows))
    train2, eval2 = build_training_table(shuffled, eval_fraction=0.25, seed=3)
    assert train2.equals(train) and eval2.equals(evaluation)
    # The hash is stable across processes (no salted hash()): a fixed known value.
    assert episode_hash("abc", 0) == episode_hash("abc", 0) != episode_hash("abc", 1)
    assert episode_hash(12) == episode_hash("12")
    # Another seed gives another split.
    _, eval3 = build_training_table(steps, eval_fraction=0.25, seed=4)
    assert set(eval3.column("mdp_id").to_pylist()) != eval_ids


def test_large_input_is_fast() -> None:
    import time

    steps = many_episodes(20_000, 5)  # 100k rows
    start = time.perf_counter()
    train, evaluation = build_training_table(steps)
    assert time.perf_counter() - start < 10.0
    assert train.num_rows + evaluation.num_rows == 100_000


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.drop_columns(["reward"]), "'reward'"),
        (lambda t: t.drop_columns(["action_probability"]), "action_probability"),
        (lambda t: t.drop_columns(["state_features"]), "state_features"),
        (
            lambda t: t.set_column(6, "action_probability", pa.array([0.5, 0.0, 1.5, 1.0, 0.5])),
            "2 rows outside (0, 1]",
        ),
        (
            lambda t: t.set_column(1, "sequence_number", pa.array([0, 1, 0, 1, 2])),
            "1 rows repeat",
        ),
        (
            lambda t: t.set_column(0, "mdp_id", pa.array(["b", None, "a", "a", "b"])),
            "'mdp_id': 1 rows are null",
        ),
        (
            lambda t: t.set_column(1, "sequence_number", pa.array(["0", "3", "0", "1", "2"])),
            "expected an integer",
        ),
    ],
)
def test_bad_input_raises_data_error(change, message: str) -> None:
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace("]", r"\]")) as info:
        build_training_table(change(discrete_steps()), source="logs.parquet")
    assert "logs.parquet" in str(info.value)


def test_cli_writes_train_and_eval(tmp_path) -> None:
    write_table(many_episodes(200), tmp_path / "steps.parquet")
    result = run_module(
        "workflows.timeline",
        "--input",
        str(tmp_path / "steps.parquet"),
        "--output",
        str(tmp_path / "train.parquet"),
        "--eval-output",
        str(tmp_path / "eval.parquet"),
        "--eval-fraction",
        "0.2",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    train = pq.read_table(tmp_path / "train.parquet")
    evaluation = pq.read_table(tmp_path / "eval.parquet")
    assert train.num_rows + evaluation.num_rows == 600
    assert evaluation.num_rows > 0
    assert "time_diff" in train.column_names


def test_cli_bad_input_exits_3_without_traceback(tmp_path) -> None:
    write_table(discrete_steps().drop_columns(["action"]), tmp_path / "steps.parquet")
    result = run_module(
        "workflows.timeline",
        "--input",
        str(tmp_path / "steps.parquet"),
        "--output",
        str(tmp_path / "train.parquet"),
        timeout=60,
    )
    assert result.returncode == 3
    assert "'action'" in result.stderr and "steps.parquet" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "train.parquet").exists()

    missing = run_module(
        "workflows.timeline", "--input", str(tmp_path / "nope"), "--output", "x", timeout=60
    )
    assert missing.returncode == 3 and "Traceback" not in missing.stderr
