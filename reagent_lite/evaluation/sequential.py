"""Sequential CPE over whole episodes: sequential DR, weighted DR and MAGIC.

Pure numpy, no models, no I/O, no ranks. Rows are logged transitions of episodes; the
caller supplies, per row, the target policy's probability of the logged action (already
renormalised over the possible actions), the model's Q of the logged action and the model's
state value under the target policy, `v_hat(s) = sum_a pi(a|s) q_hat(s, a)`.

Notation (episode i, step t = position within the episode, 0-based after sorting by
sequence_number): `rho_t = prod_{k<=t} pi(a_k|s_k) / mu(a_k|s_k)` (cumulative importance
weight, `rho_{-1} = 1`); `d_t^i = gamma^(tau_t^i)` the discount of step t, where `tau_t^i`
is the time elapsed since the episode's first step, the sum of the earlier steps'
`time_diff` (the project's one rule, `reagent_lite.discount`: the return training
optimises). All three estimators share one form,

    sum_t sum_i d_t^i [ w_t^i (r_t^i - q_t^i) + w_{t-1}^i v_t^i ],

* sequential DR (Jiang & Li 2016): `w_t^i = rho_t^i / M`, the unrolled form of the backward
  recursion `V = v_t + rho(r_t + gamma V' - q_t)`; unbiased, high variance.
* weighted DR (Thomas & Brunskill 2016): `w_t^i = rho_t^i / sum_j rho_t^j` (normalised
  across episodes per step); slightly biased, far lower variance.
* MAGIC (Thomas & Brunskill 2016): a convex blend of partial-horizon WDR estimates
  `g_j` (importance sampling up to step j, the model's value afterwards; `g_{-1}` is the
  direct method, `g_{T-1}` is WDR), weights minimising estimated bias^2 + variance.

Episodes of different lengths are padded to the longest one as if absorbed in a terminal
state: reward, q and v are 0 there and the per-step ratio is 1 (every action is equivalent
in an absorbing state). So the per-step normalisation of WDR always runs over all episodes,
and on-policy data (pi = mu) gives exactly the mean discounted return. (ReAgent pads the
ratio with 0, which renormalises over surviving episodes only and biases WDR upwards for
positive rewards when episode lengths vary.)

Values are normalised by the logged policy's value (mean discounted return over episodes);
standard errors come from a bootstrap over episodes (`cpe.bootstrap_sums`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from reagent_lite.discount import episode_discounts, sequence_gaps
from reagent_lite.evaluation.cpe import (
    CpeEstimate,
    FloatArray,
    bootstrap_sums,
    make_estimate,
)

# MAGIC's bias estimate: distance of g_j from this percentile-bootstrap interval of WDR.
# A 50% interval as in Thomas & Brunskill (ReAgent uses 90%, which lets a biased model's
# short-horizon estimates in more easily: on the synthetic MDP in the tests it doubled
# MAGIC's bias with no gain in variance).
MAGIC_CI_LEVEL = 0.5


def sequential_estimates(
    mdp_ids: npt.ArrayLike,
    sequence_numbers: npt.ArrayLike,
    rewards: npt.ArrayLike,
    logged_propensity: npt.ArrayLike,
    target_prob_logged: npt.ArrayLike,
    q_hat_logged: npt.ArrayLike,
    v_hat: npt.ArrayLike,
    *,
    gamma: float,
    time_diffs: npt.ArrayLike | None = None,
    n_bootstrap: int = 200,
    seed: int = 0,
    magic_max_j_steps: int = 20,
) -> dict[str, CpeEstimate]:
    """Sequential DR, weighted DR and MAGIC for a target policy, from logged episodes.

    Args:
        mdp_ids: `[N]` episode id per row (any sortable dtype: int or str).
        sequence_numbers: `[N]` step order within the episode (unique per episode; gaps
            count as time only where `time_diffs` is None).
        rewards: `[N]` logged rewards.
        logged_propensity: `[N]` logging-policy probability of the logged action, in (0, 1].
        target_prob_logged: `[N]` target-policy probability of the logged action.
        q_hat_logged: `[N]` model Q(s, a) of the logged action.
        v_hat: `[N]` model value of the state under the target policy.
        gamma: discount factor in [0, 1].
        time_diffs: `[N]` time from each step to the next (≥ 0), the exponent training
            discounts the transition with (the evaluator passes the table's, 1 for every
            row unless `rl.use_seq_num_diff_as_time_diff`); None = the sequence-number
            gaps, as the timeline writes `time_diff` and Horizon valued a logged episode.
        n_bootstrap: bootstrap replicates over episodes; 0 = no standard errors (NaN), and
            MAGIC then falls back to WDR (its blend weights need the bootstrap).
        seed: bootstrap seed.
        magic_max_j_steps: at most this many partial horizons j (spread evenly over
            -1 .. T-1, both ends always included) are blended by MAGIC.

    Returns:
        `{"sequential_doubly_robust", "weighted_doubly_robust", "magic"}` -> `CpeEstimate`.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    ep = _EpisodeTable.build(
        mdp_ids,
        sequence_numbers,
        rewards,
        logged_propensity,
        target_prob_logged,
        q_hat_logged,
        v_hat,
        time_diffs,
    )
    n_ep, horizon = ep.rewards.shape
    discounts = episode_discounts(gamma, ep.steps)  # d_t^i, [M, T]

    cum = np.cumprod(ep.ratios, axis=1)
    prev = np.hstack([np.ones((n_ep, 1)), cum[:, :-1]])
    returns = np.sum(ep.rewards * discounts, axis=1)

    # Per-episode statistics whose sums over (resampled) episodes determine every estimator;
    # the discounts are per episode, so they go in before the sums.
    stats = np.hstack(
        [
            cum,
            discounts * cum * (ep.rewards - ep.q_hat),
            discounts * prev * ep.v_hat,
            returns[:, None],
            np.ones((n_ep, 1)),
        ]
    )
    full = _Sums(stats.sum(axis=0, keepdims=True), horizon)
    boot = _Sums(bootstrap_sums(stats, n_bootstrap, seed), horizon)

    j_steps = _j_steps(horizon, magic_max_j_steps)
    g_full = _partial_horizon_wdr(full, j_steps)[0]
    g_boot = _partial_horizon_wdr(boot, j_steps)
    logged_full = float(full.returns[0] / full.count[0])
    logged_boot = boot.returns / boot.count

    def estimate(raw: FloatArray, boot_raw: FloatArray) -> CpeEstimate:
        return make_estimate(float(raw[0]), logged_full, boot_raw, logged_boot)

    weights = _magic_weights(g_full, g_boot)
    return {
        "sequential_doubly_robust": estimate(_sdr(full), _sdr(boot)),
        "weighted_doubly_robust": estimate(g_full[-1:], g_boot[:, -1]),
        "magic": estimate(np.array([g_full @ weights]), g_boot @ weights),
    }


