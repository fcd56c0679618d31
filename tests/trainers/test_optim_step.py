"""`OptimizerStep`: the fused Adam(W) kernel called directly equals `optimizer.step()`."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from reagent_lite.trainers.common import adam, load_optimizer_state
from reagent_lite.trainers.optim_step import OptimizerStep


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def set_grads(module: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def run(module: nn.Module, opt: torch.optim.Optimizer, stepper, steps: int) -> None:
    """`steps` steps of `stepper` (a callable reading `opt.step` when called: the
    scheduler wraps it to track calls), the learning rate halved every other step."""
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.5)
    for i in range(steps):
        set_grads(module, i)
        stepper()
        if i % 2:
            sched.step()  # the learning rate read afresh each step


@pytest.mark.parametrize(
    ("cls", "kw"),
    [
        (torch.optim.Adam, {}),
        (torch.optim.Adam, {"weight_decay": 0.1, "betas": (0.8, 0.9), "eps": 1e-6}),
        (torch.optim.AdamW, {"weight_decay": 0.1}),
        (torch.optim.Adam, {"maximize": True}),
    ],
)
def test_direct_kernel_is_bit_identical_to_step(cls, kw) -> None:
    a, b = net(), net()
    opt_a, opt_b = (
        cls(a.parameters(), lr=0.01, fused=True, **kw),
        cls(b.parameters(), lr=0.01, fused=True, **kw),
    )
    direct = OptimizerStep(opt_a)
    assert direct.direct
    run(a, opt_a, direct, 6)
    run(b, opt_b, lambda: opt_b.step(), 6)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)
    for s, t in zip(opt_a.state.values(), opt_b.state.values(), strict=True):
        assert s.keys() == t.keys() and all(torch.equal(s[k], t[k]) for k in s)


def test_state_replaced_by_load_state_dict_is_used() -> None:
    a, b = net(), net()
    opt_a = torch.optim.Adam(a.parameters(), lr=0.01, fused=True)
    opt_b = torch.optim.Adam(b.parameters(), lr=0.01, fused=True)
    direct = OptimizerStep(opt_a)
    run(a, opt_a, direct, 3)
    run(b, opt_b, lambda: opt_b.step(), 3)
    saved = opt_b.state_dict()
    # Own copies: a CPU load keeps the given tensors, which two optimizers would share.
    opt_a.load_state_dict(copy.deepcopy(saved))
    opt_b.load_state_dict(copy.deepcopy(saved))
    run(a, opt_a, direct, 3)
    run(b, opt_b, lambda: opt_b.step(), 3)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)


def test_falls_back_to_step_where_step_does_more() -> None:
    module = net()
    opt = torch.optim.Adam(module.parameters(), lr=0.01, fused=True)
    direct = OptimizerStep(opt)
    calls: list[int] = []
    handle = opt.register_step_post_hook(lambda *_: calls.append(1))
    set_grads(module, 0)
    direct()  # first step: no state yet → step(), which runs the hook
    direct()  # hooks registered → step()
    assert calls == [1, 1]
    handle.remove()
    first = next(module.parameters())
    first.grad = None  # step() skips a parameter without gradient: so must we
    before = first.detach().clone()
    direct()
    assert torch.equal(first, before)
    assert int(opt.state[first]["step"]) == 2


def test_shared_step_counters_count_like_step_through_fallbacks_and_a_save(tmp_path) -> None:
    """The direct path keeps every step counter in one tensor; steps through `step()`
    (a hook registered for a while), a `torch.save` / `torch.load` of the state and a
    resume from it count exactly as `step()` alone."""
    a, b = net(), net()
    opt_a = torch.optim.Adam(a.parameters(), lr=0.01, fused=True)
    opt_b = torch.optim.Adam(b.parameters(), lr=0.01, fused=True)

    def steps(module: nn.Module, stepper, first: int, last: int) -> None:
        for i in range(first, last):
            set_grads(module, i)
            stepper()

    direct = OptimizerStep(opt_a)
    steps(a, direct, 0, 3)
    counters = [opt_a.state[p]["step"] for p in a.parameters()]
    assert len({t.untyped_storage().data_ptr() for t in counters}) == 1  # one tensor
    handle = opt_a.register_step_post_hook(lambda *_: None)
    steps(a, direct, 3, 5)  # hooked: through step()
    handle.remove()
    steps(a, direct, 5, 7)
    torch.save(opt_a.state_dict(), tmp_path / "opt.pt")
    c = net()
    c.load_state_dict(a.state_dict())
    opt_c = torch.optim.Adam(c.parameters(), lr=0.01, fused=True)
    opt_c.load_state_dict(torch.load(tmp_path / "opt.pt"))
    steps(c, OptimizerStep(opt_c), 7, 10)
    steps(b, opt_b.step, 0, 10)
    for x, y in zip(c.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)
    for p, q in zip(c.parameters(), b.parameters(), strict=True):
        assert float(opt_c.state[p]["step"]) == float(opt_b.state[q]["step"]) == 10.0


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.Adam(p, lr=0.01),  # not fused
        lambda p: torch.optim.Adam(p, lr=0.01, fused=True, amsgrad=True),
        lambda p: torch.optim.SGD(p, lr=0.01),
    ],
)
def test_other_optimizers_use_step(make) -> None:
    a, b = net(), net()
    opt_a, opt_b = make(a.parameters()), make(b.parameters())
    direct = OptimizerStep(opt_a)
    run(a, opt_a, direct, 3)
    run(b, opt_b, lambda: opt_b.step(), 3)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)


def test_a_resumed_run_steps_through_step_once_so_the_scheduler_does_not_warn() -> None:
    """After a resume the loaded state would allow the kernel at once; the first call
    still runs `step()`, which the scheduler watches (else: 'lr_scheduler.step() before
    optimizer.step()')."""
    a = net()
    opt = torch.optim.Adam(a.parameters(), lr=0.01, fused=True)
    run(a, opt, OptimizerStep(opt), 3)
    saved = copy.deepcopy(opt.state_dict())
    b = net()
    resumed = torch.optim.Adam(b.parameters(), lr=0.01, fused=True)
    resumed.load_state_dict(saved)
    sched = torch.optim.lr_scheduler.ExponentialLR(resumed, 0.5)
    stepper = OptimizerStep(resumed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(3):
            set_grads(b, i)
            stepper()
            sched.step()
    assert int(resumed.state[next(b.parameters())]["step"]) == 6


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
