"""How far the CPE estimates of a policy can be trusted: effective sample sizes, ties and
closeness to uniform, and the log lines that print them beside the estimates.

Pure numpy on the arrays the evaluator already has; no models, no I/O, no ranks.

* Effective sample size (Kish): `(Σ w)² / Σ w²` of the importance weights, per row for the
  one-step estimators and per episode (the product of an episode's per-step ratios) for the
  sequential ones. For the greedy policy a weight is 1/μ where the logger took the served
  action and 0 elsewhere, so the ESS is roughly the number of such rows: an IPS or DR
  estimate rests on them alone, whatever the table's size.
* A softmax whose top probability is close to 1/#candidates is nearly uniform: its value
  says little about the greedy policy that is served.
* Rows whose best Q is tied between candidates are served the first of them; many ties
  usually mean candidates the network cannot tell apart (see the normalization warnings).
* An estimate outside the values any policy can reach with the eval table's rewards (one
  step: [min r, max r]; a discounted return: [min(r, 0), max(r, 0)] / (1 − γ)) by more
  than its bootstrap noise is wrong by at least its excess. Seen on CartPole: the policy-value
  model of a policy that leaves the logged states (always pushing right) diverges, and
  with no logged episode that follows the policy (episode ESS 0) the importance weights
  cannot correct it: sequential DR 72× the logger for a policy truly worth 0.6×.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger("reagent_lite")

# Below this effective sample size (rows or episodes) a bootstrap standard error is itself
# unreliable and the estimate rests on a handful of logged decisions.
MIN_EFFECTIVE_SAMPLES = 30.0
# ... or below this fraction of the rows / episodes evaluated.
MIN_EFFECTIVE_FRACTION = 0.01
# A policy whose mean top probability has gone less than this fraction of the way from
# uniform's (1/#candidates) to a deterministic policy's (1) is "near-uniform": e.g. a
# softmax over 80 candidates with mean top probability 0.016 (uniform: 0.0125).
NEAR_UNIFORM_FRACTION = 0.1
# Warn when more than this fraction of rows (with several candidates) tie at the top Q.
MAX_TIED_FRACTION = 0.1

_SHOWN = ("ips", "doubly_robust", "sequential_doubly_robust", "magic")
ONE_STEP = ("direct_method", "ips", "snips", "doubly_robust")
SEQUENTIAL = ("sequential_doubly_robust", "weighted_doubly_robust", "magic")


def effective_sample_size(weights: np.ndarray) -> float:
    """Kish's effective sample size `(Σ w)² / Σ w²` (0 when every weight is 0)."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    top = float(np.max(w)) if w.size else 0.0
    if top > 0.0:
        w = w / top  # scale-free, and no overflow in the squares
    sq = float(np.sum(w * w))
    return float(np.sum(w)) ** 2 / sq if sq > 0.0 else 0.0


def policy_diagnostics(
    *,
    q: np.ndarray,
    probs: np.ndarray,
    mask: np.ndarray,
    ratio: np.ndarray,
    keep: np.ndarray,
    mdp_ids: np.ndarray,
) -> dict[str, float]:
    """Diagnostics of an evaluated policy on the eval rows.

    `q`, `probs`, `mask` [N, K]: Q, the policy's probabilities, the candidates; `ratio` [N]:
    π(logged action) / μ(logged action) (0 where the policy cannot take it); `keep` [N]:
    rows with candidates (those the one-step estimators score); `mdp_ids` [N] episodes.
    """
    rows = int(keep.sum())
    w_rows = ratio[keep]
    codes = np.unique(mdp_ids, return_inverse=True)[1].reshape(-1)
    # Product of each episode's per-step ratios, through logs (a ratio of 0 gives -inf → 0).
    with np.errstate(divide="ignore"):
        log_r = np.log(np.asarray(ratio, dtype=np.float64))
    episode_log = np.zeros(int(codes.max()) + 1 if codes.size else 0)
    np.add.at(episode_log, codes, log_r)
    # ESS is scale-free: shift the logs so that long episodes' products cannot overflow.
    finite = episode_log[np.isfinite(episode_log)]
    shift = float(finite.max()) if finite.size else 0.0
    w_episodes = np.exp(episode_log - shift)
    n_cand = mask[keep].sum(axis=1)
    several = n_cand >= 2
    q_valid = np.where(mask[keep], q[keep], -np.inf)
    top = q_valid.max(axis=1, keepdims=True) if rows else np.zeros((0, 1))
    ties = (q_valid == top).sum(axis=1) >= 2
    return {
        "effective_sample_size_rows": effective_sample_size(w_rows),
        "rows": float(rows),
        "effective_sample_size_episodes": effective_sample_size(w_episodes),
        "episodes": float(episode_log.size),
        # The mean importance weight (SNIPS's denominator / rows): ≈ 1 when the propensities
        # are right, whatever the policy; far from 1 means μ or the rows are off.
        "mean_importance_weight": _mean(w_rows),
        "mean_top_probability": _mean(probs[keep].max(axis=1)) if rows else float("nan"),
        "uniform_top_probability": _mean(1.0 / np.maximum(n_cand, 1)),
        "tied_top_q_fraction": _mean(ties[several]),
    }


