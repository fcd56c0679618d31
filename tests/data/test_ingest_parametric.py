"""The ingest engine on parametric tables (`data/parametric_shard.py`): each rank's rows
hold what the rows say (`tests/data/oracle.py`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.data.ingest import ingest
from reagent_lite.data.parametric_shard import ParametricShard
from reagent_lite.data.readers import read_shard
from reagent_lite.data.validate import ShardValidation
from reagent_lite.errors import DataError
from tests.data.oracle import assert_shard, expected_parametric, parametric_layout
from tests.data.test_ingest import good, map_keys
from tests.data.test_validate import PARAM_SCHEMA, SCHEMAS

SCHEMA = PARAM_SCHEMA.append(pa.field("time_diff", pa.int64()))
ACTION_FEATURES = ("100", "101", "102")


def parametric_rows(
    n: int, seed: int = 0, *, late_feature_at: int | None = None, long_lists_at: int | None = None
) -> list[dict[str, Any]]:
    """n parametric rows, episodes of 4 steps (the last terminal: no next action, no
    candidates). State features 0..3 with holes, "11" from row `late_feature_at` on.
    1–3 candidates over features 100..102 with holes, some with "150" (no logged action
    has it: dropped, and ignored when matching the action) or "103" (logged actions have it only in the second half, so the
    first row groups meet it in candidates only); 6 candidates on every 5th row from
    `long_lists_at` on (K grows late). The logged action is a candidate but on every
    7th row (no match: action_index -1)."""
    rng = np.random.default_rng(seed)

    def candidate() -> dict[str, float]:
        c = {f: float(rng.normal()) for f in ACTION_FEATURES if rng.random() > 0.2}
        if rng.random() < 0.3:
            c["150"] = 1.0
        if rng.random() < 0.4:
            c["103"] = float(rng.integers(2))
        return c

    out = []
    for i in range(n):
        last = i % 4 == 3
        k = 6 if long_lists_at is not None and i >= long_lists_at and i % 5 == 0 else 1 + i % 3
        cands = [candidate() for _ in range(k)]
        logged = cands[i % k] if i % 7 else candidate()
        if i < n // 2:
            logged.pop("103", None)
        state = {str(f): float(rng.normal()) for f in range(4) if rng.random() > 0.3}
        if late_feature_at is not None and i >= late_feature_at:
            state["11"] = float(i)
        nxt = {str(f): float(rng.normal()) for f in range(4) if rng.random() > 0.3}
        out.append(
            {
                "mdp_id": i // 4,
                "sequence_number": i % 4,
                "state_features": state,
                "action": {f: v for f, v in logged.items() if f != "150"},
                "reward": float(rng.normal()),
                "next_state_features": {} if last else nxt,
                "next_action": {} if last else candidate(),
                "possible_actions": cands,
                "possible_next_actions": [] if last else [candidate() for _ in range(1 + i % 2)],
                "action_probability": 0.5,
                "time_diff": int(1 + i % 2),
            }
        )
    return out


def write_parametric(path: Path, data: list[dict[str, Any]], row_group: int) -> Path:
    pq.write_table(pa.Table.from_pylist(data, schema=SCHEMA), path, row_group_size=row_group)
    return path


def ingest_parametric(
    path: Path, parts: list[tuple[int, int]], *, max_candidates: int | None = None, **kw: Any
) -> ParametricShard:
    """The shard(s), as the parametric kind ingests them before the space is agreed."""
    opts = {k: kw.pop(k) for k in ("drop", "time_diff") if k in kw}
    return ingest(path, parts, parametric_layout(max_candidates=max_candidates, **opts), **kw)


def _ids(data: list[dict[str, Any]], column: str) -> list[str]:
    return sorted({k for r in data for k in map_keys(r[column])}, key=int)


def _longest(data: list[dict[str, Any]]) -> int:
    lists = [r[c] or [] for r in data for c in ("possible_actions", "possible_next_actions")]
    return max(1, *(len(x) for x in lists))


def _good(row: dict[str, Any]) -> bool:
    """Whether a row passes validation (the bad rows the tests make)."""
    values = [v for c in row["possible_actions"] or [] for _, v in c or []]
    return good({**row, "action": "left"}) and all(math.isfinite(v) for v in values)


def assert_same(
    path: Path, rank: int, world: int, *, max_candidates: int | None = None, **kw: Any
) -> None:
    """Rank `rank`'s shard holds what its rows (as the reader gives them) say."""
    shard = ingest_parametric(
        path, [(rank, world)], max_candidates=max_candidates, time_diff=True, slice_rows=7, **kw
    )
    every = read_shard(path, rank, world).to_pylist()
    want = [r for r in every if _good(r)] if kw.get("drop") else every
    state_ids, action_ids = _ids(want, "state_features"), _ids(want, "action")
    k = max_candidates or _longest(want)
    assert shard.state_ids == set(state_ids) and shard.action_ids == set(action_ids)
    assert shard.max_candidates == k
    shard.conform(state_ids, action_ids, k + 1)  # one more slot than needed: padding
    assert list(shard.features) == [
        "state", "next_state", "action", "next_action", "possible_actions",
        "possible_next_actions",
    ]  # fmt: skip
    assert_shard(shard, expected_parametric(want, state_ids, action_ids, k + 1, time_diff=True))
    assert (shard.report.rows_in, shard.report.rows_out) == (len(every), len(want))


