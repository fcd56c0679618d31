"""The models counterfactual evaluation needs, trained alongside the Q-network.

* reward model r̂(s, a): regression of the logged reward on (state, logged action);
* policy-value model q̂(s, a): the value of the *learned* softmax policy, fitted by
  expected-SARSA targets r + γ^Δt Σ_a' π(a'|s') q̂_target(s', a').

Both are nets of the same shape as the Q-network (built by the workflow kind), so the
same code serves discrete actions and parametric candidates. No I/O, no ranks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reagent_lite.data.tensordict import TensorDict
from reagent_lite.models.fused import (
    accumulate_grads,
    fusable_here,
    layers_backward,
    layers_forward,
)
from reagent_lite.models.mlp import MLP
from reagent_lite.trainers.common import SoftUpdate, adam, load_optimizer_state
from reagent_lite.trainers.optim_step import OptimizerStep

_NEG = -1e9


def masked_softmax(q: Tensor, mask: Tensor, temperature: float) -> Tensor:
    """Softmax of q / temperature over the entries where mask is 1; all-masked rows → 0."""
    logits = torch.where(mask > 0, q / temperature, torch.full_like(q, _NEG))
    probs = torch.softmax(logits, dim=-1) * (mask > 0)
    return probs / probs.sum(dim=-1, keepdim=True).clamp_min(1e-12)


def gather_logged(q: Tensor, index: Tensor) -> Tensor:
    """q[i, index[i]], with 0 where index is -1 (logged action not among candidates)."""
    safe = index.clamp_min(0).unsqueeze(-1)
    return torch.where(
        index >= 0, q.gather(-1, safe).squeeze(-1), torch.zeros_like(index, dtype=q.dtype)
    )


class CpeNets(nn.Module):
    def __init__(self, reward_net: nn.Module, value_net: nn.Module):
        super().__init__()
        self.reward_net = reward_net
        self.value_net = value_net

    def forward(self, batch: TensorDict, kind: Any) -> tuple[Tensor, Tensor]:
        # Both heads in one forward, so that a DDP wrapper syncs both gradients.
        return (
            kind.q_all(self.reward_net, batch, next_state=False),
            kind.q_all(self.value_net, batch, next_state=False),
        )


class CpeModelTrainer:
    """One optimizer step of both CPE models per training step of the Q-network."""

    def __init__(
        self,
        kind: Any,
        nets: nn.Module,
        *,
        gamma: float,
        temperature: float,
        target_update_rate: float,
        learning_rate: float,
        use_time_diff: bool,
    ):
        self.kind = kind
        self.nets = nets  # possibly DDP-wrapped CpeNets
        self.target_value = copy.deepcopy(self._raw().value_net).requires_grad_(False)
        self._soft_update = SoftUpdate(self.target_value, self._raw().value_net)
        self.gamma = gamma
        self.temperature = temperature
        self.tau = target_update_rate
        self.use_time_diff = use_time_diff
        self.optimizer = adam(nets.parameters(), learning_rate)
        self._optimizer_step = OptimizerStep(self.optimizer)
        self._params = list(nets.parameters())
        # As `QLearningTrainer.grad_sync`: averages gradients over ranks between backward
        # and step when no DDP wrapper does it.
        self.grad_sync: Callable[[], None] | None = None
        # The CPU step without autograd (`_fused_backward`); a switch for tests.
        self.fused_step = True

    def _raw(self) -> CpeNets:
        raw = getattr(self.nets, "module", self.nets)
        assert isinstance(raw, CpeNets)
        return raw

    def train_step(self, batch: TensorDict, q_net: nn.Module) -> Tensor:
        kind = self.kind
        with torch.no_grad():
            q_next = kind.q_all(q_net, batch, next_state=True)
            mask_next = kind.candidate_mask(batch, next_state=True)
            pi_next = masked_softmax(q_next, mask_next, self.temperature)
            v_next = (pi_next * kind.q_all(self.target_value, batch, next_state=True)).sum(-1)
            discount = torch.pow(self.gamma, batch.time_diff) if self.use_time_diff else self.gamma
            target = batch.reward + (1.0 - batch.terminal) * discount * v_next
        for p in self._params:  # = optimizer.zero_grad(set_to_none=True), minus its wrapper
            p.grad = None
        idx = kind.logged_index(batch)
        valid = (idx >= 0).to(batch.reward.dtype)
        denom = valid.sum().clamp_min(1.0)
        loss = self._fused_backward(batch, target, idx, valid, denom)
        if loss is None:
            r_hat, q_hat = self.nets(batch, kind)
            reward_loss = ((gather_logged(r_hat, idx) - batch.reward) ** 2 * valid).sum() / denom
            value_loss = (
                F.smooth_l1_loss(gather_logged(q_hat, idx), target, reduction="none") * valid
            ).sum() / denom
            loss = reward_loss + value_loss
            loss.backward()
        if self.grad_sync is not None:
            self.grad_sync()
        self._optimizer_step()
        self._soft_update(self.tau)
        return loss.detach()

    def _fused_backward(
        self, batch: TensorDict, target: Tensor, idx: Tensor, valid: Tensor, denom: Tensor
    ) -> Tensor | None:
        """Both losses and their gradients without autograd, as `DQNTrainer._fused_backward`
        does for the Q-network: for discrete actions, plain ReLU MLPs on CPU tensors and no
        wrapper (DDP's reducer works through autograd). The gradient with respect to the
        logged action's output is formed directly — 2(r̂ − r) for the squared error,
        clamp(q̂ − target, −1, 1) for the smooth L1 (β = 1), times valid / denom — and
        `models.fused.layers_backward` takes it through each net. None: take the
        autograd path. Same maths (tests/evaluation/test_cpe_models.py)."""
        raw = self.nets
        if not (self.fused_step and isinstance(raw, CpeNets) and self.kind.name == "dqn"):
            return None
        if raw._forward_hooks or raw._forward_pre_hooks:
            return None  # (hooks on the pair expect its forward to run)
        if not fusable_here(batch.state):
            return None
        layers = []
        for net in (raw.reward_net, raw.value_net):
            found = net.trainable_relu_layers() if isinstance(net, MLP) else None
            if found is None:
                return None
            layers.append(found)
        logged = idx.clamp_min(0).unsqueeze(1)
        scale = valid / denom
        total = torch.zeros((), dtype=target.dtype)
        with torch.no_grad():
            for (weights, biases, relu), wanted, smooth in zip(
                layers, (batch.reward, target), (False, True), strict=True
            ):
                outs = layers_forward(batch.state, weights, biases, relu)
                diff = gather_logged(outs[-1], idx) - wanted
                if smooth:
                    adiff = diff.abs()
                    per_row = torch.where(adiff < 1.0, 0.5 * diff * diff, adiff - 0.5)
                    d_out = diff.clamp(-1.0, 1.0)
                else:
                    per_row = diff * diff
                    d_out = 2.0 * diff
                total = total + (per_row * valid).sum() / denom
                # Rows without a logged action get exactly 0 (even where wanted is not finite).
                d_out = torch.where(valid > 0, d_out * scale, 0.0)
                grad = torch.zeros_like(outs[-1]).scatter_(1, logged, d_out.unsqueeze(1))
                grads, _ = layers_backward(outs, weights, relu, grad, grad_owned=True)
                accumulate_grads(weights, biases, grads)
        return total

    def state_dict(self) -> dict[str, Any]:
        return {
            "nets": self._raw().state_dict(),
            "target_value": self.target_value.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._raw().load_state_dict(state["nets"])
        self.target_value.load_state_dict(state["target_value"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self._soft_update.refresh()
