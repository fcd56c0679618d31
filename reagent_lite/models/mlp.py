"""Plain feed-forward Q-networks built from the config's `layers` / `activations` lists.

`layers` follows Horizon's convention: the first and last entries are `-1` placeholders for
the input and output sizes, filled in here from the data; `activations[i]` follows the
linear layer `layers[i] -> layers[i + 1]` (so the last one is usually `"linear"`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from reagent_lite.errors import ConfigError

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,
    "leaky_relu": nn.LeakyReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "selu": nn.SELU,
    "linear": nn.Identity,
    "identity": nn.Identity,
}


def make_activation(name: str) -> nn.Module:
    """The activation module named `name` (case-insensitive); `linear` is the identity."""
    factory = _ACTIVATIONS.get(name.lower())
    if factory is None:
        raise ConfigError(
            f"training.activations: unknown activation (got {name!r}); "
            f"expected one of {sorted(_ACTIVATIONS)}"
        )
    return factory()


def resolve_layer_sizes(layers: Sequence[int], in_dim: int, out_dim: int) -> list[int]:
    """Replace the `-1` placeholders at both ends of `layers` by `in_dim` / `out_dim`.

    An explicit size at either end must match the data; `-1` (or any size < 1) inside the
    list is an error, as in the config models.
    """
    if len(layers) < 2:
        raise ConfigError(
            f"training.layers: needs at least input and output entries (got {list(layers)})"
        )
    sizes = [int(v) for v in layers]
    for pos, want in ((0, in_dim), (len(sizes) - 1, out_dim)):
        if sizes[pos] == -1:
            sizes[pos] = want
        elif sizes[pos] != want:
            raise ConfigError(
                f"training.layers[{pos}]: size does not match the data "
                f"(got {sizes[pos]}, expected -1 or {want})"
            )
    bad = [v for v in sizes[1:-1] if v < 1]
    if bad:
        raise ConfigError(
            f"training.layers: hidden sizes must be positive (got {list(layers)}); "
            "-1 is only allowed as the first and last entry"
        )
    return sizes


class MLP(nn.Module):
    """Linear layers, each followed by [LayerNorm] → activation → [Dropout].

    LayerNorm and dropout apply to hidden layers only, never to the output layer, so the
    network's output is the raw value the last activation gives. `ends_in_output=False`
    marks the last layer as hidden too (a trunk that heads are stacked on).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        activations: Sequence[str],
        *,
        dropout_ratio: float = 0.0,
        layer_norm: bool = False,
        ends_in_output: bool = True,
    ) -> None:
        super().__init__()
        if len(activations) != len(sizes) - 1:
            raise ConfigError(
                "training.activations: needs one entry per linear layer "
                f"(got {len(activations)}, expected {len(sizes) - 1})"
            )
        self.in_dim = int(sizes[0])
        self.out_dim = int(sizes[-1])
        self.ends_in_output = ends_in_output
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        # `tails[i]` is what follows `linears[i]`; kept separate so that a caller (the
        # parametric network) can compute the first linear layer its own way.
        tails: list[nn.Module] = []
        for i, name in enumerate(activations):
            hidden = i < len(activations) - 1 or not ends_in_output
            parts: list[nn.Module] = []
            if hidden and layer_norm:
                parts.append(nn.LayerNorm(sizes[i + 1]))
            parts.append(make_activation(name))
            if hidden and dropout_ratio > 0.0:
                parts.append(nn.Dropout(dropout_ratio))
            tails.append(parts[0] if len(parts) == 1 else nn.Sequential(*parts))
        self.tails = nn.ModuleList(tails)

    def linear(self, index: int) -> nn.Linear:
        """The `index`-th linear layer, typed (ModuleList indexing gives a bare Module)."""
        layer = self.linears[index]
        assert isinstance(layer, nn.Linear)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._from(0, x)

    def forward_after_first(self, h: torch.Tensor) -> torch.Tensor:
        """Finish the forward pass from the pre-activation output `h` of the first layer."""
        return self._from(1, self.tails[0](h))

    def forward_from(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Finish the forward pass from the input `x` of the `index`-th linear layer."""
        return self._from(index, x)

    def _from(self, start: int, x: torch.Tensor) -> torch.Tensor:
        for i in range(start, len(self.linears)):
            x = self.tails[i](self.linear(i)(x))
        return x
