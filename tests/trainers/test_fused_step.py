"""The DQN step without autograd (`DQNTrainer._fused_backward`) against the autograd path."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from reagent_lite.models import build_q_network
from reagent_lite.models import fused as fused_module
from reagent_lite.trainers import DQNHyperParams, DQNTrainer
from tests.trainers.helpers import slice_batch

D, A = 5, 3


def batch(b: int, *, seed: int) -> SimpleNamespace:
    """Random transitions with some impossible actions and rows with none possible."""
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, A, generator=g) > 0.3).float()
    next_mask = (torch.rand(b, A, generator=g) > 0.3).float()
    mask[:3] = 0.0
    next_mask[3:6] = 0.0
    return SimpleNamespace(
        state=torch.randn(b, D, generator=g),
        action=torch.randint(0, A, (b,), generator=g),
        reward=torch.randn(b, generator=g),
        next_state=torch.randn(b, D, generator=g),
        next_action=torch.randint(-1, A, (b,), generator=g),
        possible_actions_mask=mask,
        possible_next_actions_mask=next_mask,
        time_diff=torch.randint(1, 4, (b,), generator=g).float(),
        terminal=(torch.rand(b, generator=g) > 0.8).float(),
    )


def pair(net: nn.Module, **hp: object) -> tuple[DQNTrainer, DQNTrainer]:
    """Two trainers on copies of `net`: the fused step, and the autograd path."""
    params = DQNHyperParams(**{"learning_rate": 0.01, **hp})  # type: ignore[arg-type]
    boost = torch.tensor([0.0, 0.5, -1.0])
    fused, plain = (
        DQNTrainer(copy.deepcopy(net), params, n_actions=A, reward_boost_vector=boost)
        for _ in range(2)
    )
    plain.fused_step = False
    return fused, plain


def mlp(acts: list[str] | None = None, **kw: object) -> nn.Module:
    torch.manual_seed(0)
    acts = acts or ["relu", "relu", "linear"]
    return build_q_network(in_dim=D, n_actions=A, layers=[-1, 32, 16, -1], activations=acts, **kw)


def assert_same_state(a: DQNTrainer, b: DQNTrainer) -> None:
    for x, y in zip(a.online.parameters(), b.online.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    for x, y in zip(a.target.parameters(), b.target.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    for s, t in zip(a.optimizer.state.values(), b.optimizer.state.values(), strict=True):
        for key in s:
            torch.testing.assert_close(s[key], t[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "hp",
    [
        {},  # Double DQN, MSE: the reference task
        {"q_network_loss": "huber"},
        {"cql_alpha": 0.7},
        {"cql_alpha": 0.7, "q_network_loss": "huber", "double_q_learning": False},
        {"maxq_learning": False, "use_seq_num_diff_as_time_diff": True},
        {"optimizer": "sgd", "clip_grad_norm": 0.05, "l2_decay": 0.01},
        {"optimizer": "adamw", "l2_decay": 0.1, "minibatches_per_step": 2},
    ],
)
def test_fused_step_equals_the_autograd_step(hp: dict[str, object]) -> None:
    fused, plain = pair(mlp(), **hp)
    mps = int(hp.get("minibatches_per_step", 1))  # type: ignore[call-overload]
    for step in range(4):
        full = batch(64, seed=step)
        parts = [slice_batch(full, i * 64 // mps, (i + 1) * 64 // mps) for i in range(mps)]
        assert fused._fused_backward(parts[0], 1.0) is not None  # the fused path does apply
        fused.online.zero_grad(set_to_none=True)
        rec_f, rec_p = fused.train_step(parts), plain.train_step(parts)
        for name in ("td_loss", "cql_loss", "total", "mean_q"):
            torch.testing.assert_close(getattr(rec_f, name), getattr(rec_p, name))
            assert not getattr(rec_f, name).requires_grad
    assert_same_state(fused, plain)


def test_fused_gradients_equal_autograd_gradients_with_relu_output() -> None:
    """Accumulation into existing `.grad` and a ReLU on the output layer as well."""
    fused, plain = pair(mlp(["relu", "relu", "relu"]), cql_alpha=0.3)
    b = batch(40, seed=9)
    for t in (fused, plain):
        for p in t.online.parameters():
            p.grad = torch.ones_like(p)
    fused._fused_backward(b, 0.5)
    (plain.compute_loss(b).total * 0.5).backward()
    for x, y in zip(fused.online.parameters(), plain.online.parameters(), strict=True):
        assert x.grad is not None and y.grad is not None
        assert x.grad.is_contiguous()
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "net",
    [
        pytest.param(lambda: mlp(["tanh", "relu", "linear"]), id="tanh"),
        pytest.param(lambda: mlp(dropout_ratio=0.2), id="dropout"),
        pytest.param(lambda: mlp(dueling=True), id="dueling"),
    ],
)
def test_other_networks_take_the_autograd_path(net) -> None:
    fused, _ = pair(net())
    assert fused._fused_backward(batch(16, seed=0), 1.0) is None
    fused.train_step([batch(16, seed=0)])  # and train


def test_a_wrapped_network_takes_the_autograd_path() -> None:
    """DDP's reducer works through autograd hooks: a wrapper means the autograd path."""
    inner = mlp()
    wrapper = nn.Module()
    wrapper.module = inner  # what `unwrap` looks for
    wrapper.forward = inner.forward  # type: ignore[method-assign]
    trainer = DQNTrainer(wrapper, DQNHyperParams(), n_actions=A)
    assert trainer.online is inner and not trainer.fused_step
    assert trainer._fused_backward(batch(16, seed=0), 1.0) is None


