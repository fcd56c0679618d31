"""Workflow.load_training_data and the eval tables (`Workflow._eval_tensors`): the tensors
are what the rows say (`tests/data/oracle.py`), normalized by the fitted preprocessors'
`forward` (the exported model's path, not the bulk one the ingest takes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from reagent_lite.config.models import DQNWorkflowConfig, ParametricDQNWorkflowConfig
from reagent_lite.data.readers import read_shard
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import DataError
from reagent_lite.normalization.identify import fit_normalization
from reagent_lite.normalization.module import Preprocessor
from reagent_lite.training.loop import Workflow
from reagent_lite.training.verify import EMULATE_ENV
from tests.data.oracle import expected_dqn, expected_parametric
from tests.data.test_ingest import ACTIONS, map_keys, rows, write
from tests.data.test_ingest_parametric import parametric_rows, write_parametric

DQN_ORDER = [
    "state", "next_state", "action", "next_action", "reward", "possible_actions_mask",
    "possible_next_actions_mask", "terminal", "time_diff", "propensity", "mdp_id",
    "sequence_number",
]  # fmt: skip
PARAMETRIC_ORDER = [
    "state", "next_state", "action", "next_action", "possible_actions", "possible_actions_mask",
    "possible_next_actions", "possible_next_actions_mask", "action_index", "reward", "terminal",
    "time_diff", "propensity", "mdp_id", "sequence_number",
]  # fmt: skip


def _load(path: Path, tmp: Path, kind: str = "dqn", **extra: Any) -> Workflow:
    settings: dict[str, Any] = {
        "training_data_path": str(path),
        "model_output_path": str(tmp / "out"),
        "use_gpu": False,
        "use_all_avail_gpus": False,
        **extra,
    }
    if kind == "dqn":
        cfg: Any = DQNWorkflowConfig(actions=ACTIONS, **settings)
    else:
        cfg = ParametricDQNWorkflowConfig(**settings)
    wf = Workflow(kind, cfg, DistContext.single("cpu"))
    wf.load_training_data()
    return wf


def _ids(data: list[dict[str, Any]], column: str) -> list[str]:
    return sorted({k for r in data for k in map_keys(r[column])}, key=int)


def _rows_of_parts(path: Path, world: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows of the `world` ranks' shards end to end (as the reader gives them)."""
    parts = [read_shard(path, r, world).to_pylist() for r in range(world)]
    return [r for p in parts for r in p], [len(p) for p in parts]


def _normalized(raw: dict[str, np.ndarray], pre: dict[str, Preprocessor]) -> dict[str, Any]:
    """`raw` (oracle arrays, NaN = absent) as training tensors: features through the
    preprocessors' `forward`, the rest as they are."""
    out: dict[str, Any] = {}
    for name, values in raw.items():
        if values.dtype != np.float32 or "mask" in name or values.ndim == 1:
            out[name] = torch.from_numpy(values)
            continue
        p = pre["state"] if name in ("state", "next_state") else pre["action"]
        flat = torch.from_numpy(values.reshape(-1, values.shape[-1]))
        y = p(torch.nan_to_num(flat), (~torch.isnan(flat)).float())
        out[name] = y.reshape(*values.shape[:-1], p.out_dim)
    return out


def _assert_tensors(got: Any, want: dict[str, Any], order: list[str]) -> None:
    assert list(got.keys()) == order
    for name in order:
        t = got[name]
        assert t.dtype == want[name].dtype and t.shape == want[name].shape, name
        torch.testing.assert_close(t, want[name], rtol=0, atol=1e-6, msg=name)


def _fit(raw: np.ndarray, ids: list[str], action: bool = False) -> dict[str, Any]:
    rows_with_data = raw[~np.isnan(raw).all(axis=1)].astype(np.float64)
    return fit_normalization(rows_with_data, ids, action=action)


@pytest.mark.parametrize("emulate", [None, "3"])
@pytest.mark.parametrize("sample", [150, 10_000])  # fewer than the rows: sampled
def test_training_tensors_hold_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulate: str | None, sample: int
) -> None:
    if emulate:
        monkeypatch.setenv(EMULATE_ENV, emulate)
    path = write(tmp_path / "t.parquet", rows(400, late_feature_at=250), 64)
    wf = _load(path, tmp_path, normalization_sample_size=sample)
    data, sizes = _rows_of_parts(path, int(emulate or 1))
    ids = _ids(data, "state_features")
    assert wf.space.state_ids == ids and "11" in ids and "7" not in ids  # numeric order
    assert wf.space.actions == ACTIONS
    assert wf.emulated_shards == (sizes if emulate else None)
    raw = expected_dqn(data, ids)
    if sample >= len(data):  # the whole shard is the sample
        assert wf.norm == {"state": _fit(raw["state"], ids)}
    _assert_tensors(wf.train_data, _normalized(raw, wf.pre), DQN_ORDER)
    assert set(wf.ingest_timings) >= {"read", "validate", "tensorize", "fit", "normalize"}


