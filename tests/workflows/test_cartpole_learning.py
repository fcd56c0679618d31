"""Learning regression: the shipped CartPole dqn recipe, shrunk, must still learn to balance.

A fast stand-in for `benchmarks/cartpole_quality.py` (the ≥ 400 quality bar): the shipped
sample config's algorithm (γ, τ, Huber, double Q, CQL, network) on 1,000 uniformly random
episodes (~22k transitions, mean return ≈ 22) for ~430 updates, then the workflow's own
online check. Measured over training seeds 0–2 this reaches mean returns of 145–477 over
20 episodes (most epochs of a run sit far above the random policy once it has learnt);
a broken target, loss, normalization or export keeps it near 9–25 (constant or random
actions), so 75 is a clear margin on both sides.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, run_module

SHIPPED = REPO_ROOT / "sample_configs" / "discrete_action" / "cartpole_dqn.json"
RANDOM_POLICY_RETURN = 22.0
THRESHOLD = 75.0


@pytest.mark.slow
def test_small_cartpole_run_beats_random_policy_online(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")
    cfg = json.loads(SHIPPED.read_text())
    cfg.pop("$schema", None)
    data = tmp_path / "data"
    cfg.update(
        training_data_path=str(data / "train.parquet"),
        eval_data_path=str(data / "eval.parquet"),
        model_output_path=str(tmp_path / "out"),
        use_gpu=False,
        epochs=10,
        seed=0,
        checkpoint_every_epochs=10,
    )
    cfg["sample_data"].update(episodes=1000, seed=1)
    cfg["training"].update(minibatch_size=512, learning_rate=0.001)
    cfg["evaluation"].update(calc_cpe_in_training=False, online_episodes=20)
    path = tmp_path / "cartpole_small.json"
    path.write_text(json.dumps(cfg, indent=1))

    result = run_module("workflows.dqn_workflow", "--config", str(path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    meta = json.loads((tmp_path / "out" / "model_meta.json").read_text())
    online = meta["online_evaluation"]
    assert online["episodes"] == 20
    assert online["mean_return"] >= THRESHOLD, (
        f"learning regressed: mean return {online['mean_return']:.1f} over 20 episodes "
        f"(random policy ≈ {RANDOM_POLICY_RETURN:.0f}, expected ≥ {THRESHOLD:.0f})"
    )
