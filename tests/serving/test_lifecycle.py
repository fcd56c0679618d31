"""The server over its life: concurrent requests batched into fewer model calls, a new
model hot-reloaded (a broken one refused while the old one keeps serving), and SIGTERM
under load answering and logging every request it took."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

from tests.serving.conftest import meta


def _install(src: Path, dest: Path, meta_json: dict | None = None) -> None:
    """What a trainer does: each file written beside, then renamed over the served one."""
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / ".model.pt2.tmp"
    shutil.copyfile(src / "model.pt2", tmp)
    os.replace(tmp, dest / "model.pt2")
    tmp = dest / ".model_meta.json.tmp"
    tmp.write_text(json.dumps(meta_json if meta_json is not None else meta(src)))
    os.replace(tmp, dest / "model_meta.json")


def _concurrently(server, bodies: list[dict]) -> list[tuple[int, dict]]:
    """Sends every body at once, each from its own thread and connection."""
    out: list[tuple[int, dict]] = [(0, {})] * len(bodies)
    start = threading.Barrier(len(bodies))

    def send(i: int) -> None:
        start.wait(timeout=30)
        out[i] = server.act(bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


def test_concurrent_requests_share_model_calls(dqn_model: Path, serve) -> None:
    # A generous wait: on a busy machine the 16 requests still meet in a batch or two.
    server = serve(dqn_model, "--max-wait-ms", "500", "--max-batch", "64")
    states = [{f: 0.01 * i for f in meta(dqn_model)["state_feature_ids"]} for i in range(16)]
    answers = _concurrently(server, [{"state_features": s} for s in states])
    assert [status for status, _ in answers] == [200] * 16, answers
    stats = server.request("GET", "/v1/model")[1]["stats"]
    assert stats["decisions"] == 16
    assert stats["model_calls"] < 16, stats
    # Batched or not, each answer is its own state's greedy action.
    from reagent_lite.serving.policy import Policy

    with Policy(dqn_model) as alone:
        assert [a["action"] for _, a in answers] == [alone.act(s).action for s in states]


def test_a_new_model_is_hot_reloaded_and_a_broken_one_refused(
    dqn_model: Path, dqn_model_b: Path, serve, tmp_path: Path
) -> None:
    served = tmp_path / "served"
    _install(dqn_model, served)
    server = serve(served, "--reload-poll-s", "0.2")
    state = {"state_features": {f: 0.3 for f in meta(dqn_model)["state_feature_ids"]}}
    assert server.act(state)[1]["model_id"] == meta(dqn_model)["model_sha256"]

    _install(dqn_model_b, served)
    new_id = meta(dqn_model_b)["model_sha256"]
    deadline = time.monotonic() + 60
    while server.request("GET", "/v1/model")[1]["model_id"] != new_id:
        assert time.monotonic() < deadline, "the new model was not loaded within 60 s"
        time.sleep(0.2)
    assert server.act(state)[1]["model_id"] == new_id

    # A meta that does not describe the model.pt2 beside it: refused, the old one serves.
    broken = {**meta(dqn_model_b), "model_sha256": "0" * 64}
    _install(dqn_model, served, broken)
    status, body = server.request("POST", "/v1/reload")
    assert status == 409 and "still serving the old one" in body["error"], body
    assert "is not the model" in body["error"]
    time.sleep(1.0)  # the watcher sees the same files and refuses them too
    status, answer = server.act(state)
    assert status == 200 and answer["model_id"] == new_id
    code, err = server.stop()
    assert code == 0 and "new model refused" in err and "Traceback" not in err


def test_sigterm_under_load_answers_and_logs_every_request(
    dqn_model: Path, serve, tmp_path: Path
) -> None:
    log_dir = tmp_path / "log"
    server = serve(dqn_model, "--exploration", "epsilon:0.3", "--flush-interval-s", "0.2",
                   log_dir=log_dir)  # fmt: skip
    body = json.dumps({"state_features": {f: 0.2 for f in meta(dqn_model)["state_feature_ids"]}})
    answered: list[str] = []
    refused: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
        headers = {"Content-Type": "application/json"}
        while True:
            try:  # keep-alive: one connection per client, as a load balancer holds them
                conn.request("POST", "/v1/act", body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                return  # the server stopped taking requests
            with lock:
                if resp.status == 200:
                    answered.append(json.loads(data)["decision_id"])
                else:
                    refused.append(resp.status)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(answered) < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(answered) >= 20, "the server answered too few requests to test a drain"
    code, err = server.stop(timeout=90)
    for t in threads:
        t.join(timeout=30)
    assert code == 0, err[-3000:]
    assert not refused and "Traceback" not in err
    logged = []
    for part in sorted(log_dir.glob("part-*.parquet")):
        logged += pq.read_table(part, columns=["decision_id"]).column(0).to_pylist()
    assert len(logged) == len(set(logged))
    assert set(logged) == set(answered), (len(logged), len(answered))
