"""The plain training step, `Update`: what an eager step runs and a CUDA graph captures.

Kept apart from the step runner (`steps.py`) and the graph wrapper (`graphs.py`), which
both use it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from reagent_lite.config.models import Precision, Switch
from reagent_lite.distributed.context import DistContext, GradAverage
from reagent_lite.evaluation.cpe_models import CpeModelTrainer
from reagent_lite.trainers.common import QLearningTrainer
from reagent_lite.training.compiled import CompiledApply, CompiledCpeLoss, CompiledLoss
from reagent_lite.training.precision import step_precision
from reagent_lite.training.sources import LazyBatch


class Update:
    """The plain step: `update(batches)` is one optimizer step of the Q-network over the
    `minibatches_per_step` micro-batches and one of the CPE side models over the first;
    the Q-network's loss is added to `loss_sum` (a device scalar). With `q_sync` /
    `cpe_sync` the trainers forward through their plain modules and average the gradients
    with them (`averaging_gradients`), which is what a captured step over several ranks
    runs; without, through their (DDP) wrappers.

    `precision` (`training.precision`) is the arithmetic of the whole step, both models'
    forwards and backwards (`precision.step_precision`); `loss` / `cpe_loss`, when given,
    replace the Q-trainer's and the CPE models' `compute_loss` (`training.compile`:
    `compiled.CompiledLoss`, `compiled.CompiledCpeLoss`); `apply`, when given, replaces the
    Q-trainer's optimizer step and soft target update, `cpe_apply` the CPE models' ones
    (`compiled.CompiledApply`)."""

    def __init__(
        self,
        trainer: QLearningTrainer[Any],
        cpe: CpeModelTrainer | None,
        loss_sum: Tensor,
        q_sync: GradAverage | None = None,
        cpe_sync: GradAverage | None = None,
        *,
        precision: Precision,
        loss: CompiledLoss | None = None,
        cpe_loss: CompiledCpeLoss | None = None,
        apply: CompiledApply | None = None,
        cpe_apply: CompiledApply | None = None,
    ) -> None:
        self.trainer = trainer
        self.cpe = cpe
        self.loss_sum = loss_sum
        self.q_sync = q_sync
        self.cpe_sync = cpe_sync
        self.precision = precision
        self.loss = loss
        self.cpe_loss = cpe_loss
        self.apply = apply
        self.cpe_apply = cpe_apply
        self.device = loss_sum.device

    def __call__(self, batches: list[LazyBatch]) -> None:
        with step_precision(self.precision, self.device):
            record = self.trainer.train_step(
                batches,
                grad_sync=self.q_sync,
                loss=self.loss,
                apply=self.apply,
                loss_scale=_loss_scale(self.q_sync),
            )
            self.loss_sum += record.total
            if self.cpe is not None:
                self.cpe.train_step(
                    batches[0],
                    self.trainer.online,
                    grad_sync=self.cpe_sync,
                    loss=self.cpe_loss,
                    apply=self.cpe_apply,
                    loss_scale=_loss_scale(self.cpe_sync),
                )

    def describe(self) -> str:
        """The step's arithmetic, e.g. "bf16 autocast, loss compiled by Inductor"."""
        parts = [{"fp32": "fp32", "tf32": "tf32 matmuls", "bf16": "bf16 autocast"}[self.precision]]
        if self.loss is not None:
            parts.append(self.loss.describe())
        if self.cpe_loss is not None and self.cpe is not None:
            parts.append(self.cpe_loss.describe())
        if self.apply is not None:
            parts.append(self.apply.describe())
        if self.cpe_apply is not None and self.cpe is not None:
            parts.append(self.cpe_apply.describe())
        return ", ".join(parts)

    def averaging_gradients(self, ctx: DistContext, peer_sum: Switch) -> Update:
        """This step with the gradients averaged over `ctx`'s ranks by the step itself: the
        backward carries the 1/world size (`GradAverage.loss_scale`), the all-reduce sums
        (`peer_sum`: `training.step_plan.p2p_allreduce`)."""
        cpe = self.cpe
        return Update(
            self.trainer,
            cpe,
            self.loss_sum,
            q_sync=ctx.gradient_average(
                self.trainer.online.parameters(), scaled_backward=True, peer_sum=peer_sum
            ),
            cpe_sync=(
                ctx.gradient_average(
                    cpe.plain.parameters(), scaled_backward=True, peer_sum=peer_sum
                )
                if cpe is not None
                else None
            ),
            precision=self.precision,
            loss=self.loss,
            cpe_loss=self.cpe_loss,
            apply=self.apply,
            cpe_apply=self.cpe_apply,
        )

    def compiled_updates(self) -> list[CompiledApply]:
        """The compiled optimizer steps (`training.compile` under a graph), if any."""
        return [a for a in (self.apply, self.cpe_apply if self.cpe else None) if a is not None]

    def modules(self) -> list[nn.Module]:
        """Every module the step changes."""
        return self.trainer.modules() + (self.cpe.modules() if self.cpe is not None else [])

    def optimizers(self) -> list[torch.optim.Optimizer]:
        opts = [self.trainer.optimizer]
        if self.cpe is not None:
            opts.append(self.cpe.optimizer)
        return opts


def _loss_scale(sync: GradAverage | None) -> float:
    return 1.0 if sync is None else sync.loss_scale
