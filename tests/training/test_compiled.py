"""`training/compiled.py`'s `CompiledApply` on the CPU (on CUDA it runs inside the captured
graph: `test_precision.py`'s gpu tests): the compiled optimizer step and soft target
update train what the eager ones train, and a compile failure falls back to them, with
torch's fused Adam again."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from reagent_lite.trainers import DQNHyperParams
from reagent_lite.trainers.dqn import DQNTrainer
from reagent_lite.training.compiled import CompiledApply
from tests.trainers.helpers import random_discrete_batch


def _pair() -> tuple[DQNTrainer, DQNTrainer]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3))
    hp = DQNHyperParams(learning_rate=1e-2, target_update_rate=0.1, l2_decay=1e-3)
    eager = DQNTrainer(copy.deepcopy(net), hp, n_actions=3)
    other = DQNTrainer(copy.deepcopy(net), hp, n_actions=3)
    return eager, other


def _train(trainer: DQNTrainer, apply: CompiledApply | None, steps: int = 6) -> None:
    torch.manual_seed(1)
    for _ in range(steps):
        trainer.train_step([random_discrete_batch(32, 4, 3)], apply=apply)


def _weights(trainer: DQNTrainer) -> list[torch.Tensor]:
    return [p.detach() for net in trainer.modules() for p in net.parameters()]


def test_compiled_update_trains_what_the_eager_update_trains() -> None:
    eager, compiled = _pair()
    apply = CompiledApply(compiled.optimizer, compiled.apply_update, "optimizer step")
    assert not compiled.optimizer.param_groups[0]["fused"]  # the multi-tensor form, compiled
    _train(eager, None)
    _train(compiled, apply)
    assert not apply.failed and apply.compile_s > 0
    assert apply.describe() == "optimizer step compiled"
    for a, b in zip(_weights(eager), _weights(compiled), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)  # online and target nets


def test_a_compile_failure_falls_back_to_the_fused_eager_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch._inductor.config as inductor

    eager, other = _pair()
    monkeypatch.setattr(inductor.cpp, "cxx", (None, "/nonexistent/c++"))
    torch._dynamo.reset()
    try:
        apply = CompiledApply(other.optimizer, other.apply_update, "optimizer step")
        _train(other, apply)
    finally:
        torch._dynamo.reset()
    assert apply.failed and "compile failed" in apply.describe()
    assert other.optimizer.param_groups[0]["fused"]  # torch's fused kernel again
    _train(eager, None)
    for a, b in zip(_weights(eager), _weights(other), strict=True):
        assert torch.equal(a, b)
