"""The step factory: `build_update` composes, from the step plan's choices, the one step a
run trains with — what an eager step runs and a CUDA graph captures.

The trainers give the maths only (`compute_loss`, their parameters, `apply_update`: the
optimizer step and the soft target update); the factory decides the rest, for the
Q-network and the CPE side models alike, through the same `trainers.gradient_step.
GradientStep`: the loss plain or compiled (`compiled.CompiledLoss`, `CompiledCpeLoss`),
the update plain or compiled (`compiled.CompiledApply`), and the gradient reduction — the
DDP wrapper's hooks (forward through the wrapper), or the step's own average over the
ranks (forward through the plain module, the 1/world size on the backward's seed, a sum
after the last micro-batch: `DistContext.gradient_average`), which is what a graph over
several ranks runs, since it cannot hold DDP's hooks. Which one is a plan input
(`StepShape.average_in_graph`), not a copy of the step made afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from reagent_lite.config.models import Precision
from reagent_lite.data.rows import Rows
from reagent_lite.distributed.context import DistContext, GradAverage
from reagent_lite.evaluation.cpe_models import CpeModelTrainer
from reagent_lite.models.traced import ForwardOptions
from reagent_lite.trainers.common import DQNLoss, QLearningTrainer
from reagent_lite.trainers.gradient_step import GradientStep, PlainLoss, Reduction
from reagent_lite.training.compiled import CompiledApply, CompiledCpeLoss, CompiledLoss
from reagent_lite.training.precision import step_precision


@dataclass(frozen=True)
class StepKernels:
    """The compiled parts a plan chose (None: the plain one), made once per run and shared
    by every step built from them (an eager step and the captured one)."""

    loss: CompiledLoss | None = None
    cpe_loss: CompiledCpeLoss | None = None
    apply: CompiledApply | None = None
    cpe_apply: CompiledApply | None = None

    @staticmethod
    def build(
        trainer: QLearningTrainer[Any],
        cpe: CpeModelTrainer | None,
        *,
        compile: bool,
        compiled_update: bool,
        options: ForwardOptions,
    ) -> StepKernels:
        """`compile`: `training.compile` (the losses); `compiled_update`: the optimizer
        steps too (under a graph only: `compiled.py` says why)."""
        if not compile:
            return StepKernels()
        return StepKernels(
            loss=CompiledLoss(trainer, options),
            cpe_loss=CompiledCpeLoss(cpe, options) if cpe is not None else None,
            apply=(
                CompiledApply(trainer.optimizer, trainer.apply_update, "optimizer step")
                if compiled_update
                else None
            ),
            cpe_apply=(
                CompiledApply(cpe.optimizer, cpe.apply_update, "CPE models' optimizer step")
                if compiled_update and cpe is not None
                else None
            ),
        )


@dataclass(frozen=True)
class Averaging:
    """The step's own gradient average over `ctx`'s ranks."""

    ctx: DistContext

    def over(self, params: Sequence[nn.Parameter]) -> GradAverage:
        # The backward carries the 1/world size (`GradAverage.loss_scale`); the sum adds.
        return self.ctx.gradient_average(params, scaled_backward=True)


def q_step(
    trainer: QLearningTrainer[Any],
    *,
    loss: Callable[[Any, nn.Module], DQNLoss] | None = None,
    apply: Callable[[], None] | None = None,
    sync: Reduction | None = None,
) -> GradientStep[Any, DQNLoss]:
    """The Q-network's step: `loss` / `apply` in place of the trainer's own (the compiled
    ones), `sync` the step's own gradient average (else the DDP wrapper's hooks, if any)."""
    return GradientStep(
        loss=loss or (lambda batch, net: trainer.compute_loss(batch, net=net)),
        net=trainer.q_net if sync is None else trainer.online,
        params=trainer.parameters(),
        apply=apply or trainer.apply_update,
        reduce=sync,
        clip=trainer.hp.clip_grad_norm,
    )


def cpe_step(
    cpe: CpeModelTrainer,
    q_net: nn.Module,
    *,
    loss: Callable[[Any, nn.Module, nn.Module], Tensor] | None = None,
    apply: Callable[[], None] | None = None,
    sync: Reduction | None = None,
) -> GradientStep[Any, PlainLoss]:
    """The CPE side models' step, the same way; `q_net` (the plain Q-network) gives the
    policy whose value they fit."""
    fn = loss or cpe.compute_loss
    return GradientStep(
        loss=lambda batch, nets: PlainLoss(fn(batch, q_net, nets)),
        net=cpe.nets if sync is None else cpe.plain,
        params=cpe.parameters(),
        apply=apply or cpe.apply_update,
        reduce=sync,
    )


class Update:
    """The step: `update(batches)` is one optimizer step of the Q-network over the
    `minibatches_per_step` micro-batches and one of the CPE side models over the first;
    the Q-network's loss is added to `loss_sum` (a device scalar). `precision`
    (`training.precision`) is the arithmetic of both models' forwards and backwards
    (`precision.step_precision`). Built by `build_update`."""

    def __init__(
        self,
        trainer: QLearningTrainer[Any],
        cpe: CpeModelTrainer | None,
        loss_sum: Tensor,
        *,
        precision: Precision,
        kernels: StepKernels,
        q_sync: GradAverage | None,
        cpe_sync: GradAverage | None,
    ) -> None:
        self.trainer, self.cpe, self.loss_sum = trainer, cpe, loss_sum
        self.precision, self.kernels = precision, kernels
        self.q_sync, self.cpe_sync = q_sync, cpe_sync
        self.device = loss_sum.device
        k = kernels
        self.q_step = q_step(trainer, loss=k.loss, apply=k.apply, sync=q_sync)
        self.cpe_step = (
            cpe_step(cpe, trainer.online, loss=k.cpe_loss, apply=k.cpe_apply, sync=cpe_sync)
            if cpe is not None
            else None
        )

    @property
    def loss(self) -> CompiledLoss | None:
        return self.kernels.loss

    @property
    def cpe_loss(self) -> CompiledCpeLoss | None:
        return self.kernels.cpe_loss

    def __call__(self, batches: Sequence[Rows]) -> None:
        with step_precision(self.precision, self.device):
            self.loss_sum += DQNLoss.mean(self.q_step(batches)).total
            if self.cpe_step is not None:
                self.cpe_step(batches[:1])

    def describe(self) -> str:
        """The step's arithmetic, e.g. "bf16 autocast, loss compiled by Inductor"."""
        parts = [{"fp32": "fp32", "tf32": "tf32 matmuls", "bf16": "bf16 autocast"}[self.precision]]
        k = self.kernels
        for part in (k.loss, k.cpe_loss, k.apply, k.cpe_apply):
            if part is not None:
                parts.append(part.describe())
        return ", ".join(parts)

    def compiled_updates(self) -> list[CompiledApply]:
        """The compiled optimizer steps (`training.compile` under a graph), if any."""
        return [a for a in (self.kernels.apply, self.kernels.cpe_apply) if a is not None]

    def modules(self) -> list[nn.Module]:
        """Every module the step changes."""
        return self.trainer.modules() + (self.cpe.modules() if self.cpe is not None else [])

    def optimizers(self) -> list[torch.optim.Optimizer]:
        opts = [self.trainer.optimizer]
        if self.cpe is not None:
            opts.append(self.cpe.optimizer)
        return opts


def build_update(
    trainer: QLearningTrainer[Any],
    cpe: CpeModelTrainer | None,
    loss_sum: Tensor,
    *,
    precision: Precision,
    kernels: StepKernels | None = None,
    averaging: Averaging | None = None,
) -> Update:
    """The step of `trainer` (and the CPE models `cpe`) as the plan chose it: `kernels`, the
    compiled parts (default: none); `averaging`, the step's own gradient average over the
    ranks (a captured step over several), else the DDP wrappers' hooks reduce."""
    return Update(
        trainer,
        cpe,
        loss_sum,
        precision=precision,
        kernels=kernels or StepKernels(),
        q_sync=averaging.over(trainer.parameters()) if averaging is not None else None,
        cpe_sync=(
            averaging.over(cpe.parameters()) if averaging is not None and cpe is not None else None
        ),
    )
