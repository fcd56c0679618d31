"""What `predict` checks and reads of a table to score (scoring itself: tests/workflows)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from reagent_lite.errors import DataError
from reagent_lite.predict import check_scored, state_matrix
from tests.data.test_validate import FMAP, dqn_rows, dqn_table, parametric_rows, parametric_table


def test_scored_columns_pass_the_training_rules() -> None:
    """The training rules for the columns scoring reads: a NaN would become a silent NaN
    score, so it is an error naming the file, the column and the rows."""
    rows = dqn_rows()
    assert check_scored(dqn_table(rows), "dqn", "s.parquet") == "state_features"
    rows[2]["state_features"] = {"0": math.nan, "1": 1.0}
    rows[3]["state_features"] = [("1", 1.0), ("1", 2.0)]
    with pytest.raises(DataError) as exc:
        check_scored(dqn_table(rows), "dqn", "s.parquet")
    msg = str(exc.value)
    assert "s.parquet: column 'state_features': 1 bad row: null, NaN" in msg
    assert "row 2" in msg and "row 3" in msg and "twice" in msg

    dense = pa.table({"state": pa.array([[1.0, 2.0], [math.inf, 0.0], [1.0, 2.0]])})
    with pytest.raises(DataError, match=r"column 'state': 1 bad row: .*NaN or infinite.*row 1"):
        check_scored(dense, "dqn", "s")
    prm = parametric_rows()
    prm[1]["possible_actions"] = [{"10": 1.0}, {"10": math.nan}]
    with pytest.raises(DataError, match=r"'possible_actions': 1 bad row.*row 1"):
        check_scored(parametric_table(prm), "parametric_dqn", "s")


def test_scored_tables_need_only_the_columns_scoring_reads() -> None:
    state = dqn_table().select(["state_features"])
    assert check_scored(state, "dqn", "s") == "state_features"
    cands = parametric_table().select(["state_features", "possible_actions"])
    assert check_scored(cands, "parametric_dqn", "s") == "state_features"
    assert check_scored(state.slice(0, 0), "dqn", "s") == "state_features"  # no rows: fine
    check_scored(pa.table({"state": pa.nulls(3)}), "dqn", "s")  # JSON Lines, null throughout
    with pytest.raises(DataError, match=r"s: missing required column.*'state_features' or 'state'"):
        check_scored(pa.table({"x": [1]}), "dqn", "s")
    with pytest.raises(DataError, match=r"missing required column.*'possible_actions'"):
        check_scored(state, "parametric_dqn", "s")
    # Each column's own type: candidates are lists of maps, a state is not.
    with pytest.raises(DataError, match=r"column 'state': expected a list of numbers .*string"):
        check_scored(pa.table({"state": pa.array(["a", "b"])}), "dqn", "s")
    with pytest.raises(DataError, match="'possible_actions': expected a list of candidate maps"):
        check_scored(
            pa.table({"state": pa.array([[1.0]]), "possible_actions": pa.array([[1.0]])}),
            "parametric_dqn",
            "s",
        )
    candidates_as_state = pa.table({"state_features": cands.column("possible_actions")})
    with pytest.raises(DataError, match="'state_features': expected a map of feature id → num"):
        check_scored(candidates_as_state, "dqn", "s")


def test_state_in_the_models_order() -> None:
    ids = ["2", "0"]
    table = pa.table({"state_features": pa.array([{"0": 1.0, "2": 2.0}, {"5": 1.0}], FMAP)})
    got = state_matrix(table, "state_features", ids, "s")
    np.testing.assert_array_equal(got, [[2.0, 1.0], [np.nan, np.nan]])
    with pytest.raises(DataError, match="no row holds any of the model's state features"):
        state_matrix(table.slice(1), "state_features", ids, "s")
    dense = pa.table({"state": pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])})
    np.testing.assert_array_equal(state_matrix(dense, "state", ids, "s"), [[3, 1], [6, 4]])
    with pytest.raises(DataError, match="s: column 'state': dense feature lists of 2 values"):
        state_matrix(pa.table({"state": pa.array([[1.0, 2.0]])}), "state", ids, "s")


def test_best_action_is_the_best_of_the_rows_candidates() -> None:
    """`best_action` is the served policy CPE evaluates: the best of the row's
    `possible_actions` (names or 0/1 masks), ties to the first, null for a row without a
    candidate; the best of all actions only for a table without the column."""
    import torch

    from reagent_lite.kinds import DiscreteSpace, get_kind

    space = DiscreteSpace(state_ids=["0"], actions=["a", "b", "c"])
    q = torch.tensor([[3.0, 2.0, 1.0], [3.0, 2.0, 2.0], [1.0, 5.0, 0.0], [0.0, 1.0, 9.0]])

    def program(values: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
        return q[values[:, 0].long()]

    state = (torch.arange(4.0).unsqueeze(1), torch.ones(4, 1))
    kind = get_kind("dqn")
    base = pa.table({"state": pa.array([[float(i)] for i in range(4)])})

    def best(candidates: pa.Array | None) -> list[str | None]:
        table = base if candidates is None else base.append_column("possible_actions", candidates)
        scored = kind.score_rows(program, table, state, space, 2, "s")
        return scored.column("best_action").to_pylist()

    assert best(None) == ["a", "a", "b", "c"]
    names = pa.array([["b", "c"], ["c", "b"], ["a", "c"], []])
    assert best(names) == ["b", "b", "a", None]  # row 1: b and c tie, b comes first
    assert best(pa.array([[0, 1, 1], [0, 1, 1], [1, 0, 1], [0, 0, 0]])) == ["b", "b", "a", None]
    with pytest.raises(DataError, match=r"s: column 'possible_actions'.*unknown action name"):
        best(pa.array([["b", "z"], ["a"], ["a"], ["a"]]))
