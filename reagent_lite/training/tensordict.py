"""A flat bag of equally long tensors: the training shard and its minibatches.

Trainers read fields as attributes (`batch.state`, `batch.reward`), so the same object
serves both workflows; what differs is only which fields exist.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor


class TensorDict:
    __slots__ = ("_tensors",)
    _tensors: dict[str, Tensor]

    def __init__(self, tensors: dict[str, Tensor]):
        lengths = {t.shape[0] for t in tensors.values()}
        if len(lengths) > 1:
            raise ValueError(
                f"tensors of unequal length: { {k: t.shape for k, t in tensors.items()} }"
            )
        object.__setattr__(self, "_tensors", dict(tensors))

    def __getattr__(self, name: str) -> Tensor:
        try:
            return object.__getattribute__(self, "_tensors")[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Tensor:
        return self._tensors[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return next(iter(self._tensors.values())).shape[0] if self._tensors else 0

    def keys(self) -> Iterator[str]:
        return iter(self._tensors)

    def items(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self._tensors.items())

    def index(self, idx: Tensor) -> TensorDict:
        return TensorDict({k: v.index_select(0, idx) for k, v in self._tensors.items()})

    def slice(self, start: int, stop: int) -> TensorDict:
        return TensorDict({k: v[start:stop] for k, v in self._tensors.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TensorDict:
        return TensorDict(
            {k: v.to(device, non_blocking=non_blocking) for k, v in self._tensors.items()}
        )

    def chunks(self, size: int) -> Iterator[TensorDict]:
        for start in range(0, len(self), size):
            yield self.slice(start, start + size)

    def nbytes(self) -> int:
        return sum(t.element_size() * t.nelement() for t in self._tensors.values())
