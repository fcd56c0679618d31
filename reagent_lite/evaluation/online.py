"""Online check: roll an exported `model.pt2` out in the gymnasium env that made the data.

Observation index i is feature id "i" (as the sample-data generator logs it); discrete
action names are the env's action indices; parametric candidates are the env's actions
encoded as the generator encodes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from reagent_lite.errors import ConfigError
from reagent_lite.kinds import FeatureSpace, Kind
from reagent_lite.safe_load import load_program


def _state_columns(state_feature_ids: list[str], obs_dim: int) -> np.ndarray:
    cols = [int(f) for f in state_feature_ids]
    if any(c >= obs_dim for c in cols):
        raise ConfigError(
            f"online check: feature ids {state_feature_ids} do not match the env's "
            f"{obs_dim}-dimensional observations"
        )
    return np.asarray(cols, dtype=np.int64)


def rollout_exported_model(
    model_path: Path,
    *,
    env_id: str,
    episodes: int,
    seed: int,
    kind: Kind[Any],
    space: FeatureSpace,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Greedy rollouts of the exported model; returns mean/median/std of the returns.
    (`kind` and `space` of a finished run: `get_kind(meta["workflow"])`,
    `kind.space_type.from_json(meta)` of its `model_meta.json`.)"""
    import gymnasium as gym

    program = load_program(model_path, "online check").module()
    env = gym.make(env_id)
    n_env_actions = int(env.action_space.n)  # type: ignore[attr-defined]
    cols = _state_columns(space.state_ids, int(np.prod(env.observation_space.shape or (0,))))
    act = kind.greedy_actor(program, space, n_env_actions)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, steps, done = 0.0, 0, False
        while not done:
            state = torch.from_numpy(np.asarray(obs, dtype=np.float32)[cols]).unsqueeze(0)
            presence = torch.ones_like(state)
            with torch.no_grad():
                action = act(state, presence)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            steps += 1
            done = terminated or truncated or (max_steps is not None and steps >= max_steps)
        returns.append(total)
    env.close()
    arr = np.asarray(returns)
    return {
        "env": env_id,
        "episodes": episodes,
        "mean_return": float(arr.mean()),
        "median_return": float(np.median(arr)),
        "std_return": float(arr.std()),
    }