class _EpisodeTable:
    """Rows sorted by (mdp_id, sequence_number) and scattered into padded `[M, T]` arrays."""

    def __init__(
        self,
        rewards: FloatArray,
        ratios: FloatArray,
        q_hat: FloatArray,
        v_hat: FloatArray,
        steps: FloatArray,
    ) -> None:
        self.rewards = rewards
        self.ratios = ratios
        self.q_hat = q_hat
        self.v_hat = v_hat
        self.steps = steps  # each step's time_diff (padding: irrelevant, nothing follows)

    @classmethod
    def build(
        cls,
        mdp_ids: npt.ArrayLike,
        sequence_numbers: npt.ArrayLike,
        rewards: npt.ArrayLike,
        logged_propensity: npt.ArrayLike,
        target_prob_logged: npt.ArrayLike,
        q_hat_logged: npt.ArrayLike,
        v_hat: npt.ArrayLike,
        time_diffs: npt.ArrayLike | None = None,
    ) -> _EpisodeTable:
        ids = np.asarray(mdp_ids).reshape(-1)
        seq = np.asarray(sequence_numbers).reshape(-1)
        n = ids.shape[0]
        if n == 0:
            raise ValueError("no rows to evaluate")
        cols = {
            "rewards": rewards,
            "logged_propensity": logged_propensity,
            "target_prob_logged": target_prob_logged,
            "q_hat_logged": q_hat_logged,
            "v_hat": v_hat,
            "time_diffs": np.zeros(n) if time_diffs is None else time_diffs,  # None: below
        }
        arrays = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in cols.items()}
        for name, arr in [("sequence_numbers", seq), *arrays.items()]:
            if arr.shape[0] != n:
                raise ValueError(f"{name} has {arr.shape[0]} rows, expected {n}")
            if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
                raise ValueError(f"{name} has {int(np.sum(~np.isfinite(arr)))} non-finite rows")
        mu = arrays["logged_propensity"]
        if np.any(mu <= 0.0):
            raise ValueError(f"logged_propensity must be > 0; {int(np.sum(mu <= 0))} bad rows")
        if np.any(arrays["target_prob_logged"] < 0.0):
            raise ValueError("target_prob_logged must be >= 0")
        if np.any(arrays["time_diffs"] < 0.0):
            raise ValueError(
                f"time_diffs must be >= 0; {int(np.sum(arrays['time_diffs'] < 0))} bad rows"
            )

        codes = np.unique(ids, return_inverse=True)[1].reshape(-1)
        order = np.lexsort((seq, codes))
        codes, seq = codes[order], seq[order]
        dup = (codes[1:] == codes[:-1]) & (seq[1:] == seq[:-1])
        if np.any(dup):
            raise ValueError(f"{int(dup.sum())} rows repeat an (mdp_id, sequence_number) pair")
        lengths = np.bincount(codes)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        pos = np.arange(n) - starts[codes]
        shape = (lengths.size, int(lengths.max()))

        def scatter(values: FloatArray, fill: float) -> FloatArray:
            out = np.full(shape, fill, dtype=np.float64)
            out[codes, pos] = values[order]
            return out

        steps = scatter(arrays["time_diffs"], 0.0)
        if time_diffs is None:
            steps[codes, pos] = sequence_gaps(codes, seq)  # rows already in (episode, seq) order

        return cls(
            rewards=scatter(arrays["rewards"], 0.0),
            ratios=scatter(arrays["target_prob_logged"] / mu, 1.0),
            q_hat=scatter(arrays["q_hat_logged"], 0.0),
            v_hat=scatter(arrays["v_hat"], 0.0),
            steps=steps,
        )


