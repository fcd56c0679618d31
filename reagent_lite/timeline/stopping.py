"""SIGTERM and Ctrl-C stop the timeline command cleanly: exit 143 / 130, one line.

Without a handler SIGTERM ended the process where it stood, leaving the hidden temporary
outputs and the spill directory behind, and Ctrl-C printed a traceback. `stop_on_signals`
turns the first signal into an exception in the main thread (a wait on the sorting
thread is interrupted; DuckDB interrupts its query), so every `finally` on the way out
runs: the temporary outputs are discarded, the sorting thread is stopped and joined, the
spill directory is removed. Further signals are ignored while that cleanup runs, so a
second Ctrl-C cannot cut it short. The exit codes are the workflows' (128 + the signal).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from reagent_lite.errors import ReagentLiteError

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(ReagentLiteError):
    """The command stopped on a signal; nothing was written."""

    def __init__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"stopped by {name}: no table written (temporary outputs and the spill "
            "directory removed)"
        )
        self.exit_code = 128 + int(signum)


class Signals:
    """The first signal received (0: none)."""

    signum: int = 0


@contextmanager
def stop_on_signals() -> Iterator[Signals]:
    """SIGTERM / SIGINT raise `Interrupted` in the main thread while inside (the first
    one; later ones are ignored until the handlers are restored on the way out)."""
    received = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield received  # only the main thread can have handlers: leave them alone
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if received.signum:
            return  # cleaning up after the first one
        received.signum = signum
        raise Interrupted(signum)

    previous: dict[int, Any] = {sig: signal.signal(sig, handle) for sig in SIGNALS}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
