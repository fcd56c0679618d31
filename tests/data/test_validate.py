"""Validation (`ShardValidation` against the kinds' schemas): every bad input gives a
DataError naming file, column and bad-row count."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig
from reagent_lite.data.checks import dense_rows, map_rows
from reagent_lite.data.readers import read_table
from reagent_lite.data.schema import check_columns
from reagent_lite.data.validate import ShardValidation, ValidationReport
from reagent_lite.errors import DataError
from reagent_lite.kinds import KINDS

ACTIONS = ["left", "right"]
FMAP = pa.map_(pa.string(), pa.float64())


def dqn_rows(n: int = 6) -> list[dict[str, Any]]:
    """n valid discrete transitions: episodes of 3 steps, the last one terminal."""
    rows = []
    for i in range(n):
        last = i % 3 == 2
        rows.append(
            {
                "mdp_id": f"ep{i // 3}",
                "sequence_number": i % 3,
                "state_features": {"0": float(i), "2": 0.5} if i % 2 else {"1": -1.0},
                "action": ACTIONS[i % 2],
                "reward": float(i) / 2,
                "next_state_features": {} if last else {"0": float(i + 1)},
                "next_action": "" if last else ACTIONS[(i + 1) % 2],
                "possible_actions": ["left", "right"],
                "possible_next_actions": [] if last else ["right"],
                "action_probability": 0.5,
                "time_diff": 1,
            }
        )
    return rows


DQN_SCHEMA = pa.schema(
    [
        ("mdp_id", pa.string()),
        ("sequence_number", pa.int64()),
        ("state_features", FMAP),
        ("action", pa.string()),
        ("reward", pa.float64()),
        ("next_state_features", FMAP),
        ("next_action", pa.string()),
        ("possible_actions", pa.list_(pa.string())),
        ("possible_next_actions", pa.list_(pa.string())),
        ("action_probability", pa.float64()),
        ("time_diff", pa.int64()),
    ]
)


def dqn_table(rows: list[dict[str, Any]] | None = None) -> pa.Table:
    return pa.Table.from_pylist(rows if rows is not None else dqn_rows(), schema=DQN_SCHEMA)


def parametric_rows(n: int = 4) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        last = i == n - 1
        cands = [{"10": 1.0, "11": 0.0}, {"10": 0.0, "11": 1.0}, {"10": 0.5}][: 2 + i % 2]
        rows.append(
            {
                "mdp_id": 7,
                "sequence_number": i,
                "state_features": {"0": float(i)},
                "action": cands[i % len(cands)],
                "reward": 1.0,
                "next_state_features": {"0": float(i + 1)},
                "next_action": {} if last else cands[0],
                "possible_actions": cands,
                "possible_next_actions": [] if last else cands[:2],
                "action_probability": 1.0,
            }
        )
    return rows


PARAM_SCHEMA = pa.schema(
    [
        ("mdp_id", pa.int64()),
        ("sequence_number", pa.int64()),
        ("state_features", FMAP),
        ("action", FMAP),
        ("reward", pa.float64()),
        ("next_state_features", FMAP),
        ("next_action", FMAP),
        ("possible_actions", pa.list_(FMAP)),
        ("possible_next_actions", pa.list_(FMAP)),
        ("action_probability", pa.float64()),
    ]
)


def parametric_table(rows: list[dict[str, Any]] | None = None) -> pa.Table:
    return pa.Table.from_pylist(
        rows if rows is not None else parametric_rows(), schema=PARAM_SCHEMA
    )


PATHS = {"training_data_path": "t.parquet", "model_output_path": "out"}
SCHEMAS = {
    "dqn": KINDS["dqn"].schema(DQNWorkflowConfig(**PATHS, actions=ACTIONS)),
    "parametric_dqn": KINDS["parametric_dqn"].schema(ParametricDQNWorkflowConfig(**PATHS)),
}


def validate(
    table: pa.Table, kind: str = "dqn", *, source: str, drop_bad_rows: bool = False
) -> tuple[pa.Table, ValidationReport]:
    """`table` validated at once against the `kind`'s schema: (the rows kept, the report)."""
    check = ShardValidation(SCHEMAS[kind], source=source, drop_bad_rows=drop_bad_rows)
    table = check.check(table)
    return table, check.finish()


def _error(table: pa.Table, kind: str = "dqn", **kw: Any) -> str:
    with pytest.raises(DataError) as exc:
        validate(table, kind, source="data/train.parquet", **kw)
    return str(exc.value)


def _assert_names(msg: str, column: str, count: int) -> None:
    assert "data/train.parquet" in msg
    assert f"column '{column}'" in msg
    assert f"{count} bad row" in msg


