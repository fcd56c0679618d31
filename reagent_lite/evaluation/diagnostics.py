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
  than its bootstrap noise (and than 1% of the range) is wrong by at least its excess.
  Seen on CartPole: the policy-value model of a policy that leaves the logged states
  (always pushing right) diverges, and with no logged episode that follows the policy
  (episode ESS 0) the importance weights cannot correct it: sequential DR 72× the logger
  for a policy truly worth 0.6×.
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
# An estimate outside the reachable range by less than this fraction of the range's scale
# is rounding or a model's last per cent, not a wrong estimate.
NEGLIGIBLE_FRACTION = 0.01

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
    logged_index: np.ndarray | None = None,
) -> dict[str, float]:
    """Diagnostics of an evaluated policy on the eval rows.

    `q`, `probs`, `mask` [N, K]: Q, the policy's probabilities, the candidates; `ratio` [N]:
    π(logged action) / μ(logged action) (0 where the policy cannot take it); `keep` [N]:
    rows with candidates (those the one-step estimators score); `mdp_ids` [N] episodes;
    `logged_index` [N]: the logged action's candidate position (-1: not a candidate), which
    adds the policy's action coverage (`coverage`).
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
        **(coverage(probs[keep], logged_index[keep]) if logged_index is not None else {}),
    }


def coverage(probs: np.ndarray, logged_index: np.ndarray) -> dict[str, float]:
    """How much of the policy the logs show: `logged_action_agreement`, the mean
    probability the policy gives the logged action (for the greedy policy: the share of
    rows where it picks what the logger did), and `unlogged_pick_fraction`, the share of
    its picks that go to candidate positions (dqn: actions) no eval row logged, about
    which the data says nothing."""
    if not probs.shape[0]:
        return {"logged_action_agreement": float("nan"), "unlogged_pick_fraction": float("nan")}
    idx = np.asarray(logged_index).reshape(-1).astype(np.int64)
    rows = np.arange(idx.size)
    agree = np.where(idx >= 0, probs[rows, np.clip(idx, 0, None)], 0.0)
    logged = np.zeros(probs.shape[1], dtype=bool)
    logged[idx[idx >= 0]] = True
    return {
        "logged_action_agreement": _mean(agree),
        "unlogged_pick_fraction": _mean(probs[:, ~logged].sum(axis=1)),
    }


def reachable_range(estimates: dict[str, Any], rewards: np.ndarray, gamma: float) -> dict[str, Any]:
    """The values any policy can reach with these rewards, and the raw estimates beyond
    them by more than 2 bootstrap standard errors (less is the eval table's noise: DR on
    CartPole scatters around the one-step value 1 that every policy has) and by more than
    NEGLIGIBLE_FRACTION of the range's scale max(|lo|, |hi|, hi - lo).

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
        # An excess that is a negligible part of the scale is not "wrong": DR = 0.999 on
        # [1, 1] is rounding and a reward model's last per mille, whatever its tiny SE.
        scale = max(abs(low), abs(high), high - low) if np.isfinite(high - low) else 0.0
        noise = max(noise, NEGLIGIBLE_FRACTION * scale)
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


