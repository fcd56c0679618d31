"""Plays one node of a job in the distributed tests: plan_launch + launch + a tiny worker.

    python -m tests.distributed._node --init_method file:///tmp/x/rdzv --num_nodes 2 \
        --node_index 0 --out /tmp/x/out [--cpu_procs 2] [--steps 3] [--step_sleep 0.5] [--ddp]

Every rank all-reduces `rank + 1` for `--steps` steps (plus one broadcast and one gather),
touches ``<out>/started_rank<r>`` after its first collective and writes
``<out>/rank<r>.json`` at the end. Errors exit like the real CLI: message on stderr, the
error's exit code. With `--ddp` the ranks first train a DDP-wrapped layer for `--steps`
steps (`--fail_rank` fails there, with a `DataError` raised from a `ValueError`), with the
cycle collector off, and write ``<out>/ddp_freed_rank<r>`` when the wrapper is freed:
whether the process group still existed then.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
import time
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from reagent_lite.distributed import DistContext, launch, plan_launch
from reagent_lite.errors import DataError, ReagentLiteError


def worker(
    ctx: DistContext,
    out: str,
    steps: int,
    step_sleep: float,
    fail_rank: int,
    fail_kind: str,
    ignore_sigterm: bool = False,
    ddp: bool = False,
) -> None:
    out_dir = Path(out)
    if ignore_sigterm:  # a worker stuck where a signal cannot stop it (say, in a driver call)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if ddp:
        try:
            _train_ddp(ctx, out_dir, steps, fail=ctx.rank == fail_rank)
        except ValueError as err:  # raised from: the DDP is in the cause's frames only
            raise DataError(f"rank {ctx.rank}: the DDP steps failed") from err
    sums = []
    for step in range(steps):
        if step == 1 and ctx.rank == fail_rank:
            if fail_kind == "data":
                raise DataError(f"{out_dir}/part-0.parquet: column reward: 3 bad rows")
            raise ValueError("boom")
        t = torch.tensor([float(ctx.rank + 1)])
        sums.append(ctx.all_reduce_sum(t).item())
        if step == 0:
            (out_dir / f"started_rank{ctx.rank}").touch()
        time.sleep(step_sleep)
    mean = ctx.all_reduce_mean(torch.tensor([float(ctx.rank)])).item()
    token = ctx.broadcast_object({"stop": True, "from": ctx.rank})
    gathered = ctx.all_gather_object(ctx.rank * 10)
    ctx.barrier()
    record = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "node_index": ctx.node_index,
        "procs_per_node": ctx.procs_per_node,
        "pid": os.getpid(),
        "sums": sums,
        "mean": mean,
        "broadcast": token,
        "gathered": gathered,
        # What OpenMP in this worker started with, and torch's thread count in it.
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "torch_threads": torch.get_num_threads(),
    }
    tmp = out_dir / f".rank{ctx.rank}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, out_dir / f"rank{ctx.rank}.json")


def _train_ddp(ctx: DistContext, out_dir: Path, steps: int, fail: bool) -> None:
    """`steps` steps of a DDP-wrapped layer (its reducer all-reduces over gloo), a
    `ValueError` at the second when `fail`; ``ddp_freed_rank<r>`` says when it went."""
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    weakref.finalize(model, _note_freed, out_dir / f"ddp_freed_rank{ctx.rank}")
    for step in range(steps):
        if step == 1 and fail:
            raise ValueError("boom")
        model(torch.ones(2, 4)).sum().backward()


def _note_freed(path: Path) -> None:
    path.write_text("group alive" if dist.is_initialized() else "group destroyed")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--init_method")
    p.add_argument("--num_nodes", type=int, default=1)
    p.add_argument("--node_index", type=int, default=0)
    p.add_argument("--out", required=True)
    p.add_argument("--cpu_procs", type=int, default=None)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--step_sleep", type=float, default=0.0)
    p.add_argument("--rdzv_timeout", type=float, default=30.0)
    p.add_argument("--coll_timeout", type=float, default=30.0)
    p.add_argument("--fail_rank", type=int, default=-1)
    p.add_argument("--fail_kind", choices=["data", "value"], default="data")
    p.add_argument("--run_id", default=None)
    p.add_argument("--ignore_sigterm", action="store_true")
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--preempt_grace", type=float, default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if a.ddp:
        gc.disable()  # only the launcher's own collection may free the DDP's cycle
    Path(a.out).mkdir(parents=True, exist_ok=True)
    if a.preempt_grace is not None:
        from reagent_lite.distributed import children

        children._PREEMPT_GRACE_S = a.preempt_grace
    try:
        plan = plan_launch(
            num_nodes=a.num_nodes,
            node_index=a.node_index,
            use_gpu=False,
            use_all_avail_gpus=True,
            init_method=a.init_method,
            run_id=a.run_id,
            cpu_procs_per_node=a.cpu_procs,
        )
        print(plan.describe(), file=sys.stderr, flush=True)
        launch(
            plan,
            worker,
            (a.out, a.steps, a.step_sleep, a.fail_rank, a.fail_kind, a.ignore_sigterm, a.ddp),
            rendezvous_timeout_s=a.rdzv_timeout,
            collective_timeout_s=a.coll_timeout,
        )
    except ReagentLiteError as exc:
        print(f"ERROR: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
