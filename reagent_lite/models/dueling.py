"""Dueling Q-network (Wang et al. 2016): Q(s, a) = V(s) + A(s, a) − mean_a' A(s, a')."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from reagent_lite.models.mlp import MLP, make_activation


class DuelingQNetwork(nn.Module):
    """A shared trunk (all hidden layers) with a value head and an advantage head.

    `sizes` are the resolved layer sizes `[in_dim, *hidden, n_actions]`; both heads are one
    linear layer from the last hidden size, followed by the last activation. Subtracting
    the mean advantage makes V and A identifiable without changing the greedy action.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        activations: Sequence[str],
        *,
        dropout_ratio: float = 0.0,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        if len(activations) != len(sizes) - 1:
            # MLP raises the same ConfigError; let it phrase the message.
            MLP(sizes, activations)
        self.in_dim = int(sizes[0])
        self.out_dim = int(sizes[-1])
        trunk_sizes = list(sizes[:-1])
        self.trunk: nn.Module
        if len(trunk_sizes) > 1:
            self.trunk = MLP(
                trunk_sizes,
                activations[:-1],
                dropout_ratio=dropout_ratio,
                layer_norm=layer_norm,
                ends_in_output=False,
            )
        else:
            self.trunk = nn.Identity()
        hidden = trunk_sizes[-1]
        self.value = nn.Sequential(nn.Linear(hidden, 1), make_activation(activations[-1]))
        self.advantage = nn.Sequential(
            nn.Linear(hidden, self.out_dim), make_activation(activations[-1])
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.trunk(x)
        advantage = self.advantage(h)
        return self.value(h) + advantage - advantage.mean(dim=-1, keepdim=True)
