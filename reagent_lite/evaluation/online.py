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
    kind: str,
    state_feature_ids: list[str],
    action_feature_ids: list[str] | None = None,
    actions: list[str] | None = None,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Greedy rollouts of the exported model; returns mean/median/std of the returns."""
    import gymnasium as gym

    from reagent_lite.samples.gym_logging import action_feature_map

    program = torch.export.load(str(model_path)).module()
    env = gym.make(env_id)
    n_env_actions = int(env.action_space.n)  # type: ignore[attr-defined]
    cols = _state_columns(state_feature_ids, int(np.prod(env.observation_space.shape or (0,))))
    if kind == "dqn":
        assert actions is not None
        env_action = [int(a) if a.isdigit() else i for i, a in enumerate(actions)]
    else:
        assert action_feature_ids is not None
        cand = np.zeros((1, n_env_actions, len(action_feature_ids)), dtype=np.float32)
        cand_presence = np.zeros_like(cand)
        for k in range(n_env_actions):
            for fid, value in action_feature_map(k, n_env_actions).items():
                if fid in action_feature_ids:
                    j = action_feature_ids.index(fid)
                    cand[0, k, j] = value
                    cand_presence[0, k, j] = 1.0
        cand_t = torch.from_numpy(cand)
        cand_p = torch.from_numpy(cand_presence)
        mask = torch.ones(1, n_env_actions)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, steps, done = 0.0, 0, False
        while not done:
            state = torch.from_numpy(np.asarray(obs, dtype=np.float32)[cols]).unsqueeze(0)
            presence = torch.ones_like(state)
            with torch.no_grad():
                if kind == "dqn":
                    q = program(state, presence)
                    action = env_action[int(q.argmax(dim=1).item())]
                else:
                    q = program(state, presence, cand_t, cand_p, mask)
                    action = int(q.argmax(dim=1).item())
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
