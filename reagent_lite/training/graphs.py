"""CUDA-graph plumbing of the training step (`steps.StepRunner` captures with it).

* Optimizers: capture needs Adam(W) with `capturable` state on the device and, for a
  learning rate the scheduler changes between replays, a tensor lr (`make_capturable`);
  checkpoints store the portable form (`plain_lr`), so a graph run resumes anywhere.
* Streams: autograd runs a node's backward on the stream the node was made on, so DDP is
  built (`ddp_construction`) on the stream the step is warmed up and captured on
  (`capture_stream`).
* Several processes: `GradAllReduce` averages the gradients inside the graph (one flat
  buffer, NCCL), in place of DDP's host-side reducer.
* `WarmupSnapshot` undoes the eager warm-up steps run before capture.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from reagent_lite.torch_private import foreach_copy_, silence_capturable_warning


def adam_family(opt: torch.optim.Optimizer) -> bool:
    return type(opt) in (torch.optim.Adam, torch.optim.AdamW)


def make_capturable(opt: torch.optim.Optimizer, device: torch.device, lr_tensor: bool) -> None:
    """Adam(W) whose step can live in a CUDA graph: device step counters, and (when the
    learning rate changes between epochs) the lr as a device tensor the graph reads."""
    opt.defaults["capturable"] = True
    # Warm-up and evaluation run it outside a graph on purpose: no warning about that.
    silence_capturable_warning(opt)
    for group in opt.param_groups:
        group["capturable"] = True
        lr = group["lr"]
        if lr_tensor and not (isinstance(lr, Tensor) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
    for state in opt.state.values():
        step = state.get("step")
        if isinstance(step, Tensor) and step.device != device:
            state["step"] = step.to(device=device, dtype=torch.float32)


def plain_lr(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state_dict made portable for checkpoints: tensor learning rates become
    floats and `capturable` is cleared, so the checkpoint resumes on CPU or without graphs
    too (a graph-capturing run makes its optimizer capturable again before capture)."""
    for group in optimizer_state.get("param_groups", []):
        if isinstance(group.get("lr"), Tensor):
            group["lr"] = float(group["lr"])
        if group.get("capturable"):
            group["capturable"] = False
    return optimizer_state


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream on which a device's multi-process step is warmed up and
    captured, and its DDP wrappers built."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(index)
    return _CAPTURE_STREAMS[index]


@contextlib.contextmanager
def ddp_construction(device: torch.device, cuda_graphs: bool) -> Iterator[None]:
    """Where the workflow builds its DDP wrappers: on `capture_stream` when the step may be
    captured (see the module notes), ordered with the default stream both ways."""
    if device.type != "cuda" or not cuda_graphs:
        yield
        return
    stream = capture_stream(device)
    current = torch.cuda.current_stream(device)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield
    current.wait_stream(stream)  # DDP's initial broadcast lands before anything reads


class GradAllReduce:
    """Averages the gradients of `params` over the default process group, as DDP does
    (divide by the world size, then sum): flattened into one buffer, one all-reduce, copied
    back. Plain tensor ops and one NCCL call, so it can be captured in a CUDA graph."""

    def __init__(self, params: list[Tensor], world_size: int):
        self.params = [p for p in params if p.requires_grad]
        self.world_size = world_size

    def __call__(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat.div_(self.world_size)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        parts = flat.split([g.numel() for g in grads])
        foreach_copy_(grads, [part.view_as(g) for part, g in zip(parts, grads, strict=True)])


class WarmupSnapshot:
    """Values of parameters, buffers and optimizer state, to undo the warm-up steps."""

    def __init__(self, modules: list[nn.Module], optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        self.tensors: list[tuple[Tensor, Tensor]] = []
        for module in modules:
            for t in [*module.parameters(), *module.buffers()]:
                self.tensors.append((t, t.detach().clone()))
        self.opt_state: dict[int, Tensor] = {}
        for opt in optimizers:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, Tensor):
                        self.opt_state[id(v)] = v.detach().clone()

    @torch.no_grad()
    def restore(self) -> None:
        for t, saved in self.tensors:
            t.copy_(saved)
        for opt in self.optimizers:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, Tensor):
                        before = self.opt_state.get(id(v))
                        # State born in the warm-up (Adam moments, step) starts at zero.
                        v.copy_(before) if before is not None else v.zero_()