def test_valid_tables_pass() -> None:
    _, report = validate(dqn_table(), "dqn", source="x")
    assert report.rows_in == report.rows_out == 6 and not report.dropped
    _, report = validate(parametric_table(), "parametric_dqn", source="x")
    assert report.rows_out == 4


def test_propensity_alias_is_renamed() -> None:
    t = dqn_table().rename_columns(
        ["propensity" if c == "action_probability" else c for c in DQN_SCHEMA.names]
    )
    out, _ = validate(t, "dqn", source="x")
    assert "action_probability" in out.column_names


def test_missing_column() -> None:
    msg = _error(dqn_table().drop_columns(["reward", "possible_actions"]))
    assert "data/train.parquet" in msg and "'reward'" in msg and "'possible_actions'" in msg


def test_dense_state_alternative_is_accepted() -> None:
    t = dqn_table().drop_columns(["state_features", "next_state_features"])
    t = t.append_column("state", pa.array([[1.0, 2.0]] * 6)).append_column(
        "next_state", pa.array([[1.0, 2.0]] * 6)
    )
    validate(t, "dqn", source="x")
    bad = t.set_column(t.column_names.index("state"), "state", pa.array([[1.0, 2.0]] * 5 + [[1.0]]))
    _assert_names(_error(bad), "state", 1)


def test_wrong_type() -> None:
    t = dqn_table()
    t = t.set_column(t.column_names.index("reward"), "reward", pa.array(["a"] * 6))
    msg = _error(t)
    assert "column 'reward'" in msg and "expected numbers" in msg and "data/train.parquet" in msg


def test_nan_and_inf_reward() -> None:
    rows = dqn_rows()
    rows[1]["reward"] = math.nan
    rows[4]["reward"] = math.inf
    msg = _error(dqn_table(rows))
    _assert_names(msg, "reward", 2)
    assert "row 1" in msg


def test_nan_feature_and_bad_feature_id() -> None:
    rows = dqn_rows()
    rows[0]["state_features"] = {"1": math.nan}
    rows[3]["next_state_features"] = {"abc": 1.0}
    msg = _error(dqn_table(rows))
    _assert_names(msg, "state_features", 1)
    _assert_names(msg, "next_state_features", 1)
    assert "'abc'" in msg


def test_unknown_action_names() -> None:
    rows = dqn_rows()
    rows[0]["action"] = "jump"
    rows[1]["next_action"] = "fly"
    rows[2]["possible_actions"] = ["left", "dig"]
    msg = _error(dqn_table(rows))
    for col in ("action", "next_action", "possible_actions"):
        _assert_names(msg, col, 1)
    assert "'jump'" in msg


def test_mask_of_wrong_length() -> None:
    rows = dqn_rows()
    schema = DQN_SCHEMA.set(
        DQN_SCHEMA.get_field_index("possible_actions"),
        pa.field("possible_actions", pa.list_(pa.int8())),
    )
    for r in rows:
        r["possible_actions"] = [1, 1]
    rows[5]["possible_actions"] = [1, 0, 1]
    msg = _error(pa.Table.from_pylist(rows, schema=schema))
    _assert_names(msg, "possible_actions", 1)
    # Entries other than 0 and 1 (a count, a −1, a null) are broken masks too.
    rows[5]["possible_actions"] = [1, 1]
    rows[1]["possible_actions"] = [2, 1]
    rows[3]["possible_actions"] = [1, -1]
    rows[4]["possible_actions"] = [None, 1]
    msg = _error(pa.Table.from_pylist(rows, schema=schema))
    _assert_names(msg, "possible_actions", 3)
    assert "not all 0 or 1" in msg


def test_propensity_out_of_range() -> None:
    rows = dqn_rows()
    rows[0]["action_probability"] = 0.0
    rows[1]["action_probability"] = 1.5
    rows[2]["action_probability"] = None
    _assert_names(_error(dqn_table(rows)), "action_probability", 3)


def test_time_diff_below_one() -> None:
    rows = dqn_rows()
    rows[2]["time_diff"] = 0
    _assert_names(_error(dqn_table(rows)), "time_diff", 1)


def test_empty_table() -> None:
    msg = _error(dqn_table([]))
    assert "data/train.parquet" in msg and "no rows" in msg


