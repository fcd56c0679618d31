"""One-step CPE: hand-computed tiny tables, properties, bootstrap, Monte-Carlo bandit."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from reagent_lite.evaluation import CpeEstimate, masked_distribution, one_step_estimates

# Three logged rows, two actions. Per row (derived by hand in the tests below):
#   row 0: pi = [.5, .5], logged a=0, mu=.25, r=1,   r_hat=[.8, .2] -> w = 2
#   row 1: pi = [1, 0],   logged a=1, mu=.5,  r=2,   r_hat=[1, 3]   -> w = 0
#   row 2: pi = [.2, .8], logged a=1, mu=.4,  r=1.5, r_hat=[.5, .5] -> w = 2
TARGET = np.array([[0.5, 0.5], [1.0, 0.0], [0.2, 0.8]])
LOGGED_IDX = np.array([0, 1, 1])
MU = np.array([0.25, 0.5, 0.4])
REWARDS = np.array([1.0, 2.0, 1.5])
R_HAT = np.array([[0.8, 0.2], [1.0, 3.0], [0.5, 0.5]])
MASK = np.ones((3, 2))
LOGGED_VALUE = (1.0 + 2.0 + 1.5) / 3  # mean logged reward = 1.5


def _estimates(**kw: Any) -> dict[str, CpeEstimate]:
    args: dict[str, Any] = {
        "target_probs": TARGET,
        "logged_idx": LOGGED_IDX,
        "logged_propensity": MU,
        "rewards": REWARDS,
        "reward_hat": R_HAT,
        "mask": MASK,
    }
    return one_step_estimates(**{**args, **kw})


def test_hand_computed_tiny_table() -> None:
    est = _estimates()
    # DM: per-row sum_a pi * r_hat = .5*.8 + .5*.2 = .5 ; 1*1 = 1 ; .2*.5 + .8*.5 = .5
    dm = (0.5 + 1.0 + 0.5) / 3
    # IPS: w * r = 2*1, 0*2, 2*1.5
    ips = (2.0 + 0.0 + 3.0) / 3
    # SNIPS: sum(w r) / sum(w) = 5 / 4
    snips = 5.0 / 4.0
    # DR: dm_row + w (r - r_hat[a]) = .5 + 2(1 - .8) ; 1 + 0 ; .5 + 2(1.5 - .5)
    dr = (0.9 + 1.0 + 2.5) / 3
    for key, expected in [
        ("direct_method", dm),
        ("ips", ips),
        ("snips", snips),
        ("doubly_robust", dr),
    ]:
        assert est[key].raw == pytest.approx(expected), key
        assert est[key].normalized == pytest.approx(expected / LOGGED_VALUE), key


def test_clipping_importance_weights() -> None:
    est = _estimates(max_importance_weight=1.5)
    # Clipped weights: 1.5, 0, 1.5.
    assert est["ips"].raw == pytest.approx((1.5 * 1.0 + 1.5 * 1.5) / 3)
    assert est["doubly_robust"].raw == pytest.approx(
        ((0.5 + 1.5 * 0.2) + 1.0 + (0.5 + 1.5 * 1.0)) / 3
    )
    assert est["direct_method"].raw == pytest.approx(2.0 / 3)


def test_mask_ignores_probability_and_model_on_masked_candidates() -> None:
    # A padded third candidate with huge target score and garbage model output; unnormalised
    # target scores on the allowed slots in the same proportions as TARGET.
    target = np.hstack([TARGET * 7.0, np.full((3, 1), 100.0)])
    r_hat = np.hstack([R_HAT, np.full((3, 1), np.nan)])
    mask = np.hstack([MASK, np.zeros((3, 1))])
    padded = _estimates(target_probs=target, reward_hat=r_hat, mask=mask)
    plain = _estimates()
    for key in plain:
        assert padded[key].raw == pytest.approx(plain[key].raw), key
        assert padded[key].raw_std_error == pytest.approx(plain[key].raw_std_error), key


def test_masked_distribution_uniform_fallback() -> None:
    probs = masked_distribution([[0.0, 0.0, 5.0], [1.0, 3.0, 0.0]], [[1, 1, 0], [1, 1, 1]])
    np.testing.assert_allclose(probs, [[0.5, 0.5, 0.0], [0.25, 0.75, 0.0]])


def test_target_equals_logging_policy() -> None:
    rng = np.random.default_rng(1)
    n, k = 50, 4
    mu_full = rng.dirichlet(np.ones(k), size=n)
    idx = np.array([rng.choice(k, p=p) for p in mu_full])
    rewards = rng.normal(size=n) + 3.0
    est = one_step_estimates(
        mu_full,
        idx,
        mu_full[np.arange(n), idx],
        rewards,
        rng.normal(size=(n, k)),
        np.ones((n, k)),
    )
    assert est["ips"].raw == pytest.approx(rewards.mean())
    assert est["ips"].normalized == pytest.approx(1.0)
    assert est["snips"].normalized == pytest.approx(1.0)
    # Every replicate of on-policy IPS equals that replicate's logged value.
    assert est["ips"].normalized_std_error == pytest.approx(0.0, abs=1e-12)


def test_doubly_robust_with_perfect_reward_model_is_exact() -> None:
    # Deterministic rewards r(x, a) = r_hat[x, a]: DR (and DM) give the true target value.
    rng = np.random.default_rng(2)
    n, k = 40, 3
    r_table = rng.normal(size=(n, k))
    target = rng.dirichlet(np.ones(k), size=n)
    idx = rng.integers(0, k, size=n)
    est = one_step_estimates(
        target, idx, np.full(n, 1.0 / k), r_table[np.arange(n), idx], r_table, np.ones((n, k))
    )
    true_value = float(np.mean(np.sum(target * r_table, axis=1)))
    assert est["doubly_robust"].raw == pytest.approx(true_value)
    assert est["direct_method"].raw == pytest.approx(true_value)


def test_bootstrap_std_error_positive_zero_and_deterministic() -> None:
    est = _estimates()
    assert all(e.raw_std_error > 0 for e in est.values())
    assert _estimates(seed=0) == est
    assert _estimates(seed=1)["ips"].raw_std_error != est["ips"].raw_std_error

    n = 5
    constant = one_step_estimates(
        np.full((n, 2), 0.5),
        np.zeros(n),
        np.full(n, 0.5),
        np.ones(n),
        np.ones((n, 2)),
        np.ones((n, 2)),
    )
    for e in constant.values():
        assert e.raw_std_error == 0.0
        assert e.normalized_std_error == 0.0
        assert e.normalized == pytest.approx(1.0)


def test_no_bootstrap_and_zero_logged_value_serialise_as_none() -> None:
    est = one_step_estimates(
        np.full((2, 2), 0.5),
        [0, 1],
        [0.5, 0.5],
        [1.0, -1.0],
        np.zeros((2, 2)),
        np.ones((2, 2)),
        n_bootstrap=0,
    )
    d = est["ips"].to_dict()
    assert d["raw"] == 0.0
    assert d["normalized"] is None  # logged value 0
    assert d["raw_std_error"] is None  # no bootstrap
    json.dumps(d, allow_nan=False)
    assert math.isnan(est["ips"].normalized)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"logged_propensity": np.array([0.25, 0.0, 0.4])}, "logged_propensity"),
        ({"logged_idx": np.array([0, 2, 1])}, "logged_idx"),
        ({"mask": np.array([[1, 1], [0, 0], [1, 1]])}, "no possible action"),
        ({"rewards": np.ones(2)}, "rewards"),
    ],
)
def test_bad_inputs_raise(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _estimates(**kw)


def test_monte_carlo_bandit_within_three_standard_errors() -> None:
    rng = np.random.default_rng(123)
    n, k = 4000, 3
    contexts = rng.integers(0, 2, size=n)
    mean_reward = np.array([[1.0, 0.2, 0.5], [0.1, 0.9, 0.4]])
    logging = np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    target = np.array([[0.1, 0.1, 0.8], [0.7, 0.2, 0.1]])
    true_value = float(0.5 * np.sum(target * mean_reward))

    mu_rows = logging[contexts]
    idx = (rng.random(n)[:, None] > np.cumsum(mu_rows, axis=1)).sum(axis=1)
    rewards = mean_reward[contexts, idx] + rng.normal(scale=0.5, size=n)
    # A biased reward model: DR must stay unbiased, DM will not.
    r_hat = mean_reward[contexts] + 0.3
    est = one_step_estimates(
        target[contexts], idx, mu_rows[np.arange(n), idx], rewards, r_hat, np.ones((n, k)), seed=7
    )
    for key in ("ips", "snips", "doubly_robust"):
        e = est[key]
        assert 0 < e.raw_std_error < 0.2, key
        assert abs(e.raw - true_value) < 3 * e.raw_std_error, (key, e.raw, true_value)
    # DM is exact given the (biased) model and the empirical context mix.
    assert est["direct_method"].raw == pytest.approx(
        np.mean(np.sum(target[contexts] * r_hat, axis=1))
    )
    assert est["direct_method"].raw - true_value > 0.25
