"""The mechanics of a gradient step that the Q trainer and the CPE models share: the
optimizer (Adam built with the kernel the step plan chose, `OptimizerKernel`, and its
state loaded keeping that kernel), the seed the backward starts from, and the target
network's soft update. No maths of any algorithm here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from reagent_lite.torch_private import silence_capturable_warning

# The group settings that are this run's kernel, not the checkpoint's (`load_optimizer_state`).
_KERNEL_KEYS = ("fused", "foreach", "capturable")


@dataclass(frozen=True)
class OptimizerKernel:
    """How Adam(W) runs its step, decided once by the step plan before any optimizer is
    built (`training.step_plan.step_shape`): `fused` (one kernel for all parameters),
    `foreach` (the multi-tensor form, which Inductor can fuse: a compiled optimizer step),
    `capturable` (step counters on the device: a step a CUDA graph can hold) and
    `tensor_lr` (the learning rate a device tensor, so a graph reads the scheduler's
    value). Every combination also runs eagerly, so a step whose capture or compilation
    fails keeps its optimizer as built. Other optimizers than Adam(W) ignore it."""

    fused: bool = False
    foreach: bool = False
    capturable: bool = False
    tensor_lr: bool = False

    @staticmethod
    def eager(device: torch.device) -> OptimizerKernel:
        """The kernel of an eager step: fused where the device has it (CUDA, and the CPU
        since torch 2.4), one kernel instead of a dozen per-tensor passes (~7% of the CPU
        reference step)."""
        return OptimizerKernel(fused=device.type in ("cpu", "cuda"))

    def describe(self) -> str:
        """For the `training step:` line, e.g. "fused Adam, capturable, lr on the device"."""
        form = "fused" if self.fused else "multi-tensor" if self.foreach else "per-tensor"
        extra = [
            w
            for w, on in (("capturable", self.capturable), ("lr on the device", self.tensor_lr))
            if on
        ]
        return ", ".join([f"{form} Adam", *extra])


def adam(
    params: Iterable[nn.Parameter],
    lr: float,
    *,
    weight_decay: float = 0.0,
    decoupled: bool = False,
    kernel: OptimizerKernel | None = None,
) -> torch.optim.Optimizer:
    """Adam (AdamW with `decoupled`) built with `kernel` (default: the eager kernel of the
    parameters' device). The fused kernel only where the parameters' device has it."""
    plist = list(params)
    device = plist[0].device if plist else torch.device("cpu")
    kernel = kernel or OptimizerKernel.eager(device)
    fused = kernel.fused and bool(plist) and all(p.device.type in ("cpu", "cuda") for p in plist)
    rate: float | torch.Tensor = lr
    if kernel.tensor_lr:
        rate = torch.tensor(float(lr), dtype=torch.float32, device=device)
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = cls(
        plist,
        lr=rate,
        weight_decay=weight_decay,
        fused=fused or None,
        foreach=(kernel.foreach and not fused) or None,
        capturable=kernel.capturable,
    )
    if kernel.capturable:
        # Warm-up, evaluation and an eager fallback step it outside a graph on purpose.
        silence_capturable_warning(opt)
    return opt


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """`optimizer.load_state_dict(state)`, keeping the optimizer as built: torch replaces a
    group's settings by the saved group's, which carry the kernel of the run that wrote it
    (not fused, from before CPU Adam was fused; capturable or not; another device), so the
    kernel flags go back to this run's, and a device-tensor learning rate keeps its tensor
    (the loaded value copied in). torch places a loaded step counter by the *saved* group's
    choice (on the parameter's device, float32, only for a fused or capturable one), so for
    a group fused or capturable here the counters are placed as the kernel needs."""
    built = [
        ({k: g.get(k) for k in _KERNEL_KEYS}, g["lr"], g.get("initial_lr"))
        for g in optimizer.param_groups
    ]
    optimizer.load_state_dict(state)  # type: ignore[arg-type]
    for group, (kernel, lr, initial) in zip(optimizer.param_groups, built, strict=True):
        group.update(kernel)
        for key, mine in (("lr", lr), ("initial_lr", initial)):
            if isinstance(mine, torch.Tensor) and key in group:
                mine.fill_(float(group[key]))
                group[key] = mine
        if not (group.get("fused") or group.get("capturable")):
            continue
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and (
                step.device != p.device or step.dtype != torch.float32
            ):
                optimizer.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)


class BackwardSeed:
    """`seed(loss, scale)`: what `loss.backward()` starts from so that every gradient comes
    out multiplied by `scale` (None for 1: autograd's own seed). The factor is a device
    scalar made once per (scale, dtype, device), so inside a captured step it costs no
    kernel: a micro-batch's 1/n, and where the caller's all-reduce does not divide, the
    1/world size of gradient averaging, ride on the backward itself."""

    def __init__(self) -> None:
        self._seeds: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}

    def __call__(self, loss: torch.Tensor, scale: float) -> torch.Tensor | None:
        if scale == 1.0:
            return None
        key = (scale, loss.dtype, loss.device)
        seed = self._seeds.get(key)
        if seed is None:
            seed = self._seeds[key] = torch.full((), scale, dtype=loss.dtype, device=loss.device)
        return seed


class SoftUpdate:
    """target ← (1 − τ)·target + τ·online, a public `lerp_` per tensor. (The multi-tensor
    `torch._foreach_lerp_` was removed: on a CPU it runs a `lerp_` per tensor inside, and
    under a CUDA graph it saves a few launches of a ~290 µs step, under the 5% a private
    API must earn.)

    The parameter lists are taken once: walking the module tree every step costs more
    than the update itself on a CPU. They hold the `Parameter` objects, which `.to()` and
    an in-place `load_state_dict` keep; whatever replaces them (`load_state_dict(...,
    assign=True)`, buffers moved by `.to()`) must call `refresh()`."""

    def __init__(self, target: nn.Module, online: nn.Module):
        self.target, self.online = target, online
        self.refresh()

    def refresh(self) -> None:
        self.targets: list[torch.Tensor] = list(self.target.parameters())
        self.sources: list[torch.Tensor] = list(self.online.parameters())
        self.buffers = list(zip(self.target.buffers(), self.online.buffers(), strict=True))

    @torch.no_grad()
    def __call__(self, tau: float) -> None:
        for t, o in zip(self.targets, self.sources, strict=True):
            t.lerp_(o, tau)
        for t_buf, o_buf in self.buffers:
            t_buf.copy_(o_buf)


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """One soft update of `target` towards `online` (see `SoftUpdate`)."""
    SoftUpdate(target, online)(tau)
