"""LunarLander-v3 logs (gymnasium's heuristic lander, ε-noise, random episodes) and the
shipped LunarLander sample config, trained end to end on a few hundred rows it makes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import reagent_lite
from reagent_lite.samples.gym_logging import log_gym_episodes
from tests.conftest import REPO_ROOT, run_module

pytest.importorskip("gymnasium")
pytest.importorskip("Box2D")  # LunarLander's physics (the gym extra installs it)

ENV = "LunarLander-v3"
CONFIG = REPO_ROOT / "sample_configs/discrete_action/lunarlander_dqn.json"
ACTIONS = ["0", "1", "2", "3"]


def test_lunarlander_logs_heuristic_episodes_land_and_random_ones_crash() -> None:
    """Same episode seeds for both: the ε-greedy heuristic lander scores far above random
    play, every row has the 8 observation features and one of the 4 actions."""
    eps = 0.1
    greedy = log_gym_episodes(ENV, 6, policy="epsilon_greedy", epsilon=eps, seed=0)
    random = log_gym_episodes(ENV, 6, policy="random", seed=0)
    for logged in (greedy, random):
        steps = logged.steps
        assert steps.num_rows == int(logged.lengths.sum())
        assert set(steps.column("action").to_pylist()) <= set(ACTIONS)
        assert steps.column("possible_actions").to_pylist()[0] == ACTIONS
        features = steps.column("state_features").combine_chunks()
        assert set(features.keys.to_pylist()) == {str(i) for i in range(8)}
        assert len(features.keys) == 8 * steps.num_rows  # every observation, every row
        assert np.isfinite(features.items.to_numpy()).all()
    props = greedy.steps.column("action_probability").to_numpy()
    greedy_p, explore_p = 1 - eps + eps / 4, eps / 4
    assert np.isin(np.round(props, 9), np.round([greedy_p, explore_p], 9)).all()
    # The heuristic lands (≈ +200 with ε = 0.1), random play crashes (≈ −180).
    assert greedy.mean_return > 100 > 0 > -100 > random.mean_return, (
        greedy.returns,
        random.returns,
    )


def test_make_sample_data_lunarlander_mix_builds_a_training_table(tmp_path: Path) -> None:
    """The command line makes a LunarLander mix whose training table has terminal rows
    (crash or landing: no next actions) and rewards of both signs."""
    out = tmp_path / "lunar"
    result = run_module(
        "workflows.make_sample_data",
        *("--env", ENV, "--episodes", "16", "--policy", "epsilon_greedy", "--epsilon", "0.1"),
        *("--random-episode-fraction", "0.5", "--eval-fraction", "0.3", "--seed", "1"),
        *("--output-dir", str(out)),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["env"] == ENV and summary["episodes"] == 16
    train = pq.read_table(out / "train.parquet")
    evaluation = pq.read_table(out / "eval.parquet")
    assert train.num_rows + evaluation.num_rows == summary["steps"]
    assert set(train.column("action").to_pylist()) <= set(ACTIONS)
    terminal = pc.equal(pc.list_value_length(train.column("possible_next_actions")), 0)
    assert 0 < pc.sum(terminal).as_py() < train.num_rows
    rewards = train.column("reward").to_numpy()
    assert rewards.min() < 0 < rewards.max()


def test_shipped_lunarlander_config_trains_end_to_end_on_data_it_makes(tmp_path: Path) -> None:
    """The config as shipped, on a few hundred rows: it generates its own data from its
    `sample_data` block (a tiny version of it), trains, exports, and plays its online check.
    Its six continuous observations are z-scored whatever their distribution (identified,
    x, y, vy, angle and ω are QUANTILE, which cost both seeds of a 60/40 mix their
    landing), the leg contacts BINARY."""
    cfg = json.loads(CONFIG.read_text())
    assert cfg["sample_data"]["env"] == ENV and cfg["actions"] == ACTIONS
    cfg.pop("$schema")
    data = tmp_path / "data"
    cfg.update(
        training_data_path=str(data / "train.parquet"),
        eval_data_path=str(data / "eval.parquet"),
        model_output_path=str(tmp_path / "model"),
        epochs=1,
    )
    cfg["sample_data"].update(episodes=4, eval_fraction=0.5)
    cfg["training"].update(steps_per_epoch=5, minibatch_size=64)
    cfg["evaluation"].update(online_episodes=1, calc_cpe_in_training=False)
    result = reagent_lite.train(cfg)
    assert (result.model_dir / "model.pt2").exists()
    assert 100 < pq.read_table(data / "train.parquet").num_rows < 2000
    meta = json.loads((result.model_dir / "model_meta.json").read_text())
    assert meta["online_evaluation"]["env"] == ENV
    assert not meta["final_metrics"].get("q_diverging")
    norm = json.loads((result.model_dir / "normalization.json").read_text())
    types = {feature: params["feature_type"] for feature, params in norm.items()}
    assert types == {**{str(i): "CONTINUOUS" for i in range(6)}, "6": "BINARY", "7": "BINARY"}


def test_without_box2d_make_sample_data_names_the_extra_that_installs_it(tmp_path: Path) -> None:
    """Box2D blocked (as if not installed): exit 2 naming the env and `reagent-lite[gym]`
    (gymnasium's own hint builds box2d-py from source), no traceback, no files."""
    out = tmp_path / "lunar"
    code = (
        "import sys; sys.modules['Box2D'] = None; "  # an import of it now fails
        "from workflows.make_sample_data import main; "
        f"sys.exit(main(['--env', '{ENV}', '--episodes', '2', '--output-dir', '{out}']))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert f"sample_data: env '{ENV}' cannot be made by gymnasium" in result.stderr
    assert "pip install 'reagent-lite[gym]' installs Box2D" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
