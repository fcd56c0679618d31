"""DQN over a discrete action set: Q(s) → [B, A], targets from the masked next-state max.

Only Q of the logged action and the next-state value are specific to this trainer; the
loss, optimizer, accumulation and target updates are in `common.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch
from torch import nn

from reagent_lite.config import DQNWorkflowConfig
from reagent_lite.errors import ConfigError
from reagent_lite.models.fused import (
    accumulate_grads,
    fusable_here,
    layers_backward,
    layers_forward,
)
from reagent_lite.models.mlp import MLP, ReluLayers
from reagent_lite.trainers.common import (
    DQNHyperParams,
    DQNLoss,
    QLearningTrainer,
    double_q_value,
    masked_logsumexp,
    masked_max,
    masked_softmax,
    td_loss_and_grad,
)


class DiscreteBatch(Protocol):
    """The fields of `DiscreteTransitions` the trainer reads, states already normalized.

    `state`, `next_state` [B, D] float32; `action`, `next_action` int64 [B] (−1 = none);
    `possible_actions_mask`, `possible_next_actions_mask` [B, A] (1 = possible);
    `reward`, `time_diff`, `terminal` [B] float32.
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
    def possible_actions_mask(self) -> torch.Tensor: ...
    @property
    def possible_next_actions_mask(self) -> torch.Tensor: ...
    @property
    def time_diff(self) -> torch.Tensor: ...
    @property
    def terminal(self) -> torch.Tensor: ...


def reward_boost_vector(
    actions: Sequence[str], reward_boost: Mapping[str, float]
) -> torch.Tensor | None:
    """`rl.reward_boost` (action name → boost) as a [A] tensor in `actions` order, or None."""
    if not reward_boost:
        return None
    unknown = sorted(set(reward_boost) - set(actions))
    if unknown:
        raise ConfigError(
            f"rl.reward_boost: unknown action(s) (got {unknown}); expected names from "
            f"actions {list(actions)}"
        )
    return torch.tensor([float(reward_boost.get(a, 0.0)) for a in actions], dtype=torch.float32)


