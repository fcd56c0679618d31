"""EpochSampler: reproducible, rank-distinct, equal steps on uneven shards, resumable."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from reagent_lite.data.readers import read_shard, shard_plan
from reagent_lite.data.sampler import EpochSampler, UnionSampler, steps_for


def _epoch(s: EpochSampler) -> list[torch.Tensor]:
    return list(s)


def test_steps_for() -> None:
    assert steps_for([333, 334, 334], 64) == 6
    assert steps_for([100], 100) == 1 and steps_for([101], 100) == 2
    assert steps_for([0, 0], 8) == 1
    with pytest.raises(ValueError):
        steps_for([10], 0)


def test_one_epoch_is_a_permutation() -> None:
    s = EpochSampler(n_rows=100, batch_size=10, steps_per_epoch=10, seed=3, rank=0)
    batches = _epoch(s)
    assert len(batches) == len(s) == 10
    assert all(b.dtype == torch.int64 and b.shape == (10,) for b in batches)
    assert sorted(torch.cat(batches).tolist()) == list(range(100))
    assert s.epoch == 1 and s.position == 0
    assert torch.cat(_epoch(s)).tolist() != torch.cat(batches).tolist()  # new epoch, new order


def test_reproducible_and_rank_distinct() -> None:
    a = torch.cat(_epoch(EpochSampler(50, 5, 10, seed=1, rank=0)))
    b = torch.cat(_epoch(EpochSampler(50, 5, 10, seed=1, rank=0)))
    c = torch.cat(_epoch(EpochSampler(50, 5, 10, seed=1, rank=1)))
    d = torch.cat(_epoch(EpochSampler(50, 5, 10, seed=2, rank=0)))
    assert torch.equal(a, b)
    assert not torch.equal(a, c) and not torch.equal(a, d)


def test_short_shard_wraps_with_full_batches() -> None:
    s = EpochSampler(n_rows=7, batch_size=4, steps_per_epoch=5, seed=0)
    batches = _epoch(s)
    assert len(batches) == 5 and all(len(b) == 4 for b in batches)
    flat = torch.cat(batches).tolist()
    assert set(flat) == set(range(7))
    assert sorted(flat[:7]) == list(range(7)) and sorted(flat[7:14]) == list(range(7))


def test_equal_steps_on_uneven_shards(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": list(range(1001))}), path)
    sizes = [s.num_rows or 0 for s in shard_plan(path, 3)]
    assert sizes == [333, 334, 334]
    steps = steps_for(sizes, 64)
    counts = []
    for rank in range(3):
        n = read_shard(path, rank, 3).num_rows
        sampler = EpochSampler(n, 64, steps, seed=0, rank=rank)
        batches = _epoch(sampler)
        counts.append(len(batches))
        assert all(int(b.max()) < n for b in batches)
    assert counts == [6, 6, 6]


def test_resume_mid_epoch_continues_the_stream() -> None:
    ref = EpochSampler(30, 4, 8, seed=5, rank=2)
    full = _epoch(ref) + _epoch(ref)
    s = EpochSampler(30, 4, 8, seed=5, rank=2)
    first = _epoch(s)
    it = iter(s)
    head = [next(it) for _ in range(3)]
    state = s.state_dict()
    assert state["epoch"] == 1 and state["position"] == 3
    resumed = EpochSampler(30, 4, 8, seed=5, rank=2)
    resumed.load_state_dict(state)
    rest = _epoch(resumed)
    got = first + head + rest
    assert len(got) == 16
    assert all(torch.equal(x, y) for x, y in zip(got, full, strict=True))
    assert resumed.epoch == 2


def test_resume_after_last_batch_moves_to_next_epoch() -> None:
    s = EpochSampler(20, 5, 4, seed=0)
    it = iter(s)
    for _ in range(4):
        next(it)  # the loop checkpoints after the last batch, before the generator ends
    state = s.state_dict()
    r = EpochSampler(20, 5, 4, seed=0)
    r.load_state_dict(state)
    assert torch.equal(
        torch.cat(_epoch(r)), torch.cat(EpochSampler(20, 5, 4, 0).epoch_indices(1).split(5))
    )


def test_load_state_dict_refuses_another_layout() -> None:
    state = EpochSampler(20, 5, 4, seed=0).state_dict()
    with pytest.raises(ValueError, match="n_rows"):
        EpochSampler(21, 5, 4, seed=0).load_state_dict(state)


def test_device_and_bad_arguments() -> None:
    s = EpochSampler(10, 3, 2, seed=0, device="cpu")
    assert all(b.device.type == "cpu" for b in s)
    with pytest.raises(ValueError, match="empty shard"):
        EpochSampler(0, 3, 2, seed=0)


def test_union_sampler_draws_what_the_ranks_draw_together() -> None:
    sizes, batch, steps = [333, 334, 334], 16, 25  # wraps around every shard
    union = UnionSampler(sizes, batch, steps, seed=5)
    ranks = [EpochSampler(n, batch, steps, seed=5, rank=r) for r, n in enumerate(sizes)]
    offsets = [0, 333, 667]
    for epoch in (0, 3):
        union.set_epoch(epoch)
        for s in ranks:
            s.set_epoch(epoch)
        got = list(union)
        want = [
            torch.cat([b + off for b, off in zip(per_rank, offsets, strict=True)])
            for per_rank in zip(*(list(s) for s in ranks), strict=True)
        ]
        assert len(got) == steps and all(len(b) == 3 * batch for b in got)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_same_stream_as_cpu() -> None:
    cpu = torch.cat(_epoch(EpochSampler(100, 8, 5, seed=9)))
    gpu = torch.cat(_epoch(EpochSampler(100, 8, 5, seed=9, device="cuda")))
    assert gpu.device.type == "cuda" and torch.equal(cpu, gpu.cpu())