@pytest.mark.parametrize(("emulate", "max_candidates"), [(None, None), ("3", None), (None, 9)])
def test_parametric_training_tensors_hold_the_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulate: str | None, max_candidates: int | None
) -> None:
    if emulate:
        monkeypatch.setenv(EMULATE_ENV, emulate)
    data = parametric_rows(400, late_feature_at=250, long_lists_at=300)
    path = write_parametric(tmp_path / "t.parquet", data, 64)
    wf = _load(
        path, tmp_path, "parametric_dqn", max_candidates=max_candidates,
        normalization_sample_size=10_000,
    )  # fmt: skip
    data, sizes = _rows_of_parts(path, int(emulate or 1))
    state_ids, action_ids = _ids(data, "state_features"), _ids(data, "action")
    k = max_candidates or 6
    assert wf.space.to_json() == {
        "state_feature_ids": state_ids, "action_feature_ids": action_ids,
        "max_candidates": k,
    }  # fmt: skip
    assert "11" in state_ids and "150" not in action_ids
    assert wf.emulated_shards == (sizes if emulate else None)
    raw = expected_parametric(data, state_ids, action_ids, k)
    cands = raw["possible_actions"].reshape(-1, len(action_ids))
    assert wf.norm == {
        "state": _fit(raw["state"], state_ids),
        "action": _fit(cands, action_ids, action=True),
    }
    _assert_tensors(wf.train_data, _normalized(raw, wf.pre), PARAMETRIC_ORDER)


# ----------------------------------------------------------------------------- eval tables


def test_eval_table_in_the_training_space(tmp_path: Path) -> None:
    """An eval table is ingested in the training run's feature space and normalized by its
    preprocessors: features the training data never had are ignored; JSON Lines work."""
    train = write(tmp_path / "t.parquet", rows(200), 50)
    data = rows(60, seed=4)
    for r in data[:10]:
        r["state_features"]["99"] = 5.0  # never in the training data
    data[20]["next_state_features"] = {"11": 1.0}
    path = tmp_path / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    wf = _load(train, tmp_path, eval_data_path=str(path))
    got = wf._eval_tensors()
    assert "99" not in wf.space.state_ids
    raw = expected_dqn(data, wf.space.state_ids)
    _assert_tensors(got, _normalized(raw, wf.pre), DQN_ORDER)


def test_eval_table_errors_name_the_eval_file(tmp_path: Path) -> None:
    train = write(tmp_path / "t.parquet", rows(200), 50)
    data = rows(40)
    data[13]["action"] = "jump"
    data[17]["next_action"] = "fly"
    data[25]["reward"] = float("nan")
    bad = write(tmp_path / "eval.parquet", data, 20)
    wf = _load(train, tmp_path, eval_data_path=str(bad))
    with pytest.raises(DataError) as err:
        wf._eval_tensors()
    lines = str(err.value).splitlines()
    assert any(
        ln.startswith(f"{bad}: column 'action': 1 bad row: unknown action name")
        and "(e.g. row 13: 'jump')" in ln
        for ln in lines
    ), lines
    assert any(f"{bad}: column 'next_action': 1 bad row" in ln for ln in lines), lines
    assert any(f"{bad}: column 'reward': 1 bad row" in ln and "row 25" in ln for ln in lines)
    # With drop_bad_rows the eval table's bad rows are dropped too.
    wf = _load(train, tmp_path, eval_data_path=str(bad), drop_bad_rows=True)
    good = [r for i, r in enumerate(data) if i not in (13, 17, 25)]
    got = wf._eval_tensors()
    _assert_tensors(got, _normalized(expected_dqn(good, wf.space.state_ids), wf.pre), DQN_ORDER)


def test_parametric_eval_table_candidates(tmp_path: Path) -> None:
    """Eval candidates are padded to the training K, action features the training actions
    never had are ignored, and a longer candidate list than K is an error naming the file
    (the eval rows cannot be scored in the training run's K slots)."""
    train = write_parametric(tmp_path / "t.parquet", parametric_rows(100), 20)  # K = 3
    data = parametric_rows(40, seed=3)
    data[5]["possible_actions"][0]["777"] = 1.0
    data[6]["action"]["777"] = 2.0
    short = write_parametric(tmp_path / "e.parquet", [r for r in data if r["possible_actions"]], 20)
    wf = _load(train, tmp_path, "parametric_dqn", eval_data_path=str(short))
    space = wf.space
    assert space.max_candidates == 3 and "777" not in space.action_ids
    want = [r for r in data if r["possible_actions"]]
    raw = expected_parametric(want, space.state_ids, space.action_ids, 3)
    _assert_tensors(wf._eval_tensors(), _normalized(raw, wf.pre), PARAMETRIC_ORDER)

    long = write_parametric(tmp_path / "l.parquet", parametric_rows(60, long_lists_at=30), 20)
    wf = _load(train, tmp_path, "parametric_dqn", eval_data_path=str(long))
    with pytest.raises(DataError, match=rf"^{long}: 2 rows have more than max_candidates=3"):
        wf._eval_tensors()
