"""The CPE side models' CPU step without autograd (`CpeModelTrainer._fused_backward`)
against the autograd path, and where it steps aside."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from reagent_lite.data.tensordict import TensorDict
from reagent_lite.evaluation import cpe_models
from reagent_lite.evaluation.cpe_models import CpeModelTrainer, CpeNets
from reagent_lite.kinds import KINDS
from reagent_lite.models import build_q_network

D, A, B = 5, 3, 64


def batch(seed: int) -> TensorDict:
    """Transitions with rewards large enough that the smooth-L1 value loss meets both of
    its branches, some rows without a logged action (−1) and next states with none
    possible."""
    g = torch.Generator().manual_seed(seed)
    action = torch.randint(0, A, (B,), generator=g)
    action[:5] = -1
    next_mask = (torch.rand(B, A, generator=g) > 0.3).float()
    next_mask[5:8] = 0.0
    return TensorDict(
        {
            "state": torch.randn(B, D, generator=g),
            "next_state": torch.randn(B, D, generator=g),
            "action": action,
            "reward": 3.0 * torch.randn(B, generator=g),
            "terminal": (torch.rand(B, generator=g) > 0.8).float(),
            "time_diff": torch.randint(1, 4, (B,), generator=g).float(),
            "possible_actions_mask": torch.ones(B, A),
            "possible_next_actions_mask": next_mask,
        }
    )


def net(activations: list[str] | None = None) -> nn.Module:
    return build_q_network(
        in_dim=D,
        n_actions=A,
        layers=[-1, 32, 16, -1],
        activations=activations or ["relu", "relu", "linear"],
    )


def trainer(nets: CpeNets, kind: str = "dqn", *, use_time_diff: bool = True) -> CpeModelTrainer:
    return CpeModelTrainer(
        KINDS[kind],
        nets,
        gamma=0.9,
        temperature=0.5,
        target_update_rate=0.1,
        learning_rate=0.01,
        use_time_diff=use_time_diff,
    )


def pair(activations: list[str] | None = None) -> tuple[CpeModelTrainer, CpeModelTrainer]:
    torch.manual_seed(0)
    nets = CpeNets(net(activations), net(activations))
    fused, plain = trainer(copy.deepcopy(nets)), trainer(copy.deepcopy(nets))
    plain.fused_step = False
    return fused, plain


def assert_same(a: CpeModelTrainer, b: CpeModelTrainer) -> None:
    for x, y in zip(a.nets.parameters(), b.nets.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    for x, y in zip(a.target_value.parameters(), b.target_value.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    for p, q in zip(a.nets.parameters(), b.nets.parameters(), strict=True):
        sa, sb = a.optimizer.state.get(p, {}), b.optimizer.state.get(q, {})
        assert sa.keys() == sb.keys()
        if not sa:
            continue  # a frozen parameter: never stepped
        torch.testing.assert_close(sa["exp_avg"], sb["exp_avg"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("use_time_diff", [True, False])
def test_fused_step_equals_autograd_path(
    monkeypatch: pytest.MonkeyPatch, use_time_diff: bool
) -> None:
    fused, plain = pair()
    fused.use_time_diff = plain.use_time_diff = use_time_diff
    torch.manual_seed(1)
    q_net = net()
    calls = []
    real = cpe_models.layers_backward
    monkeypatch.setattr(
        cpe_models, "layers_backward", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    # The first step's value-loss errors meet both branches of the smooth L1 (|x| < 1, > 1).
    data = batch(0)
    with torch.no_grad():
        mask = data.possible_next_actions_mask
        pi = cpe_models.masked_softmax(q_net(data.next_state), mask, plain.temperature)
        v = (pi * plain.target_value(data.next_state)).sum(-1)
        discount = 0.9**data.time_diff if use_time_diff else 0.9
        target = data.reward + (1.0 - data.terminal) * discount * v
        q_hat = plain._raw().value_net(data.state)
        err = (cpe_models.gather_logged(q_hat, data.action) - target).abs()[data.action >= 0]
    assert (err < 1.0).any() and (err > 1.0).any()
    for step in range(4):
        data = batch(step)
        before = [p.detach().clone() for p in fused.nets.parameters()]
        loss_fused = fused.train_step(data, q_net)
        loss_plain = plain.train_step(data, q_net)
        torch.testing.assert_close(loss_fused, loss_plain, rtol=1e-5, atol=1e-6)
        assert_same(fused, plain)
        moved = [
            not torch.equal(p, q) for p, q in zip(before, fused.nets.parameters(), strict=True)
        ]
        assert all(moved)  # every layer of both nets got a gradient
    assert len(calls) == 4 * 2  # both nets, every step, took the path without autograd


def test_fused_step_steps_aside_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tanh layers (not the fused ReLU MLP), a forward hook on the pair and a frozen layer
    keep autograd: trained as before, the hook runs, `layers_backward` is never called."""
    calls = []
    real = cpe_models.layers_backward
    monkeypatch.setattr(
        cpe_models, "layers_backward", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    q_net = net()

    def hooked() -> tuple[CpeModelTrainer, CpeModelTrainer]:
        fused, plain = pair()
        fused._raw().register_forward_hook(lambda *_: seen.append(1))
        return fused, plain

    def frozen() -> tuple[CpeModelTrainer, CpeModelTrainer]:
        fused, plain = pair()
        for t in (fused, plain):
            next(t._raw().value_net.parameters()).requires_grad_(False)
        return fused, plain

    seen: list[int] = []
    for make in (lambda: pair(["tanh", "tanh", "linear"]), hooked, frozen):
        fused, plain = make()
        for step in range(2):
            data = batch(step)
            torch.testing.assert_close(fused.train_step(data, q_net), plain.train_step(data, q_net))
        assert_same(fused, plain)
    assert calls == []
    assert len(seen) == 2


def test_rows_without_a_logged_action_add_nothing_even_with_a_bad_reward() -> None:
    """A row whose logged action is −1 gets no gradient from either loss, also when its
    reward is not finite (the fused step must not turn inf · 0 into NaN parameters)."""
    fused, plain = pair()
    data = batch(0)
    data.reward[0] = float("inf")  # row 0 has action −1
    q_net = net()
    fused.train_step(data, q_net)
    plain.train_step(data, q_net)
    for p in fused.nets.parameters():
        assert torch.isfinite(p).all()
    assert_same(fused, plain)
