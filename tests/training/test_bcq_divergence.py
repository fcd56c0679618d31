"""The divergence check ignores the actions BCQ drops: they are served at the lowest float,
no Q-value, so a BCQ run whose imitator drops an action is neither flagged `q_diverging`
nor refused its export (it was: |lowest float| ≈ 3.4e38 read as max|Q|)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.data.test_ingest import ACTIONS, write
from tests.training.runs import run_workflow, tiny_dqn_config


def _data(path: Path) -> Path:
    """400 one-step episodes logging ACTIONS[0] 19 times in 20: BCQ drops ACTIONS[1]."""
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for i in range(400):
        rows.append(
            {
                "mdp_id": i,
                "sequence_number": 0,
                "state_features": {"0": float(rng.uniform(-1.0, 1.0))},
                "action": ACTIONS[int(i % 20 == 0)],
                "reward": 1.0,
                "next_state_features": {},
                "next_action": "",
                "possible_actions": ACTIONS,
                "possible_next_actions": [],
                "action_probability": 0.5,
                "time_diff": 1,
            }
        )
    return write(path, rows, 200)


def test_a_bcq_run_that_drops_an_action_is_not_called_diverged(tmp_path: Path) -> None:
    _data(tmp_path / "t.parquet")
    cfg = tiny_dqn_config(
        tmp_path,
        epochs=2,
        seed=0,
        rainbow={"bcq_drop_threshold": 0.3},
        training={"learning_rate": 0.01, "steps_per_epoch": 40, "layers": [-1, 16, -1]},
    )
    wf = run_workflow(cfg, save=True)
    last = wf.history[-1]
    # The Q-values of one-step episodes with reward 1 are about 1; the dropped action's
    # lowest float must not count.
    assert last["max_abs_q"] < 10.0, last
    assert not any(r.get("q_diverging") for r in wf.history)
    assert (tmp_path / "out" / "model.pt2").exists()
