"""The CPE and the online check agree in direction (benchmarks/cpe_direction.py's check).

Random CartPole logs (the logger scores ≈ 22 steps). Every model below is trained on them
with the same settings and compared with the logger replayed on the same episode seeds:

* a model trained for 600 updates is better online, and the CPE (sequential doubly robust,
  normalized, beyond 2 bootstrap SE) must say so;
* a deliberately bad model, trained with a reward boost of −3 on action 0 so that it always
  pushes right (≈ 9.5 steps), must be called worse after 100 updates. The boost enters the
  Q-target only, so the CPE values the served policy on the true rewards;
* the same bad model after 600 updates: its policy-value model diverges (sequential DR
  ≈ 5× the logger, beyond the 1 / (1 − γ) any policy can reach) with no logged episode
  following the policy to correct it. The CPE must not call it better: the estimate is
  flagged outside the reachable range.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import reagent_lite
from benchmarks.cpe_direction import (
    agreement,
    cpe_of,
    cpe_verdict,
    play_logger,
    play_model,
    verdict,
)
from tests.conftest import REPO_ROOT

EPISODES = 20
GAMMA = 0.95
SAMPLE = {"kind": "gym", "env": "CartPole-v1", "episodes": 300, "seed": 0, "eval_fraction": 0.5}


def _train(tmp: Path, name: str, boost: dict[str, float], epochs: int) -> Path:
    cfg: dict[str, Any] = json.loads((REPO_ROOT / "sample_configs/ci/dqn_1node.json").read_text())
    cfg.pop("$schema")
    cfg.update(
        training_data_path=str(tmp / "data/train.parquet"),
        eval_data_path=str(tmp / "data/eval.parquet"),
        model_output_path=str(tmp / name),
        sample_data=SAMPLE,
        epochs=epochs,
        rl={"gamma": GAMMA, "target_update_rate": 0.1, "reward_boost": boost},
    )
    cfg["training"].update(steps_per_epoch=50, minibatch_size=256, learning_rate=1e-3)
    cfg["evaluation"] = {"bootstrap_samples": 50, "online_episodes": 0}
    return reagent_lite.train(cfg).model_dir


def _directions(model_dir: Path) -> tuple[str, str]:
    _, _, logged, norm, se, outside = cpe_of(model_dir, one_step=False)
    served = play_model(model_dir, "CartPole-v1", EPISODES, GAMMA)
    logger = play_logger(SAMPLE, EPISODES, GAMMA)
    diff = served[:, 1] - logger[:, 1]
    se_diff = float(diff.std(ddof=1) / math.sqrt(EPISODES))
    return cpe_verdict(logged, norm, se, outside), verdict(float(diff.mean()), se_diff)


def test_cpe_and_online_agree_for_a_good_and_a_bad_policy(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")
    assert _directions(_train(tmp_path, "good", {}, epochs=12)) == ("better", "better")
    bad = {"0": -3.0}
    assert _directions(_train(tmp_path, "bad_brief", bad, epochs=2)) == ("worse", "worse")
    cpe, online = _directions(_train(tmp_path, "bad", bad, epochs=12))
    assert (cpe, online) == ("invalid (outside the reachable range)", "worse")


def test_verdicts_and_agreement() -> None:
    assert verdict(1.0, 0.4) == "better" and verdict(-1.0, 0.4) == "worse"
    assert verdict(1.0, 0.6) == "within noise" and verdict(float("nan"), 0.1) == "n/a"
    # Negative values (Acrobot): a ratio below 1 to the logger is better.
    assert cpe_verdict(-80.0, 0.8, 0.05, False) == "better"
    assert cpe_verdict(-80.0, 1.2, 0.05, False) == "worse"
    assert cpe_verdict(10.0, 5.0, 0.1, True).startswith("invalid")
    assert agreement("better", "better") == "yes" and agreement("better", "worse") == "no"
    assert agreement("within noise", "worse") == "CPE undecided"
    assert agreement("worse", "within noise") == "online undecided"
    assert agreement("invalid (outside the reachable range)", "worse") == "CPE flagged invalid"
