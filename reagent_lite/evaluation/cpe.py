"""One-step counterfactual policy evaluation (CPE): Direct Method, IPS, SNIPS, Doubly Robust.

Pure numpy, no models, no I/O, no ranks. Every input is a plain array; the same code serves
discrete actions (K = number of actions, mask = possible actions) and parametric actions
(K = padded candidates, mask = candidate mask).

Each estimate is reported raw and normalised by the logged policy's value (the mean logged
reward), as ReAgent does, with bootstrap standard errors over rows. The bootstrap resamples
rows with replacement; every estimator here is a function of a few per-row sums, so each
replicate is one matrix product of resample counts with a small `[N, S]` table of per-row
statistics (`bootstrap_sums`), done in chunks to bound memory.

References: Dudík, Langford & Li (2011), "Doubly Robust Policy Evaluation and Learning";
Swaminathan & Joachims (2015) for the self-normalised IPS estimator.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# The bootstrap materialises a [chunk, N] count matrix; keep it around 32 MB of float64.
_BOOTSTRAP_CHUNK_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class CpeEstimate:
    """One CPE estimate: raw policy value, value relative to the logged policy, std errors.

    `normalized` is `raw / logged_value` (1.0 means "as good as the logging policy"). It is
    NaN when the logged value is zero. Standard errors are NaN without a bootstrap.
    """

    raw: float
    normalized: float
    raw_std_error: float
    normalized_std_error: float

    def to_dict(self) -> dict[str, float | None]:
        """Plain dict for metrics records; non-finite values become None (valid JSON)."""
        return {k: (v if math.isfinite(v) else None) for k, v in asdict(self).items()}


def bootstrap_sums(stats: FloatArray, n_bootstrap: int, seed: int) -> FloatArray:
    """Column sums of `stats [U, S]` over `n_bootstrap` resamples of its U rows: `[B, S]`.

    Rows are drawn uniformly with replacement (U draws per replicate), seeded, so the result
    is deterministic for a given `seed`.
    """
    stats = np.asarray(stats, dtype=np.float64)
    n_units = stats.shape[0]
    out = np.empty((n_bootstrap, stats.shape[1]), dtype=np.float64)
    if n_bootstrap == 0 or n_units == 0:
        out[:] = 0.0
        return out
    rng = np.random.default_rng(seed)
    draw_dtype = np.int32 if n_units < 2**31 else np.int64  # int32 draws are twice as fast
    chunk = max(1, _BOOTSTRAP_CHUNK_ELEMENTS // n_units)
    counts = np.empty((chunk, n_units), dtype=np.float64)
    for start in range(0, n_bootstrap, chunk):
        b = min(chunk, n_bootstrap - start)
        draws = rng.integers(0, n_units, size=(b, n_units), dtype=draw_dtype)
        # Row r of `counts` says how often each unit was drawn in replicate r.
        for row in range(b):
            counts[row] = np.bincount(draws[row], minlength=n_units)
        out[start : start + b] = counts[:b] @ stats
    return out


def safe_ratio(num: FloatArray | float, den: FloatArray | float) -> FloatArray:
    """`num / den` elementwise, NaN where `den` is zero (no warnings)."""
    num_a = np.asarray(num, dtype=np.float64)
    den_a = np.asarray(den, dtype=np.float64)
    shape = np.broadcast_shapes(num_a.shape, den_a.shape)
    out = np.full(shape, np.nan)
    np.divide(num_a, den_a, out=out, where=np.broadcast_to(den_a != 0.0, shape))
    return out


def make_estimate(
    raw: float, logged: float, boot_raw: FloatArray, boot_logged: FloatArray
) -> CpeEstimate:
    """Build a `CpeEstimate` from a point estimate and its bootstrap replicates."""
    return CpeEstimate(
        raw=float(raw),
        normalized=float(safe_ratio(raw, logged)),
        raw_std_error=_std(boot_raw),
        normalized_std_error=_std(safe_ratio(boot_raw, boot_logged)),
    )


def _std(replicates: FloatArray) -> float:
    finite = replicates[np.isfinite(replicates)]
    if finite.size < 2:
        return math.nan
    return float(np.std(finite, ddof=1))


def _check_rows(name: str, arr: np.ndarray, n: int) -> None:
    if arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} rows, expected {n}")


def one_step_estimates(
    target_probs: npt.ArrayLike,
    logged_idx: npt.ArrayLike,
    logged_propensity: npt.ArrayLike,
    rewards: npt.ArrayLike,
    reward_hat: npt.ArrayLike,
    mask: npt.ArrayLike,
    *,
    n_bootstrap: int = 200,
    seed: int = 0,
    max_importance_weight: float | None = None,
) -> dict[str, CpeEstimate]:
    """Contextual-bandit CPE of a target policy from logged rows.

    Args:
        target_probs: `[N, K]` target-policy probabilities (or any non-negative scores).
            They are renormalised over `mask`, so mass on masked slots is ignored; a row with
            no mass on any allowed slot gets the uniform distribution over its allowed slots.
        logged_idx: `[N]` index (0..K-1) of the logged action / candidate.
        logged_propensity: `[N]` logging-policy probability of the logged action, in (0, 1].
        rewards: `[N]` logged rewards.
        reward_hat: `[N, K]` reward model (e.g. the Q-network's immediate-reward head, or Q
            itself for gamma = 0). Masked entries are ignored, NaN allowed there.
        mask: `[N, K]` 1 where the action / candidate was possible. Every row needs one.
        n_bootstrap: bootstrap replicates (over rows) for the standard errors; 0 = none (NaN).
        seed: bootstrap seed.
        max_importance_weight: if set, importance weights `pi(a|x) / mu(a|x)` are clipped to
            at most this value (trades a little bias for much less variance); None = no clip.

    Returns:
        `{"direct_method", "ips", "snips", "doubly_robust"}` -> `CpeEstimate`, normalised by the
        logged policy's value (mean logged reward). Rows whose logged action is masked out get
        importance weight 0.
    """
    probs = np.asarray(target_probs, dtype=np.float64)
    allowed = np.asarray(mask).astype(bool)
    idx = np.asarray(logged_idx).astype(np.int64).reshape(-1)
    mu = np.asarray(logged_propensity, dtype=np.float64).reshape(-1)
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    r_hat = np.asarray(reward_hat, dtype=np.float64)

    if probs.ndim != 2:
        raise ValueError(f"target_probs must be [N, K], got shape {probs.shape}")
    n, k = probs.shape
    if allowed.shape != (n, k) or r_hat.shape != (n, k):
        raise ValueError(
            f"mask {allowed.shape} and reward_hat {r_hat.shape} must match target_probs {probs.shape}"
        )
    for name, arr in (("logged_idx", idx), ("logged_propensity", mu), ("rewards", r)):
        _check_rows(name, arr, n)
    if n == 0:
        raise ValueError("no rows to evaluate")
    if np.any((idx < 0) | (idx >= k)):
        raise ValueError(
            f"logged_idx out of range [0, {k}) in {int(np.sum((idx < 0) | (idx >= k)))} rows"
        )
    if not np.all(np.isfinite(mu) & (mu > 0.0)):
        raise ValueError(
            f"logged_propensity must be finite and > 0; {int(np.sum(~(np.isfinite(mu) & (mu > 0))))} bad rows"
        )
    if not np.all(np.isfinite(r)):
        raise ValueError(f"rewards has {int(np.sum(~np.isfinite(r)))} non-finite rows")
    if not np.all(allowed.any(axis=1)):
        raise ValueError(f"{int(np.sum(~allowed.any(axis=1)))} rows have no possible action")

    pi = masked_distribution(probs, allowed)
    r_hat = np.where(allowed, r_hat, 0.0)
    rows = np.arange(n)

    dm_row = np.sum(pi * r_hat, axis=1)
    w = pi[rows, idx] / mu
    if max_importance_weight is not None:
        w = np.minimum(w, max_importance_weight)
    ips_row = w * r
    dr_row = dm_row + w * (r - r_hat[rows, idx])

    # Every estimator is (sum of a per-row statistic) / (sum of a per-row denominator).
    stats = np.stack([dm_row, ips_row, dr_row, w, r, np.ones(n)], axis=1)
    full = stats.sum(axis=0)
    boot = bootstrap_sums(stats, n_bootstrap, seed)
    s_dm, s_ips, s_dr, s_w, s_r, s_n = range(6)

    def ratio_estimate(num: int, den: int) -> CpeEstimate:
        return make_estimate(
            raw=float(safe_ratio(full[num], full[den])),
            logged=full[s_r] / full[s_n],
            boot_raw=safe_ratio(boot[:, num], boot[:, den]),
            boot_logged=boot[:, s_r] / boot[:, s_n],
        )

    return {
        "direct_method": ratio_estimate(s_dm, s_n),
        "ips": ratio_estimate(s_ips, s_n),
        "snips": ratio_estimate(s_ips, s_w),
        "doubly_robust": ratio_estimate(s_dr, s_n),
    }


def masked_distribution(probs: npt.ArrayLike, mask: npt.ArrayLike) -> FloatArray:
    """Renormalise non-negative `probs [N, K]` over `mask`; uniform where a row has no mass."""
    p = np.asarray(probs, dtype=np.float64)
    allowed = np.asarray(mask).astype(bool)
    # Scores on masked slots (padding, possibly NaN) must not leak in; NaN > 0 is False.
    p = np.where(allowed & (p > 0.0), p, 0.0)
    total = p.sum(axis=1, keepdims=True)
    uniform = allowed / np.maximum(allowed.sum(axis=1, keepdims=True), 1)
    return np.where(total > 0.0, p / np.where(total > 0.0, total, 1.0), uniform)