def reachable_range(estimates: dict[str, Any], rewards: np.ndarray, gamma: float) -> dict[str, Any]:
    """The values any policy can reach with these rewards, and the raw estimates beyond
    them by more than 2 bootstrap standard errors (less is the eval table's noise: DR on
    CartPole scatters around the one-step value 1 that every policy has).

    One step: [min r, max r]. A discounted return (time_diff ≥ 1, so step t is discounted
    by at least γ^t): [min(r, 0), max(r, 0)] / (1 − γ); unbounded at γ = 1. `estimates`
    maps an estimator's name to its `CpeEstimate.to_dict()`."""
    r = np.asarray(rewards, dtype=np.float64)
    lo, hi = (float(r.min()), float(r.max())) if r.size else (0.0, 0.0)
    horizon = 1.0 / (1.0 - gamma) if gamma < 1.0 else float("inf")
    # No reward of that sign: that bound is 0 (never 0 × inf at γ = 1).
    ret_lo = lo * horizon if lo < 0 else 0.0
    ret_hi = hi * horizon if hi > 0 else 0.0
    bounds = {name: (lo, hi) for name in ONE_STEP}
    bounds.update({name: (ret_lo, ret_hi) for name in SEQUENTIAL})
    outside = []
    for name, (low, high) in bounds.items():
        est = estimates.get(name) or {}
        raw, se = est.get("raw"), est.get("raw_std_error")
        noise = 2.0 * se if se is not None and np.isfinite(se) else 0.0
        noise += 1e-6 * max(1.0, abs(low), abs(high)) if np.isfinite(high - low) else 0.0
        if raw is not None and not low - noise <= raw <= high + noise:
            outside.append(name)
    return {
        "reward_min": lo,
        "reward_max": hi,
        "return_min": ret_lo,
        "return_max": ret_hi,
        "outside": outside,
    }


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if np.size(x) else float("nan")


def diagnostic_warnings(diag: dict[str, float], label: str) -> list[str]:
    """What is wrong with the estimates of `label`'s policy, one sentence each."""
    out: list[str] = []
    for unit in ("rows", "episodes"):
        ess, n = diag[f"effective_sample_size_{unit}"], diag[unit]
        if n > 0 and (ess < MIN_EFFECTIVE_SAMPLES or ess < MIN_EFFECTIVE_FRACTION * n):
            out.append(
                f"CPE of the {label}: effective sample size {ess:.1f} of {n:.0f} {unit}: the "
                f"{'one-step' if unit == 'rows' else 'sequential'} estimates rest on a handful "
                "of logged decisions (the logger rarely took the evaluated policy's action); "
                "do not trust them, nor their standard errors"
            )
    top, uniform = diag["mean_top_probability"], diag["uniform_top_probability"]
    if uniform < 1.0 and (top - uniform) < NEAR_UNIFORM_FRACTION * (1.0 - uniform):
        out.append(
            f"CPE of the {label}: the policy is near-uniform (mean top probability {top:.3f}, "
            f"uniform {uniform:.3f}): its value says little about the greedy policy that "
            "model.pt2 serves"
        )
    tied = diag["tied_top_q_fraction"]
    if tied > MAX_TIED_FRACTION:
        out.append(
            f"{tied:.0%} of the eval rows tie at the top Q between candidates: model.pt2 "
            "serves the first of them; candidates that look identical to the network usually "
            "mean features that normalize to a constant (see the normalization warnings)"
        )
    return out


def warn_and_summarize(cpe: dict[str, Any], label: str) -> None:
    """Logs the headline estimates with their effective sample sizes, then the warnings."""
    diag = cpe["diagnostics"]
    parts = []
    for name in _SHOWN:
        est = cpe.get(name)
        if est and est.get("normalized") is not None:
            se = est.get("normalized_std_error")
            parts.append(f"{name} {est['normalized']:.3f}" + (f" ± {se:.3f}" if se else ""))
    log.info(
        "CPE of the %s, relative to the logger: %s; effective sample size %.1f of %.0f rows, "
        "%.1f of %.0f episodes",
        label,
        ", ".join(parts) or "no estimate",
        diag["effective_sample_size_rows"],
        diag["rows"],
        diag["effective_sample_size_episodes"],
        diag["episodes"],
    )
    for message in diagnostic_warnings(diag, label):
        log.warning("%s", message)
    check = cpe.get("reachable_range") or {}
    for name in check.get("outside", []):
        sequential = name in SEQUENTIAL
        low, high = (
            (check["return_min"], check["return_max"])
            if sequential
            else (check["reward_min"], check["reward_max"])
        )
        log.warning(
            "CPE of the %s: %s = %.4g is outside [%.4g, %.4g], the %s any policy can reach "
            "with the eval table's rewards, by more than 2 standard errors: it is wrong by at "
            "least the excess (%s); do not read a direction from it",
            label,
            name,
            cpe[name]["raw"],
            low,
            high,
            "discounted return" if sequential else "one-step value",
            "the policy-value model has diverged on states the logged data barely covers, "
            "or too few logged episodes follow the policy to correct it"
            if sequential
            else "the reward model extrapolates, or the importance weights rest on too few rows",
        )
