"""One worker process's life in the job: join the process group with the collective
timeout, run the worker function, and leave the group — gracefully, or by aborting it after
a failure over NCCL — with the failure classified (`DistributedError` for a collective that
failed, the worker's own error otherwise). `launch` runs it in-process; `children` runs it
in each spawned child.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from reagent_lite.distributed.context import DistContext
from reagent_lite.distributed.plan import LaunchPlan
from reagent_lite.errors import DistributedError
from reagent_lite.torch_private import abort_process_groups

WorkerFn = Callable[..., Any]


class WorkerError(RuntimeError):
    """A worker failed with an unexpected (non-ReagentLiteError) exception: a bug, not bad input."""

    def __init__(self, message: str, rank: int, remote_traceback: str) -> None:
        super().__init__(f"{message}\n\nTraceback of rank {rank}:\n{remote_traceback}")
        self.rank = rank
        self.remote_traceback = remote_traceback


def run_worker(
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
