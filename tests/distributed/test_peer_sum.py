"""When the captured step may sum gradients with one NVLink kernel instead of NCCL."""

from __future__ import annotations

import pytest
import torch

from reagent_lite.distributed.peer_sum import KEY, MAX_BYTES, peer_sum_blocker
from reagent_lite.torch_private import has_one_shot_sum

CUDA = torch.device("cuda", 0)


def _blocker(**overrides: object) -> str:
    args: dict = dict(
        backend="nccl", device=CUDA, world_size=4, procs_per_node=4, nbytes=270_000, mode="auto"
    )
    args.update(overrides)
    return peer_sum_blocker(**args)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"mode": "off"}, f"{KEY} is off"),
        ({"world_size": 1, "procs_per_node": 1}, "one rank"),
        ({"backend": "gloo", "device": torch.device("cpu")}, "backend gloo on cpu"),
        ({"world_size": 8, "procs_per_node": 4}, "8 ranks over 2 nodes"),
        ({"nbytes": MAX_BYTES + 4}, "MiB of gradients"),
        ({"dtype": torch.float64}, "torch.float64 gradients"),
    ],
)
def test_what_keeps_the_gradient_sum_on_nccl(overrides: dict, reason: str) -> None:
    assert reason in _blocker(**overrides)


def test_every_local_gpu_must_be_visible_and_a_peer() -> None:
    """Past the job's shape, the operator and then peer access between the node's GPUs."""
    why = _blocker(mode="on", nbytes=MAX_BYTES + 4)  # `on`: past the size where it pays
    visible = torch.cuda.device_count()
    if not has_one_shot_sum():
        assert "no one-shot symmetric-memory all-reduce" in why
    elif visible < 4:
        assert why == f"this process sees {visible} of the node's 4 GPUs"
    else:  # a 4-GPU machine: no reason, or the pair without peer access
        assert why == "" or "has no peer access to" in why


# What each stage does on rank 1 in the agreement test below (rank 0 always succeeds).
_SCENARIOS = {
    "all succeed": {},
    "rank 1 is switched off": {"blocker": "switched off"},
    "allocation fails on rank 1": {"alloc": RuntimeError("out of memory")},
    "rendezvous fails on rank 1": {"rendezvous": RuntimeError("cannot map the peer")},
    "wrong test sum on rank 1": {"verify": False},
    "test sum raises on rank 1": {"verify": RuntimeError("no kernel image")},
}


def _agree_worker(rank: int, init: str, out: str) -> None:
    """Two gloo ranks through `agree_on_peer_sum`, its GPU-only parts replaced by stand-ins
    that fail on rank 1 as each scenario says (symmetric memory needs CUDA peers)."""
    import torch.distributed as dist

    from reagent_lite.distributed import peer_sum

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    from tests.conftest import cpu_rank

    ctx = cpu_rank(rank)
    results = {}
    try:
        for name, fails in _SCENARIOS.items():
            mine = fails if rank == 1 else {}

            def stage(key: str, ok: object, mine: dict = mine) -> object:
                got = mine.get(key, ok)
                if isinstance(got, Exception):
                    raise got
                return got

            peer_sum.peer_sum_blocker = lambda **_: stage("blocker", "")  # type: ignore[assignment]
            peer_sum.symmetric_empty = lambda n, dt, dev: stage("alloc", torch.zeros(n, dtype=dt))  # type: ignore[assignment]
            peer_sum.symmetric_rendezvous = lambda buf: stage("rendezvous", None)  # type: ignore[assignment]
            peer_sum.PeerSum.verify = lambda self, r, w: stage("verify", True)  # type: ignore[method-assign]
            got, _ = peer_sum.agree_on_peer_sum(ctx, 10, torch.float32, "auto")
            results[name] = got is not None
        torch.save(results, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_every_rank_takes_the_same_route_whichever_stage_fails(tmp_path) -> None:
    """A failure at any stage on one rank takes every rank back to NCCL, without leaving a
    peer inside a collective (the test would hang, then fail on its timeout)."""
    import torch.multiprocessing as mp

    init = (tmp_path / "store").as_uri()
    ctx = mp.start_processes(
        _agree_worker, args=(init, str(tmp_path)), nprocs=2, start_method="spawn", join=False
    )
    assert ctx.join(timeout=120) or ctx.join(timeout=60)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0] == ranks[1]
    assert ranks[0] == {name: not fails for name, fails in _SCENARIOS.items()}
