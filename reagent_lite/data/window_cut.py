"""A disk stream's loaded window and how it is cut into chunks of whole steps
(`data/disk_stream.py`): rows that do not fill a step at the end of a window are carried
into the next one, as a copy (not a view that would keep the whole window alive)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from reagent_lite.data.windows import one_omp_thread, settled


@dataclass
class Left:
    """What an epoch still needs: `rows`, and the rows carried from the last window (less
    than one step) that the next chunk starts with."""

    rows: int
    carry: dict[str, Tensor] | None = None

    @property
    def carried(self) -> int:
        return 0 if self.carry is None else int(next(iter(self.carry.values())).shape[0])


@dataclass
class Window:
    columns: dict[str, Tensor]  # its rows, already in their shuffled order
    serial: bool = True  # its concatenations on one OpenMP thread (`one_omp_thread`)
    stream: torch.cuda.Stream | None = None  # on a GPU, the stream its copies run on

    @property
    def num_rows(self) -> int:
        return int(next(iter(self.columns.values())).shape[0]) if self.columns else 0

    def rows(self, lo: int, hi: int | None = None) -> dict[str, Tensor]:
        """Its rows lo..hi: views, no copy (the window is never written after loading)."""
        return {k: v[lo:hi] for k, v in self.columns.items()}

    def cut(
        self, left: Left, step: int, chunk_rows: int
    ) -> Iterator[tuple[dict[str, Tensor], int]]:
        """Its rows as chunks of whole steps (at most `chunk_rows`, and no more than the
        epoch still needs): the rows carried from the last window first, topped up to a
        step; rows short of a step at the end are carried into the next window."""
        n, pos = self.num_rows, 0
        if left.carry is not None:
            have = left.carried
            take = min(step - have, n)
            left.carry = self._joined(left.carry, self.rows(0, take))
            pos = take
            if have + take == step:
                chunk, left.carry = left.carry, None
                left.rows -= step
                yield chunk, step
        while left.rows > 0 and n - pos >= step:
            rows = min(chunk_rows, (n - pos) // step * step, left.rows)
            left.rows -= rows
            yield self.rows(pos, pos + rows), rows
            pos += rows
        if left.rows > 0 and pos < n:
            with settled(self._device(), self.stream):
                rest = {k: v.clone() for k, v in self.rows(pos).items()}  # not the whole window
            left.carry = rest if left.carry is None else self._joined(left.carry, rest)

    def _device(self) -> torch.device:
        return next(iter(self.columns.values())).device

    def _joined(self, a: dict[str, Tensor], b: dict[str, Tensor]) -> dict[str, Tensor]:
        """a's rows, then b's: on one OpenMP thread where serial; on a GPU on the window's
        stream, waited for (`settled`), so that the result is ready for any stream."""
        with one_omp_thread(self.serial), settled(self._device(), self.stream):
            return {c: torch.cat([a[c], b[c]]) for c in a}
