"""`Rows`: the one container of training rows — a flat bag of equally long tensors.

Everything that holds rows is a `Rows`: a kind's training shard (`Kind.training_tensors`),
the eval table and the divergence probe, a streamed chunk (`training/prefetch.py`), the
static buffers a CUDA graph reads, a step's micro-batches and the rows a compiled loss
gathers. Trainers, kinds and the CPE models read columns as attributes (`rows.state`,
`rows.reward`): a `Rows` satisfies the trainers' batch protocols (`TransitionBatch`,
`DiscreteBatch`, `ParametricBatch`) whatever its kind; which columns exist is the kind's.

Two variants remain, each for a reason a plain `Rows` cannot serve:

* `LazyBatch` (a micro-batch view): rows `idx` of another `Rows`, each column gathered on
  its first read. A step reads a handful of columns (the CPE-only ones only with CPE on,
  the CQL mask only with CQL): gathering the rest would cost the bandwidth for nothing.
  With the shard's `RowPack` the first packed column read gathers all packed ones at once.
* `training.sources.StaticRows` (a graph's feed): columns at fixed device addresses plus
  a device index table and counter, so that every replay of one captured graph reads the
  next step's rows.

`Rows` reads its columns through a plain slot, not `object.__getattribute__`, so that
Dynamo traces a `Rows` built inside a compiled loss without a graph break
(`training/compiled.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
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


class Rows:
    """Columns of equal length, read as attributes or by name; `pack`: the `RowPack`
    the float columns are views of, if any (`packed`)."""

    __slots__ = ("_tensors", "pack")
    _tensors: dict[str, Tensor]
    pack: RowPack | None

    def __init__(self, tensors: Mapping[str, Tensor], pack: RowPack | None = None):
        lengths = {t.shape[0] for t in tensors.values()}
        if len(lengths) > 1:
            raise ValueError(
                f"tensors of unequal length: { {k: t.shape for k, t in tensors.items()} }"
            )
        self._tensors = dict(tensors)
        self.pack = pack

    def __getattr__(self, name: str) -> Tensor:
        # Only called when normal lookup fails: a column. A slot not yet set (copy and
        # pickle probe objects before `__init__`) must not recurse into `_tensors`.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._tensors[name]
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

    def values(self) -> Iterator[Tensor]:
        return (v for _, v in self.items())

    def select(self, names: Sequence[str]) -> Rows:
        """The columns in `names` (those that exist), not copied."""
        return Rows({k: v for k, v in self.items() if k in names})

    def without(self, names: Sequence[str]) -> Rows:
        """Every column but `names`, not copied."""
        return Rows({k: v for k, v in self.items() if k not in names})

    def index(self, idx: Tensor) -> Rows:
        return Rows({k: v.index_select(0, idx) for k, v in self.items()})

    def slice(self, start: int, stop: int) -> Rows:
        return Rows({k: v[start:stop] for k, v in self.items()})

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Rows:
        return Rows({k: v.to(device, non_blocking=non_blocking) for k, v in self.items()})

    def chunks(self, size: int) -> Iterator[Rows]:
        for start in range(0, len(self), size):
            yield self.slice(start, start + size)

    def nbytes(self) -> int:
        return sum(t.element_size() * t.nelement() for t in self.values())

    def packed(self, skip: Sequence[str] = (), *, consume: bool = False) -> Rows:
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
            self.pack = pack
            return self
        return Rows({k: views.get(k, v) for k, v in self._tensors.items()}, pack)


class LazyBatch(Rows):
    """Rows `idx` of `source`, each column gathered on its first read (module notes).

    `idx` is an index tensor or a slice (a streamed chunk is already in step order, so its
    batches are views). With `pack` (the shard's `RowPack`), the first packed column read
    gathers the rows of all of them at once and each is a view of those rows. Its
    `_tensors` are the source's columns; what it hands out are the batch's."""

    __slots__ = ("_cache", "_idx", "_rows")
    _cache: dict[str, Tensor]
    _idx: Tensor | slice
    _rows: Tensor | None

    def __init__(
        self, source: Rows | Mapping[str, Tensor], idx: Tensor | slice, pack: RowPack | None = None
    ):
        # The source's own dict, not a copy (nor a check: its columns were checked when it
        # was built): a micro-batch costs no more than its index.
        self._tensors = source._tensors if isinstance(source, Rows) else dict(source)
        self.pack = pack
        self._idx = idx
        self._cache = {}
        self._rows = None

    def __getattr__(self, name: str) -> Tensor:
        if name.startswith("_"):
            raise AttributeError(name)
        cache = self._cache
        found = cache.get(name)
        if found is None:
            source = self._tensors
            if name not in source:
                raise AttributeError(name)
            idx = self._idx
            pack = self.pack
            if pack is not None and name in pack.columns and not isinstance(idx, slice):
                rows = self._rows
                if rows is None:
                    rows = pack.matrix.index_select(0, idx)
                    self._rows = rows
                found = pack.view(rows, name)
            else:
                column = source[name]
                found = column[idx] if isinstance(idx, slice) else column.index_select(0, idx)
            cache[name] = found
        return found

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self.__getattr__(name)
        except AttributeError:
            raise KeyError(name) from None

    def __len__(self) -> int:
        idx = self._idx
        if isinstance(idx, slice):
            return len(range(*idx.indices(Rows.__len__(self))))
        return int(idx.numel())

    def items(self) -> Iterator[tuple[str, Tensor]]:
        """Every column's batch rows (each gathered, if not yet)."""
        return ((k, self.__getattr__(k)) for k in self._tensors)

    def packed(self, skip: Sequence[str] = (), *, consume: bool = False) -> Rows:
        return Rows(dict(self.items())).packed(skip)

    def parts(self) -> tuple[dict[str, Tensor], Tensor | None]:
        """(columns, row index) for code that gathers the rows itself (a compiled loss):
        with a slice, the columns are already the batch's rows (views) and the index None."""
        source = self._tensors
        idx = self._idx
        if isinstance(idx, slice):
            return {k: v[idx] for k, v in source.items()}, None
        return dict(source), idx
