"""Stopping on SIGTERM / SIGINT without losing the epoch: schedulers (Slurm, Kubernetes,
spot instances) send SIGTERM and, after a grace period, SIGKILL.

`StopSignals` replaces the handlers of both signals while a rank works. Before training
starts a signal stops the process at once (there is nothing to save); during training it
only records the signal: the loop finishes its optimizer step, the ranks agree at the
next check (`Workflow._poll`: one MAX all-reduce every `stop_check_every_steps` steps,
which also carries rank 0's clock-based checkpoint decision), rank 0 writes a checkpoint
at that step, and every rank raises `Preempted` — exit code 128 + the signal (143 for
SIGTERM, 130 for SIGINT), one line that names `--resume`. A repeated signal changes
nothing: the checkpoint being written is the point.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType
from typing import Any

from reagent_lite.errors import ReagentLiteError

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
