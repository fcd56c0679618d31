from __future__ import annotations

import dataclasses

import pytest
import torch

from reagent_lite.distributed import DistContext


def test_single_context_collectives_are_noops() -> None:
    ctx = DistContext.single("cpu")
    assert ctx.is_rank_zero and ctx.world_size == 1 and ctx.backend == "gloo"
    t = torch.tensor([2.0, 4.0])
    assert ctx.all_reduce_sum(t) is t and t.tolist() == [2.0, 4.0]
    assert ctx.all_reduce_mean(t) is t and t.tolist() == [2.0, 4.0]
    assert ctx.broadcast_object({"a": 1}) == {"a": 1}
    assert ctx.all_gather_object(7) == [7]
    ctx.barrier()


def test_context_is_frozen() -> None:
    ctx = DistContext.single()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.rank = 1  # type: ignore[misc]
