"""Tensorization against hand-built expectations; batch helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from reagent_lite.data.batches import DiscreteTransitions, ParametricTransitions
from reagent_lite.data.readers import read_table
from reagent_lite.data.tensorize import (
    collect_feature_ids,
    sparse_to_dense,
    tensorize_discrete,
    tensorize_parametric,
)
from reagent_lite.data.validate import validate
from reagent_lite.errors import DataError
from tests.data.test_validate import ACTIONS, dqn_rows, dqn_table, parametric_table

IDS = ["0", "1", "2"]


def _maps(rows: list[dict[Any, float] | None], key: pa.DataType | None = None) -> pa.Array:
    return pa.array(rows, type=pa.map_(key or pa.string(), pa.float64()))


def test_sparse_to_dense_missing_and_unknown_features() -> None:
    col = _maps([{"0": 1.5, "2": -2.0}, {}, None, {"1": 3.0, "99": 7.0}])
    values, presence = sparse_to_dense(col, IDS)
    assert values.dtype == np.float32 and values.shape == (4, 3)
    np.testing.assert_array_equal(values, [[1.5, 0, -2], [0, 0, 0], [0, 0, 0], [0, 3, 0]])
    np.testing.assert_array_equal(presence, [[1, 0, 1], [0, 0, 0], [0, 0, 0], [0, 1, 0]])


def test_sparse_to_dense_int_keys_and_order_of_ids() -> None:
    col = _maps([{0: 1.0, 2: 2.0}, {1: 3.0}], key=pa.int64())
    values, presence = sparse_to_dense(col, ["2", "0"])  # column order follows feature_ids
    np.testing.assert_array_equal(values, [[2, 1], [0, 0]])
    np.testing.assert_array_equal(presence, [[1, 1], [0, 0]])


def test_sparse_to_dense_chunked_and_sliced() -> None:
    full = _maps([{"0": float(i), "1": -float(i)} if i % 2 else {"2": float(i)} for i in range(10)])
    col = pa.chunked_array([full.slice(0, 3), full.slice(3, 4), full.slice(7)])
    values, presence = sparse_to_dense(col, IDS)
    ref_v, ref_p = sparse_to_dense(full, IDS)
    np.testing.assert_array_equal(values, ref_v)
    np.testing.assert_array_equal(presence, ref_p)
    assert values[7].tolist() == [7, -7, 0] and values[4].tolist() == [0, 0, 4]


def test_dictionary_keys_from_parquet(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"f": _maps([{"0": 1.0}, {"2": 2.0, "1": 1.0}] * 50)}), path, row_group_size=30
    )
    t = read_table(path)
    assert pa.types.is_dictionary(t.schema.field("f").type.key_type)  # fast path in use
    values, presence = sparse_to_dense(t["f"], IDS)
    assert values[:2].tolist() == [[1, 0, 0], [0, 1, 2]] and presence.sum() == 150
    assert collect_feature_ids(t, "f") == IDS


def test_dense_list_columns() -> None:
    col = pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    values, presence = sparse_to_dense(col, ["0", "2"])
    np.testing.assert_array_equal(values, [[1, 3], [4, 6]])
    assert presence.tolist() == [[1, 1], [1, 1]]


def test_collect_feature_ids_sorts_numerically() -> None:
    t = pa.table(
        {
            "a": _maps([{"10": 1.0, "2": 1.0}, {"1": 0.0}]),
            "b": pa.array([[{"3": 1.0}], []], type=pa.list_(pa.map_(pa.string(), pa.float64()))),
        }
    )
    assert collect_feature_ids(t, "a") == ["1", "2", "10"]
    assert collect_feature_ids(t, ["a", "b"]) == ["1", "2", "3", "10"]
    assert collect_feature_ids(pa.table({"s": pa.array([[1.0, 2.0]])}), "s") == ["0", "1"]


def test_tensorize_discrete() -> None:
    rows = dqn_rows(6)
    rows[4]["time_diff"] = 3
    b = tensorize_discrete(dqn_table(rows), IDS, ACTIONS)
    assert len(b) == 6 and isinstance(b, DiscreteTransitions)
    # row 1: {"0": 1, "2": .5}; row 0: {"1": -1}
    assert b.state[1].tolist() == [1.0, 0.0, 0.5] and b.state_presence[0].tolist() == [0, 1, 0]
    assert b.next_state[0].tolist() == [1.0, 0, 0] and b.next_state_presence[2].sum() == 0
    assert b.action.tolist() == [0, 1, 0, 1, 0, 1] and b.action.dtype == torch.int64
    assert b.next_action.tolist() == [1, 0, -1, 0, 1, -1]
    assert b.terminal.tolist() == [0, 0, 1, 0, 0, 1]
    assert b.possible_actions_mask.tolist() == [[1, 1]] * 6
    assert b.possible_next_actions_mask.tolist()[:3] == [[0, 1], [0, 1], [0, 0]]
    assert b.reward.tolist() == [0, 0.5, 1, 1.5, 2, 2.5]
    assert b.propensity.tolist() == [0.5] * 6
    assert b.mdp_id.tolist() == [0, 0, 0, 1, 1, 1]
    assert b.sequence_number.tolist() == [0, 1, 2, 0, 1, 2]
    # ReAgent semantics: the time_diff column counts only with use_seq_num_diff_as_time_diff.
    assert b.time_diff.tolist() == [1] * 6
    b2 = tensorize_discrete(dqn_table(rows), IDS, ACTIONS, use_seq_num_diff_as_time_diff=True)
    assert b2.time_diff.tolist() == [1, 1, 1, 1, 3, 1]
    for name, t in b.fields().items():
        assert t.dtype in (torch.float32, torch.int64), name


def test_tensorize_discrete_masks_and_explicit_terminal() -> None:
    t = dqn_table()
    mask_type = pa.list_(pa.int8())
    pa_masks = pa.array([[1, 0], [0, 1], [1, 1], [1, 1], [0, 1], [1, 0]], mask_type)
    pna_masks = pa.array([[1, 1], [0, 0], [], [1, 1], [1, 1], [1, 1]], mask_type)
    t = t.set_column(t.column_names.index("possible_actions"), "possible_actions", pa_masks)
    t = t.set_column(
        t.column_names.index("possible_next_actions"), "possible_next_actions", pna_masks
    )
    t = t.append_column("terminal", pa.array([False, False, False, False, True, None]))
    b = tensorize_discrete(t, IDS, ACTIONS)
    assert b.possible_actions_mask[:2].tolist() == [[1, 0], [0, 1]]
    assert b.possible_next_actions_mask[2].tolist() == [0, 0]
    assert b.terminal.tolist() == [0, 1, 1, 0, 1, 0]  # all-zero/empty mask, or explicit flag


def test_tensorize_discrete_unknown_action() -> None:
    rows = dqn_rows()
    rows[0]["action"] = "jump"
    with pytest.raises(DataError, match="column 'action': 1 rows"):
        tensorize_discrete(dqn_table(rows), IDS, ACTIONS)


def test_tensorize_discrete_dense_state() -> None:
    t = dqn_table().drop_columns(["state_features", "next_state_features"])
    t = t.append_column("state", pa.array([[float(i), 1.0] for i in range(6)]))
    t = t.append_column("next_state", pa.array([[float(i + 1), 1.0] for i in range(6)]))
    b = tensorize_discrete(t, ["0", "1"], ACTIONS)
    assert b.state[3].tolist() == [3.0, 1.0] and b.state_presence.sum() == 12
    assert b.next_state[5].tolist() == [6.0, 1.0]


def test_tensorize_parametric() -> None:
    # parametric_table: 4 rows; candidates alternate between 2 and 3; last row terminal.
    b = tensorize_parametric(parametric_table(), ["0"], ["10", "11"])
    assert isinstance(b, ParametricTransitions) and len(b) == 4
    assert b.possible_actions.shape == (4, 3, 2)  # K = the most candidates in the table
    assert b.possible_actions_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]]
    assert b.possible_actions[1].tolist() == [[1, 0], [0, 1], [0.5, 0]]
    assert b.possible_actions_presence[1].tolist() == [[1, 1], [1, 1], [1, 0]]
    assert b.possible_actions[0, 2].tolist() == [0, 0]  # padding
    # logged action = candidate i % len(cands): rows 0..3 → 0, 1, 0, 0
    assert b.action_index.tolist() == [0, 1, 0, 0]
    assert b.action[1].tolist() == [0, 1] and b.action_presence[1].tolist() == [1, 1]
    assert b.terminal.tolist() == [0, 0, 0, 1]
    assert b.possible_next_actions_mask[3].sum() == 0
    assert b.next_action_presence[3].sum() == 0 and b.next_action[0].tolist() == [1, 0]
    assert b.mdp_id.tolist() == [0, 0, 0, 0]


def test_tensorize_parametric_action_not_among_candidates_and_padding() -> None:
    from tests.data.test_validate import parametric_rows

    rows = parametric_rows()
    rows[0]["action"] = {"10": 1.0}  # presence differs from candidate {"10": 1, "11": 0}
    b = tensorize_parametric(parametric_table(rows), ["0"], ["10", "11"], max_candidates=5)
    assert b.action_index.tolist() == [-1, 1, 0, 0]
    assert b.possible_actions.shape == (4, 5, 2) and b.possible_next_actions_mask.shape == (4, 5)
    with pytest.raises(DataError, match="max_candidates=2"):
        tensorize_parametric(parametric_table(rows), ["0"], ["10", "11"], max_candidates=2)


def test_batch_helpers() -> None:
    b = tensorize_discrete(dqn_table(), IDS, ACTIONS)
    idx = torch.tensor([4, 0])
    sub = b.index(idx)
    assert isinstance(sub, DiscreteTransitions) and len(sub) == 2
    assert sub.reward.tolist() == [2.0, 0.0] and sub.state.shape == (2, 3)
    assert b.to("cpu").fields().keys() == b.fields().keys()
    assert DiscreteTransitions.field_names()[0] == "state"
    both = DiscreteTransitions.concat([sub, sub])
    assert len(both) == 4 and both.nbytes() == 2 * sub.nbytes()
    with pytest.raises(ValueError, match="differ in length"):
        DiscreteTransitions(**{**b.fields(), "reward": torch.zeros(2)})


def test_parametric_from_jsonl_with_null_columns(tmp_path: Path) -> None:
    import json

    from tests.data.test_validate import parametric_rows

    rows = parametric_rows(2)
    for r in rows:  # every row terminal: JSON gives null / empty-list columns
        r["next_action"] = None
        r["possible_next_actions"] = []
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = read_table(path)
    b = tensorize_parametric(t, ["0"], ["10", "11"])
    assert b.terminal.tolist() == [1, 1] and b.next_action_presence.sum() == 0
    assert b.action_index.tolist() == [0, 1]


def test_action_name_lists_after_a_null_list_that_owns_names() -> None:
    """A null possible_actions slot that owns names in Arrow (no action possible) leaves
    the rows after it in place: validation passes and the mask has the right rows."""
    names = pa.array(["left", "right", "left", "right"])
    lists = pa.ListArray.from_arrays(
        pa.array([0, 2, 3, 4], pa.int32()), names, mask=pa.array([True, False, False])
    )
    rows = dqn_rows(3)
    table = dqn_table(rows)
    table = table.set_column(
        table.schema.get_field_index("possible_actions"), "possible_actions", lists
    )
    validated, _ = validate(table, "dqn", actions=ACTIONS, source="t")
    out = tensorize_discrete(validated, collect_feature_ids(validated, "state_features"), ACTIONS)
    assert out.possible_actions_mask.tolist() == [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
