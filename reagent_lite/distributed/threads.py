"""How many threads each CPU worker of this node runs, and how its OpenMP threads wait.

A CPU worker takes its share of the cores this node may use: the smaller of the affinity
mask (`os.sched_getaffinity`) and the cgroup CPU quota (v2 ``cpu.max``, v1
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, rounded up to whole cores), divided by the
processes the node starts, at least 1. OpenMP threads that spin while waiting for their
team are what collapses training on a shared box (a descheduled peer keeps the others
spinning), so they wait passively. A value the user set in ``OMP_NUM_THREADS`` or
``OMP_WAIT_POLICY`` is respected.

OpenMP reads ``OMP_WAIT_POLICY`` once, when the runtime loads with torch: a process can
only choose it before ``import torch``. Spawned workers get both variables in their
environment; for the worker it runs itself, the command-line entry point chooses before
it imports torch (`reagent_lite/openmp_env.py`). The thread count can change later
(`torch.set_num_threads`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from reagent_lite.errors import ConfigError
from reagent_lite.openmp_env import DEFAULT_WAIT, WAIT_VAR, wait_policy_here

THREADS_VAR = "OMP_NUM_THREADS"
CGROUP_ROOT = Path("/sys/fs/cgroup")
_QuotaReader = Callable[[Path], float | None]


@dataclass(frozen=True)
class CpuLimits:
    """The cores this process may use: the affinity mask and the cgroup quota (None: none)."""

    affinity: int
    quota: float | None = None

    @property
    def cores(self) -> int:
        if self.quota is None:
            return max(1, self.affinity)
        return max(1, min(self.affinity, math.ceil(self.quota)))

    def describe(self) -> str:
        text = f"affinity {self.affinity} core{'s' * (self.affinity != 1)}"
        return text if self.quota is None else f"{text}, cgroup quota {self.quota:g}"


@dataclass(frozen=True)
class ThreadPlan:
    """Threads per CPU worker and OpenMP's wait policy, with where each came from."""

    threads: int
    processes: int
    limits: CpuLimits
    user_threads: bool  # OMP_NUM_THREADS was the user's
    wait_policy: str | None  # None: OpenMP's own default (set too late to choose)
    user_wait: bool

    def child_env(self) -> dict[str, str]:
        """What a worker process started by the launcher gets in its environment (the
        user's own values are inherited as they are)."""
        env = {}
        if not self.user_threads:
            env[THREADS_VAR] = str(self.threads)
        if not self.user_wait:
            env[WAIT_VAR] = DEFAULT_WAIT
        return env

    def describe(self) -> str:
        procs = f"{self.processes} process{'es' * (self.processes != 1)}"
        source = f"{THREADS_VAR}={self.threads}, yours" if self.user_threads else None
        line = (
            f"CPU threads: {self.threads} per process ({source or self.limits.describe()}, {procs})"
        )
        if self.wait_policy is None:
            return (
                f"{line}, OpenMP wait: OpenMP's default (torch was imported before "
                f"{WAIT_VAR} could be set; set it in the environment to choose)"
            )
        yours = f" ({WAIT_VAR}, yours)" if self.user_wait else ""
        return f"{line}, OpenMP wait {self.wait_policy.lower()}{yours}"


def plan_threads(
    processes: int,
    limits: CpuLimits,
    env: Mapping[str, str],
    *,
    user_wait: str | None = None,
    wait_settable: bool = True,
) -> ThreadPlan:
    """The share of `limits` for each of `processes` workers, unless `env` sets
    ``OMP_NUM_THREADS``. `user_wait`: the user's ``OMP_WAIT_POLICY`` (None: not set);
    `wait_settable`: whether the workers can still be given a wait policy (spawned
    workers can; this process only before torch was imported)."""
    user_threads = env.get(THREADS_VAR, "").strip()
    if user_threads:
        threads = _parse_threads(user_threads)
    else:
        threads = max(1, limits.cores // max(1, processes))
    if user_wait:
        wait: str | None = user_wait.strip().upper()
    else:
        wait = DEFAULT_WAIT if wait_settable else None
    return ThreadPlan(
        threads=threads,
        processes=processes,
        limits=limits,
        user_threads=bool(user_threads),
        wait_policy=wait,
        user_wait=bool(user_wait),
    )


def this_node(processes: int, *, in_process: bool) -> ThreadPlan:
    """`plan_threads` for this machine and environment. `in_process`: the (one) worker
    runs in this process, whose wait policy was fixed when torch was imported."""
    user_wait, before_torch = wait_policy_here()
    settable = not in_process or before_torch
    limits = CpuLimits(len(os.sched_getaffinity(0)), cgroup_quota_cores())
    return plan_threads(processes, limits, os.environ, user_wait=user_wait, wait_settable=settable)


def cores_per_process(processes: int) -> int:
    """This process's share, among the node's `processes`, of the cores it may use (the
    affinity mask and the cgroup quota): what one rank's background work may count on."""
    limits = CpuLimits(len(os.sched_getaffinity(0)), cgroup_quota_cores())
    return max(1, limits.cores // max(1, processes))


def cgroup_quota_cores(root: Path = CGROUP_ROOT, self_cgroup: str | None = None) -> float | None:
    """The CPU quota of this process's cgroup and its ancestors in cores (the smallest),
    or None when there is none. `self_cgroup`: the text of ``/proc/self/cgroup``."""
    if self_cgroup is None:
        try:
            self_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    quotas: list[float] = []
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and not controllers:  # cgroup v2
            quotas += _quotas(root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # cgroup v1, mounted per controller
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if mount.is_dir():
                    quotas += _quotas(mount, path, _v1_quota)
                    break
    return min(quotas) if quotas else None


def _quotas(mount: Path, path: str, read: _QuotaReader) -> list[float]:
    # A container often sees its own cgroup at the mount point rather than at `path`:
    # the directory of `path`, its ancestors and the mount point itself are all read.
    rel = Path(path.lstrip("/"))
    found = []
    for d in {mount / rel, *(mount / p for p in rel.parents), mount}:
        quota = read(d)
        if quota is not None:
            found.append(quota)
    return found


def _v2_quota(d: Path) -> float | None:
    fields = _read(d / "cpu.max").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1_quota(d: Path) -> float | None:
    return _ratio(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us"))


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None  # v1 writes -1 for no quota


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _parse_threads(value: str) -> int:
    # OpenMP takes a list for nested levels ("4,2"); the first is the threads per process.
    first = value.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ConfigError(
            f"environment variable {THREADS_VAR}: expected a positive number of threads per "
            f"process (got {value!r}); unset it to let reagent-lite choose"
        )
    return int(first)
