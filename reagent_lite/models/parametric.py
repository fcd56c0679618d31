"""Parametric Q-network: Q(s, a) for actions described by feature vectors.

One MLP scores concat(state, action). Scoring K candidates of a state must not run the
state half of the first layer K times, so the first layer's weight is split into a state
block and an action block: W·[s; a] + b = (W_s·s + b) + W_a·a, with the state part computed
once per row and broadcast over candidates. The parameters are those of the plain MLP
over the concatenation, so scoring a set and scoring its candidates one at a time agree up
to float rounding. One action per state (the logged action, the target net's value of a
chosen candidate) takes the concatenation instead: one matrix product forward and one for
the weight's gradient, where the split takes two of each and joins the gradient's halves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.models.mlp import MLP, resolve_layer_sizes


class ParametricQNetwork(nn.Module):
    """Q(s, a) → scalar; `forward(state [B, D], actions [B, K, G]) -> [B, K]`, or
    `forward(state [B, D], action [B, G]) -> [B]` for one action per state.

    `layers` / `activations` follow the config convention (`-1` placeholders at both ends;
    the input is `state_dim + action_dim`, the output one value). Candidate masking is
    the caller's business: padded candidates get a score like any other.
    """

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        layers: Sequence[int] = (-1, 256, 256, -1),
        activations: Sequence[str] = ("relu", "relu", "linear"),
        *,
        dropout_ratio: float = 0.0,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        self.state_dim = int(state_dim)
        self.action_dim = int(action_dim)
        sizes = resolve_layer_sizes(layers, self.state_dim + self.action_dim, 1)
        self.mlp = MLP(sizes, activations, dropout_ratio=dropout_ratio, layer_norm=layer_norm)

    def forward(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Scores of K candidate actions per state: [B, D], [B, K, G] → [B, K]; of one
        action per state: [B, D], [B, G] → [B]."""
        if actions.dim() == 2:
            return self.mlp(torch.cat([state, actions], dim=-1)).squeeze(-1)
        first = self.mlp.linear(0)
        w_state = first.weight[:, : self.state_dim]
        w_action = first.weight[:, self.state_dim : self.state_dim + self.action_dim]
        h_s = F.linear(state, w_state, first.bias)
        # [B, K, H] + [B, 1, H]: the state's contribution is shared by all candidates.
        h_a = F.linear(actions, w_action)
        return self.mlp.forward_after_first(h_a + h_s.unsqueeze(1)).squeeze(-1)