def test_drop_bad_rows_counts_them() -> None:
    rows = dqn_rows()
    rows[1]["reward"] = math.nan
    rows[2]["action_probability"] = 2.0
    rows[2]["reward"] = math.nan
    table, report = validate(dqn_table(rows), "dqn", source="f.parquet", drop_bad_rows=True)
    assert table.num_rows == 4 and report.rows_dropped == 2
    assert {(p.column, p.count) for p in report.dropped} == {
        ("reward", 2),
        ("action_probability", 1),
    }
    assert "f.parquet" in str(report)
    all_bad = [dict(r, reward=math.nan) for r in dqn_rows()]
    with pytest.raises(DataError, match="every row is bad"):
        validate(dqn_table(all_bad), "dqn", source="f", drop_bad_rows=True)


def test_parametric_bad_candidate_values() -> None:
    rows = parametric_rows()
    rows[1]["possible_actions"] = [{"10": math.inf}]
    rows[2]["action"] = {"10": math.nan}
    msg = _error(parametric_table(rows), "parametric_dqn")
    _assert_names(msg, "possible_actions", 1)
    _assert_names(msg, "action", 1)


def test_file_name_from_a_real_file(tmp_path: Any) -> None:
    rows = dqn_rows()
    rows[0]["reward"] = math.nan
    path = tmp_path / "bad.parquet"
    pq.write_table(dqn_table(rows), path)
    with pytest.raises(DataError, match=r"bad\.parquet: column 'reward': 1 bad row"):
        validate(read_table(path), "dqn", source=str(path))


def test_feature_id_twice_in_one_map() -> None:
    """Arrow's map type allows a key twice in one map (Python dicts cannot say it; lists of
    pairs can). Which value was meant is unknowable, so the row is bad — in any key order,
    and in a candidate's map too."""
    rows: list[dict[str, Any]] = dqn_rows()
    rows[1]["state_features"] = [("0", 1.0), ("2", 0.5), ("0", 2.0)]
    rows[4]["next_state_features"] = [("3", 1.0), ("3", 1.0)]
    rows[5]["state_features"] = [("2", 1.0), ("1", 0.5)]  # out of order, no repeat: fine
    msg = _error(dqn_table(rows))
    _assert_names(msg, "state_features", 1)
    _assert_names(msg, "next_state_features", 1)
    assert "twice" in msg and "row 1" in msg and "row 4" in msg
    table, report = validate(dqn_table(rows), "dqn", source="f", drop_bad_rows=True)
    assert table.num_rows == 4 and report.rows_dropped == 2

    prm = parametric_rows()
    prm[2]["possible_actions"] = [{"10": 1.0}, [("11", 0.0), ("10", 1.0), ("11", 1.0)]]
    prm[3]["action"] = [("10", 1.0), ("10", 0.0)]
    msg = _error(parametric_table(prm), "parametric_dqn")
    _assert_names(msg, "possible_actions", 1)
    _assert_names(msg, "action", 1)
    assert "row 2" in msg and "row 3" in msg


@pytest.mark.parametrize(
    "key_type", [pa.dictionary(pa.int32(), pa.string()), pa.int64(), pa.string()]
)
def test_repeated_feature_id_found_for_every_key_type(key_type: pa.DataType) -> None:
    """Keys as read from Parquet (dictionary-encoded), integer keys and plain strings. A
    null map slot may own entries in Arrow; its repeats do not count."""
    keys = [0, 1, 1, 0, 5, 0, 5, 7, 7]  # maps: [0 1] [1 0] [5 0 5] null:[7 7] []
    offsets = pa.array([0, 2, 4, 7, 9, 9], pa.int32())
    items = pa.array([float(i) for i in range(len(keys))])
    if pa.types.is_integer(key_type):
        key_arr = pa.array(keys, key_type)
    else:
        key_arr = pa.array([str(k) for k in keys]).cast(key_type)
    null = pa.array([False, False, False, True, False])
    maps = pa.MapArray.from_arrays(offsets, key_arr, items, mask=null)
    assert maps.type.key_type == key_type and maps.null_count == 1
    bad_val, bad_key, bad_dup = map_rows(pa.chunked_array([maps]), nested=False)
    assert bad_dup.tolist() == [False, False, True, False, False]
    assert not bad_val.any() and not bad_key.any()


def test_rows_of_candidate_lists_after_a_null_list_that_owns_entries() -> None:
    """Arrow lets a null list slot own elements; `flatten` leaves them out, so the rows of
    the flattened candidates must skip them too (else every later row is misnamed and
    `drop_bad_rows` drops the wrong one)."""
    maps = pa.array([[("1", 1.0)], [("5", 1.0), ("5", 2.0)], [("6", math.nan)]], FMAP)
    lists = pa.ListArray.from_arrays(
        pa.array([0, 1, 2, 3], pa.int32()), maps, mask=pa.array([True, False, False])
    )
    bad_val, _, bad_dup = map_rows(pa.chunked_array([lists]), nested=True)
    assert bad_dup.tolist() == [False, True, False]
    assert bad_val.tolist() == [False, False, True]
    dense = pa.ListArray.from_arrays(
        pa.array([0, 2, 4], pa.int32()),
        pa.array([math.nan, 1.0, 2.0, 3.0]),
        mask=pa.array([True, False]),
    )
    bad_val, bad_len = dense_rows(pa.chunked_array([dense]))
    assert bad_val.tolist() == [True, False] and not bad_len.any()  # only the null row is bad


