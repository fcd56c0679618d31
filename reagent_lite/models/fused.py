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


def layers_forward(
    x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor], relu: Sequence[bool]
) -> list[Tensor]:
    """[x, out_0, ..., out_{n-1}]: each linear layer's output after its (optional) ReLU.

    No autograd: with `layers_backward`, what a caller that forms its loss gradient itself
    uses (`DQNTrainer._fused_backward`); each output is fresh, so the ReLU runs in place."""
    outs = [x]
    for w, b, act in zip(weights, biases, relu, strict=True):
        inp = outs[-1]
        if _onednn_suits(inp, w):
            # Without oneDNN's ReLU post-op: it turns NaN into 0, and a diverged run would
            # look healthy. torch's ReLU below keeps NaN.
            h = _onednn_linear(inp, w, b, "none", [], "")
        else:
            h = torch.addmm(b, inp, w.t())
        if act:
            h.relu_()
        outs.append(h)
    return outs


# -- which library multiplies ------------------------------------------------------------
# On AMD's Zen 4 cores, oneDNN's fp32 GEMM (through the op torch's own CPU compiler calls,
# `mkldnn._linear_pointwise`) runs the reference step's 1024×256×256 products faster than
# MKL's `addmm` / `mm` (690 vs 770 µs forward, 665 vs 750 µs for g·W; whole step +2–7%);
# on an Intel Xeon it is the other way round (whole step −3 to −10%); weight gradients
# gᵀ·h are faster on MKL (710 vs 900 µs on Zen 4).
# Figures: `bench_train` (`ours` vs `ours-mkl` / `ours-onednn`), `benchmarks/RESULTS.md`.
# So: oneDNN for forward products and input gradients on AMD CPUs (measured on Zen 4 only),
# MKL otherwise, and never with `torch.backends.mkldnn.flags(enabled=False)` — a fixed
# rule of the machine (not a timing race), so a run and its resumption, and every rank
# of a node, multiply the same way. Same fp32 maths either way, another summation order.
# Only for products of at least `_ONEDNN_MIN` in every dimension.
_ONEDNN_MIN = 64