class CpeNotices:
    """The CPE warnings a run has given: each distinct one (by kind, not by its numbers)
    is said at WARNING the first time, at DEBUG with a count afterwards. One per run,
    held by the run's `CpeNets` rather than by this module, so that two runs in one
    process (the API, tests) each hear every warning once."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def say(self, key: str, message: str) -> bool:
        """Logs `message` (WARNING when `key` is new); True when it was new."""
        seen = self.counts.get(key, 0) + 1
        self.counts[key] = seen
        if seen == 1:
            log.warning("%s", message)
        else:
            log.debug("%s (said %d times this run)", message, seen)
        return seen == 1


def diagnostic_notices(diag: dict[str, float], label: str) -> list[tuple[str, str]]:
    """What is wrong with the estimates of `label`'s policy: (kind, sentence) pairs."""
    out: list[tuple[str, str]] = []
    for unit in ("rows", "episodes"):
        ess, n = diag[f"effective_sample_size_{unit}"], diag[unit]
        if n > 0 and (ess < MIN_EFFECTIVE_SAMPLES or ess < MIN_EFFECTIVE_FRACTION * n):
            which = "one-step" if unit == "rows" else "sequential"
            out.append(
                (
                    f"{label}: ess {unit}",
                    f"CPE of the {label}: {which} estimates unreliable, effective sample size "
                    f"{ess:.1f} of {n:.0f} {unit} (few logged actions match the policy's): "
                    "do not trust them or their errors",
                )
            )
    top, uniform = diag["mean_top_probability"], diag["uniform_top_probability"]
    if uniform < 1.0 and (top - uniform) < NEAR_UNIFORM_FRACTION * (1.0 - uniform):
        out.append(
            (
                f"{label}: near-uniform",
                f"CPE of the {label}: the policy is near-uniform (mean top probability "
                f"{top:.3f}, uniform {uniform:.3f}): its value says little about the greedy "
                "policy model.pt2 serves",
            )
        )
    tied = diag["tied_top_q_fraction"]
    if tied > MAX_TIED_FRACTION:
        out.append(
            (
                "ties",
                f"{tied:.0%} of the eval rows tie at the top Q: model.pt2 serves the first "
                "candidate; usually features that normalize to a constant (see the "
                "normalization warnings)",
            )
        )
    return out


def diagnostic_warnings(diag: dict[str, float], label: str) -> list[str]:
    """What is wrong with the estimates of `label`'s policy, one sentence each."""
    return [message for _, message in diagnostic_notices(diag, label)]


def _short(label: str) -> str:
    # "greedy policy (what model.pt2 serves)": the per-epoch line keeps the name only.
    return label.split(" (what model.pt2 serves)")[0]


def warn_and_summarize(cpe: dict[str, Any], label: str, notices: CpeNotices | None = None) -> None:
    """Logs the headline estimates with their effective sample sizes on one short line,
    then each warning through `notices` (a fresh one says everything)."""
    notices = notices or CpeNotices()
    diag = cpe["diagnostics"]
    found = diagnostic_notices(diag, label)
    check = cpe.get("reachable_range") or {}
    for name in check.get("outside", []):
        sequential = name in SEQUENTIAL
        low, high = (
            (check["return_min"], check["return_max"])
            if sequential
            else (check["reward_min"], check["reward_max"])
        )
        raw = cpe[name]["raw"]
        found.append(
            (
                f"{label}: outside {name}",
                f"CPE of the {_short(label)}: {name} = {raw:.4g} is off by at least "
                f"{max(low - raw, raw - high):.3g}: any policy's "
                f"{'discounted return' if sequential else 'one-step value'} here is in "
                f"[{low:.4g}, {high:.4g}] ("
                + (
                    "the value model diverged where the data is thin)"
                    if sequential
                    else "the reward model is off, or too few rows carry the weights)"
                ),
            )
        )
    parts = []
    for name in _SHOWN:
        est = cpe.get(name)
        if est and est.get("normalized") is not None:
            se = est.get("normalized_std_error")
            parts.append(f"{name} {est['normalized']:.3f}" + (f"±{se:.3f}" if se else ""))
    repeated = sum(key in notices.counts for key, _ in found)
    log.info(
        "CPE of the %s vs the logger: %s; ESS %.0f/%.0f rows, %.1f/%.0f episodes%s",
        _short(label),
        ", ".join(parts) or "no estimate",
        diag["effective_sample_size_rows"],
        diag["rows"],
        diag["effective_sample_size_episodes"],
        diag["episodes"],
        f" ({repeated} warning(s) as before)" if repeated else "",
    )
    for key, message in found:
        notices.say(key, message)
