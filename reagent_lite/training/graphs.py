"""The training step as one CUDA graph: `GraphStep`, a wrapper around the plain step.

`GraphStep(step, source, ctx)` takes the step the factory built (`update.build_update`: the
Q-network's optimizer step and the CPE side models' step, called on a list of
micro-batches) and a batch source; it only captures that function. `capture()` runs a few eager steps on a side stream so that lazily created
state (Adam moments, cuBLAS workspaces) exists, captures one step reading the source's
static buffers (`BatchSource.static()`), then undoes the warm-up (`WarmupSnapshot`). From
then on a step is the source's `stage()` and one `replay()`: index lookup, gathers,
forwards, backward, fused Adam, soft target update and CPE step cost one launch instead of
a few hundred. When capture is impossible (`step_plan.graph_blocker`) or fails, `StepRunner` stays
eager and says why.

Several processes (DDP over NCCL): DDP's reducer works on the host and cannot live in a
graph, so the step plan has the factory build the captured step averaging the gradients
itself (`StepShape.average_in_graph`) — the models forward through their plain modules, and between backward and the optimizer step
one flat buffer per optimizer is all-reduced inside the graph
(`DistContext.gradient_average`: NCCL's all-reduce). The DDP wrapper stays for what it did at construction
(rank 0's parameters broadcast, so replicas start identical) and for the eager fallback,
which every rank takes if capture fails on any rank (`DistContext.all_agree`); a failure
in the eager warm-up steps, whose all-reduces run, stops the run (`_warmup_failed`). DDP
keeps the parameters' AccumulateGrad nodes alive, and autograd accumulates on the stream a
node was made on: made on the default stream, the captured backward would have to sync
with it, which invalidates the capture. So DDP is built (`ddp_construction`) on the stream
the step is warmed up and captured on (`capture_stream`). An eager heartbeat all-reduce
every `_HEARTBEAT_STEPS` replays gives NCCL's watchdog something to time out on, so a dead
peer still ends the job within `collective_timeout_s`. The heartbeat and the stop check's
all-reduce stay on the replays' stream: NCCL orders the eager collectives of a
communicator as the host issues them, but not against one replayed from a graph, so a
side-stream collective could pass the graph's on one rank and not on another. CPU / gloo
runs never capture.

The plumbing: capture needs Adam(W) with `capturable` state on the device and, for a
learning rate the scheduler changes between epochs, a tensor lr: the step plan decides
that before the optimizers are built (`step_plan.step_shape`, `optim.OptimizerKernel`),
and nothing here changes them. Checkpoints store the portable form (`plain_lr`), so a
graph run resumes anywhere.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from reagent_lite.distributed.context import DistContext, is_collective_error
from reagent_lite.errors import TrainingError
from reagent_lite.training.sources import BatchSource, StaticRows
from reagent_lite.training.update import Update

log = logging.getLogger("reagent_lite")

# Eager steps run before capture so that lazily created state exists; undone afterwards.
_WARMUP_STEPS = 3
# Replays between the eager heartbeat all-reduces of a multi-process graph: well inside the
# host's queue of pending launches, so one is queued before the host could block on a dead
# peer; a one-element all-reduce per 64 steps costs well under 0.1%.
_HEARTBEAT_STEPS = 64


class GraphStep:
    """The factory's `step` (`update.build_update`) captured as one CUDA graph reading
    `source`'s static buffers; over several ranks, a step that averages its gradients."""

    def __init__(self, step: Update, source: BatchSource, ctx: DistContext) -> None:
        self.ctx = ctx
        self.ranks = ctx.world_size
        # Over several ranks, built to average the gradients itself (module notes).
        assert self.ranks == 1 or step.q_sync is not None, "a step DDP's hooks reduce"
        self.step = step
        self.source = source
        self.graph: torch.cuda.CUDAGraph | None = None
        self._static: StaticRows | None = None
        self._lr: list[Tensor] = []
        self._replays = 0

    def describe(self) -> str:
        what = "one CUDA graph per step"
        if self.ranks > 1:
            sync = self.step.q_sync
            by = f": {sync.describe()}" if sync is not None and self.graph is not None else ""
            what += f" (gradients all-reduced inside the graph over {self.ranks} ranks{by})"
        return what

    def _body(self) -> None:
        """What is captured: the plain step on the static buffers' next rows."""
        assert self._static is not None
        self.step(self._static.batches())

    def capture(self) -> str:
        """Warm up, capture, undo the warm-up (after the source's `begin_epoch`). Returns
        "" when the graph is ready, else why the steps stay eager — capture failed here or
        on another rank. Over several ranks a warm-up failure raises (`_warmup_failed`)."""
        device, several = self.ctx.device, self.ranks > 1
        optimizers = self.step.optimizers()
        # Built capturable, the lr a device tensor (`step_plan.step_shape`): the tensors
        # the graph will read.
        self._lr = [g["lr"] for g in self.step.trainer.optimizer.param_groups]
        snapshot = WarmupSnapshot(self.step.modules(), optimizers, self.step.trainer.step_tensors())
        failure, phase = "", "warm-up"
        try:
            self._static = self.source.static()
            # Multi-process: on DDP's construction stream (module notes).
            side = capture_stream(device) if several else torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(_WARMUP_STEPS):
                    self._static.rewind()
                    self._body()
            torch.cuda.current_stream(device).wait_stream(side)
            self._agree_on_compiled_updates()
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize(device)
            phase = "capture"
            graph = torch.cuda.CUDAGraph()
            # Thread-local: NCCL's watchdog thread queries events while we capture.
            mode = "thread_local" if several else "global"
            with torch.cuda.graph(graph, stream=side if several else None, capture_error_mode=mode):
                self._body()
        except Exception as err:  # a capture problem: eager is always correct (one rank)
            if is_collective_error(err):
                raise  # a collective failed (a peer died): the launcher's error, not ours
            failure = f"CUDA graph {phase} failed: {_summary(err)}"
            if several and phase == "warm-up":
                raise self._warmup_failed(failure) from err
        torch.cuda.synchronize(device)
        if failure:
            log.warning("cuda_graphs: %s; training eagerly", failure)
        if several and not self.ctx.all_agree(not failure) and not failure:
            failure = "CUDA graph capture failed on another rank (its log says why)"
            log.warning("cuda_graphs: %s; training eagerly", failure)
        snapshot.restore()
        if failure:
            self._static = None
            self.source.release_static()
            for update in self.step.compiled_updates():  # compiled only for a graph
                update.give_up("the step is not captured")
            return failure
        assert self._static is not None
        self._static.rewind()
        self.graph = graph
        return ""

    def _agree_on_compiled_updates(self) -> None:
        """Over several ranks, all compiled optimizer steps or none: a rank whose
        compilation failed runs the eager multi-tensor Adam, not bit for bit the compiled one, and
        the replicas would drift apart. The compiled losses need no agreement: their
        gradients are averaged before any rank uses them."""
        updates = self.step.compiled_updates()
        if (
            self.ranks > 1
            and updates
            and not self.ctx.all_agree(not any(u.failed for u in updates))
        ):
            for update in updates:
                update.give_up("compile failed on another rank")

    def _warmup_failed(self, failure: str) -> TrainingError:
        """Before capture, the ranks run eager steps whose gradient all-reduces execute: a
        rank that failed there cannot fall back alone — its peers wait inside one, and the
        all-reduce that would agree on the fallback would pair with theirs. So it stops the
        run; the launcher ends the node's other ranks, other nodes' time out."""
        return TrainingError(
            f"cuda_graphs: {failure} on rank {self.ctx.rank} of {self.ranks}, in an "
            "eager step before capture: the other ranks may be inside its gradient "
            "all-reduce, so this rank cannot fall back to eager training alone and the run "
            "stops (with `cuda_graphs: false` every rank trains eagerly from the start)"
        )

    def begin_epoch(self) -> None:
        """The scheduler may have put a float where the graph reads a tensor: copy it back
        (torch since 2.2 fills the tensor in place; an older one replaced it)."""
        groups = self.step.trainer.optimizer.param_groups
        for group, lr in zip(groups, self._lr, strict=True):
            if isinstance(lr, Tensor) and group["lr"] is not lr:
                lr.fill_(float(group["lr"]))
                group["lr"] = lr

    def release(self) -> None:
        """Destroys the captured graph (no replay afterwards). NCCL's finalize, run when the
        process group is destroyed, waits until every graph that captured one of its
        collectives is gone: a graph still referenced then (say, from an exception's frames
        after a preemption stop) would hang the exit. An in-flight replay completes first
        (CUDA frees a launched graph asynchronously), so no synchronize is needed here."""
        if self.graph is not None:
            self.graph.reset()
            self.graph = None

    def __call__(self) -> None:
        """One optimizer step: the source stages its rows, the graph replays."""
        assert self.graph is not None
        self.source.stage()
        self.graph.replay()
        if self.ranks > 1:
            self._replays += 1
            if self._replays % _HEARTBEAT_STEPS == 0:
                self.ctx.heartbeat()