@pytest.mark.parametrize("seed", range(4))
def test_repeated_ids_match_a_plain_python_count(seed: int) -> None:
    """Random map columns — key types, key orders, null slots owning entries, slices,
    several chunks, few and many distinct ids — against a count done entry by entry."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for _ in range(40):
        n_ids = int(rng.choice([3, 50, 5000]))
        kind = rng.choice(["str", "int", "dict"])
        chunks, expected = [], []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.integers(0, 30))
            lengths = rng.integers(0, 6, n)
            keys = rng.integers(0, n_ids, int(lengths.sum()))
            if rng.random() < 0.5:  # most rows sorted: exercises the fast check
                pos = 0
                for ln in lengths:
                    keys[pos : pos + ln] = np.sort(keys[pos : pos + ln])
                    pos += ln
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            null = rng.random(n) < 0.2
            key_arr = (
                pa.array(keys, pa.int64())
                if kind == "int"
                else pa.array([str(k) for k in keys], pa.string())
            )
            if kind == "dict":
                key_arr = key_arr.dictionary_encode()
            maps = pa.MapArray.from_arrays(
                pa.array(offsets),
                key_arr,
                pa.array(rng.random(len(keys)), pa.float64()),
                mask=pa.array(null, pa.bool_()),
            )
            lo = int(rng.integers(0, n + 1))
            maps = maps.slice(lo)
            chunks.append(maps)
            for r in range(lo, n):
                own = keys[offsets[r] : offsets[r + 1]]
                expected.append(not null[r] and len(set(own.tolist())) < len(own))
        col = pa.chunked_array(chunks, chunks[0].type)
        _, _, bad_dup = map_rows(col, nested=False)
        assert bad_dup.tolist() == expected


def test_unsigned_integer_feature_ids() -> None:
    """uint64 ids are fine up to 2**63 - 1 (they are read as int64 later); a larger one is
    a bad row, not an Arrow overflow traceback."""
    umap = pa.map_(pa.uint64(), pa.float64())
    schema = DQN_SCHEMA
    for name in ("state_features", "next_state_features"):
        schema = schema.set(schema.get_field_index(name), pa.field(name, umap))
    rows = dqn_rows()
    for r in rows:
        for name in ("state_features", "next_state_features"):
            r[name] = {int(k): v for k, v in r[name].items()}
    validate(pa.Table.from_pylist(rows, schema=schema), "dqn", source="u")
    rows[0]["state_features"] = {2**64 - 1: 1.0}
    rows[1]["state_features"] = {2**63 - 1: 1.0}
    msg = _error(pa.Table.from_pylist(rows, schema=schema))
    assert "column 'state_features': 1 bad row: feature id is not a non-negative" in msg


def test_the_schemas_are_the_kinds_declarations() -> None:
    """Validation knows no kind: the columns, types and rules come from the schema handed
    to it. A schema of other columns checks other columns."""
    from reagent_lite.data.checks import nonfinite_rows
    from reagent_lite.data.schema import TableSchema, field

    schema = TableSchema("a test", (field("score", pa.types.is_floating, "floats",
                                           nonfinite_rows("not a finite score")),))  # fmt: skip
    check = ShardValidation(schema, source="s.parquet")
    check.check(pa.table({"score": [1.0, math.nan, 2.0], "other": ["x", "y", "z"]}))
    with pytest.raises(DataError, match=r"s.parquet: column 'score': 1 bad row: not a finite"):
        check.finish()
    with pytest.raises(DataError, match=r"missing required column.*'score' for a test"):
        check_columns(pa.table({"other": [1]}), schema, "s.parquet")
    # The dry run's check: columns and types of an empty table, every kind's schema.
    assert [f.name for f, _ in check_columns(dqn_table([]), SCHEMAS["dqn"], "x")][:2] == [
        "mdp_id",
        "sequence_number",
    ]
    with pytest.raises(DataError, match="column 'action': expected map<feature id, float>"):
        check_columns(dqn_table([]), SCHEMAS["parametric_dqn"], "x")