class _Sums:
    """Sums over episodes (one row per bootstrap replicate, or one row for the full data)."""

    def __init__(self, sums: FloatArray, horizon: int) -> None:
        t = horizon
        self.weight = sums[:, :t]  # sum_i rho_t^i
        self.weighted_td = sums[:, t : 2 * t]  # sum_i d_t^i rho_t^i (r_t^i - q_t^i)
        self.weighted_v = sums[:, 2 * t : 3 * t]  # sum_i d_t^i rho_{t-1}^i v_t^i
        self.returns = sums[:, 3 * t]  # sum_i discounted return
        self.count = sums[:, 3 * t + 1]  # number of episodes


def _div0(num: FloatArray, den: FloatArray) -> FloatArray:
    """`num / den`, 0 where `den` is 0 (all weights zero at a step: numerators are 0 too)."""
    return np.divide(
        num, den, out=np.zeros(np.broadcast_shapes(num.shape, den.shape)), where=den != 0
    )


def _sdr(s: _Sums) -> FloatArray:
    return (s.weighted_td + s.weighted_v).sum(axis=1) / s.count


def _partial_horizon_wdr(s: _Sums, j_steps: np.ndarray) -> FloatArray:
    """WDR truncated after step j, the model's value afterwards: `[R, len(j_steps)]`."""
    prev_weight = np.hstack([s.count[:, None], s.weight[:, :-1]])
    continuation = _div0(s.weighted_v, prev_weight)  # sum_i d_t w_{t-1} v_t / sum_i w_{t-1}
    per_step = _div0(s.weighted_td, s.weight) + continuation
    # g_j = sum_{t<=j} per_step_t + continuation_{j+1}; pad so j = -1 and j = T-1 index cleanly.
    zeros = np.zeros((per_step.shape[0], 1))
    head = np.hstack([zeros, np.cumsum(per_step, axis=1)])  # head[:, j + 1]
    tail = np.hstack([continuation, zeros])  # tail[:, j + 1]
    return head[:, j_steps + 1] + tail[:, j_steps + 1]


def _j_steps(horizon: int, max_j_steps: int) -> np.ndarray:
    """Partial horizons for MAGIC: -1 (direct method) .. horizon-1 (full WDR), evenly spread."""
    count = max(2, min(max_j_steps, horizon + 1))
    return np.unique(np.round(np.linspace(-1, horizon - 1, count)).astype(np.int64))


def _magic_weights(g_full: FloatArray, g_boot: FloatArray) -> FloatArray:
    """Blend weights on the simplex minimising x'(Cov + bias bias')x (Thomas & Brunskill 2016).

    Cov is the bootstrap covariance of the partial-horizon estimates; bias of g_j is its
    distance to the percentile-bootstrap interval of the full WDR (the least biased one).
    Without a usable bootstrap, all weight goes to WDR. MAGIC's reported standard error
    keeps these weights fixed, so it ignores the variance of choosing them (it is a little
    optimistic).
    """
    weights = np.zeros(g_full.shape[0])
    weights[-1] = 1.0
    finite = g_boot[np.all(np.isfinite(g_boot), axis=1)]
    if finite.shape[0] < 2 or g_full.shape[0] < 2:
        return weights
    tail = (1.0 - MAGIC_CI_LEVEL) / 2.0
    low, high = np.quantile(finite[:, -1], [tail, 1.0 - tail])
    bias = np.maximum(0.0, np.maximum(low - g_full, g_full - high))
    error = np.atleast_2d(np.cov(finite, rowvar=False)) + np.outer(bias, bias)
    return _simplex_qp(error, weights)


def _simplex_qp(a: FloatArray, x0: FloatArray, iterations: int = 5000) -> FloatArray:
    """Minimise x'Ax over the probability simplex by projected gradient descent."""
    lipschitz = 2.0 * float(np.max(np.abs(np.linalg.eigvalsh(a))))
    if not np.isfinite(lipschitz) or lipschitz <= 0.0:
        return x0
    x = x0.copy()
    for _ in range(iterations):
        nxt = _project_simplex(x - (2.0 * a @ x) / lipschitz)
        if np.max(np.abs(nxt - x)) < 1e-12:
            return nxt
        x = nxt
    return x


def _project_simplex(v: FloatArray) -> FloatArray:
    """Euclidean projection onto {x >= 0, sum x = 1} (sort-based, Duchi et al. 2008)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u - css / k > 0)[0][-1])
    return np.maximum(v - css[rho] / (rho + 1.0), 0.0)


__all__ = ["MAGIC_CI_LEVEL", "sequential_estimates"]
