"""Counterfactual evaluation of the current Q-network on the eval table (rank 0 only).

Turns networks + eval tensors into the arrays the pure estimators of `cpe.py` and
`sequential.py` take. The evaluated policy (`EvaluatedPolicy`) is by default the greedy
policy `model.pt2` serves (argmax of Q over each row's candidates, ties to the first);
softmax(Q / temperature), which ReAgent evaluated, is an option reported under its name.
With a deterministic policy an importance weight is 1/μ or 0, so only the rows where the
logger happened to take the served action carry IPS: the effective sample size printed
with the estimates says how many such rows the estimate really rests on.

Row handling: a logged action outside the row's candidates gets importance weight 0 (the
learned policy never takes it) rather than being dropped, so every estimator values the same
states; rows without any candidate leave the one-step estimators (no policy to value there)
but stay in the sequential ones, so no episode loses a step.

On CartPole-like data (reward always 1) the one-step estimators are ≈ 1.0 normalized by
construction (SNIPS exactly 1): they value one immediate reward. Only the sequential ones
compare discounted returns, and only as far as the logged episodes went.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from reagent_lite.data.rows import Rows
from reagent_lite.evaluation.cpe import CpeEstimate, one_step_estimates
from reagent_lite.evaluation.cpe_models import CpeNets, EvaluatedPolicy, gather_logged
from reagent_lite.evaluation.diagnostics import (
    policy_diagnostics,
    reachable_range,
    warn_and_summarize,
)
from reagent_lite.evaluation.sequential import sequential_estimates

_CHUNK = 65_536

log = logging.getLogger("reagent_lite")


@torch.no_grad()
def _predict(kind: Any, net: nn.Module, data: Rows) -> Tensor:
    parts = [kind.q_all(net, chunk, next_state=False) for chunk in data.chunks(_CHUNK)]
    return torch.cat(parts).float()


def evaluate_cpe(
    kind: Any,
    q_net: nn.Module,
    cpe_nets: CpeNets,
    data: Rows,
    *,
    policy: EvaluatedPolicy,
    gamma: float,
    n_bootstrap: int,
    seed: int,
) -> dict[str, dict[str, Any]]:
    """All CPE estimates of `policy` (over `q_net`'s Q) on `data` (eval tensors), with
    `policy` (what was evaluated) and `diagnostics` (effective sample sizes, ties, how
    close to uniform the policy is) beside them; warnings are logged here, each distinct
    one at WARNING once per run (`cpe_nets.notices`), repeats at DEBUG."""
    was_training = q_net.training, cpe_nets.training
    q_net.eval()
    cpe_nets.eval()
    try:
        q = _predict(kind, q_net, data)
        r_hat = _predict(kind, cpe_nets.reward_net, data)
        q_hat = _predict(kind, cpe_nets.value_net, data)
    finally:
        q_net.train(was_training[0])
        cpe_nets.train(was_training[1])
    mask = kind.candidate_mask(data, next_state=False).float()
    idx = kind.logged_index(data)
    probs = policy.probs(q, mask)
    arrays = _one_step_inputs(probs, idx, r_hat, mask)
    keep = arrays.pop("keep")

    def np_(t: Tensor) -> np.ndarray:
        return t.detach().cpu().numpy()[keep]

    estimates: dict[str, CpeEstimate] = {}
    if keep.any():
        estimates.update(
            one_step_estimates(
                arrays["probs"],
                arrays["idx"],
                np_(data.propensity),
                np_(data.reward),
                arrays["r_hat"],
                arrays["mask"],
                n_bootstrap=n_bootstrap,
                seed=seed,
            )
        )
    else:
        estimates.update({name: _NAN for name in _ONE_STEP})

    def all_(t: Tensor) -> np.ndarray:
        return t.detach().cpu().numpy()

    # Sequential estimators see every row, so that no episode loses a step: a logged action
    # the learned policy cannot take (not a candidate, or no candidates) has target
    # probability 0 there, which zeroes the episode's weight from that step on.
    try:
        estimates.update(
            sequential_estimates(
                all_(data.mdp_id),
                all_(data.sequence_number),
                all_(data.reward),
                all_(data.propensity),
                all_(gather_logged(probs, idx)),
                all_(gather_logged(q_hat, idx)),
                all_((probs * q_hat).sum(-1)),
                gamma=gamma,
                time_diffs=all_(data.time_diff),
                n_bootstrap=n_bootstrap,
                seed=seed,
            )
        )
    except ValueError as err:  # e.g. repeated (mdp_id, sequence_number) pairs
        cpe_nets.notices.say("sequential skipped", f"sequential CPE skipped: {err}")
    out: dict[str, dict[str, Any]] = {name: est.to_dict() for name, est in estimates.items()}
    off_list = (idx < 0).cpu().numpy()
    out["rows"] = {
        "scored": float(keep.sum()),
        "dropped": float((~keep).sum()),
        "logged_action_not_candidate": float((off_list & keep).sum()),
    }
    out["policy"] = policy.describe()
    ratio = gather_logged(probs, idx) / data.propensity.to(probs.dtype)
    out["diagnostics"] = policy_diagnostics(
        q=all_(q),
        probs=all_(probs),
        mask=all_(mask) > 0,
        ratio=all_(ratio),
        keep=keep,
        mdp_ids=all_(data.mdp_id),
        logged_index=all_(idx),
    )
    out["reachable_range"] = reachable_range(out, all_(data.reward), gamma)
    warn_and_summarize(out, policy.label, cpe_nets.notices)
    return out


_ONE_STEP = ("direct_method", "ips", "snips", "doubly_robust")
_NAN = CpeEstimate(math.nan, math.nan, math.nan, math.nan)


def _one_step_inputs(
    probs: Tensor, idx: Tensor, r_hat: Tensor, mask: Tensor
) -> dict[str, np.ndarray]:
    """The `[N, K]` arrays of `one_step_estimates` for the rows that have candidates.

    A row whose logged action is not among its candidates (a parametric table whose
    `possible_actions` omit it; `action_index` is -1) stays in: the learned policy,
    restricted to the candidates, never takes that action, so its importance weight is 0,
    the same as a discrete logged action outside `possible_actions`. It gets an extra slot
    K, possible for that row only, with target probability 0 and r̂ = 0 (never used).
    Dropping such rows instead would estimate the value on a biased subset of states.
    Rows without any candidate have no learned policy and are left out (`keep`).
    """
    n = probs.shape[0]
    off_list = idx < 0
    extra = off_list.to(probs.dtype).unsqueeze(-1)
    zeros = torch.zeros(n, 1, dtype=probs.dtype, device=probs.device)
    keep = (mask > 0).any(-1).cpu().numpy()

    def np_(t: Tensor) -> np.ndarray:
        return t.detach().cpu().numpy()[keep]

    return {
        "probs": np_(torch.cat([probs, zeros], dim=-1)),
        "idx": np_(torch.where(off_list, torch.full_like(idx, probs.shape[-1]), idx)),
        "r_hat": np_(torch.cat([r_hat, zeros], dim=-1)),
        "mask": np_(torch.cat([mask, extra], dim=-1)),
        "keep": keep,
    }
