"""The tensorizer (`data/scatter.py`) and the builders' fields against hand-built
expectations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.data.discrete_shard import DiscreteShardBuilder
from reagent_lite.data.ingest import ingest, ingest_table
from reagent_lite.data.readers import read_table
from reagent_lite.data.scatter import (
    actions_mask,
    candidate_tensor,
    feature_matrix,
    match_index,
)
from reagent_lite.errors import DataError
from tests.data.oracle import dqn_layout, parametric_layout
from tests.data.test_validate import (
    ACTIONS,
    dqn_rows,
    dqn_table,
    parametric_rows,
    parametric_table,
)

IDS = ["0", "1", "2"]
NAN = np.nan


def _maps(rows: list[dict[Any, float] | None], key: pa.DataType | None = None) -> pa.Array:
    return pa.array(rows, type=pa.map_(key or pa.string(), pa.float64()))


def test_feature_matrix_missing_and_unknown_features() -> None:
    col = _maps([{"0": 1.5, "2": -2.0}, {}, None, {"1": 3.0, "99": 7.0}])
    values = feature_matrix(col, IDS)
    assert values.dtype == np.float32 and values.shape == (4, 3)
    np.testing.assert_array_equal(
        values, [[1.5, NAN, -2], [NAN, NAN, NAN], [NAN, NAN, NAN], [NAN, 3, NAN]]
    )


def test_feature_matrix_int_keys_and_order_of_ids() -> None:
    col = _maps([{0: 1.0, 2: 2.0}, {1: 3.0}], key=pa.int64())
    values = feature_matrix(col, ["2", "0"])  # column order follows feature_ids
    np.testing.assert_array_equal(values, [[2, 1], [NAN, NAN]])


def test_feature_matrix_chunked_and_sliced() -> None:
    full = _maps([{"0": float(i), "1": -float(i)} if i % 2 else {"2": float(i)} for i in range(10)])
    col = pa.chunked_array([full.slice(0, 3), full.slice(3, 4), full.slice(7)])
    values = feature_matrix(col, IDS)
    np.testing.assert_array_equal(values, feature_matrix(full, IDS))
    np.testing.assert_array_equal(values[7], [7, -7, NAN])
    np.testing.assert_array_equal(values[4], [NAN, NAN, 4])


def test_long_columns_scatter_in_threads() -> None:
    n = 300_000  # more than two row slices of a task each
    keys = pa.array(["0", "1"] * n).dictionary_encode()
    col = pa.MapArray.from_arrays(
        pa.array(np.arange(0, 2 * n + 1, 2, dtype=np.int32)), keys, pa.array(np.arange(2.0 * n))
    )
    values = feature_matrix(col, ["1", "0"])
    np.testing.assert_array_equal(values[:, 1], np.arange(0, 2 * n, 2, dtype=np.float32))
    np.testing.assert_array_equal(values[:, 0], np.arange(1, 2 * n, 2, dtype=np.float32))


def test_dictionary_keys_from_parquet(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"f": _maps([{"0": 1.0}, {"2": 2.0, "1": 1.0}] * 50)}), path, row_group_size=30
    )
    t = read_table(path)
    assert pa.types.is_dictionary(t.schema.field("f").type.key_type)  # fast path in use
    values = feature_matrix(t["f"], IDS)
    np.testing.assert_array_equal(values[:2], [[1, NAN, NAN], [NAN, 1, 2]])
    assert (~np.isnan(values)).sum() == 150


def test_dense_list_columns() -> None:
    col = pa.array([[1.0, 2.0, 3.0], None, [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(feature_matrix(col, ["0", "2"]), [[1, 3], [NAN, NAN], [4, 6]])
    # Positions not asked for are ignored; ids beyond the lists' length are absent.
    np.testing.assert_array_equal(feature_matrix(col, ["5", "1"])[0], [NAN, 2])
    with pytest.raises(DataError, match="differ in length"):
        feature_matrix(pa.array([[1.0, 2.0], [1.0]]), ["0"])


def test_candidates_padding_and_too_many() -> None:
    col = pa.array(
        [[{"10": 1.0, "11": 0.0}, {"10": 0.5}], [], None, [{"11": 2.0, "99": 1.0}]],
        pa.list_(pa.map_(pa.string(), pa.float64())),
    )
    values, mask = candidate_tensor(col, ["10", "11"], 3, "c.parquet")
    assert values.shape == (4, 3, 2) and mask.tolist() == [[1, 1, 0], [0] * 3, [0] * 3, [1, 0, 0]]
    np.testing.assert_array_equal(values[0], [[1, 0], [0.5, NAN], [NAN, NAN]])
    np.testing.assert_array_equal(values[3, 0], [NAN, 2])
    with pytest.raises(DataError, match=r"c.parquet: 1 rows have more than max_candidates=1"):
        candidate_tensor(col, ["10", "11"], 1, "c.parquet")


def test_match_index_of_nan_coded_actions() -> None:
    cands = np.array([[[1, NAN], [1, 0]], [[2, 2], [NAN, NAN]]], np.float32)
    mask = np.array([[1, 1], [1, 0]], np.float32)
    action = np.array([[1, 0], [NAN, NAN]], np.float32)
    # Row 0: the second candidate (absent ≠ 0); row 1: only the masked slot is equal.
    assert match_index(action, cands, mask).tolist() == [1, -1]


def test_action_masks_from_names_and_from_0_1_lists() -> None:
    names = pa.chunked_array([pa.array([["right"], [], ["left", "right"]])])
    assert actions_mask(names, ACTIONS, "s").tolist() == [[0, 1], [0, 0], [1, 1]]
    masks = pa.array([[1, 0], [], [0, 1]], pa.list_(pa.int8()))
    assert actions_mask(masks, ACTIONS, "s").tolist() == [[1, 0], [0, 0], [0, 1]]
    with pytest.raises(DataError, match="action masks must have 2 entries"):
        actions_mask(pa.array([[1, 0, 1]], pa.list_(pa.int8())), ACTIONS, "s")


# ----------------------------------------------------------------------------- builders


def test_dqn_fields() -> None:
    rows = dqn_rows(6)
    rows[4]["time_diff"] = 3
    b = ingest_table(dqn_table(rows), dqn_layout(IDS))
    assert len(b) == 6
    # row 1: {"0": 1, "2": .5}; row 0: {"1": -1}
    np.testing.assert_array_equal(b.state[1], [1.0, NAN, 0.5])
    np.testing.assert_array_equal(b.state[0], [NAN, -1.0, NAN])
    np.testing.assert_array_equal(b.next_state[0], [1.0, NAN, NAN])
    assert np.isnan(b.next_state[2]).all()
    f = b.fields
    assert f["action"].tolist() == [0, 1, 0, 1, 0, 1] and f["action"].dtype == np.int64
    assert f["next_action"].tolist() == [1, 0, -1, 0, 1, -1]
    assert f["terminal"].tolist() == [0, 0, 1, 0, 0, 1]
    assert f["possible_actions_mask"].tolist() == [[1, 1]] * 6
    assert f["possible_next_actions_mask"].tolist()[:3] == [[0, 1], [0, 1], [0, 0]]
    assert f["reward"].tolist() == [0, 0.5, 1, 1.5, 2, 2.5]
    assert f["propensity"].tolist() == [0.5] * 6
    assert f["mdp_id"].tolist() == [0, 0, 0, 1, 1, 1] and b.episodes == ["ep0", "ep1"]
    assert f["sequence_number"].tolist() == [0, 1, 2, 0, 1, 2]
    # ReAgent semantics: the time_diff column counts only with use_seq_num_diff_as_time_diff.
    assert f["time_diff"].tolist() == [1] * 6
    b2 = ingest_table(dqn_table(rows), dqn_layout(IDS, time_diff=True))
    assert b2.fields["time_diff"].tolist() == [1, 1, 1, 1, 3, 1]
    for name, a in {**b.features, **b.fields}.items():
        assert a.dtype in (np.float32, np.int64), name


def test_dqn_masks_and_explicit_terminal() -> None:
    t = dqn_table()
    mask_type = pa.list_(pa.int8())
    pa_masks = pa.array([[1, 0], [0, 1], [1, 1], [1, 1], [0, 1], [1, 0]], mask_type)
    pna_masks = pa.array([[1, 1], [0, 0], [], [1, 1], [1, 1], [1, 1]], mask_type)
    t = t.set_column(t.column_names.index("possible_actions"), "possible_actions", pa_masks)
    t = t.set_column(
        t.column_names.index("possible_next_actions"), "possible_next_actions", pna_masks
    )
    t = t.append_column("terminal", pa.array([False, False, False, False, True, None]))
    f = ingest_table(t, dqn_layout(IDS)).fields
    assert f["possible_actions_mask"][:2].tolist() == [[1, 0], [0, 1]]
    assert f["possible_next_actions_mask"][2].tolist() == [0, 0]
    assert f["terminal"].tolist() == [0, 1, 1, 0, 1, 0]  # all-zero/empty mask, or explicit flag


def test_dqn_builder_refuses_an_unknown_action() -> None:
    """Validation names unknown actions first; the builder still cannot represent one."""
    rows = dqn_rows()
    rows[0]["action"] = "jump"
    builder = DiscreteShardBuilder(ACTIONS, capacity=6, source="s.parquet")
    with pytest.raises(DataError, match=r"s.parquet: column 'action': 1 rows name no known"):
        builder.add(dqn_table(rows))


def test_dqn_dense_state() -> None:
    t = dqn_table().drop_columns(["state_features", "next_state_features"])
    t = t.append_column("state", pa.array([[float(i), 1.0] for i in range(6)]))
    t = t.append_column("next_state", pa.array([[float(i + 1), 1.0] for i in range(6)]))
    b = ingest_table(t, dqn_layout(["0", "1"]))
    assert b.state[3].tolist() == [3.0, 1.0] and not np.isnan(b.state).any()
    assert b.next_state[5].tolist() == [6.0, 1.0]


def test_parametric_fields() -> None:
    # parametric_table: 4 rows; candidates alternate between 2 and 3; last row terminal.
    b = ingest_table(parametric_table(), parametric_layout())
    assert b.max_candidates == 3  # K = the most candidates in the table
    b.conform(["0"], ["10", "11"], 3)
    f = {**b.features, **b.fields}
    assert f["possible_actions"].shape == (4, 3, 2)
    assert f["possible_actions_mask"].tolist() == [[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]]
    np.testing.assert_array_equal(f["possible_actions"][1], [[1, 0], [0, 1], [0.5, NAN]])
    assert np.isnan(f["possible_actions"][0, 2]).all()  # padding
    # logged action = candidate i % len(cands): rows 0..3 → 0, 1, 0, 0
    assert f["action_index"].tolist() == [0, 1, 0, 0]
    assert f["action"][1].tolist() == [0, 1]
    assert f["terminal"].tolist() == [0, 0, 0, 1]
    assert f["possible_next_actions_mask"][3].sum() == 0
    assert np.isnan(f["next_action"][3]).all() and f["next_action"][0].tolist() == [1, 0]
    assert f["mdp_id"].tolist() == [0, 0, 0, 0]


def test_parametric_action_not_among_candidates_and_padding() -> None:
    rows = parametric_rows()
    rows[0]["action"] = {"10": 1.0}  # "11" absent here, 0 in candidate {"10": 1, "11": 0}
    b = ingest_table(parametric_table(rows), parametric_layout(["0"], ["10", "11"], 5))
    assert b.fields["action_index"].tolist() == [-1, 1, 0, 0]
    assert b.features["possible_actions"].shape == (4, 5, 2)
    assert b.fields["possible_next_actions_mask"].shape == (4, 5)
    with pytest.raises(DataError, match="max_candidates=2"):
        ingest_table(parametric_table(rows), parametric_layout(["0"], ["10", "11"], 2))


def test_parametric_from_jsonl_with_null_columns(tmp_path: Path) -> None:
    rows = parametric_rows(2)
    for r in rows:  # every row terminal: JSON gives null / empty-list columns
        r["next_action"] = None
        r["possible_next_actions"] = []
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = ingest(path, [(0, 1)], parametric_layout(["0"], ["10", "11"], 3))
    assert b.fields["terminal"].tolist() == [1, 1] and np.isnan(b.features["next_action"]).all()
    assert b.fields["action_index"].tolist() == [0, 1]


def test_action_name_lists_after_a_null_list_that_owns_names() -> None:
    """A null possible_actions slot that owns names in Arrow (no action possible) leaves
    the rows after it in place: validation passes and the mask has the right rows."""
    names = pa.array(["left", "right", "left", "right"])
    lists = pa.ListArray.from_arrays(
        pa.array([0, 2, 3, 4], pa.int32()), names, mask=pa.array([True, False, False])
    )
    table = dqn_table(dqn_rows(3))
    table = table.set_column(
        table.schema.get_field_index("possible_actions"), "possible_actions", lists
    )
    out = ingest_table(table, dqn_layout(IDS))
    assert out.fields["possible_actions_mask"].tolist() == [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
