"""Test helpers: the kinds' layouts as the tests use them, and the oracle — the arrays a
table's rows should become, worked out row by row in plain Python, independently of the
ingest code (`data/scatter.py`, the builders)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig
from reagent_lite.data.ingest import Layout
from reagent_lite.kinds import KINDS, DiscreteSpace, ParametricSpace
from tests.data.test_validate import ACTIONS

PATHS = {"training_data_path": "t.parquet", "model_output_path": "out"}


def dqn_layout(
    ids: Sequence[str] | None = None, *, drop: bool = False, time_diff: bool = False
) -> Layout[Any]:
    """The dqn kind's layout (`ids`: the feature space's state ids, None: not known yet)."""
    cfg = DQNWorkflowConfig(
        **PATHS,
        actions=ACTIONS,
        drop_bad_rows=drop,
        rl={"use_seq_num_diff_as_time_diff": time_diff},
    )
    space = None if ids is None else DiscreteSpace(list(ids), actions=ACTIONS)
    return KINDS["dqn"].layout(cfg, space)


def parametric_layout(
    state_ids: Sequence[str] | None = None,
    action_ids: Sequence[str] = (),
    k: int = 0,
    *,
    drop: bool = False,
    time_diff: bool = False,
    max_candidates: int | None = None,
) -> Layout[Any]:
    """The parametric kind's layout (with `state_ids`: in the space of those ids,
    `action_ids` and `k` candidate slots)."""
    cfg = ParametricDQNWorkflowConfig(
        **PATHS,
        drop_bad_rows=drop,
        max_candidates=max_candidates,
        rl={"use_seq_num_diff_as_time_diff": time_diff},
    )
    space = None
    if state_ids is not None:
        space = ParametricSpace(list(state_ids), action_ids=list(action_ids), max_candidates=k)
    return KINDS["parametric_dqn"].layout(cfg, space)


# ----------------------------------------------------------------------------- oracle


def features(value: Any, ids: Sequence[str]) -> np.ndarray:
    """One row's feature column as float32 [F] in `ids` order, NaN = absent: a map (a dict,
    or the (key, value) pairs Arrow gives back), a dense list (feature "i" at position i),
    or None."""
    out = np.full(len(ids), np.nan, np.float32)
    if not value:
        return out
    if isinstance(value, dict) or isinstance(value[0], tuple):
        found = {str(k): v for k, v in (value.items() if isinstance(value, dict) else value)}
        for j, f in enumerate(ids):
            if found.get(f) is not None:
                out[j] = found[f]
    else:
        for j, f in enumerate(ids):
            if int(f) < len(value):
                out[j] = value[int(f)]
    return out


def _state(row: dict[str, Any], name: str) -> Any:
    return row[f"{name}_features"] if f"{name}_features" in row else row.get(name)


def _common(rows: list[dict[str, Any]], terminal: list[bool], time_diff: bool) -> dict[str, Any]:
    codes: dict[Any, int] = {}
    return {
        "reward": np.array([r["reward"] for r in rows], np.float32),
        "terminal": np.array(
            [t or bool(r.get("terminal")) for r, t in zip(rows, terminal, strict=True)],
            np.float32,
        ),
        "time_diff": np.array(
            [r["time_diff"] if time_diff and "time_diff" in r else 1 for r in rows], np.float32
        ),
        "propensity": np.array([r["action_probability"] for r in rows], np.float32),
        "mdp_id": np.array([codes.setdefault(r["mdp_id"], len(codes)) for r in rows], np.int64),
        "sequence_number": np.array([r["sequence_number"] for r in rows], np.int64),
    }


def _matrix(rows: list[dict[str, Any]], name: str, ids: Sequence[str]) -> np.ndarray:
    return np.array([features(_state(r, name), ids) for r in rows], np.float32).reshape(
        len(rows), len(ids)
    )


def expected_dqn(
    rows: list[dict[str, Any]], ids: Sequence[str], *, time_diff: bool = False
) -> dict[str, np.ndarray]:
    """What a dqn shard of `rows` holds (features in `ids` order)."""

    def index(name: Any) -> int:
        return ACTIONS.index(name) if name in ACTIONS else -1

    def mask(names: Any) -> np.ndarray:
        out = np.zeros(len(ACTIONS), np.float32)
        for j, x in enumerate(names or []):
            if isinstance(x, str):
                out[ACTIONS.index(x)] = 1.0
            else:  # a 0/1 mask
                out[j] = float(x)
        return out

    pna = np.array([mask(r["possible_next_actions"]) for r in rows], np.float32)
    return {
        "state": _matrix(rows, "state", ids),
        "next_state": _matrix(rows, "next_state", ids),
        "action": np.array([index(r["action"]) for r in rows], np.int64),
        "next_action": np.array([index(r["next_action"]) for r in rows], np.int64),
        "possible_actions_mask": np.array([mask(r["possible_actions"]) for r in rows], np.float32),
        "possible_next_actions_mask": pna.reshape(len(rows), len(ACTIONS)),
        **_common(rows, [not m.any() for m in pna], time_diff),
    }


def expected_parametric(
    rows: list[dict[str, Any]],
    state_ids: Sequence[str],
    action_ids: Sequence[str],
    k: int,
    *,
    time_diff: bool = False,
) -> dict[str, np.ndarray]:
    """What a parametric shard of `rows` holds (features in the ids' order, K = `k`)."""
    n, g = len(rows), len(action_ids)

    def candidates(name: str) -> tuple[np.ndarray, np.ndarray]:
        values = np.full((n, k, g), np.nan, np.float32)
        mask = np.zeros((n, k), np.float32)
        for i, r in enumerate(rows):
            for j, c in enumerate(r[name] or []):
                values[i, j], mask[i, j] = features(c, action_ids), 1.0
        return values, mask

    def actions(name: str) -> np.ndarray:
        return np.array([features(r[name], action_ids) for r in rows], np.float32).reshape(n, g)

    action = actions("action")
    cands, cand_mask = candidates("possible_actions")
    next_cands, next_mask = candidates("possible_next_actions")
    index = np.full(n, -1, np.int64)
    for i in range(n):
        for j in range(k):
            same = (cands[i, j] == action[i]) | (np.isnan(cands[i, j]) & np.isnan(action[i]))
            if cand_mask[i, j] and same.all():
                index[i] = j
                break
    return {
        "state": _matrix(rows, "state", state_ids),
        "next_state": _matrix(rows, "next_state", state_ids),
        "action": action,
        "next_action": actions("next_action"),
        "possible_actions": cands,
        "possible_next_actions": next_cands,
        "possible_actions_mask": cand_mask,
        "possible_next_actions_mask": next_mask,
        "action_index": index,
        **_common(rows, [not m.any() for m in next_mask], time_diff),
    }


def assert_arrays(got: dict[str, Any], want: dict[str, np.ndarray]) -> None:
    """Every array of `want` in `got`, of the same dtype and equal (NaN equal to NaN)."""
    for name, expected in want.items():
        actual = np.asarray(got[name])
        assert actual.dtype == expected.dtype, (name, actual.dtype, expected.dtype)
        np.testing.assert_array_equal(actual, expected, err_msg=name)


def assert_shard(shard: Any, want: dict[str, np.ndarray]) -> None:
    """An ingested shard's arrays (features and fields) are `want`, and no others."""
    got = {**shard.features, **shard.fields}
    assert set(got) == set(want), (sorted(got), sorted(want))
    assert_arrays(got, want)
