"""A flat bag of equally long tensors: the training shard and its minibatches.

Trainers read fields as attributes (`batch.state`, `batch.reward`), so the same object
serves both workflows; what differs is only which fields exist.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class RowPack:
    """Float32 columns stored side by side in one row-major matrix [N, F]: the rows of a
    minibatch of all of them are one gather of adjacent bytes (on a CPU, one cache miss
    per row instead of one per row and column). `columns`: name → (first, end, 1-D)."""

    matrix: Tensor
    columns: dict[str, tuple[int, int, bool]]

    def view(self, rows: Tensor, name: str) -> Tensor:
        """Column `name` of `rows` (rows gathered from `matrix`), as a view."""
        first, end, flat = self.columns[name]
        return rows[:, first] if flat else rows[:, first:end]


class TensorDict:
    __slots__ = ("_tensors", "pack")
    _tensors: dict[str, Tensor]
    pack: RowPack | None

    def __init__(self, tensors: dict[str, Tensor], pack: RowPack | None = None):
        lengths = {t.shape[0] for t in tensors.values()}
        if len(lengths) > 1:
            raise ValueError(
                f"tensors of unequal length: { {k: t.shape for k, t in tensors.items()} }"
            )
        object.__setattr__(self, "_tensors", dict(tensors))
        object.__setattr__(self, "pack", pack)

    def packed(self, skip: Sequence[str] = (), *, consume: bool = False) -> TensorDict:
        """The same columns with every float32 1-D / 2-D one not in `skip` a view of one
        `RowPack` matrix (the rest as they are): a new object, or with `consume` this one,
        switched column by column so that each original can be freed as soon as it is
        copied (peak memory then grows by about one column, not by all of them)."""
        names = [
            k
            for k, v in self._tensors.items()
            if k not in skip and v.dtype == torch.float32 and v.dim() in (1, 2)
        ]
        if len(names) < 2:
            return self
        layout: dict[str, tuple[int, int, bool]] = {}
        start = 0
        for name in names:
            column = self._tensors[name]
            width = 1 if column.dim() == 1 else column.shape[1]
            layout[name] = (start, start + width, column.dim() == 1)
            start += width
        # Pages are committed as columns are copied in, not here.
        matrix = torch.empty(
            len(self), start, dtype=torch.float32, device=self._tensors[names[0]].device
        )
        pack = RowPack(matrix, layout)
        views: dict[str, Tensor] = {}
        for name, (begin, end, flat) in layout.items():
            column = self._tensors[name]
            matrix[:, begin:end].copy_(column.unsqueeze(1) if flat else column)
            views[name] = pack.view(matrix, name)
            if consume:
                self._tensors[name] = views[name]
        if consume:
            object.__setattr__(self, "pack", pack)
            return self
        return TensorDict({k: views.get(k, v) for k, v in self._tensors.items()}, pack)

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
