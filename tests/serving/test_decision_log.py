"""The decision log in process: rows, the feedback window, unmatched feedback, rotation,
recovery of the journal, and concurrent writers."""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from reagent_lite.serving.decision_log import (
    DecisionLog,
    DecisionRecord,
    LogUnavailable,
    RecordRefused,
)


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
    assert not list((tmp_path / "_journal").glob("part-*"))


def test_late_feedback_joined_within_the_window_then_unmatched(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn", flush_interval_s=0.05, feedback_window_s=4.0)
    log.record(dqn_record(0))
    log.record(dqn_record(1))
    time.sleep(0.5)  # several flushes: both held (and journaled), neither written yet
    assert log.stats()["pending"] == 2
    assert log.feedback("d0", 1.5)  # late, but within the window
    deadline = time.monotonic() + 30
    while log.stats()["feedback_missing"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not log.feedback("d1", 3.0)  # its window ended: written without it
    log.close()
    got = rows(tmp_path)
    assert [(r["decision_id"], r["reward"], r["feedback_missing"]) for r in got] == [
        ("d0", 1.5, False), ("d1", 0.0, True)]  # fmt: skip
    stats = log.stats()
    assert (stats["feedback_joined"], stats["feedback_missing"]) == (1, 1)
    assert stats["feedback_unmatched"] == 1


def test_second_feedback_for_a_decision_is_unmatched(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn")
    log.record(dqn_record(0))
    assert log.feedback("d0", 1.0)
    assert not log.feedback("d0", 2.0)
    log.close()
    assert [r["reward"] for r in rows(tmp_path)] == [1.0]
    assert log.stats()["feedback_unmatched"] == 1


def test_parts_rotate_at_part_max_rows(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn", flush_interval_s=60.0, part_max_rows=4)
    for i in range(10):
        log.record(dqn_record(i))
        log.feedback(f"d{i}", 1.0)
    log.close()
    parts = sorted(tmp_path.glob("part-*.parquet"))
    assert [pq.read_metadata(p).num_rows for p in parts] == [4, 4, 2]
    assert all(re.fullmatch(r"part-\d{8}T\d{6}\.\d{6}Z-\d{6}\.parquet", p.name) for p in parts)
    assert log.stats()["parts"] == 3
    assert len(rows(tmp_path)) == 10


def test_a_full_part_is_written_before_the_interval(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn", flush_interval_s=600.0, part_max_rows=5)
    for i in range(5):
        log.record(dqn_record(i))
        log.feedback(f"d{i}", 1.0)
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob("part-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list(tmp_path.glob("part-*"))) == 1
    log.close()


def test_concurrent_record_and_feedback(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn", flush_interval_s=0.01, part_max_rows=50)
    threads, per_thread = 8, 150

    def writer(t: int) -> None:
        for k in range(per_thread):
            i = t * per_thread + k
            log.record(dqn_record(i, mdp=f"ep{t}"))
            if i % 3:
                assert log.feedback(f"d{i}", float(i))

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    log.close()
    got = rows(tmp_path)
    n = threads * per_thread
    assert sorted(int(str(r["decision_id"])[1:]) for r in got) == list(range(n))
    for r in got:
        i = int(str(r["decision_id"])[1:])
        assert (r["reward"], r["feedback_missing"]) == ((float(i), False) if i % 3 else (0.0, True))
    stats = log.stats()
    assert stats["decisions"] == n and stats["pending"] == 0
    assert stats["feedback_joined"] == sum(1 for i in range(n) if i % 3)
    assert not list((tmp_path / "_journal").glob("part-*"))


def test_bad_records_are_refused_naming_the_field(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn")
    with pytest.raises(RecordRefused, match=r"action_probability is 0\.0; expected a number in"):
        log.record(dataclasses.replace(dqn_record(0), action_probability=0.0))
    with pytest.raises(RecordRefused, match="action names"):
        log.record(dataclasses.replace(dqn_record(0), action={1: 1.0}))
    with pytest.raises(RecordRefused, match=r"state_features has 3: nan; expected non-neg"):
        log.record(dataclasses.replace(dqn_record(0), state_features={3: math.nan}))
    with pytest.raises(RecordRefused, match=r"state_features has -1: 1.0"):
        log.record(dataclasses.replace(dqn_record(0), state_features={-1: 1.0}))
    log.record(dataclasses.replace(dqn_record(0), state_features={np.int64(2): np.float32(1)}))
    with pytest.raises(RecordRefused, match="'d0' is already recorded"):
        log.record(dqn_record(0))
    log.close()
    with pytest.raises(LogUnavailable, match="closed"):
        log.record(dqn_record(1))


def test_an_unwritable_log_dir_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(LogUnavailable) as err:
        DecisionLog(tmp_path / "file" / "log", "dqn")
    assert str(tmp_path / "file") in str(err.value) and "Not a directory" in str(err.value)


def test_a_repeated_step_is_refused_while_its_decision_is_held(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn")
    log.record(dqn_record(0))
    retry = dataclasses.replace(dqn_record(0), decision_id="retry")
    with pytest.raises(RecordRefused, match="mdp_id 'ep', sequence_number 0: a decision of"):
        log.record(retry)
    assert log.feedback("d0", 1.0)
    log.record(dataclasses.replace(dqn_record(1), decision_id="next"))
    log.close()
    assert [r["decision_id"] for r in rows(tmp_path)] == ["d0", "next"]


def test_one_log_per_directory(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn")
    with pytest.raises(LogUnavailable, match="another decision log writes there"):
        DecisionLog(tmp_path, "dqn")
    log.close()
    DecisionLog(tmp_path, "dqn").close()  # free again once closed


def test_an_answered_decisions_deadline_does_not_expire_a_later_one_of_its_id(
    tmp_path: Path,
) -> None:
    log = DecisionLog(tmp_path, "dqn", flush_interval_s=600.0, feedback_window_s=60.0)
    log.record(dqn_record(0, t=time.time() - 120))  # its deadline has passed...
    assert log.feedback("d0", 1.0)  # ...but it was answered
    log.record(dataclasses.replace(dqn_record(1), decision_id="d0"))  # the id used again
    log.flush()
    assert log.feedback("d0", 2.0)
    log.close()
    assert [r["reward"] for r in rows(tmp_path)] == [1.0, 2.0]


def test_a_parametric_candidate_with_a_bad_value_is_refused(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "parametric_dqn")
    good = {5: 1.0}
    rec = dataclasses.replace(dqn_record(0), action=good, possible_actions=[good, {5: math.inf}])
    with pytest.raises(RecordRefused, match=r"possible_actions\[1\] has 5: inf"):
        log.record(rec)
    log.record(dataclasses.replace(rec, possible_actions=[good]))  # one candidate
    log.close()
    assert rows(tmp_path)[0]["possible_actions"] == [[("5", 1.0)]]


def test_a_directory_of_another_kinds_parts_is_refused(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path, "dqn")
    log.record(dqn_record(0))
    log.close()
    with pytest.raises(LogUnavailable, match=r"holds rows of another kind or format \(action: "):
        DecisionLog(tmp_path, "parametric_dqn")
    DecisionLog(tmp_path, "dqn").close()  # the same kind goes on (and the lock was let go)


def test_values_of_the_wrong_type_are_refused_before_they_reach_the_writer(
    tmp_path: Path,
) -> None:
    log = DecisionLog(tmp_path, "dqn", flush_interval_s=0.02)
    with pytest.raises(RecordRefused, match="mdp_id is 7; expected a str"):
        log.record(dataclasses.replace(dqn_record(0), mdp_id=7))  # type: ignore[arg-type]
    with pytest.raises(RecordRefused, match=r"sequence_number is 1\.5; expected a finite number"):
        log.record(dataclasses.replace(dqn_record(0), sequence_number=1.5))  # type: ignore[arg-type]
    with pytest.raises(RecordRefused, match=r"state_features has 1: '2'"):
        log.record(dataclasses.replace(dqn_record(0), state_features={1: "2"}))  # type: ignore[dict-item]
    with pytest.raises(RecordRefused, match="possible_actions a <class 'str'>; expected a"):
        log.record(dataclasses.replace(dqn_record(0), possible_actions="ab"))  # type: ignore[arg-type]
    log.record(dataclasses.replace(dqn_record(0), sequence_number=np.int64(0)))
    with pytest.raises(RecordRefused, match="feedback for 'd0': reward is nan; expected a finite"):
        log.feedback("d0", math.nan)
    with pytest.raises(RecordRefused, match=r"metrics\['clicks'\] is 'x'; expected a finite"):
        log.feedback("d0", 1.0, {"clicks": "x"})  # type: ignore[dict-item]
    assert log.feedback("d0", 1.0, {"clicks": np.float32(2)})
    log.record(dqn_record(1))
    log.close()  # every row written: no bad value held up the writer
    assert [(r["decision_id"], r["metrics"]) for r in rows(tmp_path)] == [
        ("d0", [("clicks", 2.0)]), ("d1", [])]  # fmt: skip
