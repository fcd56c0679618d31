"""The training step as `Workflow.train` runs it: a batch source, the plain step, and
optionally the CUDA graph that replays it.

* `Update` is the step the factory (`update.build_update`) composes: the Q-network's
  optimizer step over a step's micro-batches and the CPE side models' over the first,
  the loss summed into a device scalar (no host synchronisation).
* A batch source (`sources.py`) hands out the micro-batches: resident rows gathered by
  index on the device, chunks streamed from host memory, or windows streamed from disk.
* `StepRunner.step()` is the step called on the source's next batches (eager) or,
  on CUDA with `cuda_graphs: true`, one replay of the step captured by `graphs.GraphStep`;
  if capture is impossible or fails the runner says why and stays eager.

`plan_steps` fixes the steps per epoch and the sampler; `build_step_runner` picks the
source and the step once, from the run's settings, and `StepRunner.plan()` names every
choice it took (`step_plan.py`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import torch

from reagent_lite.config import BaseWorkflowConfig
from reagent_lite.config.models import Precision, StepPlanParameters, StepVariants
from reagent_lite.data.disk_stream import DiskShardStream
from reagent_lite.data.rows import Rows
from reagent_lite.data.sampler import EpochSampler, UnionSampler
from reagent_lite.distributed.context import DistContext
from reagent_lite.evaluation.cpe_models import CpeModelTrainer
from reagent_lite.torch_private import set_autograd_cache
from reagent_lite.trainers.common import QLearningTrainer
from reagent_lite.trainers.optim import OptimizerKernel
from reagent_lite.training.compiled import forward_options
from reagent_lite.training.graphs import GraphStep
from reagent_lite.training.host_memory import HostMemory
from reagent_lite.training.sources import (
    BatchSource,
    DiskStreamed,
    HostStreamed,
    ResidentRows,
    StreamedRows,
    training_columns,
)
from reagent_lite.training.step_plan import StepPlan, StepShape, plan_text, step_shape
from reagent_lite.training.update import Averaging, StepKernels, Update, build_update

log = logging.getLogger("reagent_lite")

# Rows per streamed chunk (rounded to whole steps): large enough that the per-chunk
# handoff is noise, small enough that a few chunks fit any GPU next to the model.
DEFAULT_CHUNK_ROWS = 1 << 18


class StepRunner:
    """Runs the optimizer steps of one rank: `begin_epoch(epoch)`, then `step()`
    `steps_per_epoch` times; `loss_sum` (a device scalar) sums the epoch's losses."""

    def __init__(
        self,
        source: BatchSource,
        update: Update,
        graph: GraphStep | None,
        why_eager: str,
        plan: StepPlan,
        kernel: OptimizerKernel,
    ) -> None:
        self.source = source
        self.kernel = kernel
        self.update = update
        self.step_plan = plan
        self.loss_sum = update.loss_sum
        self.step_rows = source.step_rows
        self.why_eager = why_eager
        self.graph: GraphStep | None = None
        self._to_capture = graph  # captured at the first `begin_epoch`

    @property
    def mode(self) -> str:
        return "eager" if self.graph is None else "graph"

    @property
    def streamed(self) -> bool:
        return isinstance(self.source, StreamedRows)

    def describe(self) -> str:
        if self.graph is not None:
            mode = self.graph.describe()
        else:
            mode = "eager" + (f" ({self.why_eager})" if self.why_eager else "")
            if self.kernel.capturable:  # built for a graph that was not captured
                mode += f", optimizer as built for the graph ({self.kernel.describe()})"
        return (
            f"training step: {mode}, {self.update.describe()}; data {self.source.describe()}; "
            + plan_text(self.plan())
        )

    def plan(self) -> dict[str, str]:
        """Every choice the step took, "on" or "off (why)" (`step_plan.StepPlan.choices`):
        final once the first epoch has run its first step (capture, compilation)."""
        loss = self.update.loss
        return self.step_plan.choices(
            self.update.trainer.online,
            compile_failed=loss.failed if loss is not None else "",
            graph=self.graph is not None,
            why_eager=self.why_eager,
        )

    def unmet(self) -> list[str]:
        """A warning for each choice asked `on` and not taken."""
        return self.step_plan.unmet(self.plan())

    def begin_epoch(self, epoch: int) -> None:
        self.source.begin_epoch(epoch)
        if self._to_capture is not None:
            graph, self._to_capture = self._to_capture, None
            self.why_eager = graph.capture()
            if not self.why_eager:
                self.graph = graph
        self.loss_sum.zero_()
        if self.graph is not None:
            self.graph.begin_epoch()

    def step(self) -> None:
        if self.graph is not None:
            self.graph()
        else:
            self.update(self.source.batches())

    def skip(self, steps: int) -> None:
        """Moves the epoch's batch stream past its first `steps` steps without training
        them (a run resumed from a mid-epoch checkpoint), after `begin_epoch`."""
        for _ in range(steps):
            if self.graph is not None:
                self.source.stage()
                assert self.source.static_rows is not None
                self.source.static_rows.pos.add_(1)  # what the replay would have advanced
            else:
                self.source.batches()

    def close(self) -> None:
        """Ends the epoch's chunk stream, if any (joins its worker thread); idempotent."""
        self.source.close()

    def release(self) -> None:
        """The end of training, however it ends: the chunk stream closed and the captured
        graph destroyed (`GraphStep.release`); idempotent."""
        self.close()
        if self.graph is not None:  # only a captured step holds a CUDA graph
            self.graph.release()
        self.graph = self._to_capture = None


