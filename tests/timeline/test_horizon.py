"""Horizon's own CartPole step logs (excerpts of its sample datasets, unchanged lines; see
data/NOTICE) go through the timeline as Horizon's Spark timeline took them, and train.

Horizon logged deterministic policies with a null propensity, and marked an episode's end
with an absorbing step: null action, no possible actions, reward 0. Its timeline paired
the step before with it (next state = the absorbing state, null next action, empty
possible next actions: a terminal transition) and wrote no transition for the absorbing
step itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import reagent_lite
from tests.conftest import run_module

DATA = Path(__file__).parent / "data"
DISCRETE = DATA / "horizon_discrete_pre_timeline.jsonl"
PARAMETRIC = DATA / "horizon_parametric_pre_timeline.jsonl"
DISCRETE_POST = DATA / "horizon_discrete_post_timeline_excerpt.jsonl"


def timeline(src: Path, tmp_path: Path, *flags: str) -> tuple[int, str]:
    result = run_module(
        "workflows.timeline", "--input", str(src),
        "--output", str(tmp_path / "data/train.parquet"),
        "--eval-output", str(tmp_path / "data/eval.parquet"),
        "--eval-fraction", "0.3", "--threads", "1", *flags, timeout=120,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    tables = [pq.read_table(tmp_path / f"data/{side}.parquet") for side in ("train", "eval")]
    assert all(t.num_rows for t in tables), "both sides hold episodes"
    return pa.concat_tables(tables).to_pylist()


def train(tmp_path: Path, kind: str) -> reagent_lite.RunResult:
    cfg: dict[str, Any] = {
        "workflow": kind,
        "training_data_path": str(tmp_path / "data/train.parquet"),
        "eval_data_path": str(tmp_path / "data/eval.parquet"),
        "model_output_path": str(tmp_path / "model"),
        "use_gpu": False,
        "epochs": 1,
        "seed": 0,
        "training": {
            "layers": [-1, 16, -1],
            "activations": ["relu", "linear"],
            "minibatch_size": 16,
            "steps_per_epoch": 3,
        },
        "evaluation": {"bootstrap_samples": 5},
    }
    if kind == "dqn":
        cfg["actions"] = ["0", "1"]
        cfg["evaluation"]["online_episodes"] = 0
    return reagent_lite.train(cfg)


def test_horizons_discrete_log_gives_horizons_transitions_and_trains(tmp_path) -> None:
    steps = [json.loads(line) for line in DISCRETE.read_text().splitlines()]
    absorbing = [s for s in steps if s["action"] is None]
    assert len(absorbing) == 8 and all(s["possible_actions"] == [] for s in absorbing)
    rc, text = timeline(DISCRETE, tmp_path)  # every propensity is null: a bad row by default
    assert rc == 3 and "'action_probability': 124 rows are null" in text, text
    assert "--null-propensity one" in text and "Traceback" not in text

    rc, text = timeline(DISCRETE, tmp_path, "--null-propensity", "one")
    assert rc == 0, text
    assert "124 rows with a null action_probability read as 1.0 (--null-propensity one" in text
    assert "8 absorbing steps (null action, no possible actions, reward 0" in text
    got = {(r["mdp_id"], r["sequence_number"]): r for r in rows(tmp_path)}
    assert len(got) == len(steps) - 8 and all(r["action_probability"] == 1.0 for r in got.values())
    # Horizon's timeline wrote the same transitions, value for value (its states were
    # float32): every episode here ends in an absorbing step.
    want = [json.loads(line) for line in DISCRETE_POST.read_text().splitlines()]
    assert {(w["mdp_id"], w["sequence_number"]) for w in want} == set(got)
    for w in want:
        r = got[(w["mdp_id"], w["sequence_number"])]
        for key in ("action", "reward", "next_action", "possible_next_actions", "time_diff"):
            assert r[key] == w[key], (w, key)
        ours = dict(r["next_state_features"])
        assert ours.keys() == w["next_state_features"].keys()
        for fid, value in w["next_state_features"].items():
            assert np.float32(ours[fid]) == np.float32(value)
    assert sum(r["possible_next_actions"] == [] for r in got.values()) == 8

    result = train(tmp_path, "dqn")
    assert result.model_path.is_file()


def test_horizons_parametric_log_goes_through_and_trains(tmp_path) -> None:
    rc, text = timeline(PARAMETRIC, tmp_path)
    assert rc == 0, text
    got = rows(tmp_path)
    assert len(got) == len(PARAMETRIC.read_text().splitlines())
    result = train(tmp_path, "parametric_dqn")
    assert result.model_path.is_file()


def test_a_parquet_log_whose_propensities_are_all_null_takes_the_same_choice(tmp_path) -> None:
    """Horizon's log written to Parquet by Arrow: the propensity column has the null type."""
    steps = [json.loads(line) for line in DISCRETE.read_text().splitlines()]
    for step in steps:
        step["state_features"] = list(step["state_features"].items())
    fmap = pa.map_(pa.string(), pa.float64())
    schema = pa.schema(
        [("mdp_id", pa.string()), ("sequence_number", pa.int64()), ("state_features", fmap),
         ("action", pa.string()), ("reward", pa.float64()),
         ("possible_actions", pa.list_(pa.string())), ("action_probability", pa.null())]
    )  # fmt: skip
    src = tmp_path / "steps.parquet"
    pq.write_table(pa.Table.from_pylist(steps, schema), src)
    rc, text = timeline(src, tmp_path)
    assert rc == 3 and "'action_probability': 124 rows are null" in text, text
    rc, text = timeline(src, tmp_path, "--null-propensity", "one")
    assert rc == 0, text
    got = rows(tmp_path)
    assert len(got) == 124 and {r["action_probability"] for r in got} == {1.0}
