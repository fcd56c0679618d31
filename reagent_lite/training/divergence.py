"""A Q-network that diverges, said at the end of the epoch where it shows.

No policy's discounted return can exceed max|r| / (1 − γ) in magnitude (with
`use_seq_num_diff_as_time_diff` every gap is at least one step, so the bound holds too).
Q-values far beyond it mean the Bellman targets feed on themselves: offline Q-learning's
classic failure when the max picks actions the logged data never shows, and it looks like
nothing but a growing loss. Each epoch rank 0 scores a probe of states (the eval data's, or
its own training rows') and records the largest |Q| of a possible action in the epoch's
record (`max_abs_q`, beside `q_bound`); past `FACTOR` × the bound it warns once, naming the
remedies, and flags the record (`q_diverging`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from reagent_lite.training.loop import Workflow

log = logging.getLogger("reagent_lite")

# How far past the bound a Q-value must be to count as divergence: a fitted Q-network
# overshoots a little where the data is thin; an order of magnitude is no overshoot.
FACTOR = 2.0
PROBE_ROWS = 4096


def q_bound(wf: Workflow) -> float | None:
    """max|r| (plus the largest reward boost) / (1 − γ) over every rank's training rows — a
    collective; None when γ ≥ 1 or there are no rows. Under `stream_from_disk` the rows
    are the shard's sample."""
    reward = wf.train_data.reward
    local = float(reward.abs().max()) if len(reward) else 0.0
    largest = max(wf.ctx.all_gather_object(local))
    boost = max((abs(v) for v in wf.cfg.rl.reward_boost.values()), default=0.0)
    gamma = wf.cfg.rl.gamma
    if gamma >= 1.0 or largest + boost == 0.0:
        return None
    return (largest + boost) / (1.0 - gamma)


class DivergenceCheck:
    """Rank 0's end-of-epoch look at the Q-values (module notes)."""

    def __init__(self, bound: float | None) -> None:
        self.bound = bound
        self.warned = False

    def __call__(self, wf: Workflow, epoch: int) -> dict[str, Any]:
        if self.bound is None:
            return {}
        data = wf.eval_data if wf.eval_data is not None else wf.train_data
        probe = data.slice(0, min(PROBE_ROWS, len(data))).to(wf.device)
        wf.q_net.eval()
        try:
            with torch.no_grad():
                q = wf.kind.q_all(wf.q_net, probe, next_state=False)
        finally:
            wf.q_net.train()
        possible = torch.isfinite(q)  # BCQ masks dropped actions with -inf
        if "possible_actions_mask" in probe:
            possible &= wf.kind.candidate_mask(probe, next_state=False) > 0
        worst = float(torch.where(possible, q.abs(), 0.0).max()) if q.numel() else 0.0
        out: dict[str, Any] = {"max_abs_q": worst, "q_bound": self.bound}
        if worst > FACTOR * self.bound:
            out["q_diverging"] = True
            if not self.warned:
                self.warned = True
                log.warning(
                    "epoch %d: Q-values reach %.4g, beyond any return the rewards allow "
                    "(max|r| / (1 - gamma) = %.4g): the Q-network is diverging, as offline "
                    "Q-learning does where the data does not cover the actions its max "
                    "picks. Set training.cql_alpha (e.g. 1.0) or rainbow.bcq_drop_threshold, "
                    "lower training.learning_rate or rl.gamma, or train fewer epochs; the "
                    "model and its CPE are not to be trusted as they are",
                    epoch + 1,
                    worst,
                    self.bound,
                )
        return out