class DQNTrainer(QLearningTrainer[DiscreteBatch]):
    """(Double) DQN / SARSA with optional CQL on a network mapping [B, D] → [B, A]."""

    def __init__(
        self,
        q_net: nn.Module,
        hparams: DQNHyperParams,
        *,
        n_actions: int,
        reward_boost_vector: torch.Tensor | None = None,
        unwrapped: nn.Module | None = None,
    ) -> None:
        super().__init__(q_net, hparams, unwrapped=unwrapped)
        self.n_actions = int(n_actions)
        self.reward_boost: torch.Tensor | None = None
        if reward_boost_vector is not None:
            if reward_boost_vector.shape != (self.n_actions,):
                raise ValueError(
                    f"reward_boost_vector must have shape ({self.n_actions},) "
                    f"(got {tuple(reward_boost_vector.shape)})"
                )
            device = next(self.online.parameters()).device
            self.reward_boost = reward_boost_vector.to(device=device, dtype=torch.float32)
        # The CPU step without autograd (`_fused_backward`): a plain ReLU MLP that no
        # wrapper (DDP: its reducer hooks into autograd) stands in front of. A switch for
        # tests that compare it with the autograd path.
        self.fused_step = q_net is self.online and isinstance(self.online, MLP)

    @classmethod
    def from_config(
        cls, q_net: nn.Module, cfg: DQNWorkflowConfig, *, unwrapped: nn.Module | None = None
    ) -> DQNTrainer:
        """Hyper-parameters from `cfg.rl/rainbow/training`, actions from `cfg.actions`."""
        hp = DQNHyperParams.from_config(cfg)
        actions = list(cfg.actions)
        return cls(
            q_net,
            hp,
            n_actions=len(actions),
            reward_boost_vector=reward_boost_vector(actions, hp.reward_boost),
            unwrapped=unwrapped,
        )

    def _reward(self, batch: DiscreteBatch) -> torch.Tensor:
        if self.reward_boost is None:
            return batch.reward
        return batch.reward + self.reward_boost[batch.action]

    def _q_logged(self, batch: DiscreteBatch) -> tuple[torch.Tensor, torch.Tensor]:
        q_all = self.q_net(batch.state)
        return q_all.gather(1, batch.action.unsqueeze(1)).squeeze(1), q_all

    def _next_value(self, batch: DiscreteBatch, direct: _Direct | None = None) -> torch.Tensor:
        """`direct`: the (online, target) nets' `relu_layers()`, run by
        `models.fused.layers_forward` without their module calls (`_fused_backward`
        checked that they may)."""
        target_q = _run(self.target, batch.next_state, direct and direct[1])
        if not self.hp.maxq_learning:
            # SARSA: the logged next action; rows without one (−1) are worth nothing.
            na = batch.next_action
            value = target_q.gather(1, na.clamp(min=0).unsqueeze(1)).squeeze(1)
            return torch.where(na >= 0, value, torch.zeros_like(value))
        mask = batch.possible_next_actions_mask
        if not self.hp.double_q_learning:
            return masked_max(target_q, mask)[0]
        # Double Q: the online net picks the action, the target net values it.
        online_q = _run(self.online, batch.next_state, direct and direct[0])
        return double_q_value(online_q, target_q, mask)

    def _fused_backward(self, batch: DiscreteBatch, scale: float) -> DQNLoss | None:
        """The step's forward, loss gradient and backward written out for a ReLU MLP on
        CPU tensors: the Bellman target as `compute_target` makes it, the TD (+ CQL) loss
        gradient with respect to Q of all actions formed directly, then
        `models.fused.layers_backward`. Same maths as `compute_loss` + `backward()`
        (tests/trainers/test_fused_step.py); it saves the autograd engine, the loss and
        gather backward nodes and the gradient accumulation nodes — about a sixth of the
        reference step on two cores."""
        online = self.online
        if not (self.fused_step and isinstance(online, MLP)):
            return None
        layers = online.trainable_relu_layers()
        if layers is None or not fusable_here(batch.state):
            return None
        weights, biases, relu = layers
        target_net = self.target
        target_layers = target_net.unhooked_relu_layers() if isinstance(target_net, MLP) else None
        direct = None if target_layers is None else (layers, target_layers)
        with torch.no_grad():
            target = self.bellman_target(batch, self._next_value(batch, direct))
            outs = layers_forward(batch.state, weights, biases, relu)
            q_all = outs[-1]
            logged = batch.action.unsqueeze(1)
            q = q_all.gather(1, logged).squeeze(1)
            td, dq = td_loss_and_grad(q, target, self.hp.q_network_loss, scale)
            alpha = self.hp.cql_alpha
            if alpha > 0.0:
                # d/dQ of α·mean(logsumexp over possible actions − Q logged): α/B·(softmax − 1ₐ)
                mask = batch.possible_actions_mask
                cql = (masked_logsumexp(q_all, mask) - q).mean()
                total = td + alpha * cql
                step = alpha * scale / len(q)
                grad = masked_softmax(q_all, mask).mul_(step)
                grad.scatter_add_(1, logged, (dq - step).unsqueeze(1))
            else:
                cql = torch.zeros((), dtype=q.dtype)
                total = td
                grad = torch.zeros_like(q_all).scatter_(1, logged, dq.unsqueeze(1))
            param_grads, _ = layers_backward(outs, weights, relu, grad, grad_owned=True)
            accumulate_grads(weights, biases, param_grads)
        return DQNLoss(td, cql, total, q.mean())


_Direct = tuple[ReluLayers, ReluLayers]  # (online, target) `MLP.relu_layers()`


def _run(net: nn.Module, x: torch.Tensor, layers: ReluLayers | None) -> torch.Tensor:
    """net(x), or with `layers` (net's `relu_layers()`) the layers alone."""
    return net(x) if layers is None else layers_forward(x, *layers)[-1]
