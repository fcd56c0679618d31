"""CPU fast path for ReLU MLPs: forward and backward written out, as one autograd node.

On a CPU, the step of the reference task (Double DQN, MLP 256×256, batch 1024) spends
about a third of its time outside the four large matrix products, and much of that in
avoidable work: autograd allocates a fresh tensor for every ReLU output and every ReLU
gradient, and MKL computes a weight gradient whose input side is narrow (the first layer
of a 4-feature state) about three times slower than the same product transposed. This
node runs the layers itself:

* each ReLU is applied in place to the fresh output of `addmm`, which nothing else holds;
* the ReLU backward is `threshold_backward` on the saved post-activation output
  (output > 0 exactly where the pre-activation is), in place on a gradient it owns;
* each weight gradient is computed in the faster orientation (the wider side first);
* the input gradient is skipped when nothing upstream needs it.

The maths is that of `nn.Linear` + `nn.ReLU` — outputs and gradients agree with the
module-by-module path to float rounding (tests/models/test_fused.py) — only the schedule
differs. `MLP` uses it for CPU tensors when every hidden layer is a plain ReLU and the
output layer linear (no dropout, no LayerNorm). CUDA keeps the module-by-module path:
there the whole step is one CUDA graph, and launch overheads, not these, rule eager runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

_threshold_backward = torch.ops.aten.threshold_backward


def _layers_forward(
    x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], relu: Sequence[bool]
) -> list[Tensor]:
    """[x, out_0, ..., out_{n-1}]: each linear layer's output after its (optional) ReLU."""
    outs = [x]
    for w, b, act in zip(weights, biases, relu, strict=True):
        h = torch.addmm(b, outs[-1], w.t())
        if act:
            h.relu_()
        outs.append(h)
    return outs


class _FusedMLP(torch.autograd.Function):
    """Inputs: (x, relu flags, pre_relu, w_0, b_0, ..., w_{n-1}, b_{n-1}).

    `pre_relu`: x is the pre-activation of a layer computed outside (the parametric
    network's split first layer) and gets a ReLU before the first layer here."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, relu: tuple[bool, ...], pre_relu: bool, *params: Tensor):
        weights, biases = params[0::2], params[1::2]
        first = torch.relu(x) if pre_relu else x
        outs = _layers_forward(first, weights, biases, relu)
        ctx.relu, ctx.pre_relu = relu, pre_relu
        ctx.save_for_backward(*outs, *weights)
        return outs[-1]

    @staticmethod
    @torch.autograd.function.once_differentiable  # the backward itself is not differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        n = len(ctx.relu)
        saved = ctx.saved_tensors
        outs, weights = saved[: n + 1], saved[n + 1 :]
        grads: list[Tensor | None] = [None] * (2 * n)
        g = grad
        owned = False  # whether `g` is a tensor this backward made (safe to edit in place)
        for i in reversed(range(n)):
            if ctx.relu[i] and owned:
                _threshold_backward.grad_input(g, outs[i + 1], 0.0, grad_input=g)
            elif ctx.relu[i]:
                g = _threshold_backward(g, outs[i + 1], 0.0)
                owned = True
            h = outs[i]
            w = weights[i]
            # dW = gᵀ·h, [out, in]. MKL is much faster with the wider side as the rows.
            grads[2 * i] = torch.mm(h.t(), g).t() if w.shape[1] < w.shape[0] else torch.mm(g.t(), h)
            grads[2 * i + 1] = g.sum(0)
            if i > 0 or ctx.needs_input_grad[0]:
                g = torch.mm(g, w)
                owned = True
        grad_x: Tensor | None = None
        if ctx.needs_input_grad[0]:
            grad_x = _threshold_backward(g, outs[0], 0.0) if ctx.pre_relu else g
        return (grad_x, None, None, *grads)


def fused_mlp(
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    relu: Sequence[bool],
    *,
    pre_relu: bool = False,
) -> Tensor:
    """The MLP `x → [relu] → (linear → relu?)*` on a CPU tensor of any leading shape."""
    flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in (*weights, *biases))
    )
    if needs_grad:
        params = [t for pair in zip(weights, biases, strict=True) for t in pair]
        out = _FusedMLP.apply(flat, tuple(relu), pre_relu, *params)
    else:
        first = torch.relu(flat) if pre_relu else flat
        out = _layers_forward(first, weights, biases, relu)[-1]
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], out.shape[-1])


def fusable_here(x: Tensor) -> bool:
    """Whether the fused path may run for input `x`: a CPU floating tensor, outside
    `torch.export` / `torch.compile` tracing, `torch.func` transforms and CPU autocast
    (they must see the plain modules: the node has no vmap rule and saves activations in
    the autocast dtype)."""
    if x.device.type != "cpu" or not x.is_floating_point():
        return False
    if torch.is_autocast_enabled("cpu") or torch._C._are_functorch_transforms_active():
        return False
    compiler = torch.compiler
    if compiler.is_compiling():
        return False
    exporting = getattr(compiler, "is_exporting", None)
    return not (exporting is not None and exporting())
