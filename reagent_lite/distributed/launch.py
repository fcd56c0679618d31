"""Run a worker function in every process of this node, each with an initialised process group.

`launch(plan, worker_fn, args)`:

* ``single``: calls ``worker_fn(DistContext.single(device), *args)`` in this process;
* ``env``: torchrun/Slurm started this process: one ``env://`` process group, in-process;
* ``spawn``: meets the other nodes through the file rendezvous, then runs one worker per
  local device: in this process when there is one, else in ``spawn``-ed children.

Each worker initialises the process group with the collective timeout (so a dead or hung
peer fails the survivors instead of hanging them) and destroys it on the way out — after an
error over NCCL it aborts it instead (`worker.py`). A failing worker makes `launch`
raise: a `ReagentLiteError` keeps its class, message and exit code; a collective failure
becomes `DistributedError`; anything else becomes `WorkerError` carrying the child's
traceback. `worker_fn` and `args` must be picklable (a module-level function) when
processes are spawned.

CPU workers run their share of the node's cores as threads, with OpenMP waiting passively
(`threads.py`): set in this process for a worker it runs itself (the previous thread count
is restored afterwards), in the environment of spawned ones; the choice is logged once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from reagent_lite.distributed.children import spawn
from reagent_lite.distributed.context import DistContext
from reagent_lite.distributed.plan import LaunchPlan
from reagent_lite.distributed.rendezvous import FileRendezvous
from reagent_lite.distributed.threads import ThreadPlan, this_node
from reagent_lite.distributed.worker import WorkerError as WorkerError
from reagent_lite.distributed.worker import WorkerFn, run_worker

log = logging.getLogger(__name__)


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
    in_process = plan.mode != "spawn" or plan.procs_per_node == 1
    threads = None if plan.use_gpu else this_node(plan.procs_per_node, in_process=in_process)
    # Once per node: under torchrun every rank calls launch, local rank 0 speaks for them.
    if threads is not None and (plan.mode != "env" or plan.ranks[0] % plan.procs_per_node == 0):
        log.info("%s", threads.describe())
    with _threads_here(threads if in_process else None):
        _launch(plan, worker_fn, args, threads, rendezvous_timeout_s, collective_timeout_s)


def _launch(
    plan: LaunchPlan,
    worker_fn: WorkerFn,
    args: tuple[Any, ...],
    threads: ThreadPlan | None,
    rendezvous_timeout_s: float,
    collective_timeout_s: float,
) -> None:
    if plan.mode == "single":
        worker_fn(DistContext.single(plan.devices[0]), *args)
        return
    if plan.mode == "env":
        run_worker(plan, 0, "env://", worker_fn, args, collective_timeout_s)
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
            run_worker(plan, 0, session.init_method, worker_fn, args, collective_timeout_s)
        else:
            spawn(plan, session.init_method, worker_fn, args, collective_timeout_s, threads)
        log.info("node %d finished session %s", plan.node_index, session.session_id)


@contextlib.contextmanager
def _threads_here(threads: ThreadPlan | None) -> Iterator[None]:
    """The worker this process runs uses `threads.threads` threads; a program that called
    `launch` gets its own count back afterwards."""
    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads.threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
