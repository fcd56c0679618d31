"""The proof that the decision log closes the loop: decisions and feedback written through
`DecisionLog` go through the real `reagent-lite timeline` unchanged, and a run trains on the
table it writes (dqn and parametric_dqn, one-candidate rows included)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig, config_from_dict
from reagent_lite.distributed.context import DistContext
from reagent_lite.serving.decision_log import DecisionLog, DecisionRecord
from reagent_lite.training.loop import Workflow
from tests.conftest import run_module

ACTIONS = ["left", "right", "stay"]


def _decisions(kind: str, episodes: int, steps: int) -> list[DecisionRecord]:
    rng = random.Random(0)
    out = []
    for ep in range(episodes):
        for s in range(steps):
            state = {0: rng.random(), 1: float(s), 7: rng.choice([0.0, 1.0])}
            possible: list[Any]
            if kind == "dqn":
                possible = ACTIONS[: 1 + (ep + s) % 3]  # masked actions, one of them alone
            else:  # one, two or three candidates, each a feature map
                possible = [{20: rng.random(), 21: float(c)} for c in range(1 + (ep + s) % 3)]
            chosen = rng.randrange(len(possible))
            out.append(
                DecisionRecord(
                    decision_id=f"{kind}-{ep}-{s}",
                    mdp_id=f"user{ep}",
                    sequence_number=10 * s,  # gaps: the timeline's time_diff
                    state_features=state,
                    action=possible[chosen],
                    possible_actions=possible,
                    action_probability=1.0 / len(possible),
                    model_id="ab" * 32,
                    time_s=time.time(),
                )
            )
    return out


@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_timeline_reads_the_log_and_a_run_trains_on_it(tmp_path: Path, kind: str) -> None:
    log_dir = tmp_path / "log"
    log = DecisionLog(log_dir, kind, flush_interval_s=0.05, part_max_rows=16)
    decisions = _decisions(kind, episodes=24, steps=5)
    for i, rec in enumerate(decisions):
        log.record(rec)
        if i % 5 != 4:  # every fifth decision never hears back
            assert log.feedback(rec.decision_id, float(i % 3), {"clicks": float(i % 2)})
    log.close()
    assert len(list(log_dir.glob("part-*.parquet"))) >= 8

    table, eval_table = tmp_path / "train.parquet", tmp_path / "eval.parquet"
    done = run_module("reagent_lite.console", "timeline", "--input", str(log_dir),
                      "--output", str(table), "--eval-output", str(eval_table),
                      "--eval-fraction", "0.3", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = {r["decision_id"]: r for t in (table, eval_table) for r in pq.read_table(t).to_pylist()}
    assert len(got) == len(decisions)
    for i, rec in enumerate(decisions):
        row = got[rec.decision_id]
        assert row["action_probability"] == rec.action_probability
        assert row["reward"] == (0.0 if i % 5 == 4 else float(i % 3))
        assert row["feedback_missing"] == (i % 5 == 4)
        assert row["model_id"] == rec.model_id
        assert row["decision_time"].timestamp() == pytest.approx(rec.time_s, abs=1e-5)
        assert dict(row["metrics"]) == ({} if i % 5 == 4 else {"clicks": float(i % 2)})
        assert row["time_diff"] == 10 or row["possible_next_actions"] == []

    cfg: dict[str, Any] = {
        "training_data_path": str(table),
        "eval_data_path": str(eval_table),
        "model_output_path": str(tmp_path / "out"),
        "use_gpu": False,
        "epochs": 2,
        "training": {"layers": [-1, 8, -1], "activations": ["relu", "linear"],
                     "minibatch_size": 16},
        "evaluation": {"calc_cpe_in_training": True},
    }  # fmt: skip
    if kind == "dqn":
        cfg["actions"] = ACTIONS
    cls = DQNWorkflowConfig if kind == "dqn" else ParametricDQNWorkflowConfig
    wf = Workflow(kind, config_from_dict(cfg, cls), DistContext.single("cpu"))
    try:
        wf.setup()
        wf.train()
    finally:
        wf.cleanup()
    assert wf.space.state_ids == ["0", "1", "7"]
    assert len(wf.history) == 2 and "cpe" in wf.history[-1]  # the propensities were read
