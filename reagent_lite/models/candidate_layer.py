"""The parametric network's first layer over a candidate set, as one Triton kernel.

`first_layer(state_part, actions, w_action)` is relu(state_part + W_a·a) for the K
candidates a of each state: [B, K, H] from the state part [B, H] (W_s·s + b, once per
state) and the candidates [B, K, G]. Compiled by Inductor, the same layer is a matrix
product over the candidates' few features, which writes its [B·K, H] result, then a pass
that reads it back, adds the state part, applies the ReLU and writes it again; this
kernel reads the state part and the candidates and writes the activation once, in the
dtype the next layer reads (bfloat16 under bf16 autocast). benchmarks/RESULTS.md has the
measurement (one H100, double Q's argmax over 16 candidates).

Only where the step plan asks for it (`traced.ForwardOptions.candidate_kernel`: compiled
CUDA steps where Triton is installed, `available`) and the network and the call allow it:
the first activation a plain ReLU and at most MAX_ACTION_FEATURES action features
(`fits`), a candidate set scored without gradient (`usable`: double Q's choice of the next
candidate; CQL's candidate set, scored with gradient, keeps the plain layer). Eager steps,
evaluation and the exported model run the plain network's forward, never this kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reagent_lite.models.parametric import ParametricQNetwork

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the plain layer everywhere
    triton = None

# The widest action block the kernel unrolls (one multiply-add per feature and unit); a
# bound on the unrolled code, not a measurement: only 6 features were timed.
MAX_ACTION_FEATURES = 64
# Rows (state, candidate) and hidden units per program: the fastest of 7 shapes on an H100
# (benchmarks/candidate_scores.py: 7.4 µs for 1,024 states × 16 candidates × 256 units,
# 7.5 to 9.5 µs for the others; Inductor's matrix product and pass, 21.0 µs).
BLOCK_ROWS, BLOCK_UNITS, WARPS = 16, 256, 4


def available(device: torch.device) -> bool:
    """Whether the kernel can run on `device`: CUDA, with Triton installed."""
    return triton is not None and device.type == "cuda"


def fits(net: ParametricQNetwork) -> bool:
    """Whether the kernel computes `net`'s first layer: a plain ReLU after it, and few
    enough action features to unroll."""
    return type(net.mlp.tails[0]) is nn.ReLU and net.action_dim <= MAX_ACTION_FEATURES


def usable(state: Tensor, actions: Tensor) -> bool:
    """Whether this call scores a candidate set per state ([B, D], [B, K, G]) without
    gradient, as the kernel (which has no backward) needs."""
    return actions.dim() == 3 and actions.shape[0] == state.shape[0] and not torch.is_grad_enabled()


def output_dtype(device: torch.device) -> torch.dtype:
    """The dtype the next (linear) layer reads: autocast's, else float32."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return torch.float32


if triton is not None:

    @triton.jit
    def _first_layer_kernel(
        part_ptr,  # [B, H] the state part, bias included
        act_ptr,  # [B * K, G] the candidates, contiguous
        w_ptr,  # [H, G] the action block of the first layer's weight, rows `w_stride` apart
        out_ptr,  # [B * K, H]
        rows,
        candidates,
        w_stride,
        H: tl.constexpr,
        G: tl.constexpr,
        BM: tl.constexpr,
        BH: tl.constexpr,
    ):
        r = tl.program_id(0) * BM + tl.arange(0, BM)
        h = tl.program_id(1) * BH + tl.arange(0, BH)
        rmask, hmask = r < rows, h < H
        mask = rmask[:, None] & hmask[None, :]
        r64 = r.to(tl.int64)
        state = r64 // candidates
        acc = tl.load(part_ptr + state[:, None] * H + h[None, :], mask=mask, other=0.0)
        acc = acc.to(tl.float32)
        for g in tl.static_range(G):
            a = tl.load(act_ptr + r64 * G + g, mask=rmask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + h * w_stride + g, mask=hmask, other=0.0).to(tl.float32)
            acc += a[:, None] * w[None, :]
        acc = tl.maximum(acc, 0.0)
        out = out_ptr + r64[:, None] * H + h[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


def launch(
    state_part: Tensor,
    actions: Tensor,
    w_action: Tensor,
    out: Tensor,
    block_rows: int = BLOCK_ROWS,
    block_units: int = BLOCK_UNITS,
    warps: int = WARPS,
) -> None:
    """Runs the kernel into `out` [B, K, H] (block sizes: benchmarks/candidate_scores.py)."""
    assert triton is not None and w_action.stride(1) == 1
    b, k, g = actions.shape
    units = state_part.shape[-1]
    grid = (triton.cdiv(b * k, block_rows), triton.cdiv(units, block_units))
    torch.library.wrap_triton(_first_layer_kernel)[grid](
        state_part.contiguous(),
        actions.contiguous(),
        w_action,
        out,
        b * k,
        k,
        w_action.stride(0),
        H=units,
        G=g,
        BM=block_rows,
        BH=block_units,
        num_warps=warps,
    )


def first_layer(
    state_part: Tensor, actions: Tensor, w_action: Tensor, out_dtype: torch.dtype
) -> Tensor:
    """relu(state_part[:, None] + actions · w_actionᵀ): [B, H], [B, K, G], [H, G] →
    [B, K, H] in `out_dtype`, accumulated in float32 (module notes); needs Triton."""
    return _first_layer_op(state_part, actions, w_action, out_dtype)


if triton is not None:  # an operator Inductor sees into (without Triton, torch warns)

    @torch.library.triton_op("reagent_lite::candidate_first_layer", mutates_args=())
    def _first_layer_op(
        state_part: Tensor, actions: Tensor, w_action: Tensor, out_dtype: torch.dtype
    ) -> Tensor:
        b, k, _ = actions.shape
        out = torch.empty(b, k, state_part.shape[-1], device=actions.device, dtype=out_dtype)
        launch(state_part, actions, w_action, out)
        return out
