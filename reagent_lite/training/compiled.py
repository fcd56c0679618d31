"""`training.compile`: the trainer's loss compiled by Inductor, as a drop-in loss function.

`CompiledLoss(trainer)` is called as `trainer.compute_loss(batch, net=net)` is and returns
the same `DQNLoss`. The first call traces `compute_loss` (the micro-batch gathers, both
networks' forwards, the Bellman target, TD and CQL terms) with torch.compile; AOTAutograd
derives the backward, and Inductor fuses each into a few kernels (bias + ReLU + their
gradients, the masked max, the loss). Optimizer step and soft target update stay what they
are: one fused kernel each already. Inside a CUDA graph (`graphs.GraphStep`) the compiled
kernels are captured like any other; the compilation happens in the eager warm-up steps.

Dynamo cannot trace `LazyBatch` (it reads its slots through `object.__getattribute__`),
so the compiled function takes the batch's source columns and row index and gathers them
itself into a plain `Rows` object; the gathers of columns the loss never reads are dead
code that Inductor removes. Only the plain module is compiled: a DDP wrapper's forward
(multi-process eager steps) keeps the eager loss, since its hooks do the all-reduce.

The CPE side models' loss (`CompiledCpeLoss`: the next-state policy, the target value, the
reward and value regressions) is compiled the same way, so with CPE on the whole step is
fused, not only the Q-network's half.

In a captured CUDA graph the optimizer step and the soft target update are compiled too
(`CompiledApply`: the Q-network's and, with CPE on, the CPE side models'). torch's fused Adam runs one thread block per 65,536-element chunk of
the parameters: for a Q-network of tens of thousands of parameters that is a handful of
blocks on a GPU of 132 SMs, and measured on an H100 (batch 8192, MLP 256×256) it was 15%
of the step, the soft update's multi-tensor kernel 4% more. Inductor turns the same
arithmetic — Adam's multi-tensor (`foreach`) formulation, which the optimizer is switched
to for this, and the lerp — into kernels spread over the whole GPU. Only under a graph:
there the learning rate is a device tensor (`graphs.make_capturable`), so the per-epoch
decay does not recompile, and the step counters live on the device.

If compilation fails (no C++ compiler for the CPU backend, an unsupported operator) the
loss (the update) falls back to eager for the rest of the run, with a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from reagent_lite.evaluation.cpe_models import CpeModelTrainer
from reagent_lite.models import mlp
from reagent_lite.trainers.common import DQNLoss, QLearningTrainer
from reagent_lite.training.sources import LazyBatch

log = logging.getLogger("reagent_lite")


class Rows:
    """A micro-batch's gathered columns as attributes (what the trainers read)."""

    def __init__(self, fields: dict[str, Tensor]) -> None:
        for name, value in fields.items():
            setattr(self, name, value)


class _CompileOnce:
    """Runs a compiled function, the first call compiling it: a failure there (compilation
    problems) means the eager function for the rest of the run, with a warning; `what`
    names the function in the log."""

    what = "loss"

    def __init__(self) -> None:
        self.failed = ""
        self.compile_s = 0.0
        self._calls = 0

    def _fell_back(self) -> None:
        """Undo what compiling needed, once the eager function takes over."""

    def give_up(self, why: str) -> None:
        """The eager function from now on, `why` being the reason to show (e.g. another
        rank's compilation failed: every rank must run the same arithmetic)."""
        if not self.failed:
            self.failed = why
            self._fell_back()

    def _run(self, compiled: Callable[[], Any], eager: Callable[[], Any]) -> Any:
        if self.failed:
            return eager()
        first = self._calls == 0
        start = time.perf_counter()
        try:
            out = compiled()
        except Exception as err:  # compilation problems: the eager function is always right
            if not first:
                raise
            first_line = (str(err).splitlines() or [""])[0][:200]
            self.failed = f"compile failed: {type(err).__name__}: {first_line}"
            log.warning("training.compile: %s: %s; eager", self.what, self.failed)
            self._fell_back()
            return eager()
        self._calls += 1
        if first:
            self.compile_s = time.perf_counter() - start
            log.info("training.compile: %s compiled in %.1f s", self.what, self.compile_s)
        return out


