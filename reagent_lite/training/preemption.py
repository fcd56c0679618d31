"""Stopping on SIGTERM / SIGINT without losing the epoch: schedulers (Slurm, Kubernetes,
spot instances) send SIGTERM and, after a grace period, SIGKILL.

`StopSignals` replaces the handlers of both signals while a rank works. Before training
starts a signal stops the process at once (there is nothing to save); during training it
only records the signal: the loop finishes its optimizer step, the ranks agree at the
next check (`resuming.poll`: one MAX all-reduce every `stop_check_every_steps` steps,
which also carries rank 0's clock-based checkpoint decision), rank 0 writes a checkpoint
at that step, and every rank raises `Preempted` — exit code 128 + the signal (143 for
SIGTERM, 130 for SIGINT), one line that names `--resume`. A repeated signal changes
nothing: the checkpoint being written is the point.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ReagentLiteError
from reagent_lite.training.steps import StepRunner

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(ReagentLiteError):
    """The run stopped on a signal; a checkpoint to `--resume` from was written."""

    exit_code = 143

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """SIGTERM / SIGINT handlers of one rank; `signum` is the first signal received (0:
    none). `deferring` (set by the loop while it trains) turns an immediate stop into a
    recorded one."""

    def __init__(self) -> None:
        self.signum = 0
        self.deferring = False
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            return  # already stopping: let the checkpoint finish
        self.signum = signum
        if not self.deferring:
            raise Preempted(
                f"stopped by {signal_name(signum)} before training started; nothing new to "
                "save (run the same command with --resume to continue from the last "
                "checkpoint, if any)",
                signum,
            )


class Cadence:
    """When to write a mid-epoch checkpoint: every `every_steps` optimizer steps (all ranks
    know the step count) and/or `every_minutes` (rank 0's clock, shared at the checks)."""

    def __init__(self, every_steps: int, every_minutes: float) -> None:
        self.every_steps = every_steps
        self.every_s = every_minutes * 60.0
        self.last = time.monotonic()

    def steps_due(self, global_step: int) -> bool:
        return bool(self.every_steps) and global_step % self.every_steps == 0

    def clock_due(self) -> bool:
        return self.every_s > 0 and time.monotonic() - self.last >= self.every_s

    def written(self) -> None:
        self.last = time.monotonic()


class StopPoints:
    """After each optimizer step, whether this is a point to checkpoint and/or stop, as
    every rank decides together; and the per-rank part of a mid-epoch checkpoint."""

    def __init__(
        self,
        ctx: DistContext,
        stop: StopSignals,
        *,
        every_steps: int,
        every_minutes: float,
        check_every_steps: int,
    ) -> None:
        self.ctx = ctx
        self.stop = stop
        self.cadence = Cadence(every_steps, every_minutes)
        # One process needs no agreement: it looks at its flag after every step.
        self.check_every = 1 if ctx.world_size == 1 else check_every_steps
        self._lagged = LaggedMax(ctx) if ctx.world_size > 1 and ctx.device.type == "cuda" else None

    def poll(self, done: int, global_step: int) -> tuple[bool, int]:
        """(checkpoint due, signal to stop on or 0) after step `done` of the epoch."""
        due = self.cadence.steps_due(global_step)
        if done % self.check_every:
            return due, 0
        clock = self.ctx.is_rank_zero and self.cadence.clock_due()
        flags = [self.stop.signum, int(clock)]
        if self._lagged is not None:
            signum, clock_due = self._lagged.exchange(flags)
        else:
            signum, clock_due = self.ctx.all_reduce_max(flags)
        return due or bool(clock_due), signum

    def ranks_state(self, runner: StepRunner) -> list[dict[str, Any]]:
        """Every rank's RNG state and partial loss sum (a collective; on rank 0 the list)."""
        device = self.ctx.device
        mine: dict[str, Any] = {"rng": torch.get_rng_state(), "loss_sum": float(runner.loss_sum)}
        if device.type == "cuda":
            mine["cuda_rng"] = torch.cuda.get_rng_state(device)
        ranks: list[dict[str, Any]] = self.ctx.all_gather_object(mine)
        return ranks

    def resume(self, position: dict[str, Any], runner: StepRunner) -> int:
        """This rank's batch stream, RNG and loss sum as they were after the step of a
        mid-epoch checkpoint's `position`, after `begin_epoch`; returns that step."""
        done = int(position["steps_done"])
        runner.skip(done)
        mine = position["ranks"][self.ctx.rank]
        torch.set_rng_state(mine["rng"])
        if self.ctx.device.type == "cuda" and "cuda_rng" in mine:
            torch.cuda.set_rng_state(mine["cuda_rng"], self.ctx.device)
        runner.loss_sum.fill_(mine["loss_sum"])
        return done


class LaggedMax:
    """The stop check's all-reduce on GPUs, without draining the launch queue.

    Reading a collective's result on the host right away would wait for every step queued
    before it, leaving the GPU idle until the host queues the next ones — every
    `stop_check_every_steps` steps. Instead each check queues its all-reduce and a copy
    into pinned host memory, and acts on the previous check's result, which the GPU
    reached long ago (waiting on its event at worst keeps the host one interval ahead).
    Every rank reads the same exchange at the same check, so they still decide together,
    one interval later."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self._pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any] | None = None

    def exchange(self, values: list[int]) -> list[int]:
        """Queues the MAX all-reduce of `values` on the current stream; returns the previous
        call's result (zeros on the first call)."""
        result = [0] * len(values)
        if self._pending is not None:
            _, _, host_out, done = self._pending
            done.synchronize()
            result = [int(v) for v in host_out.tolist()]
        device = self.ctx.device
        host_in = torch.tensor(values, dtype=torch.int64).pin_memory()
        host_out = torch.empty_like(host_in).pin_memory()
        flags = host_in.to(device, non_blocking=True)
        self.ctx.all_reduce_max_(flags)
        host_out.copy_(flags, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        self._pending = (host_in, flags, host_out, event)
        return result


def stopped(signum: int, epoch: int, done: int, global_step: int, path: Path | None) -> Preempted:
    where = f"after step {done} of epoch {epoch + 1} (global step {global_step})"
    saved = f"checkpoint {path}" if path else "rank 0 wrote the checkpoint"
    stop = Preempted(
        f"stopped by {signal_name(signum)} {where}; {saved}; run the same command with "
        "--resume to continue from there",
        signum,
    )
    stop.agreed_by_all_ranks = True  # every rank raises it after the same step
    return stop
