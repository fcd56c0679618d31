from __future__ import annotations

import dataclasses
from pathlib import Path

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


def test_single_context_step_collectives_are_noops() -> None:
    ctx = DistContext.single("cpu")
    assert ctx.all_agree(True) is True and ctx.all_agree(False) is False
    ctx.heartbeat()
    net = torch.nn.Linear(3, 2)
    net(torch.ones(4, 3)).sum().backward()
    grads = [p.grad.clone() for p in net.parameters() if p.grad is not None]
    ctx.gradient_average(net.parameters())()  # an average over one rank
    for p, g in zip(net.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)


def _agree_worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        from tests.conftest import cpu_rank

        ctx = cpu_rank(rank)
        agreed = [ctx.all_agree(True), ctx.all_agree(rank == 0), ctx.all_agree(False)]
        ctx.heartbeat()
        t = torch.full((3,), float(rank + 1), requires_grad=True)
        u = torch.zeros(2, requires_grad=True)
        t.grad = torch.full((3,), float(rank + 1))
        u.grad = torch.full((2,), 10.0 * (rank + 1))
        average = ctx.gradient_average([t, u])
        average()
        # The averaged values are the gradients (views of one buffer), not copies.
        shared = t.grad.untyped_storage().data_ptr() == u.grad.untyped_storage().data_ptr()
        # A parameter that is not contiguous keeps a gradient of its own layout (copied).
        w = torch.zeros(3, 2).t().detach().requires_grad_(True)
        w.grad = torch.full((3, 2), float(rank + 1)).t()
        ctx.gradient_average([t, w])()
        kept = w.grad.stride() == w.stride() and w.grad.eq(1.5).all().item()
        averaged = t.grad
        # With the 1/world size left to the backward, the buffer is summed, not divided.
        t.grad = torch.full((3,), float(rank + 1))
        summed = ctx.gradient_average([t], scaled_backward=True)
        summed()
        sums = (summed.loss_scale, t.grad.clone())
        torch.save(
            (agreed, averaged, u.grad, shared, average.describe(), kept, sums),
            f"{out}/rank{rank}.pt",
        )
        dist.barrier()  # both done before either tears the gloo group down
    finally:
        dist.destroy_process_group()


def test_step_collectives_over_gloo(tmp_path: Path) -> None:
    """`all_agree` is true only when every rank says so; `gradient_average` averages."""
    import torch.multiprocessing as mp

    init = (tmp_path / "store").as_uri()
    mp.start_processes(_agree_worker, args=(init, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        saved = torch.load(tmp_path / f"rank{rank}.pt")
        agreed, grad, grad_u, shared, how, kept, sums = saved
        assert kept
        assert sums[0] == 0.5 and sums[1].tolist() == [3.0, 3.0, 3.0]
        assert agreed == [True, False, False]
        assert grad.tolist() == [1.5, 1.5, 1.5]
        assert grad_u.tolist() == [15.0, 15.0]
        assert shared
        assert how == "gloo all-reduce"  # the process group's all-reduce
