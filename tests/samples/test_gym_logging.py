"""Logging policies in gymnasium envs: propensities, episode structure, returns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from reagent_lite.data.timeline import build_training_table
from reagent_lite.samples.gym_logging import action_feature_map, episode_returns, log_gym_episodes

pytest.importorskip("gymnasium")


def test_random_cartpole_logs() -> None:
    logged = log_gym_episodes("CartPole-v1", 300, policy="random", seed=1)
    steps = logged.steps
    assert steps.num_rows == int(logged.lengths.sum())
    assert set(steps.column("action").to_pylist()) == {"0", "1"}
    np.testing.assert_allclose(steps.column("action_probability").to_numpy(), 0.5)
    assert steps.column("possible_actions").to_pylist()[0] == ["0", "1"]
    first = steps.column("state_features").to_pylist()[0]
    assert [k for k, _ in first] == ["0", "1", "2", "3"]
    # Episode structure: sequence numbers 0..len-1 per episode, in order.
    seq = steps.column("sequence_number").to_numpy()
    starts = np.cumsum(logged.lengths) - logged.lengths
    assert (seq[starts] == 0).all()
    assert (seq[starts + logged.lengths - 1] == logged.lengths - 1).all()
    np.testing.assert_allclose(np.sort(episode_returns(steps)), np.sort(logged.returns))
    # CartPole gives +1 per step, so return = length.
    np.testing.assert_allclose(logged.returns, logged.lengths)


def test_random_cartpole_mean_return_is_about_22() -> None:
    logged = log_gym_episodes("CartPole-v1", 2000, policy="random", seed=0)
    assert 20.0 < logged.mean_return < 24.5
    assert not logged.truncated.any()


def test_epsilon_greedy_propensities_and_return() -> None:
    eps = 0.2
    logged = log_gym_episodes("CartPole-v1", 40, policy="epsilon_greedy", epsilon=eps, seed=0)
    props = logged.steps.column("action_probability").to_numpy()
    greedy_p, explore_p = 1 - eps + eps / 2, eps / 2
    assert np.isin(np.round(props, 12), np.round([greedy_p, explore_p], 12)).all()
    # Explorations happen about ε/A of the time.
    assert 0.05 < np.mean(np.isclose(props, explore_p)) < 0.15
    # The probabilities of all actions of a state sum to 1: greedy + (A-1) · explore.
    assert greedy_p + explore_p == pytest.approx(1.0)
    random_mean = log_gym_episodes("CartPole-v1", 40, policy="random", seed=0).mean_return
    assert logged.mean_return > 5 * random_mean
    assert logged.lengths.max() <= 500


def test_seeded_logs_are_reproducible() -> None:
    a = log_gym_episodes("CartPole-v1", 20, policy="epsilon_greedy", seed=5).steps
    b = log_gym_episodes("CartPole-v1", 20, policy="epsilon_greedy", seed=5).steps
    c = log_gym_episodes("CartPole-v1", 20, policy="epsilon_greedy", seed=6).steps
    assert a.equals(b)
    assert not a.equals(c)


def test_actions_as_features_one_hot() -> None:
    plain = log_gym_episodes("CartPole-v1", 10, seed=2).steps
    para = log_gym_episodes("CartPole-v1", 10, seed=2, actions_as_features=True).steps
    assert plain.column("state_features").equals(para.column("state_features"))
    assert pa.types.is_map(para.schema.field("action").type)
    for name, features in zip(
        plain.column("action").to_pylist(), para.column("action").to_pylist(), strict=True
    ):
        k = int(name)
        assert features == [("100", float(k == 0)), ("101", float(k == 1))]
        assert dict(features) == action_feature_map(k, 2)
    assert para.column("possible_actions").to_pylist()[0] == [
        [("100", 1.0), ("101", 0.0)],
        [("100", 0.0), ("101", 1.0)],
    ]
    train, _ = build_training_table(para, eval_fraction=0.0)
    last = train.to_pylist()[-1]
    assert last["next_action"] == [] and last["possible_next_actions"] == []


def test_other_discrete_env_and_errors() -> None:
    logged = log_gym_episodes("Acrobot-v1", 2, policy="random", seed=0)
    assert logged.steps.column("possible_actions").to_pylist()[0] == ["0", "1", "2"]
    np.testing.assert_allclose(logged.steps.column("action_probability").to_numpy(), 1 / 3)
    with pytest.raises(ValueError, match="heuristic"):
        log_gym_episodes("MountainCar-v0", 1, policy="epsilon_greedy")
    with pytest.raises(ValueError, match="Discrete"):
        log_gym_episodes("Pendulum-v1", 1)
    with pytest.raises(ValueError, match="policy"):
        log_gym_episodes("CartPole-v1", 1, policy="greedy")  # type: ignore[arg-type]


def test_acrobot_mix_of_random_and_epsilon_greedy_episodes() -> None:
    """`random_episode_fraction`: whole episodes played at random (propensity 1/3 on every
    row), the others ε-greedy over the Acrobot heuristic (propensities 1−ε+ε/3 or ε/3);
    the heuristic swings up far sooner than random play."""
    eps = 0.3
    logged = log_gym_episodes(
        "Acrobot-v1", 12, policy="epsilon_greedy", epsilon=eps, seed=3,
        random_episode_fraction=0.5,
    )  # fmt: skip
    steps = logged.steps
    props = steps.column("action_probability").to_numpy()
    episode = steps.column("mdp_id").to_numpy().astype(int)
    greedy_p, explore_p = 1 - eps + eps / 3, eps / 3
    kinds = []
    for ep in range(12):
        p = props[episode == ep]
        if np.allclose(p, 1 / 3):
            kinds.append("random")
        else:
            assert np.isin(np.round(p, 9), np.round([greedy_p, explore_p], 9)).all()
            kinds.append("greedy")
    assert 2 <= kinds.count("random") <= 10  # drawn per episode (p = 0.5)
    returns = dict(zip(range(12), logged.returns, strict=True))
    greedy_mean = np.mean([returns[e] for e, k in enumerate(kinds) if k == "greedy"])
    random_mean = np.mean([returns[e] for e, k in enumerate(kinds) if k == "random"])
    assert greedy_mean > -200 and random_mean < -300, (greedy_mean, random_mean)
    with pytest.raises(ValueError, match="random_episode_fraction must be in"):
        log_gym_episodes("Acrobot-v1", 1, random_episode_fraction=1.5)
