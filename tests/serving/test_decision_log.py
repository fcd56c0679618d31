"""The decision log in process: rows, the feedback window, unmatched feedback, rotation,
recovery of the journal, and concurrent writers."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq

from reagent_lite.serving.decision_log import DecisionLog, DecisionRecord


def dqn_record(i: int, t: float | None = None, mdp: str = "ep") -> DecisionRecord:
    return DecisionRecord(
        decision_id=f"d{i}",
        mdp_id=mdp,
        sequence_number=i,
        state_features={0: float(i), 3: 0.5},
        action="left",
        possible_actions=["left", "right"],
        action_probability=0.25,
        model_id="m" * 64,
        time_s=time.time() if t is None else t,
    )


def rows(log_dir: Path) -> list[dict[str, object]]:
    return sorted(pq.read_table(log_dir).to_pylist(), key=lambda r: str(r["decision_id"]))


def test_feedback_joined_and_missing_rows(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn", flush_interval_s=0.05)
    for i in range(3):
        log.record(dqn_record(i))
    assert log.feedback("d1", 2.5, {"clicks": 1.0})
    assert not log.feedback("nope", 1.0)
    log.close()
    log.close()  # idempotent
    got = rows(tmp_path)
    assert [r["decision_id"] for r in got] == ["d0", "d1", "d2"]
    assert [(r["reward"], r["feedback_missing"]) for r in got] == [
        (0.0, True), (2.5, False), (0.0, True)]  # fmt: skip
    assert got[1]["metrics"] == [("clicks", 1.0)]
    assert got[1]["state_features"] == [("0", 1.0), ("3", 0.5)]
    assert got[1]["action_probability"] == 0.25
    assert dict(log.stats()) == {
        "decisions": 3, "feedback_joined": 1, "feedback_unmatched": 1,
        "feedback_missing": 2, "parts": 1, "recovered": 0, "pending": 0}  # fmt: skip
    assert not list((tmp_path / "_journal").iterdir())
