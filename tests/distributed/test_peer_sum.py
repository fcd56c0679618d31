"""When the captured step may sum gradients with one NVLink kernel instead of NCCL."""

from __future__ import annotations

import pytest
import torch

from reagent_lite.distributed.peer_sum import MAX_BYTES, P2P_ENV, peer_sum_blocker
from reagent_lite.torch_private import has_one_shot_sum

CUDA = torch.device("cuda", 0)


def _blocker(**overrides: object) -> str:
    args: dict = dict(
        backend="nccl", device=CUDA, world_size=4, procs_per_node=4, nbytes=270_000, env={}
    )
    args.update(overrides)
    return peer_sum_blocker(**args)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"env": {P2P_ENV: "0"}}, f"{P2P_ENV}=0"),
        ({"world_size": 1, "procs_per_node": 1}, "one rank"),
        ({"backend": "gloo", "device": torch.device("cpu")}, "backend gloo on cpu"),
        ({"world_size": 8, "procs_per_node": 4}, "8 ranks over 2 nodes"),
        ({"nbytes": MAX_BYTES + 4}, "MiB of gradients"),
    ],
)
def test_what_keeps_the_gradient_sum_on_nccl(overrides: dict, reason: str) -> None:
    assert reason in _blocker(**overrides)


def test_one_host_of_nccl_ranks_may_use_the_nvlink_sum() -> None:
    """Nothing blocks it but, on a torch without the operator, the operator."""
    why = _blocker(env={P2P_ENV: "1"})
    if has_one_shot_sum():
        assert why == ""
    else:
        assert "no one-shot symmetric-memory all-reduce" in why
