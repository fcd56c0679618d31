"""The processes of a node with several local devices: one `spawn`-ed child per device,
each running `worker.run_worker`; signals to the launcher forwarded to them; the first
real failure (not a collective failing because of it) reported back through files and
re-raised here with its class, message and exit code; children ended when their launcher
or a sibling goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from reagent_lite.distributed.plan import LaunchPlan
from reagent_lite.distributed.threads import ThreadPlan
from reagent_lite.distributed.worker import WorkerError, WorkerFn, run_worker
from reagent_lite.errors import DistributedError, ReagentLiteError

log = logging.getLogger("reagent_lite")

# How long siblings of a failed worker get to exit on SIGTERM before SIGKILL.
_TERMINATE_GRACE_S = 5.0
# How long workers get to stop by themselves after a signal: siblings of a worker that
# stopped, and all of them after a signal to this launcher (then they are ended).
_PREEMPT_GRACE_S = 20.0


def spawn(
    plan: LaunchPlan,
    init_method: str,
    worker_fn: WorkerFn,
    args: tuple[Any, ...],
    collective_timeout_s: float,
    threads: ThreadPlan | None = None,
) -> None:
    """Runs one spawned child per local rank; CPU workers (`threads`) start with their
    thread count and OpenMP wait policy in their environment."""
    ctx = mp.get_context("spawn")
    # Children report failures through files, not pipes: a large traceback in a pipe nobody
    # reads yet would block the child's exit.
    report_dir = Path(tempfile.mkdtemp(prefix="reagent-lite-workers-"))
    procs = []
    try:
        for local_rank in range(plan.procs_per_node):
            p = ctx.Process(
                target=_child_main,
                args=(
                    plan,
                    local_rank,
                    init_method,
                    worker_fn,
                    args,
                    collective_timeout_s,
                    str(report_dir),
                    os.getpid(),
                    threads.threads if threads else None,
                ),
                name=f"reagent-lite-rank{plan.ranks[local_rank]}",
            )
            with _environment(threads.child_env() if threads else {}):
                p.start()
            procs.append(p)
        pending = {p.sentinel: p for p in procs}
        failed = False
        with _forward_signals(procs) as forwarded:
            while pending:
                ready = wait(list(pending), timeout=1.0)
                if not ready and forwarded and _overdue(forwarded[0]):
                    # The workers were told to stop and should have by now: whatever holds
                    # them (a hung collective, a driver call), the scheduler's SIGKILL is
                    # near. End them here, so that this node exits with the signal's code.
                    _terminate(list(pending.values()))
                    raise _not_stopped(forwarded[0][0])
                for sentinel in ready:
                    p = pending.pop(sentinel)  # type: ignore[arg-type]
                    p.join()
                    if p.exitcode != 0 and not failed:
                        failed = True
                        # Preempted (a signal here, or a stop its ranks agreed on after a
                        # signal on another node: exit 130 / 143): the workers stop together
                        # at an agreed step and rank 0 checkpoints; ending its siblings now
                        # could cut that short.
                        stopping = bool(forwarded) or p.exitcode in (128 + 2, 128 + 15)
                        _terminate(list(pending.values()), _PREEMPT_GRACE_S if stopping else 0)
                if failed:
                    break
        if failed:
            raise _child_failure(plan, procs, report_dir)
    finally:
        _terminate([p for p in procs if p.is_alive()])
        shutil.rmtree(report_dir, ignore_errors=True)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in this process's environment while a child starts (a spawned child
    inherits it, and its OpenMP reads it when the child imports torch, before any code
    of ours runs there); the launcher's own environment afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _forward_signals(procs: list[Any]) -> Iterator[list[tuple[int, float]]]:
    """While the workers run, SIGTERM / SIGINT sent to this launcher go to them (once each:
    a terminal's Ctrl-C reaches them directly too); yields the signals received, each with
    the monotonic time it came."""
    received: list[tuple[int, float]] = []

    def forward(signum: int, frame: Any) -> None:
        if received:
            return
        received.append((signum, time.monotonic()))
        for p in procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signum)

    if threading.current_thread() is not threading.main_thread():  # signal.signal refuses
        log.debug("launched from a non-main thread: SIGTERM/SIGINT are not forwarded")
        yield received
        return
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _overdue(signal_at: tuple[int, float]) -> bool:
    return time.monotonic() - signal_at[1] > _PREEMPT_GRACE_S


def _not_stopped(signum: int) -> ReagentLiteError:
    err = ReagentLiteError(
        f"the workers did not stop within {_PREEMPT_GRACE_S:g}s of "
        f"{signal.Signals(signum).name}; ended them. Run the same command with --resume to "
        "continue from the newest checkpoint"
    )
    err.exit_code = 128 + signum
    return err


def _terminate(procs: list[Any], wait_first_s: float = 0.0) -> None:
    end = time.monotonic() + wait_first_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + _TERMINATE_GRACE_S
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _child_main(
    plan: LaunchPlan,
    local_rank: int,
    init_method: str,
    worker_fn: WorkerFn,
    args: tuple[Any, ...],
    collective_timeout_s: float,
    report_dir: str,
    parent_pid: int,
    threads: int | None = None,
) -> None:
    _die_with_parent(parent_pid)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        run_worker(plan, local_rank, init_method, worker_fn, args, collective_timeout_s)
    except SystemExit as exc:
        if exc.code in (0, None):
            return
        raise
    except BaseException as exc:
        report: dict[str, Any] = {
            "time": getattr(exc, "_failed_at", time.time()),
            "echo": getattr(exc, "_echo", False),
            "rank": plan.ranks[local_rank],
            "module": type(exc).__module__,
            "qualname": type(exc).__qualname__,
            "message": str(exc),
            "exit_code": exc.exit_code if isinstance(exc, ReagentLiteError) else 1,
            "reagent": isinstance(exc, ReagentLiteError),
            "traceback": traceback.format_exc(),
        }
        tmp = Path(report_dir) / f".rank{local_rank}.tmp"
        tmp.write_bytes(pickle.dumps(report))
        os.replace(tmp, Path(report_dir) / f"rank{local_rank}.pkl")
        sys.exit(int(report["exit_code"]) or 1)


def _child_failure(plan: LaunchPlan, procs: list[Any], report_dir: Path) -> BaseException:
    reports = []
    for f in report_dir.glob("rank*.pkl"):
        with contextlib.suppress(Exception):
            reports.append(pickle.loads(f.read_bytes()))
    if not reports:
        dead = [(plan.ranks[i], p.exitcode) for i, p in enumerate(procs) if p.exitcode]
        rank, code = dead[0] if dead else (plan.ranks[0], None)
        how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
        return DistributedError(f"the process of rank {rank} died with {how}")
    # The cause is the first failure that is not a collective failing because of it.
    first = min(reports, key=lambda r: (r["echo"], r["time"]))
    if first["reagent"]:
        return _rebuild_reagent_error(first)
    return WorkerError(
        f"rank {first['rank']} failed: {first['qualname']}: {first['message']}",
        first["rank"],
        first["traceback"],
    )


def _rebuild_reagent_error(report: dict[str, Any]) -> ReagentLiteError:
    cls: Any = None
    with contextlib.suppress(Exception):
        cls = getattr(importlib.import_module(report["module"]), report["qualname"])
    if isinstance(cls, type) and issubclass(cls, ReagentLiteError):
        with contextlib.suppress(Exception):
            rebuilt: ReagentLiteError = cls(report["message"])
            rebuilt.exit_code = int(report["exit_code"])  # e.g. 130 or 143 for a signal
            return rebuilt
    err = ReagentLiteError(report["message"])
    err.exit_code = int(report["exit_code"])
    return err


def _die_with_parent(parent_pid: int) -> None:
    # If the launcher is killed (kill -9, node failure), its workers must not linger in
    # collectives holding the GPU: ask Linux to SIGKILL them when the parent goes.
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(1)
