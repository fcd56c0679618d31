"""One optimizer step of one model over a step's micro-batches: the code path the Q-trainer
and the CPE side models both take (`training/update.py` builds one of each from the step
plan). No maths of any algorithm and no choice of the plan here: the loss function, the
module forwarded through, the gradient reduction and the update are given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

import torch
from torch import Tensor, nn

from reagent_lite.trainers.optim import BackwardSeed


class StepLoss(Protocol):
    """What a loss function returns: `total` carries the gradient; `detach()` is the record
    kept once the backward has run."""

    @property
    def total(self) -> Tensor: ...

    def detach(self) -> Self: ...


class Reduction(Protocol):
    """A step's own gradient reduction (`DistContext.gradient_average`): called once the
    micro-batches' gradients are accumulated; `loss_scale` is what the backward's seed
    must carry for it (the 1/world size of an average whose all-reduce only sums)."""

    @property
    def loss_scale(self) -> float: ...

    def __call__(self) -> None: ...


@dataclass(frozen=True)
class PlainLoss:
    """A loss that is one tensor (the CPE side models')."""

    total: Tensor

    def detach(self) -> PlainLoss:
        return PlainLoss(self.total.detach())


BatchT = TypeVar("BatchT")
LossT = TypeVar("LossT", bound=StepLoss)


class GradientStep(Generic[BatchT, LossT]):
    """`step(batches)`: gradients set to none, then for each micro-batch the loss through
    `net` and its backward seeded with `reduce.loss_scale` / n (`BackwardSeed`:
    equal-sized micro-batches accumulate to the gradient of their union; the scale is the
    1/world size of an average whose all-reduce only sums), then `reduce()` (the step's own
    gradient average), clipping to `clip`, and `apply()` (optimizer step and soft target update).
    Returns the detached records, one per micro-batch.

    Under a DDP wrapper (`net` has `no_sync`, no `reduce`) the wrapper's hooks all-reduce
    during the last micro-batch's backward only, and divide by the world size themselves
    (the seed then carries only 1/n)."""

    def __init__(
        self,
        *,
        loss: Callable[[BatchT, nn.Module], LossT],
        net: nn.Module,
        params: Sequence[Tensor],
        apply: Callable[[], None],
        reduce: Reduction | None = None,
        clip: float | None = None,
    ) -> None:
        self.loss, self.net, self.apply = loss, net, apply
        self.params = list(params)
        # Only the step's own reduction scales: through a DDP wrapper its hooks divide.
        self.reduce, self.clip = reduce, clip
        self.scale = 1.0 if reduce is None else reduce.loss_scale
        self._no_sync: Callable[[], contextlib.AbstractContextManager[None]] | None = (
            getattr(net, "no_sync", None) if reduce is None else None
        )
        self._seed = BackwardSeed()

    def __call__(self, batches: Sequence[BatchT]) -> list[LossT]:
        n = len(batches)
        if n == 0:
            raise ValueError("a gradient step needs at least one micro-batch")
        for p in self.params:  # = optimizer.zero_grad(set_to_none=True), minus its wrapper
            p.grad = None
        records = []
        for i, batch in enumerate(batches):
            last = i == n - 1
            ctx = self._no_sync() if self._no_sync is not None and not last else _NULL
            with ctx:
                record = self.loss(batch, self.net)
                record.total.backward(self._seed(record.total, self.scale / n))
            records.append(record.detach())
        if self.reduce is not None:
            self.reduce()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.apply()
        return records


_NULL = contextlib.nullcontext()
