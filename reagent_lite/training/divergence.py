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
from typing import Any

import torch
from torch import Tensor, nn

from reagent_lite.config.models import RLParameters
from reagent_lite.data.rows import Rows
from reagent_lite.distributed.context import DistContext
from reagent_lite.kinds import Kind
from reagent_lite.training.state import EpochRecord, TrainState

log = logging.getLogger("reagent_lite")

# How far past the bound a Q-value must be to count as divergence: a fitted Q-network
# overshoots a little where the data is thin; an order of magnitude is no overshoot.
FACTOR = 2.0
PROBE_ROWS = 4096
# What to change, in the error of a run that ends diverged (cql_alpha=1.0 brought Horizon's
# 2018-12 CartPole config on its own sample data from a diverged policy to a return of 143).
REMEDIES = (
    "e.g. training.cql_alpha=1.0 (or rainbow.bcq_drop_threshold, a lower "
    "training.learning_rate or rl.gamma, fewer epochs)"
)


def q_bound(ctx: DistContext, reward: Tensor, rl: RLParameters) -> float | None:
    """max|r| (plus the largest reward boost) / (1 − γ) over every rank's training rewards
    `reward` — a collective; None when γ ≥ 1 or there are no rows. Under `stream_from_disk`
    the rows are the shard's sample."""
    local = float(reward.abs().max()) if len(reward) else 0.0
    largest = max(ctx.all_gather_object(local))
    boost = max((abs(v) for v in rl.reward_boost.values()), default=0.0)
    if rl.gamma >= 1.0 or largest + boost == 0.0:
        return None
    return (largest + boost) / (1.0 - rl.gamma)


def probe_rows(data: Rows, device: torch.device) -> Rows:
    """The states each epoch's check scores: the first `PROBE_ROWS` of `data` (the eval
    rows, else the training rows), on `device`."""
    return data.slice(0, min(PROBE_ROWS, len(data))).to(device)


def check_q_values(
    kind: Kind[Any],
    q_net: nn.Module,
    probe: Rows,
    bound: float | None,
    epoch: int,
    *,
    warned: bool,
) -> EpochRecord:
    """Rank 0's end-of-epoch look at the Q-values (module notes): the fields for epoch
    `epoch`'s record; a warning unless `warned` (an earlier epoch was flagged)."""
    if bound is None:
        return {}
    q_net.eval()
    try:
        with torch.no_grad():
            q = kind.q_all(q_net, probe, next_state=False)
    finally:
        q_net.train()
    # BCQ serves a dropped action at the lowest float: no Q-value, and |lowest| ≈ 3.4e38
    # would read as divergence and refuse the export of every BCQ run that drops one.
    possible = torch.isfinite(q) & (q > torch.finfo(q.dtype).min)
    if "possible_actions_mask" in probe:
        possible &= kind.candidate_mask(probe, next_state=False) > 0
    worst = float(torch.where(possible, q.abs(), 0.0).max()) if q.numel() else 0.0
    out: EpochRecord = {"max_abs_q": worst, "q_bound": bound}
    if worst > FACTOR * bound:
        out["q_diverging"] = True
        if not warned:
            log.warning(
                "epoch %d: Q-values reach %.4g, beyond any return the rewards allow "
                "(max|r| / (1 - gamma) = %.4g): the Q-network is diverging, as offline "
                "Q-learning does where the data does not cover the actions its max "
                "picks. Set training.cql_alpha (e.g. 1.0) or rainbow.bcq_drop_threshold, "
                "lower training.learning_rate or rl.gamma, or train fewer epochs; the "
                "model and its CPE are not to be trusted as they are",
                epoch + 1,
                worst,
                bound,
            )
    return out


def ended_diverged(state: TrainState) -> str | None:
    """What is wrong with a run whose last epoch is flagged `q_diverging` (rank 0's
    records): the epoch the flags began and max|Q|; None when the last epoch is fine."""
    if not state.history or not state.history[-1].get("q_diverging"):
        return None
    last = state.history[-1]
    first = last["epoch"]
    for record in reversed(state.history):
        if not record.get("q_diverging"):
            break
        first = record["epoch"]
    return (
        f"the Q-network diverged: from epoch {first + 1} on its Q-values were beyond any "
        f"return the rewards allow, reaching max|Q| {last['max_abs_q']:.4g} in the last "
        f"epoch (bound max|r| / (1 - gamma) = {last['q_bound']:.4g})"
    )
