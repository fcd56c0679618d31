"""`load_optimizer_state`: a checkpoint's optimizer state into this run's optimizer."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from reagent_lite.trainers.optim import adam, load_optimizer_state


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
