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
from reagent_lite.kinds.base import Actor
from reagent_lite.safe_load import load_program


def _state_columns(state_feature_ids: list[str], obs_dim: int) -> np.ndarray:
    cols = [int(f) for f in state_feature_ids]
    if any(c >= obs_dim for c in cols):
        raise ConfigError(
            f"online check: feature ids {state_feature_ids} do not match the env's "
            f"{obs_dim}-dimensional observations"
        )
    return np.asarray(cols, dtype=np.int64)


# Episodes stepped in lockstep, one forward for all of them: the policy's per-call cost
# (an exported program, the OpenMP team) is paid once per step of the longest episode, not
# once per step of every episode (100 CartPole episodes: 500 calls, not 50,000).
LOCKSTEP_ENVS = 256


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
    Episode ``ep`` starts from ``env.reset(seed=seed + ep)``, so a result does not depend on
    how many episodes run at once. (`kind` and `space` of a finished run:
    `get_kind(meta["workflow"])`, `kind.space_type.from_json(meta)` of its `model_meta.json`.)"""
    import gymnasium as gym

    program = load_program(model_path, "online check").module()
    probe = gym.make(env_id)
    n_env_actions = int(probe.action_space.n)  # type: ignore[attr-defined]
    cols = _state_columns(space.state_ids, int(np.prod(probe.observation_space.shape or (0,))))
    probe.close()
    act = kind.greedy_actor(program, space, n_env_actions)
    returns: list[float] = []
    timed_out = 0
    for first in range(0, episodes, LOCKSTEP_ENVS):
        group = range(first, min(episodes, first + LOCKSTEP_ENVS))
        totals, ended = _lockstep(gym, env_id, [seed + ep for ep in group], cols, act, max_steps)
        returns += totals
        timed_out += sum(
            not term and total < 0.0 for total, term in zip(totals, ended, strict=True)
        )
    arr = np.asarray(returns)
    return {
        "env": env_id,
        "episodes": episodes,
        "mean_return": float(arr.mean()),
        "median_return": float(np.median(arr)),
        "std_return": float(arr.std()),
        "timed_out": timed_out,
    }


def _lockstep(
    gym: Any,
    env_id: str,
    seeds: list[int],
    cols: np.ndarray,
    act: Actor,
    max_steps: int | None,
) -> tuple[list[float], list[bool]]:
    """One env per seed, all stepped together until each ends: (returns, whether each
    ended by termination rather than a time limit)."""
    envs = [gym.make(env_id) for _ in seeds]
    obs = [env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)]
    totals, terminated, steps = [0.0] * len(envs), [False] * len(envs), [0] * len(envs)
    active = list(range(len(envs)))
    try:
        while active:
            state = torch.from_numpy(
                np.stack([np.asarray(obs[i], dtype=np.float32)[cols] for i in active])
            )
            with torch.no_grad():
                actions = act(state, torch.ones_like(state))
            still = []
            for i, action in zip(active, actions, strict=True):
                obs[i], reward, term, trunc, _ = envs[i].step(action)
                totals[i] += float(reward)
                steps[i] += 1
                capped = max_steps is not None and steps[i] >= max_steps
                if term or trunc or capped:
                    terminated[i] = bool(term)
                else:
                    still.append(i)
            active = still
    finally:
        for env in envs:
            env.close()
    return totals, terminated


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
