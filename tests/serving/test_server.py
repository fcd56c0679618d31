"""`reagent-lite serve` as a client sees it: a real server subprocess on a free port,
spoken to over HTTP (standard library client), its decision log read back as Parquet."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.serving.conftest import meta


def logged_rows(log_dir: Path) -> list[dict]:
    """Every row of the log's final parts (what the timeline reads)."""
    rows: list[dict] = []
    for part in sorted(log_dir.glob("part-*.parquet")):
        rows += pq.read_table(part).to_pylist()
    return rows


def test_dqn_act_feedback_model_health_and_the_log(dqn_model: Path, serve, tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    server = serve(dqn_model, "--exploration", "epsilon:0.2", "--seed", "0", log_dir=log_dir)
    state = {f: 0.1 for f in meta(dqn_model)["state_feature_ids"]}
    status, first = server.act({"state_features": state})
    assert status == 200, first
    assert first["model_id"] == meta(dqn_model)["model_sha256"]
    assert sorted(first["probabilities"]) == pytest.approx([0.1, 0.9])
    assert first["propensity"] == first["probabilities"][int(first["action"])]
    status, second = server.act({"state_features": state, "mdp_id": first["mdp_id"],
                                 "possible_actions": ["1"]})  # fmt: skip
    assert status == 200 and second["action"] == "1" and second["probabilities"] == [1.0]
    assert second["sequence_number"] == 1
    assert server.request("POST", "/v1/feedback",
                          {"decision_id": first["decision_id"], "reward": 2.5,
                           "metrics": {"clicks": 1.0}})[0] == 200  # fmt: skip
    status, body = server.request("POST", "/v1/feedback", {"decision_id": "nope", "reward": 1})
    assert status == 404 and "'nope'" in body["error"]
    status, health = server.request("GET", "/v1/health")
    assert status == 200 and health["status"] == "ok"
    status, model = server.request("GET", "/v1/model")
    assert model["kind"] == "dqn" and model["actions"] == meta(dqn_model)["actions"]
    assert model["exploration"] == "epsilon:0.2" and model["stats"]["decisions"] == 2
    assert model["state_feature_ids"] == meta(dqn_model)["state_feature_ids"]

    code, err = server.stop()
    assert code == 0, err[-2000:]
    rows = {r["decision_id"]: r for r in logged_rows(log_dir)}
    assert set(rows) == {first["decision_id"], second["decision_id"]}
    one = rows[first["decision_id"]]
    assert one["reward"] == 2.5 and one["action"] == first["action"]
    assert one["action_probability"] == pytest.approx(first["propensity"])
    assert one["possible_actions"] == meta(dqn_model)["actions"]
    assert rows[second["decision_id"]]["possible_actions"] == ["1"]


def test_parametric_one_and_many_candidates(parametric_model: Path, serve) -> None:
    server = serve(parametric_model, "--exploration", "softmax:1.0")
    ids = meta(parametric_model)["action_feature_ids"]
    state = {f: 0.5 for f in meta(parametric_model)["state_feature_ids"]}
    cands = [{f: float(i) for f in ids} for i in range(4)]
    status, many = server.act({"state_features": state, "possible_actions": cands})
    assert status == 200, many
    assert len(many["probabilities"]) == 4 and math.isclose(sum(many["probabilities"]), 1.0)
    assert many["action"] in range(4)
    status, one = server.act({"state_features": state, "possible_actions": cands[:1]})
    assert status == 200 and one["action"] == 0 and one["probabilities"] == [1.0]
    status, body = server.act({"state_features": state})
    assert status == 422 and body["field"] == "possible_actions"
    assert "required by a parametric_dqn model" in body["error"]


BAD_REQUESTS = [
    ({"state_features": {"0": 1}, "possible_actions": ["7"]},
     "possible_actions[0]: unknown action '7' (expected one of"),
    ({"state_features": {"0": 1}, "possible_actions": []},
     "possible_actions: Value should have at least 1 item"),
    ({"state_features": {"zero": 1}}, "state_features: feature id 'zero' is not a string of"),
    ({"state_features": {"0": "high"}}, "state_features.0: Input should be a valid number"),
    ({"state_features": {"0": float("nan")}}, "state_features.0: Input should be a finite number"),
    ({"state_features": [1, 2]}, "state_features: Input should be a valid dictionary"),
    ({}, "state_features: Field required"),
    ({"state_features": {"0": 1}, "sequence_number": 1.5}, "sequence_number: Input should"),
    ({"state_features": {"0": 1}, "colour": "red"}, "colour: Extra inputs are not permitted"),
    ({"state_features": {"0": 1}, "possible_actions": [{"0": 1.0}]},
     "possible_actions: a dqn model takes action names"),
    ({"state_features": {"424242": 1}}, "state_features: holds none of the model's state"),
]  # fmt: skip


def test_bad_requests_are_422_naming_the_field(dqn_model: Path, serve) -> None:
    server = serve(dqn_model)
    for body, expected in BAD_REQUESTS:
        status, answer = server.act(body)  # (json.dumps writes NaN as the NaN literal)
        assert status == 422, (body, answer)
        assert expected in answer["error"], (expected, answer["error"])
        assert "Traceback" not in str(answer)
    # Not JSON at all.
    status, answer = server.request("POST", "/v1/act", "{bad")
    assert status == 422 and "Traceback" not in str(answer)
    status, answer = server.request("POST", "/v1/feedback", {"decision_id": "x", "reward": "y"})
    assert status == 422 and "reward: Input should be a valid number" in answer["error"]
    # A step of an episode answered twice while the first still waits for its feedback:
    # the timeline would refuse the log, so the second is a bad request.
    step = {"state_features": {"0": 1}, "mdp_id": "dup", "sequence_number": 0}
    assert server.act(step)[0] == 200
    status, answer = server.act(step)
    assert status == 422 and "'dup'" in answer["error"], answer
    # The server still answers after all that.
    assert server.act({"state_features": {"0": 1}})[0] == 200


def test_a_log_that_cannot_be_written_is_503_and_the_exit_says_why(
    dqn_model: Path, serve, tmp_path: Path
) -> None:
    log_dir = tmp_path / "log"
    server = serve(dqn_model, "--flush-interval-s", "0.1", log_dir=log_dir)
    state = {"state_features": {f: 0.0 for f in meta(dqn_model)["state_feature_ids"]}}
    assert server.act(state)[0] == 200
    # The log directory becomes a file: every write under it fails (ENOTDIR), root or not.
    shutil.rmtree(log_dir)
    log_dir.write_text("")
    deadline = time.monotonic() + 30
    while (answer := server.act(state))[0] == 200:
        assert time.monotonic() < deadline, "no 503 within 30 s of the log going away"
        time.sleep(0.05)
    status, body = answer
    assert status == 503, body
    assert f"decision log {log_dir}: cannot write" in body["error"]
    assert server.request("GET", "/v1/health")[0] == 200  # up, and saying why it refuses
    code, err = server.stop()
    assert code == 2 and f"decision log {log_dir}: cannot write" in err, err[-2000:]
    assert "Traceback" not in err
