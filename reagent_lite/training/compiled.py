"""`training.compile`: the trainer's loss compiled by Inductor, as a drop-in loss function.

`CompiledLoss(trainer, options)` is called as `trainer.compute_loss(batch, net=net)` is and returns
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
arithmetic — Adam's multi-tensor (`foreach`) formulation, which the step plan builds the
optimizer in for this (`step_plan.step_shape`), and the lerp — into kernels spread over
the whole GPU. Only under a graph: there the learning rate is a device tensor (built so),
so the per-epoch decay does not recompile, and the step counters live on the device.

The compiled losses trace the networks' variants (`models.traced`): the same parameters,
with the faster forms of `ForwardOptions`, which `forward_options` decides once from
`training.step_variants`, the device and the precision; the eager losses (and the
fallback below) run the plain forward. The step's log line names the forms that change
something in its networks (`ForwardOptions.names`).

If compilation fails (no C++ compiler for the CPU backend, an unsupported operator) the
loss (the update) falls back to eager for the rest of the run, with a warning; the
optimizer stays as built (multi-tensor, capturable Adam runs eagerly too).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor, nn

from reagent_lite.config.models import Precision, StepVariants
from reagent_lite.data.rows import Rows
from reagent_lite.evaluation.cpe_models import CpeModelTrainer
from reagent_lite.models import candidate_layer
from reagent_lite.models.traced import ForwardOptions, traced_variant
from reagent_lite.trainers.common import DQNLoss, QLearningTrainer, unwrap
from reagent_lite.training.sources import LazyBatch

log = logging.getLogger("reagent_lite")

# The widest output layer traced as a product and a sum. Measured faster on H100s
# (benchmarks/RESULTS.md) with 1 and 2 outputs (parametric, CartPole's dqn) on one GPU and,
# on one host, on four; the bound of 4 is a guess between those and the wider layers whose
# matrix product is not so thin.
SUM_OUTPUTS = 4
# A row of a TF32 product's first layer is padded to this (`models.traced`).
ALIGN_BYTES = 16
# Why bf16 products are not padded: the same-run A/B (benchmarks/RESULTS.md, "A first layer
# of 14 features padded to 16 under tf32 / bf16") gave dqn +2.6% and parametric ±0%, under
# the 5% a speed-up must earn; tf32 gave +13%. The step plan names it in its choice.
BF16_NOT_PADDED = "bf16 products are not padded: measured under 5% faster"


def forward_options(
    variants: StepVariants, device: torch.device, precision: Precision
) -> ForwardOptions:
    """The forms a compiled step on `device` in `precision` traces (`models.traced`), as
    `training.step_variants` asks; `auto` is what was measured faster: padding for tf32
    products (CUDA only), the sum everywhere, the kernel where Triton runs (`on`: the
    same, the step plan warning where it cannot run)."""
    cuda = device.type == "cuda"
    pad = variants.pad_first_layer != "off"
    # TF32 products only: float32 on tensor cores is a CUDA setting (a CPU step in tf32 is
    # IEEE fp32, whose products keep their maths bit for bit); bf16: `BF16_NOT_PADDED`.
    tf32 = precision == "tf32" and cuda
    return ForwardOptions(
        row_align=ALIGN_BYTES // 4 if pad and tf32 else 0,
        sum_outputs=SUM_OUTPUTS if variants.output_sum == "auto" else 0,
        candidate_kernel=variants.candidate_kernel != "off" and candidate_layer.available(device),
    )


_T = TypeVar("_T")
_Out = TypeVar("_Out")
# What the compiled Q-loss returns: the fields of `DQNLoss` (td, cql, total, mean Q).
LossParts = tuple[Tensor, Tensor, Tensor, Tensor]


def traced_view(trainer: _T, options: ForwardOptions, memo: dict[int, nn.Module]) -> _T:
    """A shallow copy of `trainer` whose networks are their variants under `options`: what
    the compiled loss traces `compute_loss` on. `trainer` itself keeps its networks; a
    DDP wrapper is kept as it is (its forward is the eager loss's)."""
    view = copy.copy(trainer)
    for name, value in vars(trainer).items():
        if isinstance(value, nn.Module) and unwrap(value) is value:
            setattr(view, name, traced_variant(value, options, memo))
    return view


def describe_forms(options: ForwardOptions, net: nn.Module) -> str:
    """The forms `options` take in `net`, for the step's log line."""
    return ", ".join(options.names(net)) or "plain forward"


class _CompileOnce:
    """Runs a compiled function, the first call compiling it: a failure there (compilation
    problems) means the eager function for the rest of the run, with a warning; `what`
    names the function in the log."""

    what = "loss"

    def __init__(self) -> None:
        self.failed = ""
        self.compile_s = 0.0
        self._calls = 0

    def give_up(self, why: str) -> None:
        """The eager function from now on, `why` being the reason to show (e.g. another
        rank's compilation failed: every rank must run the same arithmetic)."""
        if not self.failed:
            self.failed = why

    def _run(self, compiled: Callable[[], _Out], eager: Callable[[], _Out]) -> _Out:
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
            return eager()
        self._calls += 1
        if first:
            self.compile_s = time.perf_counter() - start
            log.info("training.compile: %s compiled in %.1f s", self.what, self.compile_s)
        return out


class _Compiled(_CompileOnce, Generic[_Out]):
    """A loss function of (micro-batch, modules...) compiled once per run: the batch goes in
    as its source columns and row index (module notes); the trace runs on the modules'
    variants under `options`, the eager function on the modules."""

    def __init__(self, options: ForwardOptions) -> None:
        super().__init__()
        self.options = options
        self._memo: dict[int, nn.Module] = {}  # plain module id → its variant
        self._compiled: Callable[..., _Out] = torch.compile(self._traced, dynamic=False)

    def _eager(self, batch: LazyBatch, *modules: nn.Module) -> _Out:
        raise NotImplementedError

    def _traced_loss(self, rows: Rows, *modules: nn.Module) -> _Out:
        raise NotImplementedError

    def _traced(self, columns: dict[str, Tensor], idx: Tensor | None, *modules: nn.Module) -> _Out:
        rows = Rows(
            columns if idx is None else {k: v.index_select(0, idx) for k, v in columns.items()}
        )
        return self._traced_loss(rows, *modules)

    def _call(self, batch: LazyBatch, *modules: nn.Module) -> _Out:
        columns, idx = batch.parts()
        variants = [traced_variant(m, self.options, self._memo) for m in modules]
        return self._run(
            lambda: self._compiled(columns, idx, *variants), lambda: self._eager(batch, *modules)
        )


class CompiledLoss(_Compiled[LossParts]):
    """`trainer.compute_loss`, compiled once per run (see the module notes)."""

    def __init__(self, trainer: QLearningTrainer[Any], options: ForwardOptions) -> None:
        self.trainer = trainer
        super().__init__(options)
        self._view = traced_view(trainer, options, self._memo)

    def _eager(self, batch: LazyBatch, *modules: nn.Module) -> LossParts:
        loss = self.trainer.compute_loss(batch, net=modules[0])
        return loss.td_loss, loss.cql_loss, loss.total, loss.mean_q

    def _traced_loss(self, rows: Rows, *modules: nn.Module) -> LossParts:
        loss = self._view.compute_loss(rows, net=modules[0])
        return loss.td_loss, loss.cql_loss, loss.total, loss.mean_q

    def __call__(self, batch: LazyBatch, net: nn.Module) -> DQNLoss:
        if self.failed or net is not self.trainer.online:
            return self.trainer.compute_loss(batch, net=net)
        return DQNLoss(*self._call(batch, net))

    def describe(self) -> str:
        if self.failed:
            return f"{self.failed}, eager loss"
        forms = describe_forms(self.options, self.trainer.online)
        return f"loss compiled by Inductor ({forms})"


class CompiledCpeLoss(_Compiled[Tensor]):
    """The CPE side models' `compute_loss` (reward and policy-value models: the
    next-state policy, the target value and both regressions), compiled the same way."""

    what = "CPE models' loss"

    def __init__(self, cpe: CpeModelTrainer, options: ForwardOptions) -> None:
        self.cpe = cpe
        super().__init__(options)
        self._view = traced_view(cpe, options, self._memo)

    def _eager(self, batch: LazyBatch, *modules: nn.Module) -> Tensor:
        return self.cpe.compute_loss(batch, modules[0], modules[1])

    def _traced_loss(self, rows: Rows, *modules: nn.Module) -> Tensor:
        return self._view.compute_loss(rows, modules[0], modules[1])

    def __call__(self, batch: LazyBatch, q_net: nn.Module, nets: nn.Module) -> Tensor:
        if self.failed or nets is not self.cpe.plain:  # a DDP wrapper: its hooks reduce
            return self.cpe.compute_loss(batch, q_net, nets)
        return self._call(batch, q_net, nets)

    def describe(self) -> str:
        if self.failed:
            return "CPE models' loss eager"
        return f"CPE models' loss compiled ({describe_forms(self.options, self.cpe.plain)})"


class CompiledApply(_CompileOnce):
    """A trainer's `apply_update` (the optimizer step, then a soft target update) —
    `optimizer` being the one it steps, built in the multi-tensor form for this
    (`step_plan.step_shape`) —, compiled once per run for a captured CUDA graph (module
    notes); after a compile failure, the eager update with the optimizer as built."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, apply_update: Callable[[], None], what: str
    ) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.apply_update = apply_update
        self.what = what
        self._compiled: Callable[[], None] = torch.compile(apply_update, dynamic=False)

    def __call__(self) -> None:
        self._run(self._compiled, self.apply_update)

    def describe(self) -> str:
        if self.failed:
            return f"{self.what} eager, optimizer as built ({self.failed})"
        return f"{self.what} compiled"
