"""Online check: roll an exported `model.pt2` out in the gymnasium env that made the data.

Observation index i is feature id "i" (as the sample-data generator logs it); discrete
action names are the env's action indices; parametric candidates are the env's actions
encoded as the generator encodes them.

An episode *times out* when the time limit (the env's, or `max_steps`) ends it with a
return below zero: in an env that charges every step until a goal (Acrobot, MountainCar)
the policy never reached the goal. (CartPole's time-out, +500, is its best case, not one.)
A policy that times out on most episodes has failed, whatever its mean return says: on logs
that almost never reach the goal, the logger's own mean is about the time-out's, so a
failed policy looks "within noise" of it (`failed`).
"""

from __future__ import annotations

from collections.abc import Mapping
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
    returns, timed_out = [], 0
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
            capped = max_steps is not None and steps >= max_steps
            done = terminated or truncated or capped
        timed_out += int(not terminated and total < 0.0)
        returns.append(total)
    env.close()
    arr = np.asarray(returns)
    return {
        "env": env_id,
        "episodes": episodes,
        "mean_return": float(arr.mean()),
        "median_return": float(np.median(arr)),
        "std_return": float(arr.std()),
        "timed_out": timed_out,
    }


def failed(online: Mapping[str, object] | None) -> str | None:
    """Why an online check's result (`rollout_exported_model`'s, as `model_meta.json`
    records it) shows a failed policy: more than half of its episodes timed out (module
    notes). None when it did not, or the result predates the count."""
    if not online:
        return None
    episodes, timed_out = online.get("episodes"), online.get("timed_out")
    if not isinstance(episodes, int) or not isinstance(timed_out, int) or episodes < 1:
        return None
    if 2 * timed_out <= episodes:
        return None
    return f"{timed_out} of {episodes} online episodes timed out short of the goal"
