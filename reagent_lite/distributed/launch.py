"""Run a worker function in every process of this node, each with an initialised process group.

`launch(plan, worker_fn, args)`:

* ``single``: calls ``worker_fn(DistContext.single(device), *args)`` in this process;
* ``env``: torchrun/Slurm started this process: one ``env://`` process group, in-process;
* ``spawn``: meets the other nodes through the file rendezvous, then runs one worker per
  local device: in this process when there is one, else in ``spawn``-ed children.

Each worker initialises the process group with the collective timeout (so a dead or hung
peer fails the survivors instead of hanging them) and destroys it on the way out — after an
error over NCCL it aborts it instead (`_leave_group`). A failing worker makes `launch`
raise: a `ReagentLiteError` keeps its class, message and exit code; a collective failure
becomes `DistributedError`; anything else becomes `WorkerError` carrying the child's
traceback. `worker_fn` and `args` must be picklable (a module-level function) when
processes are spawned.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
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
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reagent_lite.distributed.context import DistContext
from reagent_lite.distributed.plan import LaunchPlan
from reagent_lite.distributed.rendezvous import FileRendezvous
from reagent_lite.errors import DistributedError, ReagentLiteError
from reagent_lite.torch_private import abort_process_groups

log = logging.getLogger(__name__)

WorkerFn = Callable[..., Any]
# How long siblings of a failed worker get to exit on SIGTERM before SIGKILL.
_TERMINATE_GRACE_S = 5.0
# How long workers get to stop by themselves after a signal: siblings of a worker that
# stopped, and all of them after a signal to this launcher (then they are ended).
_PREEMPT_GRACE_S = 20.0


class WorkerError(RuntimeError):
    """A worker failed with an unexpected (non-ReagentLiteError) exception: a bug, not bad input."""

    def __init__(self, message: str, rank: int, remote_traceback: str) -> None:
        super().__init__(f"{message}\n\nTraceback of rank {rank}:\n{remote_traceback}")
        self.rank = rank
        self.remote_traceback = remote_traceback


def launch(
    plan: LaunchPlan,
    worker_fn: WorkerFn,
    args: Sequence[Any] = (),
    *,
    rendezvous_timeout_s: float = 600.0,
    collective_timeout_s: float = 1800.0,
) -> None:
    """Run ``worker_fn(ctx, *args)`` in every local process of `plan` (see module docstring)."""
    args = tuple(args)
    if plan.mode == "single":
        worker_fn(DistContext.single(plan.devices[0]), *args)
        return
    if plan.mode == "env":
        _run_worker(plan, 0, "env://", worker_fn, args, collective_timeout_s)
        return
    assert plan.rendezvous_dir is not None, "spawn mode needs a file:// init_method"
    rdzv = FileRendezvous(
        plan.rendezvous_dir,
        num_nodes=plan.num_nodes,
        node_index=plan.node_index,
        procs_per_node=plan.procs_per_node,
        timeout_s=rendezvous_timeout_s,
    )
    with rdzv as session:
        log.info("node %d joined session %s", plan.node_index, session.session_id)
        if plan.procs_per_node == 1:
            _run_worker(plan, 0, session.init_method, worker_fn, args, collective_timeout_s)
        else:
            _spawn(plan, session.init_method, worker_fn, args, collective_timeout_s)


def _run_worker(
    plan: LaunchPlan,
    local_rank: int,
    init_method: str,
    worker_fn: WorkerFn,
    args: tuple[Any, ...],
    collective_timeout_s: float,
) -> None:
    device = torch.device(plan.devices[local_rank])
    rank = plan.ranks[local_rank]
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Without it a NCCL collective whose peer died blocks forever instead of timing out.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    ctx = DistContext(
        rank=rank,
        world_size=plan.world_size,
        local_rank=local_rank,
        node_index=plan.node_index,
        procs_per_node=plan.procs_per_node,
        device=device,
        backend=plan.backend,
    )
    failed = True
    try:
        try:
            dist.init_process_group(
                plan.backend,
                init_method=init_method,
                rank=rank,
                world_size=plan.world_size,
                timeout=timedelta(seconds=collective_timeout_s),
            )
        except (dist.DistError, RuntimeError, ValueError) as exc:
            raise DistributedError(
                f"rank {rank} could not join the process group ({init_method}) within "
                f"{collective_timeout_s:g}s: {_first_line(exc)}"
            ) from exc
        try:
            worker_fn(ctx, *args)
            # Nobody tears the group (and the store file) down while a peer still uses it.
            ctx.barrier()
            failed = False
        except BaseException as exc:
            # The traceback holds the worker's frames and, through them, its models. A DDP
            # wrapper that outlives the group holds the group's last reference and destroys
            # it, under the GIL, whenever it is freed — which can deadlock with a gloo worker
            # thread waiting for the GIL. Let go of them while the group still exists.
            _release_frames(exc)
            if getattr(exc, "agreed_by_all_ranks", False):
                # Every rank stops here together (preemption): wait for rank 0's checkpoint
                # and leave the group as a finished run does; aborting NCCL communicators
                # is for a rank whose peers may be stuck waiting for it.
                with contextlib.suppress(Exception):
                    ctx.barrier()
                    failed = False
            # Stamped before the group is left: leaving it (or this process ending) is what
            # makes the peers fail, and the parent must tell the cause from those echoes.
            err = _classify(exc, rank, collective_timeout_s)
            with contextlib.suppress(Exception):
                err._failed_at = time.time()  # type: ignore[attr-defined]
                err._echo = err is not exc  # type: ignore[attr-defined]
            if err is exc:
                raise
            raise err from exc
    finally:
        # DDP's constructor leaves the wrapper in a reference cycle (through torch's lazy
        # imports), so only the cycle collector frees it: now, while the group exists.
        gc.collect()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                _leave_group(failed)


def _release_frames(exc: BaseException) -> None:
    """Clears the local variables of the frames in the tracebacks of `exc`, of the errors
    it was raised from or while handling, and of an exception group's members (frames
    still running keep theirs)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        err = todo.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        todo += [e for e in (err.__cause__, err.__context__) if e is not None]
        # An exception group's members (Python 3.11+; `requires-python` allows 3.10).
        members = getattr(err, "exceptions", ())
        todo += [e for e in members if isinstance(e, BaseException)]


