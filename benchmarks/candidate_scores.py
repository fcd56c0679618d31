"""Double Q's next-state argmax over 16 candidates, the parametric step's largest part.

What the parametric step computes without gradient for each next state: the online net's
scores of its K candidates (MLP 256×256 over [state; candidate]) and their masked argmax.
Per precision, compiled as the step compiles it: with the first layer as one kernel
(`models.candidate_layer`, what the network traces) and as the matrix product and pass
it replaced, alternating, twice each; then the second layer's matrix product alone (the
floor of the rest), and in fp32 the first layer alone: Inductor's product and pass, and
the kernel at several block shapes (rows, units, warps). Each variant is captured in a
CUDA graph (10 calls) and its replays are timed; accuracy is against float64 (relative
L2 of the scores, share of argmaxes equal to the float64 argmax).

    python -m benchmarks.candidate_scores --precisions fp32,tf32,bf16
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from reagent_lite.models import candidate_layer
from reagent_lite.models.parametric import ParametricQNetwork
from reagent_lite.models.traced import ForwardOptions, traced_variant
from reagent_lite.trainers.masked import masked_argmax
from reagent_lite.training.precision import step_precision

CALLS = 10


def graph_time_us(fn: Callable[[], object], blocks: int = 7, replays: int = 20) -> float:
    """µs per call of `fn`, from replays of a CUDA graph holding CALLS calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    times = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * CALLS))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--precisions", default="fp32,tf32,bf16")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--candidates", type=int, default=16)
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}", flush=True)
    b, k, d, g = args.batch, args.candidates, 8, 6
    net = ParametricQNetwork(d, g).to(dev)
    state = torch.randn(b, d, device=dev)
    cands = torch.randn(b, k, g, device=dev)
    mask = (torch.rand(b, k, device=dev) > 0.1).float()
    first, second = net.mlp.linear(0), net.mlp.linear(1)

    with torch.no_grad():
        ref64 = ParametricQNetwork(d, g).to(dev).double()
        ref64.load_state_dict(net.state_dict())
        q64 = ref64(state.double(), cands.double())
        best64 = masked_argmax(q64, mask)[0]

    def plain() -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            q = net(state, cands)
            return q, masked_argmax(q, mask)[0]

    # What a compiled step traces (`models.traced`): the kernel and the output sum.
    variant = traced_variant(net, ForwardOptions(sum_outputs=4, candidate_kernel=True))

    def with_kernel() -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            q = variant(state, cands)
            return q, masked_argmax(q, mask)[0]

    def matrix_product() -> tuple[Tensor, Tensor]:
        """`with_kernel` with the first layer as a matrix product and a pass (the form
        before)."""
        with torch.no_grad():
            h_a = F.linear(cands, first.weight[:, d:])
            h_s = F.linear(state, first.weight[:, :d], first.bias).unsqueeze(1)
            q = variant.mlp.forward_after_first(h_a + h_s).squeeze(-1)
            return q, masked_argmax(q, mask)[0]

    rows: list[str] = []
    configs = [(32, 256, 4), (16, 256, 4), (32, 256, 8), (64, 256, 8), (64, 128, 4),
               (128, 64, 4), (32, 128, 4)]  # fmt: skip

    def report(name: str, fn: Callable[[], tuple[Tensor, Tensor]]) -> None:
        q, best = fn()
        err = float((q.double() - q64).norm() / q64.norm())
        agree = float((best == best64).float().mean())
        us = graph_time_us(fn)
        rows.append(f"  {name:44s} {us:8.2f} µs   rel.err {err:.1e}   argmax = f64 {agree:.4f}")
        print(rows[-1], flush=True)

    @torch.no_grad()
    def first_layer_only() -> Tensor:
        h_s = F.linear(state, first.weight[:, :d], first.bias)
        return torch.relu(F.linear(cands, first.weight[:, d:]) + h_s.unsqueeze(1))

    def timed(name: str, fn: Callable[[], object]) -> None:
        rows.append(f"  {name:44s} {graph_time_us(fn):8.2f} µs")
        print(rows[-1], flush=True)

    for prec in args.precisions.split(","):
        with step_precision(prec, dev):
            torch._dynamo.reset()
            report(f"{prec} plain eager", plain)
            kernel = torch.compile(with_kernel, dynamic=False)
            product = torch.compile(matrix_product, dynamic=False)
            for _ in range(2):  # twice each, alternating: the spread beside the difference
                report(f"{prec} compiled, first layer one kernel", kernel)
                report(f"{prec} compiled, first layer a product", product)
            a2, w2 = torch.randn(b * k, 256, device=dev), second.weight
            timed(f"{prec} the layer-2 mm alone", lambda a2=a2, w2=w2: a2 @ w2.T)
            if prec != "fp32":
                continue
            timed("first layer alone, compiled product", torch.compile(first_layer_only))
            h_s = F.linear(state, first.weight[:, :d], first.bias).detach()
            out = torch.empty(b, k, 256, device=dev)
            want = first_layer_only()
            for cfg in configs:
                run = functools.partial(
                    candidate_layer.launch, h_s, cands, first.weight[:, d:].detach(), out, *cfg
                )
                run()
                ok = torch.equal(out, want) or float((out - want).abs().max()) < 1e-5
                timed(f"first layer alone, kernel {cfg}{'' if ok else ' WRONG'}", run)
    print("\nsummary")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
