"""The soft target update in both forms: the multi-tensor kernel (`torch._foreach_lerp_`,
what every step runs) and its plain path, a public `lerp_` per tensor (what
`benchmarks/speedups.py` times the step with beside it)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from reagent_lite.models import build_q_network
from reagent_lite.trainers.optim import SoftUpdate


def _pair(seed: int) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    online = build_q_network(
        in_dim=3, n_actions=2, layers=[-1, 8, 8, -1], activations=["relu", "relu", "linear"]
    )
    target = build_q_network(
        in_dim=3, n_actions=2, layers=[-1, 8, 8, -1], activations=["relu", "relu", "linear"]
    )
    return target, online


@pytest.mark.parametrize("multi_tensor", [True, False])
def test_each_form_moves_the_target_by_tau(multi_tensor: bool) -> None:
    target, online = _pair(0)
    before = [p.detach().clone() for p in target.parameters()]
    SoftUpdate(target, online, multi_tensor=multi_tensor)(0.25)
    for new, old, o in zip(target.parameters(), before, online.parameters(), strict=True):
        torch.testing.assert_close(new.detach(), old + 0.25 * (o.detach() - old))
        assert not torch.equal(new.detach(), old)  # every tensor moved, not only the first


def test_the_plain_path_gives_the_multi_tensor_bits() -> None:
    fused, online = _pair(1)
    plain, _ = _pair(1)
    for _ in range(3):
        SoftUpdate(fused, online)(0.1)
        SoftUpdate(plain, online, multi_tensor=False)(0.1)
    for a, b in zip(fused.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def _ops(update: SoftUpdate) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update(0.5)
    return {e.key for e in prof.key_averages() if "lerp" in e.key}


def test_each_form_runs_its_own_operator() -> None:
    target, online = _pair(2)
    # On a CPU the multi-tensor operator runs `lerp_` per tensor inside (its slow path):
    # what it saves there is the Python calls, one per tensor.
    assert "aten::_foreach_lerp_" in _ops(SoftUpdate(target, online))
    assert _ops(SoftUpdate(target, online, multi_tensor=False)) == {"aten::lerp_"}


def test_a_torch_without_the_multi_tensor_operator_takes_the_plain_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`torch_private.foreach_lerp_` falls back to the per-tensor loop where torch lacks
    `_foreach_lerp_` (a release that renames it): the same update, by `lerp_`."""
    target, online = _pair(3)
    before = [p.detach().clone() for p in target.parameters()]
    monkeypatch.delattr(torch, "_foreach_lerp_")
    update = SoftUpdate(target, online)
    assert _ops(update) == {"aten::lerp_"}  # τ = 0.5
    for new, old, o in zip(target.parameters(), before, online.parameters(), strict=True):
        torch.testing.assert_close(new.detach(), old + 0.5 * (o.detach() - old))
