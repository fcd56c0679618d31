"""The replica check and the world-size emulation switch (training/verify.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from reagent_lite.distributed import DistContext, launch, plan_launch
from reagent_lite.errors import ConfigError, DistributedError
from reagent_lite.training.verify import (
    EMULATE_ENV,
    VERIFY_ENV,
    check_replicas,
    emulated_world_size,
    replica_digest,
    verify_every,
)


def test_switches_are_off_by_default_and_validated() -> None:
    assert verify_every({}) == 0 and verify_every({VERIFY_ENV: ""}) == 0
    assert verify_every({VERIFY_ENV: "5"}) == 5
    assert emulated_world_size(1, {}) is None
    assert emulated_world_size(1, {EMULATE_ENV: "3"}) == 3
    with pytest.raises(ConfigError, match=VERIFY_ENV):
        verify_every({VERIFY_ENV: "often"})
    with pytest.raises(ConfigError, match="already has world size 2"):
        emulated_world_size(2, {EMULATE_ENV: "2"})


def test_digest_sees_every_bit() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    twin = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    twin.load_state_dict(net.state_dict())
    assert replica_digest(net) == replica_digest(twin)
    with torch.no_grad():
        twin[0].weight[0, 0] = torch.nextafter(twin[0].weight[0, 0], torch.tensor(1.0))
    assert replica_digest(net) != replica_digest(twin)
    assert replica_digest(net) != replica_digest(net, net)  # the target net counts too
    assert check_replicas(DistContext.single(), 7, "x") is None  # one rank: nothing to compare


def _worker(ctx: DistContext, out: str) -> None:
    net = nn.Linear(2, 2)
    with torch.no_grad():
        net.weight.fill_(1.0)
        net.bias.fill_(0.0)
    check_replicas(ctx, 1, replica_digest(net))  # identical: passes
    if ctx.rank == 1:
        with torch.no_grad():
            net.bias[0] += 1e-7
    try:
        check_replicas(ctx, 2, replica_digest(net))
    except DistributedError as exc:
        Path(out, f"rank{ctx.rank}.json").write_text(json.dumps(str(exc)))


def test_diverged_replicas_fail_on_every_rank(tmp_path: Path) -> None:
    plan = plan_launch(
        num_nodes=1,
        node_index=0,
        use_gpu=False,
        use_all_avail_gpus=False,
        init_method=(tmp_path / "rdzv").as_uri(),
        cpu_procs_per_node=2,
    )
    launch(plan, _worker, (str(tmp_path),), rendezvous_timeout_s=60, collective_timeout_s=60)
    messages = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for msg in messages:
        assert "replica check failed after optimizer step 2" in msg
        assert "rank 0: step 2" in msg and "rank 1: step 2" in msg
