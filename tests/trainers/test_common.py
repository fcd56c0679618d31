"""`load_optimizer_state`: a checkpoint's optimizer state into this run's optimizer, built
with the step plan's kernel (`OptimizerKernel`), which loading keeps."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from reagent_lite.trainers.optim import OptimizerKernel, adam, load_optimizer_state
from reagent_lite.training.graphs import plain_lr


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def set_grads(module: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.grad = torch.randn(p.shape, generator=g)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu", "cuda"]
)
def test_state_of_an_unfused_adam_resumes_in_a_fused_one(device: str) -> None:
    """A checkpoint written by a plain (per-tensor) Adam, loaded into this run's fused one
    with `load_optimizer_state`: the fused kernel is kept and its step counters sit where
    it needs them (on CUDA torch would leave them on the CPU, by the saved group's choice),
    and the resumed optimizer steps exactly as one that never stopped."""
    src = net()
    plain = torch.optim.Adam(src.parameters(), lr=0.01)
    for i in range(3):
        set_grads(src, i)
        plain.step()
    saved = copy.deepcopy(plain.state_dict())  # as a checkpoint holds it: on the CPU

    resumed, reference = copy.deepcopy(src).to(device), copy.deepcopy(src).to(device)
    opt = adam(resumed.parameters(), 0.01)
    load_optimizer_state(opt, saved)
    ref = torch.optim.Adam(reference.parameters(), lr=0.01)
    ref.load_state_dict(copy.deepcopy(saved))
    assert all(g["fused"] for g in opt.param_groups)
    for p in resumed.parameters():
        step = opt.state[p]["step"]
        assert (step.device, step.dtype) == (p.device, torch.float32)
    for i in range(3, 5):
        for m in (resumed, reference):
            g = torch.Generator().manual_seed(i)
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g).to(device)
        opt.step()
        ref.step()
    for x, y in zip(resumed.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)  # fused vs per-tensor rounding


def _stepped_plain_adam(src: nn.Module, lr: float) -> dict[str, object]:
    plain = torch.optim.Adam(src.parameters(), lr=lr)
    for i in range(3):
        set_grads(src, i)
        plain.step()
    return copy.deepcopy(plain.state_dict())


def test_loading_a_checkpoint_keeps_the_optimizer_as_built() -> None:
    """The kernel the step plan built (here fused with the lr a tensor, as a graph reads it)
    survives loading a checkpoint of another kernel: the flags are this run's, the lr
    tensor is the same object holding the checkpoint's value, and the step goes on as an
    optimizer that never stopped."""
    src = net()
    saved = _stepped_plain_adam(src, 0.005)
    saved["param_groups"][0]["lr"] = 0.004  # type: ignore[index]  # a decayed lr
    resumed, reference = copy.deepcopy(src), copy.deepcopy(src)
    opt = adam(resumed.parameters(), 0.01, kernel=OptimizerKernel(fused=True, tensor_lr=True))
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor)
    load_optimizer_state(opt, saved)
    group = opt.param_groups[0]
    assert group["lr"] is lr and float(lr) == pytest.approx(0.004)
    assert (group["fused"], group["foreach"], group["capturable"]) == (True, None, False)
    ref = adam(reference.parameters(), 0.01)
    load_optimizer_state(ref, copy.deepcopy(saved))
    for i in range(3, 5):
        set_grads(resumed, i)
        set_grads(reference, i)
        opt.step()
        ref.step()
    for x, y in zip(resumed.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def test_a_capturable_optimizers_checkpoint_is_portable() -> None:
    """A graph run's optimizer (capturable, multi-tensor, lr a tensor) writes a checkpoint
    (`plain_lr`) that an eager run loads with its own kernel: floats, fused, not
    capturable; and a capturable optimizer loading a plain checkpoint stays capturable."""
    src = net()
    graph_kernel = OptimizerKernel(foreach=True, capturable=True, tensor_lr=True)
    built = adam(copy.deepcopy(src).parameters(), 0.01, kernel=graph_kernel)
    torch.optim.lr_scheduler.ExponentialLR(built, 0.9)  # an initial_lr, a tensor as the lr
    state = plain_lr(copy.deepcopy(built.state_dict()))
    group = state["param_groups"][0]
    assert isinstance(group["lr"], float) and isinstance(group["initial_lr"], float)
    assert not group["capturable"]
    eager = adam(copy.deepcopy(src).parameters(), 0.01)
    load_optimizer_state(eager, state)
    assert isinstance(eager.param_groups[0]["lr"], float) and eager.param_groups[0]["fused"]
    assert not eager.param_groups[0]["capturable"]
    load_optimizer_state(built, _stepped_plain_adam(copy.deepcopy(src), 0.005))
    assert built.param_groups[0]["capturable"] and built.param_groups[0]["foreach"]
    assert float(built.param_groups[0]["lr"]) == pytest.approx(0.005)


def test_a_trainers_optimizer_is_built_once_with_the_plans_kernel() -> None:
    from reagent_lite.trainers import DQNHyperParams, DQNTrainer

    trainer = DQNTrainer(net(), DQNHyperParams(learning_rate=0.01), n_actions=2)
    trainer.build_optimizer(OptimizerKernel(foreach=True), lr_scale=4)
    group = trainer.optimizer.param_groups[0]
    assert (group["fused"], group["foreach"], group["lr"]) == (None, True, 0.04)
    with pytest.raises(RuntimeError, match="built already"):
        trainer.build_optimizer(OptimizerKernel(fused=True))