def _cpu_vendor() -> str:
    """The CPU's vendor id (`AuthenticAMD`, `GenuineIntel`, ...) where Linux says, else ''."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


USE_ONEDNN = _cpu_vendor() == "AuthenticAMD"  # the rule above; tests switch it
_onednn_linear: Any = None
_onednn_checked = False


def _onednn_available() -> bool:
    """Whether the op exists and agrees with `addmm` (checked once, on first use)."""
    global _onednn_linear, _onednn_checked
    if not _onednn_checked:
        _onednn_checked = True
        try:
            if torch.backends.mkldnn.is_available():
                op = torch.ops.mkldnn._linear_pointwise
                g = torch.Generator().manual_seed(0)
                x, w, b = (torch.randn(*s, generator=g) for s in ((80, 72), (66, 72), (66,)))
                x[3, 5] = float("nan")  # must come out as NaN in row 3, like addmm's
                with torch.no_grad():
                    got = op(x, w, b, "none", [], "")
                want = torch.addmm(b, x, w.t())
                if torch.allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True):
                    _onednn_linear = op
        except (AttributeError, RuntimeError):
            _onednn_linear = None
    return _onednn_linear is not None


def _onednn_suits(x: Tensor, w: Tensor) -> bool:
    """oneDNN for x·wᵀ: large fp32 products outside autograd (the op has no backward)."""
    return (
        USE_ONEDNN
        and torch._C._get_mkldnn_enabled()
        and x.shape[0] >= _ONEDNN_MIN
        and w.shape[0] >= _ONEDNN_MIN
        and w.shape[1] >= _ONEDNN_MIN
        and x.dtype == torch.float32
        and w.dtype == torch.float32
        and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
        and _onednn_available()
    )


def _mm_weight(g: Tensor, w: Tensor) -> Tensor:
    """g·w (the input gradient of a linear layer with weight w)."""
    wt = w.t()
    if _onednn_suits(g, wt):
        return _onednn_linear(g, wt, None, "none", [], "")
    return torch.mm(g, w)


class _FusedMLP(torch.autograd.Function):
    """Inputs: (x, relu flags, pre_relu, w_0, b_0, ..., w_{n-1}, b_{n-1}).

    `pre_relu`: x is the pre-activation of a layer computed outside (the parametric
    network's split first layer) and gets a ReLU before the first layer here."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, relu: tuple[bool, ...], pre_relu: bool, *params: Tensor):
        weights, biases = params[0::2], params[1::2]
        first = torch.relu(x) if pre_relu else x
        outs = layers_forward(first, weights, biases, relu)
        ctx.relu, ctx.pre_relu = relu, pre_relu
        ctx.save_for_backward(*outs, *weights)
        return outs[-1]

    @staticmethod
    @torch.autograd.function.once_differentiable  # the backward itself is not differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        n = len(ctx.relu)
        saved = ctx.saved_tensors
        grads, grad_x = layers_backward(
            saved[: n + 1],
            saved[n + 1 :],
            ctx.relu,
            grad,
            input_grad=ctx.needs_input_grad[0],
            pre_relu=ctx.pre_relu,
        )
        return (grad_x, None, None, *grads)


def layers_backward(
    outs: Sequence[Tensor],
    weights: Sequence[Tensor],
    relu: Sequence[bool],
    grad: Tensor,
    *,
    input_grad: bool = False,
    pre_relu: bool = False,
    grad_owned: bool = False,
) -> tuple[list[Tensor], Tensor | None]:
    """Gradients of the layers of `layers_forward` (its `outs`) given the gradient of the
    last output: ([dw_0, db_0, ..., dw_{n-1}, db_{n-1}], d input or None).

    `grad_owned`: `grad` is the caller's scratch tensor, so the ReLU backward may overwrite
    it instead of allocating."""
    n = len(relu)
    grads: list[Tensor] = []
    g = grad
    owned = grad_owned  # whether `g` may be edited in place
    for i in reversed(range(n)):
        if relu[i] and owned:
            _threshold_backward.grad_input(g, outs[i + 1], 0.0, grad_input=g)
        elif relu[i]:
            g = _threshold_backward(g, outs[i + 1], 0.0)
            owned = True
        h = outs[i]
        w = weights[i]
        # dW = gᵀ·h, [out, in]. MKL is much faster with the wider side as the rows.
        dw = torch.mm(h.t(), g).t() if w.shape[1] < w.shape[0] else torch.mm(g.t(), h)
        grads[:0] = [dw, g.sum(0)]
        if i > 0 or input_grad:
            g = _mm_weight(g, w)
            owned = True
    grad_x: Tensor | None = None
    if input_grad:
        grad_x = _threshold_backward(g, outs[0], 0.0) if pre_relu else g
    return grads, grad_x


def accumulate_grads(
    weights: Sequence[Tensor], biases: Sequence[Tensor], grads: Sequence[Tensor]
) -> None:
    """Add `layers_backward`'s gradients ([dw_0, db_0, ...]) into the parameters' `.grad`,
    as autograd's accumulation does (set where there is none yet)."""
    params = [t for pair in zip(weights, biases, strict=True) for t in pair]
    for p, g in zip(params, grads, strict=True):
        if p.grad is None:
            p.grad = g if g.is_contiguous() else g.contiguous()
        else:
            p.grad.add_(g)


def fused_mlp(
    x: Tensor,
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    relu: Sequence[bool],
    *,
    pre_relu: bool = False,
    consume: bool = False,
) -> Tensor:
    """The MLP `x → [relu] → (linear → relu?)*` on a CPU tensor of any leading shape.

    `consume`: `x` is the caller's scratch tensor; without autograd, the leading ReLU then
    runs in place on it (a [B·K, H] candidate tensor: one allocation and pass fewer)."""
    flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in (*weights, *biases))
    )
    if needs_grad:
        params = [t for pair in zip(weights, biases, strict=True) for t in pair]
        out = _FusedMLP.apply(flat, tuple(relu), pre_relu, *params)
    else:
        first = (flat.relu_() if consume else torch.relu(flat)) if pre_relu else flat
        out = layers_forward(first, weights, biases, relu)[-1]
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], out.shape[-1])


_is_compiling = torch.compiler.is_compiling
_is_exporting = getattr(torch.compiler, "is_exporting", None)


def fusable_here(x: Tensor) -> bool:
    """Whether the fused path may run for input `x`: a CPU floating tensor, outside
    `torch.export` / `torch.compile` tracing, `torch.func` transforms and CPU autocast
    (they must see the plain modules: the node has no vmap rule and saves activations in
    the autocast dtype)."""
    return not (
        x.device.type != "cpu"
        or not x.is_floating_point()
        or torch.is_autocast_enabled("cpu")
        or torch._C._are_functorch_transforms_active()
        or _is_compiling()
        or (_is_exporting is not None and _is_exporting())
    )
