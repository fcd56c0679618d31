"""`data/rows.py`: the one row container (`Rows`), its packing (`RowPack`), its lazy
micro-batch view (`LazyBatch`), and every row holder of the training step being a `Rows`."""

from __future__ import annotations

import copy

import pytest
import torch

from reagent_lite.data.rows import LazyBatch, Rows


def shard(n: int = 50) -> Rows:
    g = torch.Generator().manual_seed(0)
    return Rows(
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
    data = Rows({"reward": torch.randn(5), "action": torch.zeros(5, dtype=torch.int64)})
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


def _traced_loss(columns: dict[str, torch.Tensor], idx: torch.Tensor) -> torch.Tensor:
    # What `training/compiled.py` traces: the micro-batch's rows gathered into a `Rows`,
    # read by attribute as the trainers read them.
    rows = Rows({k: v.index_select(0, idx) for k, v in columns.items()})
    return (rows.state * rows.reward.unsqueeze(1)).sum() + rows.mask.mean()


def test_a_rows_built_inside_a_compiled_function_traces_without_a_graph_break() -> None:
    data = shard()
    columns = dict(data.items())
    idx = torch.tensor([1, 4, 9])
    explained = torch._dynamo.explain(_traced_loss)(columns, idx)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    assert not explained.break_reasons, explained.break_reasons
    assert torch.equal(_traced_loss(columns, idx), _traced_loss(columns, idx))


def test_a_lazy_batch_is_rows_its_eager_copy_would_be() -> None:
    data = shard().packed(skip=["propensity"])
    idx = torch.tensor([7, 3, 3, 49, 0])
    for view, want in (
        (LazyBatch(data, idx, data.pack), data.index(idx)),
        (LazyBatch(data, slice(45, 60)), data.slice(45, 60)),  # a slice past the end
    ):
        assert isinstance(view, Rows) and len(view) == len(want)
        assert list(view.keys()) == list(want.keys()) and "state" in view
        for name, column in view.items():
            assert torch.equal(column, want[name]), name
        assert torch.equal(view.index(torch.tensor([1])).reward, want.reward[1:2])
        assert view.nbytes() == want.nbytes()
    with pytest.raises(AttributeError):
        LazyBatch(data, idx).next_state  # noqa: B018  a column the rows do not have
    with pytest.raises(KeyError):
        LazyBatch(data, idx)["next_state"]


def test_unequal_columns_and_private_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unequal length"):
        Rows({"reward": torch.zeros(3), "state": torch.zeros(4, 2)})
    rows = Rows({"reward": torch.zeros(3)})
    with pytest.raises(AttributeError):
        rows._missing  # noqa: B018  never looked up among the columns
    assert copy.copy(rows).reward is rows.reward and len(Rows({})) == 0
    assert list(shard().without(["propensity", "mdp_id"]).keys()) == [
        "state", "action", "reward", "mask", "candidates"
    ]  # fmt: skip