def _summary(err: Exception) -> str:
    """The error's type, first line and innermost frame, for a one-line warning."""
    frames = traceback.extract_tb(err.__traceback__)
    at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    first = (str(err).splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}{at}"


# ---------------------------------------------------------------------------- plumbing
def adam_family(opt: torch.optim.Optimizer) -> bool:
    return type(opt) in (torch.optim.Adam, torch.optim.AdamW)


def plain_lr(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state_dict made portable for checkpoints: tensor learning rates become
    floats and `capturable` is cleared, so the checkpoint resumes on CPU or without graphs
    too (`load_optimizer_state` keeps the loading run's kernel, as built)."""
    for group in optimizer_state.get("param_groups", []):
        for key in ("lr", "initial_lr"):
            if isinstance(group.get(key), Tensor):
                group[key] = float(group[key])
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


class WarmupSnapshot:
    """Values of parameters, buffers and optimizer state, to undo the warm-up steps."""

    def __init__(
        self,
        modules: list[nn.Module],
        optimizers: list[torch.optim.Optimizer],
        tensors: Sequence[Tensor] = (),
    ):
        """`tensors`: more that a step updates in place (`QLearningTrainer.step_tensors`,
        e.g. the certainty switch's count of full-penalty steps left)."""
        self.optimizers = optimizers
        self.tensors: list[tuple[Tensor, Tensor]] = []
        for module in modules:
            for t in [*module.parameters(), *module.buffers()]:
                self.tensors.append((t, t.detach().clone()))
        self.tensors += [(t, t.detach().clone()) for t in tensors]
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