def build_step_runner(
    *,
    trainer: QLearningTrainer[Any],
    cpe: CpeModelTrainer | None,
    ctx: DistContext,
    data: Rows,
    sampler: EpochSampler,
    steps_per_epoch: int,
    minibatches_per_step: int,
    minibatch_size: int,
    cuda_graphs: bool,
    resident: bool,
    precision: Precision,
    compiled: bool,
    step_variants: StepVariants,
    step_plan: StepPlanParameters,
    host_memory: HostMemory,
    disk: DiskShardStream | None = None,
    epochs: int | None = None,
    shape: StepShape | None = None,
) -> StepRunner:
    """The runner of a run's settings. `data`: the shard (with `disk`, the stream of
    `stream_from_disk`, only its normalized sample: a column template); `resident`:
    `device_resident_data`; `minibatch_size`: the sampler's batch (the micro-batch, or W
    of them when emulating W ranks); `epochs`: the run's epochs (a streamed source reads
    no chunk past the last); `precision`, `compiled`, `step_variants`, `step_plan`:
    `training.precision`, `training.compile`, `training.step_variants`,
    `training.step_plan` (the deprecated switches mapped on: `step_plan.asked`), the forms
    the compiled losses trace being decided here, once; `host_memory`: what setup did to
    malloc (`host_memory.keep_freed_memory`), for the plan's record; `shape`: what the step
    is built for (`step_plan.step_shape`), decided by the caller before the trainers'
    optimizers were built (by default here, for trainers whose optimizer is the eager
    one: tests and tools)."""
    device = ctx.device
    columns = training_columns(data)
    mps, batch = minibatches_per_step, minibatch_size
    step_rows = mps * batch
    chunk_rows = max(1, DEFAULT_CHUNK_ROWS // step_rows) * step_rows
    source: BatchSource
    if disk is not None:
        source = DiskStreamed(disk, columns, device, chunk_rows, mps, batch, epochs)
    elif device.type == "cuda" and not resident:
        source = HostStreamed(columns, sampler, device, chunk_rows, mps, batch, epochs)
    else:
        source = ResidentRows(columns, data.pack, sampler, steps_per_epoch, mps, batch)
    options = forward_options(step_variants, device, precision)
    if shape is None:
        shape = step_shape(
            device,
            cuda_graphs=cuda_graphs,
            compile=compiled,
            world_size=ctx.world_size,
            backend=ctx.backend,
            optimizer=trainer.hp.optimizer,
            data_parallel=isinstance(trainer.q_net, torch.nn.DataParallel),
        )
        capturable = all(g.get("capturable") for g in trainer.optimizer.param_groups)
        shape = fit_to_optimizer(shape, capturable=capturable, device=device)
    why_eager, captured = shape.why_eager, shape.graph
    plan = StepPlan(
        device=device,
        precision=precision,
        compile=compiled,
        cuda_graphs=cuda_graphs,
        variants=step_variants,
        plan=step_plan,
        options=options,
        host_memory=host_memory,
    )
    if compiled:  # process-wide, read when the parts below first compile
        set_autograd_cache(not plan.compile_cache_blocker())
    # The compiled parts once, shared by the eager step and the captured one.
    kernels = StepKernels.build(
        trainer, cpe, compile=compiled, compiled_update=shape.compiled_update, options=options
    )
    loss_sum = torch.zeros((), device=device)
    update = build_update(trainer, cpe, loss_sum, precision=precision, kernels=kernels)
    graph = None
    if captured:
        # Over several ranks the captured step averages its gradients itself; the eager
        # step (and the fallback, should capture fail) leaves that to DDP's hooks.
        averaging = Averaging(ctx) if shape.average_in_graph else None
        graph_update = (
            build_update(
                trainer, cpe, loss_sum, precision=precision, kernels=kernels, averaging=averaging
            )
            if averaging is not None
            else update
        )
        graph = GraphStep(graph_update, source, ctx)
    return StepRunner(source, update, graph, why_eager, plan, shape.kernel)


def plan_steps(
    cfg: BaseWorkflowConfig, ctx: DistContext, local_rows: int, emulated: list[int] | None
) -> tuple[int, EpochSampler]:
    """Optimizer steps per epoch — the same on every rank: `training.steps_per_epoch`, or
    one pass over the largest shard — and this rank's sampler. `local_rows`: this rank's
    shard; `emulated`: the shards of the ranks emulated in this process, if any."""
    micro, mps = cfg.training.minibatch_size, cfg.training.minibatches_per_step
    sizes = emulated or ctx.all_gather_object(local_rows)
    steps = cfg.training.steps_per_epoch or max(1, math.ceil(max(sizes) / (micro * mps)))
    device = ctx.device if cfg.device_resident_data else "cpu"
    sampler: EpochSampler
    if emulated is not None:
        log.info("emulating world size %d in one process", len(sizes))
        sampler = UnionSampler(sizes, micro, steps * mps, cfg.seed, device)
    else:
        sampler = EpochSampler(local_rows, micro, steps * mps, cfg.seed, ctx.rank, device=device)
    if ctx.is_rank_zero:
        log.info(
            "world size %d, shard rows %s, global batch %d (%d per process × %d micro-batches), "
            "%d optimizer steps per epoch",
            ctx.world_size,
            sizes,
            micro * mps * len(sizes),
            micro,
            mps,
            steps,
        )
        warn_few_steps(steps, max(sizes), micro * mps, bool(cfg.training.steps_per_epoch))
    return steps, sampler


# Fewer optimizer steps per epoch than this and an epoch barely trains: per-epoch
# evaluation, selection and checkpoints then outnumber the updates they judge.
FEW_STEPS = 10


def warn_few_steps(steps: int, rows: int, step_rows: int, fixed: bool) -> None:
    """Warns (once: `plan_steps` runs once per run, on rank 0 here) when an epoch has
    fewer than `FEW_STEPS` optimizer steps, naming the keys that change it."""
    if steps >= FEW_STEPS:
        return
    why = (
        f"training.steps_per_epoch is {steps}"
        if fixed
        else f"{rows} rows in the largest shard / {step_rows} rows per step"
    )
    log.warning(
        "only %d optimizer steps per epoch (%s): the model barely trains each epoch; "
        "lower training.minibatch_size (now %d rows per step) or set "
        "training.steps_per_epoch (e.g. %d)",
        steps,
        why,
        step_rows,
        FEW_STEPS * 10,
    )


def fit_to_optimizer(shape: StepShape, *, capturable: bool, device: torch.device) -> StepShape:
    """`shape` for a trainer whose optimizer was built before any plan (tests, tools: the
    eager kernel): a graph cannot capture a step of an optimizer that is not capturable,
    so such a step stays eager and says why."""
    if not shape.graph or capturable:
        return shape
    return replace(
        shape,
        graph=False,
        why_eager="the trainer's optimizer was built for eager steps (no step plan when it "
        "was built)",
        compiled_update=False,
        average_in_graph=False,
        kernel=OptimizerKernel.eager(device),
    )
