"""Seeded minibatch index streams with the same number of steps on every rank.

DDP hangs if one rank runs out of batches while another still calls all-reduce, so every
rank runs exactly `steps_per_epoch` steps (`steps_for` gives the usual value: one pass over
the largest shard). A shorter shard simply wraps around: the epoch's index stream is a
concatenation of fresh permutations, cut into full batches — every batch has exactly
`batch_size` rows, which also keeps shapes static for CUDA graphs.

The permutations come from a `torch.Generator` seeded by (seed, rank, epoch), so runs are
reproducible, ranks draw differently, and resuming from `state_dict()` continues the exact
stream (epoch + position) without replaying earlier epochs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch


def steps_for(shard_sizes: Sequence[int], batch_size: int) -> int:
    """Steps per epoch that every rank runs: one pass over the largest shard."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return max(1, math.ceil(max(shard_sizes, default=0) / batch_size))


def epoch_seed(seed: int, rank: int, epoch: int) -> int:
    """A well-mixed 63-bit seed for one (seed, rank, epoch); nearby inputs don't collide."""
    state = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, rank, epoch]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1])) & 0x7FFF_FFFF_FFFF_FFFF


class EpochSampler:
    """Yields `steps_per_epoch` int64 index tensors of `batch_size` rows of a shard of
    `n_rows`, epoch after epoch. Iterating runs the rest of the current epoch, then moves to
    the next one; `set_epoch` jumps."""

    def __init__(
        self,
        n_rows: int,
        batch_size: int,
        steps_per_epoch: int,
        seed: int,
        rank: int = 0,
        device: torch.device | str | None = None,
    ) -> None:
        if n_rows < 1:
            raise ValueError(f"n_rows must be >= 1 (empty shard on rank {rank}), got {n_rows}")
        if batch_size < 1 or steps_per_epoch < 1:
            raise ValueError(
                f"batch_size and steps_per_epoch must be >= 1, got {batch_size}, {steps_per_epoch}"
            )
        self.n_rows = n_rows
        self.batch_size = batch_size
        self.steps_per_epoch = steps_per_epoch
        self.seed = seed
        self.rank = rank
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.epoch = 0
        self.position = 0  # batches of the current epoch already handed out
        self._stream: torch.Tensor | None = None  # the current epoch's indices, on device
        self._stream_epoch = -1

    def __len__(self) -> int:
        return self.steps_per_epoch

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        """All indices of one epoch, [steps_per_epoch * batch_size], on `device`."""
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.rank, epoch))
        total = self.steps_per_epoch * self.batch_size
        perms = [torch.randperm(self.n_rows, generator=g) for _ in range(-(-total // self.n_rows))]
        # Generated on CPU (same stream on every device), moved once per epoch.
        return torch.cat(perms)[:total].to(self.device)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.position >= self.steps_per_epoch:
            self.set_epoch(self.epoch + 1)
        if self._stream_epoch != self.epoch:
            self._stream, self._stream_epoch = self.epoch_indices(self.epoch), self.epoch
        assert self._stream is not None
        while self.position < self.steps_per_epoch:
            k = self.position
            # Count the batch as consumed before handing it out: a checkpoint written after
            # training on it must resume with the next one.
            self.position += 1
            yield self._stream[k * self.batch_size : (k + 1) * self.batch_size]
        self.set_epoch(self.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "rank": self.rank,
            "n_rows": self.n_rows,
            "batch_size": self.batch_size,
            "steps_per_epoch": self.steps_per_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at (epoch, position). The stream depends on seed, rank, shard size, batch
        size and steps, so a checkpoint from a different layout is refused."""
        for key in ("seed", "rank", "n_rows", "batch_size", "steps_per_epoch"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state is for {key}={state[key]}, this sampler has"
                    f" {getattr(self, key)}: cannot resume the same index stream"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class UnionSampler(EpochSampler):
    """In one process, the batches that W ranks with shards of `shard_sizes` rows draw together.

    Rows are the W shards laid end to end in rank order; batch k is the concatenation, in
    rank order, of batch k of each rank's `EpochSampler(shard_sizes[r], batch_size, ...,
    rank=r)`, so it holds W·batch_size rows. DDP averages the ranks' mean gradients, which
    equals the mean gradient over this union when the ranks' batches are equally large (as
    they always are here): a single process training on these batches is the reference a
    W-rank job must match (see `reagent_lite.training.verify`).
    """

    def __init__(
        self,
        shard_sizes: Sequence[int],
        batch_size: int,
        steps_per_epoch: int,
        seed: int,
        device: torch.device | str | None = None,
    ) -> None:
        self.shards = [
            EpochSampler(n, batch_size, steps_per_epoch, seed, rank)
            for rank, n in enumerate(shard_sizes)
        ]
        super().__init__(
            sum(shard_sizes), batch_size * len(shard_sizes), steps_per_epoch, seed, 0, device
        )
        self.offsets = np.cumsum([0, *shard_sizes[:-1]]).tolist()

    def epoch_indices(self, epoch: int) -> torch.Tensor:
        parts = [
            (s.epoch_indices(epoch) + offset).view(self.steps_per_epoch, -1)
            for s, offset in zip(self.shards, self.offsets, strict=True)
        ]
        return torch.cat(parts, dim=1).reshape(-1).to(self.device)
