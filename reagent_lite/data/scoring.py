"""What scoring a table with an exported model reads, and how it feeds the model.

The columns a served model reads obey the training rules (a NaN feature would become a
silent NaN score): the state, and for a model that ranks candidates the candidates. A kind
names the fields it reads (`Kind.scoring_fields`); `predict.py` checks them and the kind
scores (`Kind.score_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import torch

from reagent_lite.data.arrow import is_dense, is_feature_map, is_list
from reagent_lite.data.checks import candidate_problems, feature_problems
from reagent_lite.data.schema import STATE_COLUMNS, Column, Field, list_of


def _json_empty(t: pa.DataType) -> bool:
    """A JSON Lines column of nulls, or of empty lists, throughout: nothing to read."""
    return bool(pa.types.is_null(t) or (is_list(t) and pa.types.is_null(t.value_type)))


# What scoring reads, under the training rules of those columns (a NaN would become a silent
# NaN score): the state, and for a parametric model the candidates to rank.
STATE = Field(
    (
        Column(STATE_COLUMNS[0], lambda t: is_feature_map(t) or _json_empty(t),
               "a map of feature id → number"),
        Column(STATE_COLUMNS[1], lambda t: is_dense(t) or _json_empty(t),
               "a list of numbers (dense features)"),
    ),
    (feature_problems,),
)  # fmt: skip
CANDIDATES = Field(
    (
        Column("possible_actions", lambda t: list_of(is_feature_map)(t) or _json_empty(t),
               "a list of candidate maps (feature id → number)"),
    ),
    (candidate_problems,),
)  # fmt: skip


def values_and_presence(values: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN-coded raw values as the serving inputs: (values, 0 where absent; presence)."""
    presence = ~np.isnan(values)
    return torch.from_numpy(np.where(presence, values, np.float32(0))), torch.from_numpy(
        presence.astype(np.float32)
    )


def run_batched(
    program: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], batch_size: int
) -> list[torch.Tensor]:
    """`program` over `inputs` in row batches of `batch_size` (outputs in row order)."""
    n = len(inputs[0])
    return [program(*(x[s : s + batch_size] for x in inputs)) for s in range(0, n, batch_size)]
