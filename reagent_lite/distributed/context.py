"""Who this process is in the job, and the handful of collectives the rest of the code needs.

Ranks live here and nowhere else: trainers, models and evaluators receive a `DistContext`
(or nothing) and never call `torch.distributed` themselves. With `world_size == 1` every
collective is a no-op, so single-process code paths need no special cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


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
