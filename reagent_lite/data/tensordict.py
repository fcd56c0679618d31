"""The old names of `data.rows`: `TensorDict` is `Rows` (the same class, not a second
container), kept while modules that import it are edited in parallel."""

from __future__ import annotations

from reagent_lite.data.rows import RowPack as RowPack
from reagent_lite.data.rows import Rows as Rows
from reagent_lite.data.rows import Rows as TensorDict

__all__ = ["RowPack", "Rows", "TensorDict"]
