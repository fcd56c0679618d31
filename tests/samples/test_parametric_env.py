"""The synthetic parametric-action environment: exact values and its step logs."""

from __future__ import annotations

import numpy as np
import pytest

from reagent_lite.data.timeline import build_training_table
from reagent_lite.samples.parametric_env import (
    Contexts,
    ParametricBanditEnv,
    greedy_policy,
    policy_probabilities,
)


@pytest.fixture(scope="module")
def env() -> ParametricBanditEnv:
    return ParametricBanditEnv(seed=3)


def test_candidate_counts_vary(env: ParametricBanditEnv) -> None:
    ctx = env.sample_contexts(2000, seed=0)
    counts = ctx.mask.sum(axis=1)
    assert counts.min() == env.min_candidates and counts.max() == env.max_candidates
    assert len(np.unique(counts)) == env.max_candidates - env.min_candidates + 1
    assert (ctx.candidates[~ctx.mask] == 0).all()
    assert set(np.unique(ctx.candidates[ctx.mask][:, -1])) == {0.0, 1.0}


def test_optimal_dominates_other_policies(env: ParametricBanditEnv) -> None:
    ctx = env.sample_contexts(5000, seed=1)
    best = env.optimal_value(ctx)
    logging = env.logging_value(ctx)
    rand = env.random_value(ctx)
    assert best > logging > rand
    rng = np.random.default_rng(0)
    for _ in range(5):
        probs = rng.random(ctx.mask.shape)

        def stochastic(c: Contexts, p: np.ndarray = probs) -> np.ndarray:
            return p

        assert env.true_policy_value(stochastic, ctx) <= best
    # A policy that ranks by the bias term only (ignores the state) is worse than optimal.
    w_less = greedy_policy(lambda s, sp, a, ap, m: a @ np.ones(a.shape[-1]))
    assert env.true_policy_value(w_less, ctx) < best
    # Values on fresh held-out states are reproducible.
    assert env.optimal_value() == env.optimal_value()
    assert env.optimal_value(n_states=20_000) == pytest.approx(best, abs=0.02)


def test_known_values_match_monte_carlo(env: ParametricBanditEnv) -> None:
    logged = env.log_episodes(40_000, seed=7)
    rewards = logged.steps.column("reward").to_numpy()
    # The mean logged reward estimates the logging value (noise std 0.1 + μ spread).
    assert rewards.mean() == pytest.approx(env.logging_value(logged.contexts), abs=0.01)
    assert env.logging_value(logged.contexts) == pytest.approx(env.logging_value(), abs=0.01)
    # Recorded propensities are the probabilities the logged choices were drawn with.
    probs = env.logging_probs(logged.contexts)
    rows = np.arange(len(logged.chosen))
    np.testing.assert_allclose(
        logged.steps.column("action_probability").to_numpy(), probs[rows, logged.chosen]
    )
    # IPS with those propensities recovers the optimal value from the logs.
    target = env.optimal_policy(logged.contexts)
    ips = np.mean(rewards * (logged.chosen == target) / probs[rows, logged.chosen])
    assert ips == pytest.approx(env.optimal_value(logged.contexts), rel=0.05)
    # Chosen candidates are the logged action features.
    first = logged.steps.column("action").to_pylist()[0]
    np.testing.assert_allclose(
        [v for _, v in first], logged.contexts.candidates[0, logged.chosen[0]]
    )


def test_step_log_layout(env: ParametricBanditEnv) -> None:
    steps = env.log_episodes(50, seed=0).steps
    assert steps.column_names[:7] == [
        "mdp_id",
        "sequence_number",
        "state_features",
        "action",
        "reward",
        "possible_actions",
        "action_probability",
    ]
    cands = steps.column("possible_actions").to_pylist()
    assert all(env.min_candidates <= len(c) <= env.max_candidates for c in cands)
    assert [k for k, _ in cands[0][0]] == env.action_feature_ids
    props = steps.column("action_probability").to_numpy()
    assert ((props > 0) & (props <= 1)).all()
    train, _ = build_training_table(steps, eval_fraction=0.0)
    assert all(r["possible_next_actions"] == [] for r in train.to_pylist())


def test_multi_step_episodes() -> None:
    env = ParametricBanditEnv(episode_length=4, seed=1)
    steps = env.log_episodes(30, seed=0).steps
    assert steps.num_rows == 120
    assert steps.column("sequence_number").to_pylist()[:5] == [0, 1, 2, 3, 0]
    train, _ = build_training_table(steps, eval_fraction=0.0)
    terminal = [r["possible_next_actions"] == [] for r in train.to_pylist()]
    assert sum(terminal) == 30


def test_policy_outputs_are_checked(env: ParametricBanditEnv) -> None:
    ctx: Contexts = env.sample_contexts(10, seed=0)
    with pytest.raises(ValueError, match="padded"):
        policy_probabilities(np.full(10, env.max_candidates - 1), ctx.mask)
    probs = policy_probabilities(ctx.mask.astype(float) * 3, ctx.mask)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    values = ctx.model_inputs(["1", "0", "99"], ["105", "100"])
    assert values[0].shape == (10, 3) and values[1][:, 2].sum() == 0
    np.testing.assert_allclose(values[0][:, 0], ctx.states[:, 1])
    assert values[2].shape == (10, env.max_candidates, 2)
