"""Q-networks: plain MLP, dueling and parametric (Q(s, a) over action features).

No ranks and no I/O here; every network is `torch.export`-able with a dynamic batch size.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from reagent_lite.models.dueling import DuelingQNetwork
from reagent_lite.models.mlp import MLP, make_activation, resolve_layer_sizes
from reagent_lite.models.parametric import ParametricQNetwork

__all__ = [
    "MLP",
    "DuelingQNetwork",
    "ParametricQNetwork",
    "build_q_network",
    "make_activation",
    "resolve_layer_sizes",
]


def build_q_network(
    *,
    in_dim: int,
    n_actions: int,
    layers: Sequence[int],
    activations: Sequence[str],
    dropout_ratio: float = 0.0,
    layer_norm: bool = False,
    dueling: bool = False,
) -> nn.Module:
    """A discrete Q-network mapping states [B, in_dim] to action values [B, n_actions]."""
    sizes = resolve_layer_sizes(layers, in_dim, n_actions)
    cls = DuelingQNetwork if dueling else MLP
    return cls(sizes, activations, dropout_ratio=dropout_ratio, layer_norm=layer_norm)
