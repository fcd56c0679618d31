"""Plain feed-forward Q-networks built from the config's `layers` / `activations` lists.

`layers` follows Horizon's convention: the first and last entries are `-1` placeholders for
the input and output sizes, filled in here from the data; `activations[i]` follows the
linear layer `layers[i] -> layers[i + 1]` (so the last one is usually `"linear"`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
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
        last = len(self.linears) - 1
        for i in range(start, last + 1):
            layer = self.linear(i)
            pad = padding(x, layer) if i == 0 else 0
            if pad:
                # The input's rows padded with zeros to 16 bytes in the product's dtype, and
                # the weight's with zero columns: cuBLAS then takes its aligned kernels for
                # the product and the weight's gradient instead of align-1 split-K ones
                # (benchmarks/RESULTS.md). The padded columns' gradient is cut off again; the
                # values are those of the layer.
                x = F.linear(F.pad(x, (0, pad)), F.pad(layer.weight, (0, pad)), layer.bias)
            elif (
                i == last
                and self.ends_in_output
                and layer.out_features <= SUM_OUTPUTS
                and compiling()
            ):
                # A few outputs (a parametric Q-value, dqn's actions): as a product and a sum,
                # Inductor fuses this layer with the previous activation into one reduction
                # kernel; a matrix product this thin would first write that activation out
                # and read it back (the parametric step's K candidates per row make it the
                # largest tensor of the step).
                x = (x.unsqueeze(-2) * layer.weight).sum(-1) + layer.bias
            else:
                x = layer(x)
            x = self.tails[i](x)
        return x


# A first layer whose rows are not a multiple of 16 bytes in the product's dtype is traced
# with its input and weight zero-padded to one (`MLP._from`) where the product runs on tensor
# cores (bf16, tf32), on PAD_DEVICE only (the tests point it at the CPU): fp32 and CPU steps
# keep their maths bit for bit. In fp32 the padding measured 1% slower (RESULTS.md).
ALIGN_BYTES = 16
PAD_DEVICE = "cuda"
# Whether the enclosing step multiplies float32 on TF32 tensor cores: set by
# `training.precision.step_precision`. Dynamo cannot read torch.backends.cuda.matmul's
# setting; it guards on this value instead, so a step traced under the other is traced again.
TF32_PRODUCTS = False


def row_padding(x: torch.Tensor, layer: nn.Linear) -> int:
    """Zero features to add to `x`'s rows so that they fill whole ALIGN_BYTES in the dtype
    the product reads (autocast's where it is on): 8 features in bf16, 4 in tf32, none
    for products off the tensor cores (IEEE float32, float64)."""
    dtype = x.dtype
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
    tensor_cores = dtype in (torch.bfloat16, torch.float16) or (
        dtype == torch.float32 and TF32_PRODUCTS
    )
    if not tensor_cores:
        return 0
    per_row = max(1, ALIGN_BYTES // dtype.itemsize)
    return -layer.in_features % per_row


def padding(x: torch.Tensor, first: nn.Linear) -> int:
    """`row_padding` where a step traced by Dynamo on PAD_DEVICE multiplies `x` by the first
    layer `first`, else 0 (eager steps, the export, other devices keep the plain layer)."""
    if x.device.type != PAD_DEVICE or not compiling():
        return 0
    return row_padding(x, first)


FUSED_OUTPUT_ENV = "REAGENT_LITE_FUSED_OUTPUT"


def sum_outputs(env: Mapping[str, str]) -> int:
    """The widest output layer traced as a product and a sum (`MLP._from`); 0 (always the
    matrix product) when `env` sets REAGENT_LITE_FUSED_OUTPUT=0. Measured faster on H100s
    (benchmarks/RESULTS.md) with 1 and 2 outputs (parametric, CartPole's dqn) on one GPU
    and, on one host, on four; on another host a 4-GPU run of the sum scaled at 36%, with
    no matrix-product run beside it, hence the switch. The bound of 4 is a guess between
    those measurements and the wider layers whose matrix product is not so thin."""
    return 0 if env.get(FUSED_OUTPUT_ENV, "").strip() == "0" else 4


# Read once: a rank's compiled steps all trace the same form.
SUM_OUTPUTS = sum_outputs(os.environ)


def compiling() -> bool:
    """Traced by TorchDynamo (`torch.compile`), not by the model export (non-strict, no
    Dynamo), whose program runs eagerly, where the matrix product is the faster form.
    (`is_compiling() and not is_exporting()` is False under torch 2.11's Dynamo.)"""
    return torch.compiler.is_dynamo_compiling()