def test_autocast_takes_the_autograd_path() -> None:
    fused, _ = pair(mlp())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused._fused_backward(batch(16, seed=0), 1.0) is None


def test_fused_step_on_onednn_products_equals_the_autograd_step_on_mkl(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Layers wide enough for oneDNN (`models.fused`), weights changing every step: the
    fused step with oneDNN products tracks the autograd step with MKL ones."""
    torch.manual_seed(0)
    net = build_q_network(
        in_dim=D, n_actions=A, layers=[-1, 96, 80, -1], activations=["relu", "relu", "linear"]
    )
    fused, plain = pair(net, cql_alpha=0.2)
    for step in range(4):
        b = batch(128, seed=step)
        monkeypatch.setattr(fused_module, "USE_ONEDNN", True)
        rec_f = fused.train_step([b])
        monkeypatch.setattr(fused_module, "USE_ONEDNN", False)
        rec_p = plain.train_step([b])
        torch.testing.assert_close(rec_f.total, rec_p.total, rtol=1e-5, atol=1e-6)
    for x, y in zip(fused.online.parameters(), plain.online.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_hooks_and_frozen_layers_take_the_autograd_path() -> None:
    fused, _ = pair(mlp())
    handle = fused.online.register_forward_hook(lambda *_: None)
    assert fused._fused_backward(batch(16, seed=0), 1.0) is None
    handle.remove()
    assert fused._fused_backward(batch(16, seed=0), 1.0) is not None
    fused.online.zero_grad(set_to_none=True)
    # A hook on the target network: the step stays fused, the target's forward runs as a
    # module call (the hook sees it and may change its output).
    calls: list[int] = []
    handle = fused.target.register_forward_hook(lambda *_: calls.append(1))
    pre = fused.target.register_forward_pre_hook(lambda *_: calls.append(2))
    assert fused._fused_backward(batch(16, seed=0), 1.0) is not None
    assert calls == [2, 1]
    handle.remove()
    pre.remove()
    fused.online.zero_grad(set_to_none=True)
    first = fused.online.linear(0)
    first.requires_grad_(False)
    assert fused._fused_backward(batch(16, seed=0), 1.0) is None
    fused.train_step([batch(16, seed=0)])
    assert first.weight.grad is None
