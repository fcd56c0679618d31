"""Discrete BCQ (batch-constrained Q-learning, Fujimoto et al. 2019): a Q-network beside an
imitation network that learns the logging policy, and a policy that only takes actions the
logger plausibly took.

`BCQQNetwork(q, imitator, threshold)` is one module, so everything that carries the
Q-network carries the imitator too: DDP, the optimizer, checkpoints, model selection, the
exported `model.pt2`. An action is *allowed* in a state when its imitation probability is
at least `threshold` times that of the most likely action (d3rlpy's and the paper's
relative rule: the most likely action is always allowed). Its `forward(state)` is the
policy's Q: Q of allowed actions, the dtype's lowest finite value for dropped ones, so
every argmax (the served model, `predict`, the online check, CPE's greedy policy) picks
among the allowed actions. `forward(state, imitation=True)` is what training reads: the
raw Q and the imitation logits side by side, [B, 2A], from one forward (DDP expects one per
backward).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class BCQQNetwork(nn.Module):
    """Q-network + imitation network (both [B, D] → [B, A]); see the module notes."""

    def __init__(self, q: nn.Module, imitator: nn.Module, threshold: float | None) -> None:
        super().__init__()
        if threshold is not None and not 0.0 < threshold < 1.0:
            raise ValueError(f"BCQ threshold must be in (0, 1) or None (got {threshold})")
        self.q = q
        self.imitator = imitator
        # None: the imitator only estimates the logging policy (`training.cql_weighting`)
        # and drops no action, so the policy is the Q-network's own.
        self.threshold = None if threshold is None else float(threshold)
        self.log_threshold = -math.inf if threshold is None else math.log(threshold)

    def forward(self, state: Tensor, imitation: bool = False) -> Tensor:
        q = self.q(state)
        if not imitation and self.threshold is None:
            return q  # nothing to drop: the served model skips the imitator
        logits = self.imitator(state)
        if imitation:
            return torch.cat([q, logits.to(q.dtype)], dim=1)
        return torch.where(self.allowed(logits), q, torch.finfo(q.dtype).min)

    def allowed(self, logits: Tensor) -> Tensor:
        """[B, A] bool: imitation probability ≥ threshold × the row's largest (in log space:
        log p − max log p ≥ log threshold, which the softmax's normaliser cancels out of);
        every action without a threshold."""
        if self.threshold is None:
            return torch.ones_like(logits, dtype=torch.bool)
        return logits - logits.max(dim=1, keepdim=True).values >= self.log_threshold

    @staticmethod
    def split(out: Tensor) -> tuple[Tensor, Tensor]:
        """(Q [B, A], imitation logits [B, A]) of a `forward(..., imitation=True)` output."""
        q, logits = out.chunk(2, dim=1)
        return q, logits
