"""Who this process is in the job, and the handful of collectives the rest of the code needs.

Ranks live here and nowhere else: trainers, models and evaluators receive a `DistContext`
(or nothing) and never call `torch.distributed` themselves. With `world_size == 1` every
collective is a no-op, so single-process code paths need no special cases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# Re-exported: callers ask the context whether an error is a failed collective.
from reagent_lite.distributed.failures import is_collective_error as is_collective_error


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job: global and local rank, node, device and backend."""

    rank: int
    world_size: int
    local_rank: int
    node_index: int
    procs_per_node: int
    device: torch.device
    backend: str

    @classmethod
    def single(cls, device: torch.device | str = "cpu") -> DistContext:
        """A context for one process with no process group (tests, single-process runs)."""
        dev = torch.device(device)
        return cls(
            rank=0,
            world_size=1,
            local_rank=0,
            node_index=0,
            procs_per_node=1,
            device=dev,
            backend="nccl" if dev.type == "cuda" else "gloo",
        )

    @property
    def is_rank_zero(self) -> bool:
        """True on global rank 0, the only rank that logs, evaluates and writes outputs."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when collectives really talk to other processes."""
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over all ranks, in place; returns `t` for chaining."""
        if self.is_distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_reduce_mean(self, t: torch.Tensor) -> torch.Tensor:
        """Average `t` over all ranks, in place (floating tensors); returns `t`."""
        if self.is_distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t.div_(self.world_size)
        return t

    def all_reduce_max(self, values: list[int]) -> list[int]:
        """The element-wise maximum of small integer flags over all ranks (one all-reduce):
        a decision every rank takes together, e.g. stopping on a signal one rank received."""
        if not self.is_distributed:
            return list(values)
        flags = torch.tensor(values, dtype=torch.int64, device=self._tensor_device())
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [int(v) for v in flags.tolist()]

    def all_reduce_max_(self, flags: torch.Tensor) -> None:
        """In place, the element-wise maximum of `flags` (on this rank's collective device)
        over all ranks, queued without reading it on the host."""
        if self.is_distributed:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Return rank `src`'s `obj` on every rank (e.g. a stop decision made on rank 0)."""
        if not self.is_distributed:
            return obj
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, device=self._object_device())
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, ordered by rank."""
        if not self.is_distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_agree(self, ok: bool) -> bool:
        """True when `ok` is true on every rank (a MIN all-reduce): a decision every rank
        must take together, such as replaying a CUDA graph that holds a collective."""
        if not self.is_distributed:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self._tensor_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def heartbeat(self) -> None:
        """A one-element all-reduce. A step whose collectives live inside a CUDA graph gives
        NCCL's watchdog nothing to time out on; queued now and then, this one does, so a
        dead peer still ends the job within `collective_timeout_s`."""
        if self.is_distributed:
            dist.all_reduce(torch.zeros(1, device=self._tensor_device()))

    def gradient_average(
        self, params: Iterable[Tensor], *, scaled_backward: bool = False
    ) -> GradAverage:
        """What DDP's reducer does to the gradients of `params`, as one callable made of
        tensor ops and one all-reduce, so that it can be captured in a CUDA graph
        (`scaled_backward`: see `GradAverage`)."""
        return GradAverage(self, list(params), scaled_backward=scaled_backward)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.is_distributed:
            if self.backend == "nccl":
                # NCCL's barrier guesses the device from the rank unless told; tell it.
                dist.barrier(device_ids=[self.device.index or 0])
            else:
                dist.barrier()

    def _object_device(self) -> torch.device | None:
        # Object collectives pickle into a tensor; NCCL needs it on this rank's GPU.
        return self.device if self.backend == "nccl" else None

    def _tensor_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")


class GradAverage:
    """Averages the gradients of `params` over the ranks, as DDP does (divide by the world
    size, then sum): flattened into one buffer, one all-reduce, and the gradients become
    views of the result (copied back instead where a parameter is not contiguous or the
    dtypes differ). Called between backward and the optimizer step
    (`trainers.gradient_step.GradientStep`, built by `training.update`).

    The sum is the process group's all-reduce (NCCL on GPUs). (A one-kernel peer-to-peer
    sum over symmetric memory was removed: +3% on 2 and 4 GPUs, under 5%.)

    With `scaled_backward` the caller's backward already multiplied the gradients by
    `loss_scale` (1 / world size, as the seed of the backward: `trainers.optim.BackwardSeed`)
    and the average is the sum alone: one kernel less per step than dividing the flat
    buffer. For a power-of-two world size the bits are those of dividing afterwards
    (scaling by a power of two is exact); otherwise they differ by rounding (at bfloat16's
    precision under bf16 autocast, where the scaled gradients pass through bf16), the same
    on every rank."""

    def __init__(
        self,
        ctx: DistContext,
        params: list[Tensor],
        *,
        scaled_backward: bool = False,
    ):
        self.ctx = ctx
        self.scaled_backward = scaled_backward
        self.params = [p for p in params if p.requires_grad]
        # Views of one flat buffer can stand for the gradients only where they would have
        # the gradient's own layout and dtype.
        self._views = all(p.is_contiguous() for p in self.params) and (
            len({p.dtype for p in self.params}) <= 1
        )

    @property
    def loss_scale(self) -> float:
        """What the caller's backward must multiply the gradients by (1: nothing)."""
        return 1.0 / self.ctx.world_size if self.scaled_backward else 1.0

    def describe(self) -> str:
        return "NCCL all-reduce" if self.ctx.backend == "nccl" else f"{self.ctx.backend} all-reduce"

    def __call__(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        if not self.scaled_backward:
            flat.div_(self.ctx.world_size)
        flat = self.ctx.all_reduce_sum(flat)
        parts = [
            part.view_as(g)
            for part, g in zip(flat.split([g.numel() for g in grads]), grads, strict=True)
        ]
        if not self._views:
            # Rare (no shipped network has such parameters): per-tensor copies, public API
            # and capturable; a multi-tensor copy saved only launches on this fallback route.
            for g, part in zip(grads, parts, strict=True):
                g.copy_(part)
            return
        # The averaged values become the gradients themselves, not a copy: every step
        # starts from `zero_grad(set_to_none=True)`, so nothing else holds them.
        for p, part in zip((p for p in self.params if p.grad is not None), parts, strict=True):
            p.grad = part
