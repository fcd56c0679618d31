"""The contenders `bench_train` times against our step: the same maths in bare PyTorch
(`Bare`: eager, in a CUDA graph, compiled by Inductor), the step's five large matrix
products alone (`Products`, the CPU's arithmetic floor) and d3rlpy's DoubleDQN."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reagent_lite.data.rows import Rows
from reagent_lite.training.precision import step_precision

GAMMA, TAU, LR = 0.99, 0.01, 1e-3
# Untimed steps before each contender's timed block. The contenders take turns, and the
# first steps after another one ran pay for its leftovers (caches, sleeping OpenMP
# threads): ≈ 5% of the figure of whichever contender came first in a round, measured.
WARMUP_STEPS = 3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Bare:
    """The same maths as our DQN / parametric trainer, written the way one would by hand."""

    def __init__(
        self,
        data: Rows,
        batch: int,
        parametric: bool,
        graph: bool,
        compiled: bool = False,
        precision: str = "fp32",
    ):
        self.device = data.state.device
        self.precision = precision
        self._loss = torch.compile(self.loss, dynamic=False) if compiled else self.loss
        self.parametric = parametric
        self.batch = batch
        keep = ["state", "action", "reward", "next_state", "terminal", "possible_next_actions_mask"]
        if parametric:
            keep.append("possible_next_actions")
        self.data = {k: data[k] for k in keep}
        d = data.state.shape[1]
        d_in = d + data.action.shape[1] if parametric else d
        out = 1 if parametric else int(data.possible_next_actions_mask.shape[1])
        self.net = nn.Sequential(
            nn.Linear(d_in, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, out)
        ).to(self.device)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        cuda = self.device.type == "cuda"
        self.opt = torch.optim.Adam(
            self.net.parameters(), lr=LR, fused=cuda or None, capturable=cuda and graph
        )
        self.n = len(data)
        self.steps = self.n // batch
        self.perm = torch.randperm(self.n, device=self.device)[: self.steps * batch]
        self.perm = self.perm.view(self.steps, batch)
        self.pos = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.k = 0
        self.loss_sum = torch.zeros((), device=self.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        if graph:
            self._capture()

    def q(self, net: nn.Module, s: Tensor, a: Tensor | None = None) -> Tensor:
        if not self.parametric:
            return net(s)
        assert a is not None  # [B, K, G] candidates → [B, K]
        return net(torch.cat([s.unsqueeze(1).expand(-1, a.shape[1], -1), a], -1)).squeeze(-1)

    def loss(self, idx: Tensor) -> Tensor:
        d = self.data
        s, r, ns = d["state"][idx], d["reward"][idx], d["next_state"][idx]
        mask, done = d["possible_next_actions_mask"][idx], d["terminal"][idx]
        cands = d["possible_next_actions"][idx] if self.parametric else None
        with torch.no_grad():
            best = self.q(self.net, ns, cands).masked_fill(mask == 0, -torch.inf).argmax(1)
            v = self.q(self.target, ns, cands).gather(1, best[:, None]).squeeze(1)
            done = torch.maximum(done, (mask == 0).all(1).float())
            y = r + GAMMA * (1.0 - done) * v
        if self.parametric:
            q = self.q(self.net, s, d["action"][idx].unsqueeze(1)).squeeze(1)
        else:
            q = self.net(s).gather(1, d["action"][idx][:, None]).squeeze(1)
        return F.mse_loss(q.float(), y.float())

    def body(self, idx: Tensor) -> None:
        with self._precision():
            loss = self._loss(idx)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
        self.opt.step()
        with torch.no_grad():
            # The bare loop keeps torch's multi-tensor update (private; developer tools may
            # use it): the floor our step is held to is the fastest plain form, not ours.
            torch._foreach_lerp_(list(self.target.parameters()), list(self.net.parameters()), TAU)
        self.loss_sum += loss.detach()

    def _precision(self) -> Any:
        """The workflow's own precision context: bf16 autocast without the cast cache (as
        in a graph), TF32 matmuls for tf32."""
        return step_precision(self.precision, torch.device("cuda"))

    def _graph_body(self) -> None:
        self.body(self.perm.index_select(0, self.pos).view(-1))
        self.pos.add_(1)

    def _capture(self) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self._graph_body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._graph_body()

    def step(self) -> None:
        if self.graph is not None:
            if self.k % self.steps == 0:
                self.pos.zero_()
            self.graph.replay()
        else:
            self.body(self.perm[self.k % self.steps])
        self.k += 1

    def time(self, steps: int) -> float:
        for _ in range(WARMUP_STEPS):
            self.step()
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync(self.device)
        return steps * self.batch / (time.perf_counter() - t0)


class Products:
    """The step's large products and nothing else (CPU, dqn): the three forwards' hidden
    256×256 layer (online on s and s', target on s'), its input and weight gradients, as
    torch's CPU kernels compute them. No fp32 implementation of the reference
    step beats this on the machine; `ours / products` is how close ours gets to it and
    `products / d3rlpy` the highest ratio to d3rlpy the arithmetic allows."""

    def __init__(self, batch: int, hidden: int = 256):
        g = torch.Generator().manual_seed(0)
        self.h = torch.randn(batch, hidden, generator=g).relu_()
        self.w = torch.randn(hidden, hidden, generator=g) / hidden**0.5
        self.b = torch.zeros(hidden)
        self.batch = batch

    @torch.no_grad()
    def step(self) -> None:
        h, w, b = self.h, self.w, self.b
        for _ in range(3):
            torch.addmm(b, h, w.t()).relu_()
        torch.mm(h, w)  # input gradient g·W (g: a [B, H] gradient)
        torch.mm(h.t(), h)  # weight gradient gᵀ·h

    def time(self, steps: int) -> float:
        for _ in range(WARMUP_STEPS):
            self.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        return steps * self.batch / (time.perf_counter() - t0)


def d3rlpy_runner(data: Rows, batch: int, device: str) -> Callable[[int], float] | None:
    try:
        import d3rlpy
        from d3rlpy.logging import NoopAdapterFactory
    except ImportError:
        return None
    import numpy as np

    order = torch.argsort(data.mdp_id.cpu() * (1 << 32) + data.sequence_number.cpu())
    mdp = data.mdp_id.cpu()[order].numpy()
    terminal = data.terminal.cpu()[order].numpy()
    ends = np.r_[mdp[1:] != mdp[:-1], True]
    dataset = d3rlpy.dataset.MDPDataset(
        observations=data.state.cpu()[order].numpy(),
        actions=data.action.cpu()[order].numpy().reshape(-1, 1),
        rewards=data.reward.cpu()[order].numpy().reshape(-1, 1),
        terminals=(terminal > 0).astype(np.float32),
        timeouts=(ends & (terminal == 0)).astype(np.float32),
        action_space=d3rlpy.ActionSpace.DISCRETE,
        action_size=2,
    )
    algo = d3rlpy.algos.DoubleDQNConfig(
        batch_size=batch,
        learning_rate=LR,
        gamma=GAMMA,
        target_update_interval=100,
        encoder_factory=d3rlpy.models.VectorEncoderFactory(hidden_units=[256, 256]),
    ).create(device="cuda:0" if device == "cuda" else False)
    algo.build_with_dataset(dataset)

    def run(steps: int) -> float:
        # Timed from the end of its WARMUP_STEPS-th step to the end of the last one, by
        # `fit`'s per-step callback: the steps (sampling, update, its bookkeeping), not the
        # set-up `fit` does on each call (≈ 8% of a 75-step call here).
        marks: dict[int, float] = {}

        def mark(_algo: Any, _epoch: int, total_step: int) -> None:
            marks[total_step] = time.perf_counter()

        n = WARMUP_STEPS + steps
        algo.fit(
            dataset, n_steps=n, n_steps_per_epoch=n, show_progress=False,
            logger_adapter=NoopAdapterFactory(), save_interval=10**9, callback=mark,
        )  # fmt: skip
        return steps * batch / (marks[n] - marks[WARMUP_STEPS])

    return run
