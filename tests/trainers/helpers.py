"""Batch builders and tiny hand-set networks for the trainer tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from reagent_lite.evaluation.cpe_models import CpeModelTrainer
from reagent_lite.models import MLP, ParametricQNetwork, build_q_network
from reagent_lite.trainers.common import DQNLoss, QLearningTrainer
from reagent_lite.training.update import cpe_step, q_step


def discrete_batch(
    state: Any,
    action: Any,
    reward: Any,
    next_state: Any,
    *,
    next_action: Any = None,
    mask: Any = None,
    next_mask: Any = None,
    time_diff: Any = None,
    terminal: Any = None,
) -> SimpleNamespace:
    s = torch.as_tensor(state, dtype=torch.float32)
    b, n_actions = s.shape[0], 2
    a = torch.as_tensor(action, dtype=torch.int64)
    ones = torch.ones(b, n_actions) if mask is None else None
    return SimpleNamespace(
        state=s,
        action=a,
        reward=torch.as_tensor(reward, dtype=torch.float32),
        next_state=torch.as_tensor(next_state, dtype=torch.float32),
        next_action=a.clone() if next_action is None else torch.as_tensor(next_action),
        possible_actions_mask=ones if mask is None else torch.as_tensor(mask, dtype=torch.float32),
        possible_next_actions_mask=torch.ones(b, n_actions)
        if next_mask is None
        else torch.as_tensor(next_mask, dtype=torch.float32),
        time_diff=torch.ones(b) if time_diff is None else torch.as_tensor(time_diff).float(),
        terminal=torch.zeros(b) if terminal is None else torch.as_tensor(terminal).float(),
    )


def random_discrete_batch(b: int, d: int, a: int, *, reward: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(
        state=torch.randn(b, d),
        action=torch.randint(0, a, (b,)),
        reward=torch.full((b,), reward),
        next_state=torch.randn(b, d),
        next_action=torch.randint(0, a, (b,)),
        possible_actions_mask=torch.ones(b, a),
        possible_next_actions_mask=torch.ones(b, a),
        time_diff=torch.ones(b),
        terminal=torch.zeros(b),
    )


def slice_batch(batch: SimpleNamespace, start: int, stop: int) -> SimpleNamespace:
    return SimpleNamespace(**{k: v[start:stop] for k, v in vars(batch).items()})


def identity_q_net(n_actions: int = 2, scale: float = 1.0) -> nn.Module:
    """Q(s) = scale · s, so a batch's states *are* its Q-values."""
    net = build_q_network(
        in_dim=n_actions, n_actions=n_actions, layers=[-1, -1], activations=["linear"]
    )
    set_identity(net, scale)
    return net


def constant_logits(probs: list[float]) -> nn.Linear:
    """An imitator of 2-d states that always says `probs` (a BCQ / behaviour estimate)."""
    lin = nn.Linear(2, len(probs))
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.copy_(torch.tensor(probs).log())
    return lin


@torch.no_grad()
def set_identity(net: nn.Module, scale: float) -> None:
    assert isinstance(net, MLP)
    lin = net.linear(0)
    lin.weight.copy_(scale * torch.eye(lin.weight.shape[0]))
    lin.bias.zero_()


def action_valued_net(scale: float = 1.0) -> ParametricQNetwork:
    """Parametric Q(s, a) = scale · a for 1-d states and actions."""
    net = ParametricQNetwork(1, 1, [-1, -1], ["linear"])
    set_action_scale(net, scale)
    return net


@torch.no_grad()
def set_action_scale(net: nn.Module, scale: float) -> None:
    assert isinstance(net, ParametricQNetwork)
    lin = net.mlp.linear(0)
    lin.weight.copy_(torch.tensor([[0.0, scale]]))
    lin.bias.zero_()


def random_parametric_batch(
    b: int, d: int, g: int, k: int, *, reward: float = 1.0, min_candidates: int = 1
) -> SimpleNamespace:
    """Candidate counts vary per row in [min_candidates, k]; padding is zero and masked."""

    def candidates() -> tuple[torch.Tensor, torch.Tensor]:
        counts = torch.randint(min_candidates, k + 1, (b,))
        mask = (torch.arange(k).unsqueeze(0) < counts.unsqueeze(1)).float()
        return torch.randn(b, k, g) * mask.unsqueeze(-1), mask

    pa, pa_mask = candidates()
    pna, pna_mask = candidates()
    return SimpleNamespace(
        state=torch.randn(b, d),
        action=pa[:, 0],
        reward=torch.full((b,), reward),
        next_state=torch.randn(b, d),
        next_action=pna[:, 0],
        possible_actions=pa,
        possible_actions_mask=pa_mask,
        possible_next_actions=pna,
        possible_next_actions_mask=pna_mask,
        time_diff=torch.ones(b),
        terminal=torch.zeros(b),
    )


@dataclass(frozen=True)
class Sync:
    """A step's own gradient reduction stand-in (`gradient_step.Reduction`): `fn` runs
    where the all-reduce would, `loss_scale` rides on the backward's seed."""

    fn: Callable[[], object] = lambda: None
    loss_scale: float = 1.0

    def __call__(self) -> None:
        self.fn()


def train_step(
    trainer: QLearningTrainer[Any],
    batches: Sequence[Any],
    *,
    sync: Sync | None = None,
    apply: Callable[[], None] | None = None,
) -> DQNLoss:
    """One optimizer step of `trainer` through the step factory's Q step (`q_step`), the
    micro-batches' records averaged."""
    return DQNLoss.mean(q_step(trainer, sync=sync, apply=apply)(batches))


def cpe_train_step(
    cpe: CpeModelTrainer, batch: Any, q_net: nn.Module, *, sync: Sync | None = None
) -> torch.Tensor:
    """One optimizer step of the CPE models through the factory's `cpe_step`."""
    return cpe_step(cpe, q_net, sync=sync)([batch])[0].total
