"""Sequential CPE: hand-computed two-episode table, properties, Monte-Carlo MDP."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from reagent_lite.evaluation import CpeEstimate, sequential_estimates
from reagent_lite.evaluation.sequential import _project_simplex, _simplex_qp

GAMMA = 0.5
# Episode "a" (two steps, sequence numbers 3 and 7, given out of order) and "b" (one step).
#   a, t=0: r=1, mu=.5,  pi=1   -> ratio 2,   q=.6,  v=.8
#   a, t=1: r=2, mu=.5,  pi=.5  -> ratio 1,   q=1.5, v=1
#   b, t=0: r=3, mu=.75, pi=.25 -> ratio 1/3, q=2,   v=1
TABLE = {
    "mdp_ids": np.array(["a", "b", "a"]),
    "sequence_numbers": np.array([7, 0, 3]),
    "rewards": np.array([2.0, 3.0, 1.0]),
    "logged_propensity": np.array([0.5, 0.75, 0.5]),
    "target_prob_logged": np.array([0.5, 0.25, 1.0]),
    "q_hat_logged": np.array([1.5, 2.0, 0.6]),
    "v_hat": np.array([1.0, 1.0, 0.8]),
    # One step per row, as the evaluator passes them with rl.use_seq_num_diff_as_time_diff
    # off: the gap 3 -> 7 does not count.
    "time_diffs": np.ones(3),
}
# Logged discounted returns: a = 1 + .5 * 2 = 2, b = 3.
LOGGED_VALUE = 2.5


def _estimates(table: dict[str, np.ndarray] = TABLE, **kw: Any) -> dict[str, CpeEstimate]:
    args: dict[str, Any] = {**table, "gamma": GAMMA, **kw}
    return sequential_estimates(**args)


def test_sequential_doubly_robust_hand_computed() -> None:
    # Backward recursion V = v + rho (r + gamma V' - q):
    #   a: t=1: 1 + 1 (2 - 1.5) = 1.5 ; t=0: .8 + 2 (1 + .5 * 1.5 - .6) = 3.1
    #   b: t=0: 1 + (1/3)(3 - 2) = 4/3
    expected = (3.1 + 4.0 / 3.0) / 2
    est = _estimates()["sequential_doubly_robust"]
    assert est.raw == pytest.approx(expected)
    assert est.normalized == pytest.approx(expected / LOGGED_VALUE)


def test_weighted_doubly_robust_hand_computed() -> None:
    # Cumulative weights: a = [2, 2], b = [1/3, 1/3] (b is absorbed after its end: ratio 1,
    # r = q = v = 0). Normalised per step: w_t = [6/7, 1/7] for t = 0, 1; w_{-1} = [1/2, 1/2].
    t0 = 6 / 7 * (1 - 0.6) + 1 / 7 * (3 - 2) + 0.5 * 0.8 + 0.5 * 1.0
    t1 = GAMMA * (6 / 7 * (2 - 1.5) + 6 / 7 * 1.0)
    est = _estimates()["weighted_doubly_robust"]
    assert est.raw == pytest.approx(t0 + t1)
    assert est.normalized == pytest.approx((t0 + t1) / LOGGED_VALUE)


def test_magic_without_bootstrap_is_wdr_and_otherwise_a_blend() -> None:
    no_boot = _estimates(n_bootstrap=0)
    assert no_boot["magic"].raw == pytest.approx(no_boot["weighted_doubly_robust"].raw)
    assert np.isnan(no_boot["magic"].raw_std_error)
    # With a bootstrap, MAGIC is a convex blend of the partial-horizon estimates:
    #   g_-1 = DM = .5 * .8 + .5 * 1 = .9 ; g_0 = t0 + gamma * 6/7 * v_a1 ; g_1 = WDR.
    est = _estimates()
    g = [0.9, 6 / 7 * 0.4 + 1 / 7 + 0.9 + GAMMA * 6 / 7, est["weighted_doubly_robust"].raw]
    assert min(g) - 1e-9 <= est["magic"].raw <= max(g) + 1e-9


def test_row_order_does_not_matter() -> None:
    perm = np.array([2, 0, 1])
    shuffled = {k: v[perm] for k, v in TABLE.items()}
    a, b = _estimates(), _estimates(shuffled)
    for key in a:
        assert a[key].raw == pytest.approx(b[key].raw), key


def test_on_policy_variable_lengths_give_logged_value() -> None:
    # pi = mu and no model: SDR and WDR reduce to the mean discounted return, also when
    # episode lengths differ (the absorbing-state padding keeps all episodes in the WDR sums).
    # (MAGIC may lean on the zero-variance zero model here: three episodes give a wide WDR
    # interval, so the model's bias is not detectable.)
    ids = np.array([0, 0, 0, 1, 2, 2])
    seq = np.array([0, 1, 2, 0, 0, 1])
    rewards = np.array([1.0, 2.0, 3.0, 4.0, 0.5, 1.0])
    mu = np.array([0.3, 0.5, 0.9, 0.2, 0.6, 0.4])
    zeros = np.zeros(6)
    est = sequential_estimates(ids, seq, rewards, mu, mu, zeros, zeros, gamma=0.9)
    logged = np.mean([1 + 0.9 * 2 + 0.81 * 3, 4.0, 0.5 + 0.9 * 1.0])
    for key in ("sequential_doubly_robust", "weighted_doubly_robust"):
        assert est[key].raw == pytest.approx(logged), key
        assert est[key].normalized == pytest.approx(1.0), key


def test_perfect_model_in_deterministic_mdp_is_exact() -> None:
    # Deterministic rewards and an exact model of the target policy's values: SDR returns the
    # true value whatever the weights. Two episodes of length 2, gamma = .9.
    # Target policy value of each visited state (computed backwards, target continues 1 step):
    #   ep 0: t=1: q = 2 (logged action), v = 1.5 ; t=0: q = 1 + .9 * 1.5, v = 2.0
    #   ep 1: t=0: q = 0.5, v = 0.7 (a one-step episode)
    gamma = 0.9
    est = sequential_estimates(
        mdp_ids=[0, 0, 1],
        sequence_numbers=[0, 1, 0],
        rewards=[1.0, 2.0, 0.5],
        logged_propensity=[0.5, 0.25, 0.8],
        target_prob_logged=[0.9, 0.1, 0.3],
        q_hat_logged=[1.0 + gamma * 1.5, 2.0, 0.5],
        v_hat=[2.0, 1.5, 0.7],
        gamma=gamma,
    )
    assert est["sequential_doubly_robust"].raw == pytest.approx((2.0 + 0.7) / 2)


def test_bootstrap_std_error_positive_zero_and_deterministic() -> None:
    est = _estimates()
    assert all(e.raw_std_error > 0 for e in est.values())
    assert _estimates(seed=0) == est
    assert _estimates(seed=5)["weighted_doubly_robust"] != est["weighted_doubly_robust"]

    # Identical episodes: every resample gives the same value.
    n_ep = 4
    ids = np.repeat(np.arange(n_ep), 2)
    seq = np.tile([0, 1], n_ep)
    ones = np.ones(2 * n_ep)
    const = sequential_estimates(
        ids, seq, ones, ones * 0.5, ones * 0.25, ones * 0.3, ones * 0.2, gamma=0.9
    )
    for key, e in const.items():
        assert e.raw_std_error == pytest.approx(0.0, abs=1e-12), key
        assert e.normalized_std_error == pytest.approx(0.0, abs=1e-12), key


@pytest.mark.parametrize(
    "change, match",
    [
        ({"sequence_numbers": np.array([3, 0, 3])}, "repeat"),
        ({"logged_propensity": np.array([0.5, 0.0, 0.5])}, "logged_propensity"),
        ({"v_hat": np.array([1.0, np.nan, 0.8])}, "v_hat"),
        ({"rewards": np.ones(2)}, "rewards"),
    ],
)
def test_bad_inputs_raise(change: dict[str, np.ndarray], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _estimates({**TABLE, **change})


def test_simplex_qp() -> None:
    np.testing.assert_allclose(_project_simplex(np.array([0.2, 0.2])), [0.5, 0.5])
    np.testing.assert_allclose(_project_simplex(np.array([3.0, -1.0, 0.0])), [1.0, 0.0, 0.0])
    # min x'Ax with A = diag(1, 3): x proportional to (3, 1).
    x = _simplex_qp(np.diag([1.0, 3.0]), np.array([0.0, 1.0]))
    np.testing.assert_allclose(x, [0.75, 0.25], atol=1e-6)


def _simulate_mdp(
    rng: np.random.Generator, n_episodes: int, policy: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray]:
    """Two states, two actions, next state = action, continue w.p. .7, at most 5 steps."""
    mean_reward = np.array([[1.0, 0.0], [0.5, 2.0]])
    state = rng.integers(0, 2, size=n_episodes)
    alive = np.ones(n_episodes, dtype=bool)
    rows = []
    for t in range(5):
        idx = np.nonzero(alive)[0]
        s = state[idx]
        a = (rng.random(idx.size) > policy[s, 0]).astype(int)
        r = mean_reward[s, a] + rng.normal(scale=0.3, size=idx.size)
        rows.append((idx, np.full(idx.size, t), s, a, r))
        state[idx] = a
        alive[idx] = rng.random(idx.size) < 0.7
    cat = [np.concatenate(col) for col in zip(*rows, strict=True)]
    return cat, mean_reward


def test_monte_carlo_mdp_within_three_standard_errors() -> None:
    gamma = 0.9
    logging = np.array([[0.6, 0.4], [0.3, 0.7]])
    target = np.array([[0.2, 0.8], [0.9, 0.1]])
    (ids, seq, s, a, r), mean_reward = _simulate_mdp(np.random.default_rng(11), 4000, logging)

    # Exact target value by dynamic programming over the (time-dependent) horizon.
    q = np.zeros((6, 2, 2))
    v = np.zeros((6, 2))
    for t in range(4, -1, -1):
        cont = 0.7 if t < 4 else 0.0
        q[t] = mean_reward + gamma * cont * v[t + 1][None, :]  # next state = action
        v[t] = np.sum(target * q[t], axis=1)
    true_value = float(np.mean(v[0]))

    # A deliberately imperfect model (stationary, off by a constant).
    q_model = q[0] - 0.5
    v_model = np.sum(target * q_model, axis=1)
    est = sequential_estimates(
        ids,
        seq,
        r,
        logging[s, a],
        target[s, a],
        q_model[s, a],
        v_model[s],
        gamma=gamma,
        seed=3,
    )
    for key, e in est.items():
        assert 0 < e.raw_std_error < 0.5, key
        assert abs(e.raw - true_value) < 3 * e.raw_std_error, (key, e.raw, true_value)


# Horizon's own case: `Evaluator.compute_episode_value_from_samples` in its unit test
# (facebookresearch/ReAgent, ml/rl/test/evaluator/test_evaluator.py,
# `test_compute_episode_value_from_samples`): (mdp_id, sequence_number, reward) at γ = 0.5,
# discounted by γ^(sequence-number gap); the expected value from each step onward.
HORIZON_SAMPLES = [
    ("1", 3, 1.0), ("1", 5, 2.0), ("1", 6, 1.0),
    ("3", 10, 2.0), ("3", 11, 1.0),
    ("6", 2, 3.0), ("6", 4, 2.0), ("6", 5, 0.0), ("6", 8, 1.0),
]  # fmt: skip
HORIZON_VALUES = [1.625, 2.5, 1.0, 2.5, 1.0, 3.515625, 2.0625, 0.125, 1.0]


def _time_diffs(ids: list[str], seq: list[int]) -> np.ndarray:
    """Each step's gap to the next step of its episode (1 for the last), as the timeline
    writes `time_diff` and training discounts γ^time_diff."""
    out = np.ones(len(ids))
    for i in range(len(ids) - 1):
        if ids[i + 1] == ids[i]:
            out[i] = seq[i + 1] - seq[i]
    return out


@pytest.mark.parametrize("start", range(len(HORIZON_SAMPLES)))
def test_discounting_follows_time_diff_as_training_does(start: int) -> None:
    """On-policy (π = μ), with q̂ = v̂ = 0, every estimator is the logged discounted return:
    from each step of Horizon's example onward it is Horizon's value (by step position it
    would be 2.25 / 2.5 / 4.125 for the three episodes)."""
    ep = HORIZON_SAMPLES[start][0]
    rows = [s for s in HORIZON_SAMPLES[start:] if s[0] == ep]
    ids, seq, rewards = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    n = len(rows)
    out = sequential_estimates(
        np.array(ids),
        np.array(seq),
        np.array(rewards),
        np.full(n, 0.5),
        np.full(n, 0.5),
        np.zeros(n),
        np.zeros(n),
        gamma=0.5,
        time_diffs=_time_diffs(ids, seq),
        n_bootstrap=0,
    )
    for name in ("sequential_doubly_robust", "weighted_doubly_robust", "magic"):
        assert out[name].raw == HORIZON_VALUES[start], name


def test_horizon_logged_value_from_sequence_numbers_alone() -> None:
    """Horizon's case as Horizon gave it (no time_diff): the sequence-number gaps are the
    time, so the logged episode value is Horizon's (1.625 + 2.5 + 3.515625) / 3 = 2.547 —
    the same as with the timeline's time_diff column; one step per row (training's γ per
    transition with rl.use_seq_num_diff_as_time_diff off) values it at 2.958."""
    ids = np.array([s[0] for s in HORIZON_SAMPLES])
    seq = np.array([s[1] for s in HORIZON_SAMPLES])
    rewards = np.array([s[2] for s in HORIZON_SAMPLES])
    n = len(ids)
    args = (ids, seq, rewards, np.ones(n), np.ones(n), np.zeros(n), np.zeros(n))
    horizon = (1.625 + 2.5 + 3.515625) / 3
    assert round(horizon, 3) == 2.547
    given_nothing = sequential_estimates(*args, gamma=0.5, n_bootstrap=0)
    timed = sequential_estimates(
        *args, gamma=0.5, time_diffs=_time_diffs(list(ids), list(seq)), n_bootstrap=0
    )
    for out in (given_nothing, timed):
        for name in ("sequential_doubly_robust", "weighted_doubly_robust", "magic"):
            assert out[name].raw == pytest.approx(horizon), name
    by_step = sequential_estimates(*args, gamma=0.5, time_diffs=np.ones(n), n_bootstrap=0)
    assert by_step["sequential_doubly_robust"].raw == pytest.approx((2.25 + 2.5 + 4.125) / 3)
