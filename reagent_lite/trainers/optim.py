"""The mechanics of a gradient step that the Q trainer and the CPE models share: the
optimizer (fused Adam, its state loaded as this run's kernels need), the seed the backward
starts from, and the target network's soft update. No maths of any algorithm here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from reagent_lite.torch_private import foreach_lerp_


def adam(
    params: Iterable[nn.Parameter], lr: float, *, weight_decay: float = 0.0, decoupled: bool = False
) -> torch.optim.Optimizer:
    """Adam (AdamW with `decoupled`), fused where the parameters' device has the kernel:
    one kernel per step over all parameters (CUDA, and CPU since torch 2.4) instead of a
    dozen per-tensor passes; on the CPU reference step that is ~7%."""
    plist = list(params)
    fused = bool(plist) and all(p.device.type in ("cpu", "cuda") for p in plist)
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    return cls(plist, lr=lr, weight_decay=weight_decay, fused=fused or None)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """`optimizer.load_state_dict(state)`, keeping this run's kernel choice: a checkpoint's
    groups carry the choice of the run that wrote it (e.g. not fused, from before CPU Adam
    was fused, or on another device). torch places a loaded step counter by the *saved*
    group's choice (on the parameter's device, float32, only for a fused or capturable
    one), so for a group fused here the counters are placed as the fused kernel needs."""
    kernels = [{k: g.get(k) for k in ("fused", "foreach")} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)  # type: ignore[arg-type]
    for group, chosen in zip(optimizer.param_groups, kernels, strict=True):
        group.update(chosen)
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
    """target ← (1 − τ)·target + τ·online, one fused foreach kernel over all parameters.

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
        if self.targets:
            foreach_lerp_(self.targets, self.sources, tau)
        for t_buf, o_buf in self.buffers:
            t_buf.copy_(o_buf)


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """One soft update of `target` towards `online` (see `SoftUpdate`)."""
    SoftUpdate(target, online)(tau)
