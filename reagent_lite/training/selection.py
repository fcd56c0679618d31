"""Model selection: which epoch's Q-network the run exports (`evaluation.model_selection`).

Pure functions over `state.Best`: the loop offers each epoch's model and keeps what
`offer` returns."""

from __future__ import annotations

import copy
import math

from torch import nn

from reagent_lite.training.state import Best, EpochRecord


def score(criterion: str, epoch: int, record: EpochRecord) -> float:
    """Epoch `epoch`'s score under `criterion`, lower better: "td_error" (the eval TD
    loss), "cpe" (the doubly robust estimate, raw) or "last"."""
    if criterion == "td_error" and "eval_td_loss" in record:
        return float(record["eval_td_loss"])
    if criterion == "cpe" and "cpe" in record:
        # Raw, not normalized: dividing by a negative logged value would flip the
        # order, and a zero one gives None. None (no estimate) never wins.
        dr = record["cpe"]["doubly_robust"]["raw"]
        return -dr if dr is not None else math.inf
    return -float(epoch)  # "last", or no eval data: the newest model wins


def offer(criterion: str, best: Best, epoch: int, record: EpochRecord, q_net: nn.Module) -> Best:
    """Epoch `epoch`'s model (its metrics `record`) if it scores no worse than `best`
    (its state copied to the CPU), else `best`."""
    new = score(criterion, epoch, record)
    if new <= best.score or not math.isfinite(best.score):
        state = {k: v.detach().cpu().clone() for k, v in q_net.state_dict().items()}
        return Best(epoch, new, state)
    return best


def selected_model(q_net: nn.Module, best: Best) -> nn.Module:
    """A CPU copy of `q_net` holding the selected state (the current one when none was
    selected yet), in eval mode."""
    net = copy.deepcopy(q_net).cpu()
    if best.state is not None:
        net.load_state_dict(best.state)
    return net.eval()