class _Compiled(_CompileOnce):
    """A loss function of (micro-batch, modules...) compiled once per run: the batch goes in
    as its source columns and row index (module notes)."""

    def __init__(self) -> None:
        super().__init__()
        self._compiled: Any = torch.compile(self._traced, dynamic=False)

    def _eager(self, batch: Any, *modules: nn.Module) -> Any:
        raise NotImplementedError

    def _traced(self, columns: dict[str, Tensor], idx: Tensor | None, *modules: nn.Module) -> Any:
        rows = Rows(
            columns if idx is None else {k: v.index_select(0, idx) for k, v in columns.items()}
        )
        return self._eager(rows, *modules)

    def _call(self, batch: LazyBatch, *modules: nn.Module) -> Any:
        columns, idx = batch.parts()
        return self._run(
            lambda: self._compiled(columns, idx, *modules), lambda: self._eager(batch, *modules)
        )


class CompiledLoss(_Compiled):
    """`trainer.compute_loss`, compiled once per run (see the module notes)."""

    def __init__(self, trainer: QLearningTrainer[Any]) -> None:
        self.trainer = trainer
        super().__init__()

    def _eager(self, batch: Any, *modules: nn.Module) -> Any:
        loss = self.trainer.compute_loss(batch, net=modules[0])
        return loss.td_loss, loss.cql_loss, loss.total, loss.mean_q

    def __call__(self, batch: LazyBatch, net: nn.Module) -> DQNLoss:
        if self.failed or net is not self.trainer.online:
            return self.trainer.compute_loss(batch, net=net)
        return DQNLoss(*self._call(batch, net))

    def describe(self) -> str:
        if self.failed:
            return f"{self.failed}, eager loss"
        if mlp.SUM_OUTPUTS == 0:
            switch = f"{mlp.FUSED_OUTPUT_ENV}=0"
            return f"loss compiled by Inductor (output layers as matrix products: {switch})"
        return "loss compiled by Inductor"


class CompiledCpeLoss(_Compiled):
    """The CPE side models' `compute_loss` (reward and policy-value models: the
    next-state policy, the target value and both regressions), compiled the same way."""

    what = "CPE models' loss"

    def __init__(self, cpe: CpeModelTrainer) -> None:
        self.cpe = cpe
        super().__init__()

    def _eager(self, batch: Any, *modules: nn.Module) -> Any:
        return self.cpe.compute_loss(batch, modules[0], modules[1])

    def __call__(self, batch: LazyBatch, q_net: nn.Module, nets: nn.Module) -> Tensor:
        if self.failed or nets is not self.cpe.plain:  # a DDP wrapper: its hooks reduce
            return self.cpe.compute_loss(batch, q_net, nets)
        out: Tensor = self._call(batch, q_net, nets)
        return out


class CompiledApply(_CompileOnce):
    """A trainer's `apply_update` (the optimizer step, then a soft target update) —
    `optimizer` being the one it steps —, compiled once per run for a captured CUDA graph
    (module notes); after a compile failure, the eager update with fused Adam again."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, apply_update: Callable[[], None], what: str
    ) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.apply_update = apply_update
        self.what = what
        # Inductor fuses the multi-tensor formulation; torch's fused kernel is opaque to it.
        self._fused = [bool(g.get("fused")) for g in optimizer.param_groups]
        self._set_fused(False)
        self._compiled: Any = torch.compile(apply_update, dynamic=False)

    def _set_fused(self, fused: bool) -> None:
        for group, was in zip(self.optimizer.param_groups, self._fused, strict=True):
            if was:
                group["fused"], group["foreach"] = fused, not fused

    def _fell_back(self) -> None:
        self._set_fused(True)

    def __call__(self) -> None:
        self._run(self._compiled, self.apply_update)

    def describe(self) -> str:
        if self.failed:
            return f"{self.what} eager ({self.failed})"
        return f"{self.what} compiled"
