"""Ranks, launch plans, process spawning and the file rendezvous (docs/DISTRIBUTED.md).

Everything else receives a `DistContext` and never asks `torch.distributed` who it is.
"""

from __future__ import annotations

from reagent_lite.distributed.context import DistContext
from reagent_lite.distributed.launch import WorkerError, launch
from reagent_lite.distributed.plan import CPU_PROCS_ENV, LaunchPlan, plan_launch
from reagent_lite.distributed.rendezvous import FileRendezvous, Session

__all__ = [
    "CPU_PROCS_ENV",
    "DistContext",
    "FileRendezvous",
    "LaunchPlan",
    "Session",
    "WorkerError",
    "launch",
    "plan_launch",
]
