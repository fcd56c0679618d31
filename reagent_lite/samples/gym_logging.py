"""Roll a logging policy through a gymnasium environment and record step logs (docs/DATA_FORMAT.md).

Any env with a `Discrete` action space and a `Box` observation space works. Feature ids are
observation indices as strings ("0", "1", ...), action names are action indices as strings.
With `actions_as_features=True` the same logs describe each action as a one-hot feature map
under ids 100, 101, ... so a discrete env can be trained by the parametric workflow.

Episodes are played one after the other in a plain loop: CartPole steps in a few
microseconds, so a per-step Python loop (~1.5 s for 110k steps) is cheaper than vector-env
autoreset bookkeeping, and keeps episode boundaries exact. Arrow columns are built once at
the end from numpy arrays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import pyarrow as pa

POLICIES = ("random", "epsilon_greedy")
ACTION_FEATURE_BASE = 100
FEATURE_MAP = pa.map_(pa.string(), pa.float64())

Policy = Literal["random", "epsilon_greedy"]
Greedy = Callable[[np.ndarray], int]


def cartpole_heuristic(obs: np.ndarray) -> int:
    """Push the cart toward the side the pole is falling to (angle + damped angular velocity).

    Balances CartPole-v1 for the full 500 steps from almost every start.
    """
    return int(obs[2] + 0.5 * obs[3] > 0.0)


def action_feature_map(k: int, n_actions: int) -> dict[str, float]:
    """Feature map of discrete action k when actions are logged as features: one-hot
    under ids ACTION_FEATURE_BASE + j (the same encoding `actions_as_features=True` writes)."""
    return {str(ACTION_FEATURE_BASE + j): float(j == k) for j in range(n_actions)}


def acrobot_heuristic(obs: np.ndarray) -> int:
    """Torque in the direction the second link swings (obs[5], its angular velocity):
    pumps energy into the swing. Reaches the line within ~80 steps on average (Acrobot-v1,
    return ≈ −78; random play times out at −500)."""
    return 2 if obs[5] > 0.0 else 0


# gymnasium's LunarLander heuristic reads only `env.unwrapped.continuous` from its env
# argument: a stand-in lets it run on an observation alone, without the env at hand.
_DISCRETE_LANDER = SimpleNamespace(unwrapped=SimpleNamespace(continuous=False))


@cache
def _lander_controller() -> Callable[[object, np.ndarray], int]:
    # Imported on first use: the module needs Box2D (the `gym` extra), which CartPole and
    # Acrobot logs do not.
    from gymnasium.envs.box2d.lunar_lander import heuristic

    return heuristic


def lunarlander_heuristic(obs: np.ndarray) -> int:
    """gymnasium's own PID-style lander controller (discrete actions: 0 noop, 1 left
    engine, 2 main engine, 3 right engine). Lands on most starts (LunarLander-v3 return
    ≈ +200 or more on average; random play crashes at ≈ −180)."""
    return int(_lander_controller()(_DISCRETE_LANDER, obs))


HEURISTICS: dict[str, Greedy] = {
    "CartPole-v0": cartpole_heuristic,
    "CartPole-v1": cartpole_heuristic,
    "Acrobot-v1": acrobot_heuristic,
    "LunarLander-v3": lunarlander_heuristic,
}


@dataclass(frozen=True)
class LoggedEpisodes:
    """Step logs plus per-episode summaries (in episode order)."""

    steps: pa.Table
    returns: np.ndarray  # undiscounted return per episode
    lengths: np.ndarray  # steps per episode
    truncated: np.ndarray  # bool: ended by the time limit, not by the env

    @property
    def mean_return(self) -> float:
        return float(self.returns.mean()) if len(self.returns) else 0.0


def log_gym_episodes(
    env_id: str = "CartPole-v1",
    episodes: int = 1000,
    *,
    policy: Policy = "random",
    epsilon: float = 0.1,
    seed: int = 0,
    actions_as_features: bool = False,
    greedy: Greedy | None = None,
    env_kwargs: dict[str, Any] | None = None,
    random_episode_fraction: float = 0.0,
) -> LoggedEpisodes:
    """Play `episodes` episodes of `env_id` with the logging policy and return the step logs.

    `policy="random"` picks uniformly (propensity 1/A). `"epsilon_greedy"` follows `greedy`
    (default: the hand-written heuristic of `HEURISTICS[env_id]`) and explores with
    probability `epsilon`; the propensity of the logged action is 1-ε+ε/A when it is the
    greedy one, ε/A otherwise. With `random_episode_fraction` f, each episode is played
    uniformly at random with probability f (drawn per episode; its rows' propensities
    1/A), else by `policy`: a mix of behaviours, each row's propensity that of the policy
    that played it. Episode e is reset with seed `seed + e`, so logs are reproducible.
    """
    import gymnasium as gym
    from gymnasium import spaces

    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES} (got {policy!r})")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1] (got {epsilon})")
    if not 0.0 <= random_episode_fraction <= 1.0:
        raise ValueError(
            f"random_episode_fraction must be in [0, 1] (got {random_episode_fraction})"
        )
    if policy == "epsilon_greedy" and random_episode_fraction < 1.0 and greedy is None:
        if env_id not in HEURISTICS:
            raise ValueError(
                f"no greedy heuristic for {env_id!r} (known: {', '.join(HEURISTICS)}); "
                "pass greedy=... or use policy='random'"
            )
        greedy = HEURISTICS[env_id]

    try:
        env = gym.make(env_id, disable_env_checker=True, **(env_kwargs or {}))
    except gym.error.DependencyNotInstalled as err:  # Box2D for LunarLander, ...
        # gymnasium's own hint (its box2d extra) builds box2d-py from source with swig;
        # ours installs a wheel.
        raise ValueError(
            f"env {env_id!r} cannot be made by gymnasium: {err}; "
            "pip install 'reagent-lite[gym]' installs Box2D from a wheel"
        ) from err
    except gym.error.Error as err:  # unknown id, wrong version
        raise ValueError(f"env {env_id!r} cannot be made by gymnasium: {err}") from err
    if not isinstance(env.action_space, spaces.Discrete):
        raise ValueError(f"{env_id}: action space must be Discrete (got {env.action_space})")
    if not isinstance(env.observation_space, spaces.Box):
        raise ValueError(f"{env_id}: observations must be a Box (got {env.observation_space})")
    n_actions = int(env.action_space.n)
    start = int(env.action_space.start)
    rng = np.random.default_rng(seed)

    observations: list[np.ndarray] = []
    actions: list[int] = []
    rewards: list[float] = []
    propensities: list[float] = []
    lengths = np.zeros(episodes, dtype=np.int64)
    returns = np.zeros(episodes, dtype=np.float64)
    truncated_eps = np.zeros(episodes, dtype=bool)
    explore_p = epsilon / n_actions
    try:
        for ep in range(episodes):
            obs, _ = env.reset(seed=seed + ep)
            done = False
            # Drawn only when asked for, so logs without a mix keep their random stream.
            random_episode = policy == "random" or (
                random_episode_fraction > 0.0 and rng.random() < random_episode_fraction
            )
            while not done:
                flat = np.asarray(obs, dtype=np.float64).ravel()
                if random_episode:
                    action, prop = int(rng.integers(n_actions)), 1.0 / n_actions
                else:
                    assert greedy is not None
                    best = greedy(flat)
                    action = int(rng.integers(n_actions)) if rng.random() < epsilon else best
                    prop = (1.0 - epsilon + explore_p) if action == best else explore_p
                obs, reward, terminated, truncated, _ = env.step(start + action)
                observations.append(flat)
                actions.append(action)
                rewards.append(float(reward))
                propensities.append(prop)
                lengths[ep] += 1
                returns[ep] += float(reward)
                done = bool(terminated or truncated)
                truncated_eps[ep] = bool(truncated and not terminated)
    finally:
        env.close()

    n = len(actions)
    obs_dim = int(np.prod(env.observation_space.shape))
    states = np.stack(observations) if n else np.zeros((0, obs_dim))
    action_idx = np.asarray(actions, dtype=np.int64)
    mdp_id = np.repeat(np.arange(episodes), lengths).astype(str)
    seq = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    names = [str(k) for k in range(n_actions)]

    if actions_as_features:
        one_hot = np.eye(n_actions)
        ids = [str(ACTION_FEATURE_BASE + k) for k in range(n_actions)]
        action_col: pa.Array = dense_to_map(one_hot[action_idx], ids)
        candidates = dense_to_map(np.tile(one_hot, (n, 1)), ids)
    else:
        action_col = pa.array(np.asarray(names, dtype=object)[action_idx], type=pa.string())
        candidates = pa.array(np.tile(np.asarray(names, dtype=object), n), type=pa.string())
    possible = lists_from_offsets(np.arange(n + 1, dtype=np.int64) * n_actions, candidates)

    table = pa.table(
        {
            "mdp_id": pa.array(mdp_id, type=pa.string()),
            "sequence_number": pa.array(seq, type=pa.int64()),
            "state_features": dense_to_map(states, [str(i) for i in range(obs_dim)]),
            "action": action_col,
            "reward": pa.array(rewards, type=pa.float64()),
            "possible_actions": possible,
            "action_probability": pa.array(propensities, type=pa.float64()),
        }
    )
    return LoggedEpisodes(table, returns, lengths, truncated_eps)


def dense_to_map(values: np.ndarray, ids: list[str], present: np.ndarray | None = None) -> pa.Array:
    """`[N, D]` values → map<string, double> column; `present` (bool [N, D]) drops entries."""
    values = np.asarray(values, dtype=np.float64).reshape(len(values), len(ids))
    mask = np.ones(values.shape, dtype=bool) if present is None else np.asarray(present, bool)
    counts = mask.sum(axis=1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    keys = np.broadcast_to(np.asarray(ids, dtype=object), values.shape)[mask]
    return pa.MapArray.from_arrays(
        pa.array(offsets, type=pa.int32()),
        pa.array(keys, type=pa.string()),
        pa.array(values[mask], type=pa.float64()),
    ).cast(FEATURE_MAP)


def lists_from_offsets(offsets: np.ndarray, values: pa.Array) -> pa.Array:
    """Group `values` into a list column: row i holds values[offsets[i]:offsets[i+1]]."""
    return pa.ListArray.from_arrays(pa.array(np.asarray(offsets), type=pa.int32()), values)


def episode_returns(steps: pa.Table) -> np.ndarray:
    """Undiscounted return of each episode of a step-log table (ordered by mdp_id)."""
    grouped = steps.group_by("mdp_id").aggregate([("reward", "sum")]).sort_by("mdp_id")
    return grouped.column("reward_sum").to_numpy()