@pytest.mark.parametrize(("world", "row_group"), [(1, 10), (2, 10), (3, 10), (1, 1000), (3, 1000)])
def test_each_rank_ingests_its_rows(tmp_path: Path, world: int, row_group: int) -> None:
    data = parametric_rows(95, late_feature_at=60, long_lists_at=70)
    path = write_parametric(tmp_path / "t.parquet", data, row_group)
    for rank in range(world):
        assert_same(path, rank, world, prefetch=rank == 1)


def test_the_awkward_cases_occur(tmp_path: Path) -> None:
    path = write_parametric(tmp_path / "t.parquet", parametric_rows(95, long_lists_at=70), 10)
    shard = ingest_parametric(path, [(0, 1)])
    # Candidate-only "150" has a column until conform drops it; "103" was met in
    # candidates before any logged action had it; K grew to 6 in a late row group.
    assert "150" in shard.action_columns.ids and "150" not in shard.action_ids
    early = write_parametric(tmp_path / "h.parquet", parametric_rows(40)[:20], 10)
    first = ingest_parametric(early, [(0, 1)])
    assert "103" in first.action_columns.ids and "103" not in first.action_ids
    assert shard.max_candidates == 6 and first.max_candidates == 3
    shard.conform(sorted(shard.state_ids), sorted(shard.action_ids), 6)
    index = shard.fields["action_index"]
    assert (index == -1).any() and (index >= 0).mean() > 0.7


def test_part_files_fixed_candidates_and_dropped_rows(tmp_path: Path) -> None:
    d = tmp_path / "parts"
    d.mkdir()
    for k in range(3):
        data = parametric_rows(40, seed=k, late_feature_at=30 if k else None)
        if k == 1:
            data[5]["reward"] = float("nan")
            data[17]["possible_actions"][0]["101"] = float("inf")
        write_parametric(d / f"part-{k:05d}.parquet", data, 16)
    assert_same(d, 0, 1, drop=True, max_candidates=8)
    assert_same(d, 1, 2, drop=True)


def test_validation_errors_match_validating_at_once(tmp_path: Path) -> None:
    data = parametric_rows(60)
    data[44]["possible_actions"][0]["101"] = float("nan")
    data[51]["action"] = {"x": 1.0}
    path = write_parametric(tmp_path / "t.parquet", data, 10)
    at_once = ShardValidation(SCHEMAS["parametric_dqn"], source=str(path))
    at_once.check(read_shard(path, 0, 1))
    with pytest.raises(DataError) as whole_err:
        at_once.finish()
    with pytest.raises(DataError) as stream_err:
        ingest_parametric(path, [(0, 1)])
    assert sorted(str(stream_err.value).splitlines()) == sorted(str(whole_err.value).splitlines())
    assert "column 'possible_actions'" in str(stream_err.value)
    assert "row 44:" in str(stream_err.value)


def test_more_candidates_than_max_candidates(tmp_path: Path) -> None:
    path = write_parametric(tmp_path / "t.parquet", parametric_rows(40, long_lists_at=30), 10)
    with pytest.raises(DataError, match="more than max_candidates=3"):
        ingest_parametric(path, [(0, 1)], max_candidates=3)
