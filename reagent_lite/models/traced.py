"""The forms a compiled training step traces in place of the plain forward.

The networks (`MLP`, `ParametricQNetwork` and what is built from them) have one forward,
the plain one that eager steps, evaluation, the export and serving run. A compiled step
traces instead a *variant* of each network, `traced_variant(net, options)`: a module that
shares the network's parameters (no copy; an optimizer step on one is a step on the
other) and computes the same values a faster way, chosen by `ForwardOptions`, which the
step plan (`training.compiled.forward_options`) decides once from the config, the device
and the precision:

* `row_align` — a first layer whose rows are not a multiple of `row_align` features (16
  bytes: 4 float32 on TF32 tensor cores) multiplies zero-padded rows by a zero-padded
  weight, so that cuBLAS takes its aligned kernels for the product and the weight's
  gradient instead of align-1 split-K ones (benchmarks/RESULTS.md). The plan sets it for
  TF32 products only: IEEE float32 measured 1% slower padded, bf16 under 5% faster.
* `sum_outputs` — an output layer of at most that many outputs is a product and a sum:
  Inductor fuses it with the previous activation into one reduction kernel, where a
  matrix product this thin would first write that activation out and read it back.
* `candidate_kernel` — the parametric network's first layer over a candidate set scored
  without gradient is one Triton kernel (`candidate_layer`).

Each form gives the plain forward's values and gradients (up to float rounding); the tests
compare them. `ForwardOptions.names(net)` says which of them apply to a network.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.models import candidate_layer
from reagent_lite.models.mlp import MLP
from reagent_lite.models.parametric import ParametricQNetwork


@dataclasses.dataclass(frozen=True)
class ForwardOptions:
    """What a compiled step's networks trace (module notes); the default is the plain
    forward."""

    row_align: int = 0
    sum_outputs: int = 0
    candidate_kernel: bool = False

    def changes_anything(self) -> bool:
        return bool(self.row_align or self.sum_outputs or self.candidate_kernel)

    def applies(self, net: nn.Module) -> dict[str, bool]:
        """Which forms change something in `net`, by their `training.step_variants` key."""
        mlps = [m for m in net.modules() if isinstance(m, MLP)]
        return {
            "pad_first_layer": any(self.first_padding(m.linear(0)) for m in mlps),
            "output_sum": any(
                m.ends_in_output and m.linear(-1).out_features <= self.sum_outputs for m in mlps
            ),
            "candidate_kernel": self.candidate_kernel
            and any(
                isinstance(m, ParametricQNetwork) and candidate_layer.fits(m) for m in net.modules()
            ),
        }

    def names(self, net: nn.Module) -> list[str]:
        """The forms that change something in `net` (for the step's log line), e.g.
        ["first layer padded to 16 bytes", "output layer as a product and a sum"]."""
        return [_NAMES[key] for key, taken in self.applies(net).items() if taken]

    def first_padding(self, first: nn.Linear) -> int:
        """The zero features added to the rows of the first layer `first` (0: none)."""
        return -first.in_features % self.row_align if self.row_align else 0


_NAMES = {
    "pad_first_layer": "first layer padded to 16 bytes",
    "output_sum": "output layer as a product and a sum",
    "candidate_kernel": "candidate kernel for grad-free candidate sets",
}


class TracedMLP(nn.Module):
    """`plain`'s forward with the first-layer padding and the output-layer sum of
    `options`, over `plain`'s own parameters."""

    def __init__(self, plain: MLP, options: ForwardOptions) -> None:
        super().__init__()
        self.plain = plain
        self.options = options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._from(0, x)

    def forward_after_first(self, h: torch.Tensor) -> torch.Tensor:
        return self._from(1, self.plain.tails[0](h))

    def forward_from(self, index: int, x: torch.Tensor) -> torch.Tensor:
        return self._from(index, x)

    def _from(self, start: int, x: torch.Tensor) -> torch.Tensor:
        plain = self.plain
        last = len(plain.linears) - 1
        for i in range(start, last + 1):
            layer = plain.linear(i)
            pad = self.options.first_padding(layer) if i == 0 else 0
            if pad:
                # The padded columns' gradient is cut off again by F.pad's backward: the
                # weight's gradient keeps its shape and the values are the layer's.
                x = F.linear(F.pad(x, (0, pad)), F.pad(layer.weight, (0, pad)), layer.bias)
            elif (
                i == last
                and plain.ends_in_output
                and layer.out_features <= self.options.sum_outputs
            ):
                # A few outputs (a parametric Q-value, dqn's actions): fused by Inductor
                # with the previous activation (the parametric step's K candidates per
                # row make that activation the largest tensor of the step).
                x = (x.unsqueeze(-2) * layer.weight).sum(-1) + layer.bias
            else:
                x = layer(x)
            x = plain.tails[i](x)
        return x


class TracedParametric(nn.Module):
    """`plain`'s forward (`ParametricQNetwork`) with the forms of `options`: its MLP
    traced as `TracedMLP`, the candidate set's first layer by the kernel."""

    def __init__(self, plain: ParametricQNetwork, options: ForwardOptions) -> None:
        super().__init__()
        self.plain = plain
        self.options = options
        self.mlp = TracedMLP(plain.mlp, options)

    def forward(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        plain = self.plain
        if actions.dim() == 2:
            return self.mlp(torch.cat([state, actions], dim=-1)).squeeze(-1)
        first = plain.mlp.linear(0)
        weight = first.weight
        pad = self.options.first_padding(first)
        if pad:
            # With TF32 products the state block, cut from the padded weight, has rows 16
            # bytes apart, so that its product can take cuBLAS's aligned kernels (the plan
            # pads TF32 products only).
            weight = F.pad(weight, (0, pad))
        d, g = plain.state_dim, plain.action_dim
        w_state, w_action = weight[:, :d], weight[:, d : d + g]
        h_s = F.linear(state, w_state, first.bias)
        if (
            self.options.candidate_kernel
            and candidate_layer.fits(plain)
            and candidate_layer.usable(state, actions)
        ):
            # One kernel for the first layer and its ReLU (`candidate_layer`'s notes).
            dtype = candidate_layer.output_dtype(actions.device)
            h = candidate_layer.first_layer(h_s, actions, w_action, dtype)
            return self.mlp.forward_from(1, h).squeeze(-1)
        h_a = F.linear(actions, w_action)
        return self.mlp.forward_after_first(h_a + h_s.unsqueeze(1)).squeeze(-1)


def traced_variant(
    net: nn.Module, options: ForwardOptions, memo: dict[int, nn.Module] | None = None
) -> nn.Module:
    """`net` as a compiled step traces it under `options` (module notes): `net` itself
    where no form applies, else a shallow copy of its module tree with every `MLP` and
    `ParametricQNetwork` replaced by its variant; parameters and buffers are shared, and
    `net` is left as it was. `memo` (plain module id → variant) makes the variants of
    networks that share a module share its variant, and a second call return the first's."""
    return _variant(net, options, {} if memo is None else memo)


def _variant(net: nn.Module, options: ForwardOptions, memo: dict[int, nn.Module]) -> nn.Module:
    if id(net) in memo:
        return memo[id(net)]
    out: nn.Module
    if not options.changes_anything():
        out = net
    elif isinstance(net, ParametricQNetwork):
        out = TracedParametric(net, options)
    elif isinstance(net, MLP):
        out = TracedMLP(net, options)
    else:
        children = {name: _variant(c, options, memo) for name, c in net.named_children()}
        if all(children[name] is c for name, c in net.named_children()):
            out = net
        else:
            # A container (dueling, BCQ, the CPE models): the same object but for its
            # children; its own dicts are copied so that the original keeps its children.
            out = copy.copy(net)
            out.__dict__["_modules"] = children
            out.__dict__["_parameters"] = dict(net._parameters)
            out.__dict__["_buffers"] = dict(net._buffers)
    memo[id(net)] = out
    return out
