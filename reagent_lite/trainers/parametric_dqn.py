"""Parametric DQN: actions are feature vectors, Q(s, a) scores each candidate.

Candidates come padded to K per row with a mask. The next-state value is the max over the
valid next candidates (double Q: chosen by the online net, valued by the target net), or
the logged next action for SARSA; a row without next candidates is terminal.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from reagent_lite.config.models import BaseWorkflowConfig
from reagent_lite.trainers.common import DQNHyperParams, QLearningTrainer, QLogged
from reagent_lite.trainers.masked import masked_argmax, masked_max


class ParametricBatch(Protocol):
    """The fields of `ParametricTransitions` the trainer reads, features already normalized.

    `state`, `next_state` [B, D]; `action`, `next_action` [B, G];
    `possible_actions`, `possible_next_actions` [B, K, G] with masks [B, K] (1 = real
    candidate); `reward`, `time_diff`, `terminal` [B] float32.
    """

    @property
    def state(self) -> torch.Tensor: ...
    @property
    def action(self) -> torch.Tensor: ...
    @property
    def reward(self) -> torch.Tensor: ...
    @property
    def next_state(self) -> torch.Tensor: ...
    @property
    def next_action(self) -> torch.Tensor: ...
    @property
    def possible_actions(self) -> torch.Tensor: ...
    @property
    def possible_actions_mask(self) -> torch.Tensor: ...
    @property
    def possible_next_actions(self) -> torch.Tensor: ...
    @property
    def possible_next_actions_mask(self) -> torch.Tensor: ...
    @property
    def time_diff(self) -> torch.Tensor: ...
    @property
    def terminal(self) -> torch.Tensor: ...


class ParametricDQNTrainer(QLearningTrainer[ParametricBatch]):
    """(Double) DQN / SARSA with optional CQL on a `ParametricQNetwork`-like module.

    The network must provide `forward(state [B, D], actions [B, K, G]) -> [B, K]` and, for
    one action per state, `forward(state [B, D], action [B, G]) -> [B]`. The logged action
    is scored through that same `forward` (alone, or prepended to the CQL candidates) so
    that a DDP wrapper sees a single forward per step.
    """

    @classmethod
    def from_config(
        cls, q_net: nn.Module, cfg: BaseWorkflowConfig, *, unwrapped: nn.Module | None = None
    ) -> ParametricDQNTrainer:
        """Hyper-parameters from `cfg.rl/rainbow/training` (`rl.reward_boost` does not apply:
        parametric actions have no names)."""
        return cls(q_net, DQNHyperParams.from_config(cfg), unwrapped=unwrapped)

    def _terminal(self, batch: ParametricBatch) -> torch.Tensor:
        no_next = (batch.possible_next_actions_mask > 0).any(dim=1).logical_not()
        return torch.maximum(batch.terminal, no_next.to(batch.terminal.dtype))

    def _q_logged(self, batch: ParametricBatch, net: nn.Module) -> QLogged:
        if self.hp.cql_alpha > 0.0:
            logged = batch.action.unsqueeze(1)
            scores = net(batch.state, torch.cat([logged, batch.possible_actions], dim=1))
            return scores[:, 0], scores[:, 1:], None
        q = net(batch.state, batch.action)
        return q, q.unsqueeze(1), None

    def _next_value(self, batch: ParametricBatch) -> torch.Tensor:
        if not self.hp.maxq_learning:
            return self.target(batch.next_state, batch.next_action)
        candidates = batch.possible_next_actions
        mask = batch.possible_next_actions_mask
        if not self.hp.double_q_learning:
            return masked_max(self.target(batch.next_state, candidates), mask)[0]
        # Double Q needs the target net's value of one candidate per row, the online net's
        # choice: scoring just that one gives the value that scoring all K and picking it
        # would, for 1/K of the target net's work (per transition, the next state's
        # forwards drop from 2K candidate rows to K + 1).
        best, any_valid = masked_argmax(self.online(batch.next_state, candidates), mask)
        pick = best.view(-1, 1, 1).expand(-1, 1, candidates.shape[-1])
        value = self.target(batch.next_state, candidates.gather(1, pick)[:, 0])
        return torch.where(any_valid, value, 0.0)