def _leave_group(failed: bool) -> None:
    """Destroys the process group; after a failure over NCCL, aborts it instead.

    A failed rank's peers may be waiting inside a collective it will never join. Over gloo,
    destroying the group closes its connections and so fails them at once. Over NCCL a
    graceful destroy waits for them — until their collective timeout — and with it this
    rank's exit, its error report and the launcher's ending of its siblings; an abort
    returns at once; peers on this node are then ended by whoever started the processes
    (this launcher, torchrun), others time out."""
    if failed and dist.get_backend() == "nccl":
        _abort_groups()
    else:
        dist.destroy_process_group()


def _abort_groups() -> None:
    """Aborts every process group without waiting for peers, and unregisters them (so this
    process could initialise a new one, as a launch from the same process does)."""
    abort_process_groups()


def _classify(exc: BaseException, rank: int, timeout_s: float) -> BaseException:
    """The exception to raise for `exc`: collective failures become `DistributedError`."""
    # gloo reports dead peers and timeouts as plain RuntimeErrors, NCCL as DistErrors.
    if isinstance(exc, dist.DistError) or (
        type(exc) is RuntimeError and _looks_like_collective_failure(exc)
    ):
        return DistributedError(
            f"rank {rank}: a collective failed, a peer process probably died or stopped "
            f"responding (collective_timeout_s={timeout_s:g}): {_first_line(exc)}"
        )
    return exc


def _looks_like_collective_failure(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(
        s in text
        for s in ("gloo", "nccl", "connection closed", "connection reset", "timed out", "timeout")
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ------------------------------------------------------------------ spawned children
def _spawn(
    plan: LaunchPlan,
    init_method: str,
    worker_fn: WorkerFn,
    args: tuple[Any, ...],
    collective_timeout_s: float,
) -> None:
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
                ),
                name=f"reagent-lite-rank{plan.ranks[local_rank]}",
            )
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
) -> None:
    _die_with_parent(parent_pid)
    try:
        _run_worker(plan, local_rank, init_method, worker_fn, args, collective_timeout_s)
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
