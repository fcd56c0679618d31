"""Model selection: which epoch's Q-network the run exports (`evaluation.model_selection`)."""

from __future__ import annotations

import copy
import math
from typing import Any

from torch import nn


class ModelSelection:
    """Keeps the model the configured offline criterion prefers, lower score better:
    "td_error" (the eval TD loss), "cpe" (the doubly robust estimate, raw) or "last".
    `best` (epoch, score, the model's state on the CPU) goes into checkpoints."""

    def __init__(self, criterion: str) -> None:
        self.criterion = criterion
        self.best: dict[str, Any] = {"epoch": -1, "score": math.inf, "state": None}

    @property
    def epoch(self) -> int:
        """The selected epoch (-1: none yet)."""
        return int(self.best["epoch"])

    def score(self, epoch: int, record: dict[str, Any]) -> float:
        if self.criterion == "td_error" and "eval_td_loss" in record:
            return float(record["eval_td_loss"])
        if self.criterion == "cpe" and "cpe" in record:
            # Raw, not normalized: dividing by a negative logged value would flip the
            # order, and a zero one gives None. None (no estimate) never wins.
            dr = record["cpe"]["doubly_robust"]["raw"]
            return -dr if dr is not None else math.inf
        return -float(epoch)  # "last", or no eval data: the newest model wins

    def offer(self, epoch: int, record: dict[str, Any], q_net: nn.Module) -> None:
        """Epoch `epoch`'s model (its metrics `record`): kept if it scores no worse."""
        score = self.score(epoch, record)
        if score <= self.best["score"] or not math.isfinite(self.best["score"]):
            self.best = {
                "epoch": epoch,
                "score": score,
                "state": {k: v.detach().cpu().clone() for k, v in q_net.state_dict().items()},
            }

    def model(self, q_net: nn.Module) -> nn.Module:
        """A CPU copy of `q_net` holding the selected state, in eval mode."""
        net = copy.deepcopy(q_net).cpu()
        if self.best["state"] is not None:
            net.load_state_dict(self.best["state"])
        return net.eval()
