"""The training loop itself, one function that reads top to bottom: for each epoch its
optimizer steps (with the running-loss log, the mid-epoch checkpoints and the preemption
stop after a step), then the epoch's end. It carries a `TrainState` from epoch to epoch and
returns the last; what it trains is the frozen `Run` setup built (`loop.Workflow`).
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from reagent_lite.training import resuming
from reagent_lite.training.epoch_end import as_float, end_epoch
from reagent_lite.training.preemption import StopPoints
from reagent_lite.training.run import Run
from reagent_lite.training.state import EpochRecord, TrainState
from reagent_lite.training.steps import StepRunner
from reagent_lite.training.verify import check_replicas, replica_digest, verify_every

log = logging.getLogger("reagent_lite")


def train_epochs(
    run: Run,
    state: TrainState,
    runner: StepRunner,
    stops: StopPoints,
    *,
    trained: nn.Module,
    steps_per_epoch: int,
) -> TrainState:
    """The loop: from `state` to the end of `run.cfg.epochs`; the state after the last
    epoch. `trained`: the network the steps train (the plain one, or its DDP wrapper)."""
    cfg, ctx = run.cfg, run.ctx
    replicas = ReplicaChecks(run)
    described = False
    while state.epoch < cfg.epochs:
        epoch = state.epoch
        # Dropout and other randomness: a pure function of (seed, epoch, rank), so a
        # resumed run draws exactly what an uninterrupted one would.
        torch.manual_seed(cfg.seed * 1_000_003 + epoch * 7919 + ctx.rank)
        trained.train()
        # Sets the epoch's batch stream (and, the first time on CUDA, captures the step).
        runner.begin_epoch(epoch)
        first = 0
        if state.position is not None:  # resumed mid-epoch
            first = stops.resume(state.position, runner)
            state = replace(state, position=None)
        if not described and ctx.is_rank_zero:
            log.info("%s", runner.describe())
            for unmet in runner.unmet():
                log.warning("%s", unmet)
        bar = progress(run, epoch, first, steps_per_epoch)
        _sync(ctx.device)
        # All ranks start the clock together: otherwise the others' first all-reduce
        # waits out rank 0's evaluation of the last epoch, counted as their training time.
        ctx.barrier()
        # The rows' wait counts from here: a resumed epoch's skipped steps waited before.
        waited_before = runner.source.waited
        start = time.perf_counter()
        global_step = state.global_step
        # The hot path: no host sync per step (the bar is host-only; logging every
        # `log_every_steps` reads the loss, which is the one sync).
        for step in range(first, steps_per_epoch):
            runner.step()
            global_step += 1
            replicas.after_step(global_step)
            bar.update(1)
            if cfg.log_every_steps and (step + 1) % cfg.log_every_steps == 0:
                log_step(run, bar, epoch, step + 1, global_step, runner.loss_sum / (step + 1))
            resuming.poll(run, stops, state, step + 1, global_step, runner)
        bar.close()
        _sync(ctx.device)
        elapsed = time.perf_counter() - start
        state = end_epoch(
            run,
            state,
            steps_per_epoch=steps_per_epoch,
            steps_run=steps_per_epoch - first,
            global_step=global_step,
            loss_sum=runner.loss_sum,
            elapsed=elapsed,
            extra=_extra(runner, described, waited_before),
        )
        described = True
    replicas.finish(state.global_step)
    ctx.barrier()
    return state


def _extra(runner: StepRunner, described: bool, waited_before: float | None) -> EpochRecord:
    """The epoch record's fields from the step runner: the seconds this rank's training
    thread waited for streamed rows while the epoch was timed (`data_wait_s`: since
    `waited_before`), and in this process's first epoch record the step plan (final after
    a full epoch)."""
    extra: EpochRecord = {}
    if runner.source.waited is not None:
        extra["data_wait_s"] = runner.source.waited - (waited_before or 0.0)
    if not described:
        extra["step_plan"] = runner.plan()
    return extra


class ReplicaChecks:
    """The debug switch of training/verify.py: every N steps all ranks compare digests of
    their parameters. Read once, so the hot loop only tests an int."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.every = verify_every()
        self.done = 0

    def after_step(self, global_step: int) -> None:
        if self.every and global_step % self.every == 0:
            self._check(global_step)

    def _check(self, global_step: int) -> None:
        digest = replica_digest(self.run.q_net, self.run.trainer.target)
        check_replicas(self.run.ctx, global_step, digest)
        self.done += 1

    def finish(self, global_step: int) -> None:
        if not self.every:
            return
        self._check(global_step)
        if self.run.ctx.is_rank_zero:
            log.info(
                "replica check: all %d ranks held identical parameters at %d checks "
                "(every %d steps, last after step %d)",
                self.run.ctx.world_size,
                self.done,
                self.every,
                global_step,
            )


def progress(run: Run, epoch: int, first: int, steps: int) -> tqdm[Any]:
    """The epoch's progress bar: `\\r` frames only on rank 0's terminal; in a file (Slurm,
    CI) a log line instead, and `log_step`'s lines."""
    epochs, ctx = run.cfg.epochs, run.ctx
    bar: tqdm[Any] = tqdm(
        initial=first,
        total=steps,
        desc=f"epoch {epoch + 1}/{epochs}",
        disable=not (ctx.is_rank_zero and _stderr_is_terminal()),
        mininterval=1.0,
        leave=False,
    )
    if ctx.is_rank_zero and bar.disable:
        log.info("epoch %d/%d: %d optimizer steps", epoch + 1, epochs, steps)
    return bar


def log_step(
    run: Run, bar: tqdm[Any], epoch: int, step: int, global_step: int, mean_loss: Tensor
) -> None:
    """The epoch's running loss so far (global): in metrics.jsonl, and in the log or on
    the bar."""
    loss = as_float(run.ctx.all_reduce_mean(mean_loss.detach().clone()))
    if run.metrics is not None:
        run.metrics.write({"epoch": epoch, "steps": global_step, "loss": loss})
    if bar.disable:
        log.info(
            "epoch %d/%d step %d/%d: running loss %.6g",
            epoch + 1,
            run.cfg.epochs,
            step,
            bar.total,
            loss,
        )
    else:
        bar.set_postfix(loss=f"{loss:.4g}", refresh=False)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
