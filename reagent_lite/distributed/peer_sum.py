"""The captured step's gradient all-reduce on one host: one kernel over NVLink, not NCCL.

On G GPUs of one host, a step of a small Q-network (tens of thousands of parameters,
≈ 100 µs on one GPU) spends a large share of its time in the gradient all-reduce: NCCL's
ring or tree, launched inside the CUDA graph, takes ≈ 20 µs for a few hundred kilobytes
whatever the size. `PeerSum` does the same sum as one kernel: every rank's flat gradient
buffer lives in symmetric memory (mapped into every peer's address space), and each rank
reads all G buffers and adds them in rank order — so every rank gets the same bits, as
the replicas require (torch's `one_shot_all_reduce`). It is used only where it can work
and is verified to: a single-node NCCL job on CUDA, the operator present, and a test sum
giving the right answer on every rank; any rank that cannot gives every rank NCCL (the
ranks agree, as they must for collectives). `REAGENT_LITE_P2P_ALLREDUCE=0` forces NCCL.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import torch
from torch import Tensor

from reagent_lite.torch_private import has_one_shot_sum, one_shot_sum, symmetric_buffer

log = logging.getLogger("reagent_lite")

P2P_ENV = "REAGENT_LITE_P2P_ALLREDUCE"
# Where the one-shot kernel stops paying: every rank reads every peer's whole buffer, so
# its traffic grows with G × size while a ring's stays ≈ 2 × size. Past this NCCL is used.
MAX_BYTES = 8 << 20


def peer_sum_blocker(
    *,
    backend: str,
    device: torch.device,
    world_size: int,
    procs_per_node: int,
    nbytes: int,
    env: Mapping[str, str] | None = None,
) -> str:
    """Why this rank cannot sum gradients with `PeerSum` ("" when it can try)."""
    env = os.environ if env is None else env
    if env.get(P2P_ENV, "").strip() == "0":
        return f"{P2P_ENV}=0"
    if world_size < 2:
        return "one rank"
    if backend != "nccl" or device.type != "cuda":
        return f"backend {backend} on {device.type}"
    if world_size != procs_per_node:
        return f"{world_size} ranks over {world_size // max(procs_per_node, 1)} nodes"
    if nbytes > MAX_BYTES:
        return f"{nbytes / 2**20:.0f} MiB of gradients (the one-shot sum pays below 8 MiB)"
    if not has_one_shot_sum():
        return f"torch {torch.__version__} has no one-shot symmetric-memory all-reduce"
    return ""


class PeerSum:
    """`input` (symmetric memory) summed over the ranks into `output` by one kernel."""

    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        self.input = symmetric_buffer(numel, dtype, device)
        self.output = torch.empty_like(self.input)

    def __call__(self) -> Tensor:
        return one_shot_sum(self.input, self.output)

    def verify(self, rank: int, world_size: int) -> bool:
        """One eager sum of known values: rank r holds r + 1 everywhere."""
        self.input.fill_(float(rank + 1))
        total = float(world_size * (world_size + 1) // 2)
        ok = bool(torch.all(self().eq(total)).item())
        self.input.zero_()
        return ok
