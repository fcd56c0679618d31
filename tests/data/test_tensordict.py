"""`TensorDict.packed` / `RowPack` and the packed gathers of `LazyBatch`."""

from __future__ import annotations

import torch

from reagent_lite.data.tensordict import TensorDict
from reagent_lite.training.sources import LazyBatch


def shard(n: int = 50) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    return TensorDict(
        {
            "state": torch.randn(n, 4, generator=g),
            "action": torch.randint(0, 3, (n,), generator=g),
            "reward": torch.randn(n, generator=g),
            "mask": (torch.rand(n, 3, generator=g) > 0.5).float(),
            "propensity": torch.rand(n, generator=g),
            "candidates": torch.randn(n, 2, 5, generator=g),
        }
    )


def test_packed_columns_are_views_of_one_matrix_with_the_same_values() -> None:
    data = shard()
    packed = data.packed(skip=["propensity"])
    assert packed.pack is not None and data.pack is None
    assert set(packed.pack.columns) == {"state", "reward", "mask"}
    assert packed.pack.matrix.shape == (50, 4 + 1 + 3)
    for name, _ in data.items():
        assert torch.equal(packed[name], data[name]), name
        shares = packed[name].untyped_storage().data_ptr() == packed.pack.matrix.data_ptr()
        assert shares == (name in packed.pack.columns), name
    assert packed.nbytes() == data.nbytes()
    # Its copies (to a device, slices) are plain again.
    assert packed.to("cpu").pack is None and packed.slice(0, 5).pack is None


def test_packing_needs_two_columns() -> None:
    data = TensorDict({"reward": torch.randn(5), "action": torch.zeros(5, dtype=torch.int64)})
    assert data.packed() is data


def test_lazy_batch_gathers_all_packed_columns_at_once() -> None:
    data = shard()
    packed = data.packed(skip=["propensity"])
    idx = torch.tensor([7, 3, 3, 49, 0])
    batch = LazyBatch(dict(packed.items()), idx, packed.pack)
    for name in ("state", "reward", "mask", "action", "propensity", "candidates"):
        assert torch.equal(getattr(batch, name), data[name][idx]), name
    assert batch._rows is not None and batch._rows.shape == (5, 8)
    assert batch.state.untyped_storage().data_ptr() == batch._rows.data_ptr()
    sliced = LazyBatch(dict(packed.items()), slice(2, 6), packed.pack)
    assert torch.equal(sliced.reward, data.reward[2:6]) and sliced._rows is None


def test_consuming_pack_switches_this_object_column_by_column() -> None:
    data = shard()
    expect = {k: v.clone() for k, v in data.items()}
    state_before = data.state
    packed = data.packed(skip=["propensity"], consume=True)
    assert packed is data and data.pack is not None
    assert data.state.untyped_storage().data_ptr() == data.pack.matrix.data_ptr()
    assert data.state is not state_before  # the original is no longer held here
    for name, value in expect.items():
        assert torch.equal(data[name], value), name
