"""Decide how many processes this node runs, which ranks and devices they get, and how they meet.

`plan_launch` is pure apart from asking torch how many GPUs are visible: it reads flags and
environment variables and returns a `LaunchPlan` that `--dry_run` can print and `launch`
can execute. Three modes:

* ``"env"``: torchrun / Slurm already started this process and exported ``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``: use them, spawn nothing.
* ``"spawn"``: more than one process in the job; this node's launcher meets the other
  nodes through the file rendezvous and starts one process per local device.
* ``"single"``: one process, no process group.

Processes per node: the number of visible GPUs with `use_gpu` (true or "auto") and
`use_all_avail_gpus`; one GPU process with `use_gpu` alone; otherwise one CPU process
(gloo), with a warning only when `use_gpu` is true (a GPU was asked for).
For testing multi-process code on CPU, `cpu_procs_per_node` (or the environment variable
``REAGENT_LITE_CPU_PROCS_PER_NODE``) sets the number of CPU processes per node.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from reagent_lite.errors import ConfigError

log = logging.getLogger(__name__)

Mode = Literal["spawn", "env", "single"]
# The config's use_gpu: "auto" uses a GPU when one is visible; only true asks for one.
UseGpu = bool | Literal["auto"]

CPU_PROCS_ENV = "REAGENT_LITE_CPU_PROCS_PER_NODE"
_ENV_MODE_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class LaunchPlan:
    """The resolved layout of the job as seen from this node."""

    num_nodes: int
    node_index: int
    procs_per_node: int
    world_size: int
    ranks: tuple[int, ...]  # global ranks of this node's processes, by local rank
    devices: tuple[str, ...]  # e.g. ("cuda:0", "cuda:1") or ("cpu",), by local rank
    backend: str  # "nccl" or "gloo"
    init_method: str | None  # "file://..." (spawn), "env://" (env) or None (single)
    mode: Mode
    run_id: str | None = None

    @property
    def use_gpu(self) -> bool:
        return self.devices[0].startswith("cuda")

    @property
    def rendezvous_base(self) -> Path | None:
        """The path named by a ``file://`` init_method (the real store files live beside it)."""
        if self.init_method is None or not self.init_method.startswith("file://"):
            return None
        return Path(urlparse(self.init_method).path)

    @property
    def rendezvous_dir(self) -> Path | None:
        """Where this job's claims, session and store files are written."""
        base = self.rendezvous_base
        if base is None:
            return None
        root = base.with_name(base.name + ".rdzv")
        return root / f"run-{self.run_id}" if self.run_id else root

    def describe(self) -> str:
        """A few human-readable lines for `--dry_run` and the start-of-run log."""
        lines = [
            f"mode: {self.mode}",
            f"world size: {self.world_size} ({self.num_nodes} node(s) x "
            f"{self.procs_per_node} process(es) per node)",
            f"this node: node_index {self.node_index}",
        ]
        for local, (rank, dev) in enumerate(zip(self.ranks, self.devices, strict=True)):
            lines.append(f"  local rank {local} -> global rank {rank} on {dev}")
        lines.append(f"backend: {self.backend}")
        if self.mode == "env":
            lines.append("rendezvous: env:// (MASTER_ADDR/MASTER_PORT from the environment)")
        elif self.mode == "spawn":
            lines.append(f"rendezvous: {self.init_method} (files in {self.rendezvous_dir})")
        else:
            lines.append("rendezvous: none (single process)")
        if self.run_id:
            lines.append(f"run id: {self.run_id}")
        return "\n".join(lines)


def plan_launch(
    *,
    num_nodes: int,
    node_index: int,
    use_gpu: UseGpu,
    use_all_avail_gpus: bool,
    init_method: str | None,
    run_id: str | None = None,
    env: Mapping[str, str] | None = None,
    default_rendezvous_dir: str | Path | None = None,
    cpu_procs_per_node: int | None = None,
) -> LaunchPlan:
    """Resolve the job layout for this node (see the module docstring for the rules).

    `default_rendezvous_dir` is used when `init_method` is unset and this single node needs
    more than one process; a multi-node job must name a shared `file://` init_method.
    Raises `ConfigError` for impossible combinations (node_index out of range, a missing or
    non-file init_method where one is needed).
    """
    env = os.environ if env is None else env
    if _is_env_mode(env):
        return _plan_from_env(env, use_gpu=use_gpu, num_nodes=num_nodes, run_id=run_id)

    if num_nodes < 1:
        raise ConfigError(f"num_nodes must be at least 1 (got {num_nodes})")
    if not 0 <= node_index < num_nodes:
        raise ConfigError(
            f"--node_index must be in [0, {num_nodes - 1}] for num_nodes={num_nodes} "
            f"(got {node_index})"
        )
    gpus = _visible_gpus() if use_gpu else 0
    if gpus > 0:
        procs, device_type, backend = (gpus if use_all_avail_gpus else 1), "cuda", "nccl"
    else:
        _cpu_notice(use_gpu)
        procs, device_type, backend = _cpu_procs(cpu_procs_per_node, env), "cpu", "gloo"

    world_size = num_nodes * procs
    ranks = tuple(node_index * procs + i for i in range(procs))
    devices = tuple(f"cuda:{i}" if device_type == "cuda" else "cpu" for i in range(procs))
    if world_size == 1:
        return LaunchPlan(1, 0, 1, 1, (0,), devices, backend, None, "single")

    resolved_run_id = _sanitize_run_id(run_id or _run_id_from_env(env, num_nodes))
    if init_method is None:
        if num_nodes > 1:
            raise ConfigError(
                "init_method is required when num_nodes > 1: name a file on the filesystem "
                'shared by all nodes, e.g. "file:///nfs/jobs/my_run/rendezvous"'
            )
        # One node, several processes: a private base no other job can collide with.
        parent = Path(default_rendezvous_dir or tempfile.gettempdir())
        name = ".rendezvous" if default_rendezvous_dir else f"reagent-lite-{uuid.uuid4().hex}"
        init_method = (parent / name).absolute().as_uri()
    _check_file_init_method(init_method)
    return LaunchPlan(
        num_nodes=num_nodes,
        node_index=node_index,
        procs_per_node=procs,
        world_size=world_size,
        ranks=ranks,
        devices=devices,
        backend=backend,
        init_method=init_method,
        mode="spawn",
        run_id=resolved_run_id,
    )


def _cpu_notice(use_gpu: UseGpu) -> None:
    """Training on CPU is news worth a warning only when a GPU was explicitly asked for:
    "auto" (the default) and false say so at INFO, so a CPU box's log stays quiet."""
    if use_gpu is True:
        log.warning("use_gpu is true but no CUDA device is visible: training on CPU (gloo)")
    elif use_gpu == "auto":
        log.info("no CUDA device is visible: training on CPU (gloo)")
    else:
        log.info("use_gpu is false: training on CPU (gloo)")


def _is_env_mode(env: Mapping[str, str]) -> bool:
    return all(env.get(k) for k in _ENV_MODE_VARS)


def _plan_from_env(
    env: Mapping[str, str], *, use_gpu: UseGpu, num_nodes: int, run_id: str | None
) -> LaunchPlan:
    try:
        rank = int(env["RANK"])
        world_size = int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError as exc:
        raise ConfigError(f"bad torchrun/Slurm environment variable: {exc}") from exc
    if not 0 <= rank < world_size:
        raise ConfigError(f"environment RANK={rank} is outside WORLD_SIZE={world_size}")
    env_nodes = max(1, world_size // max(local_world, 1))
    node_index = int(env.get("GROUP_RANK", str(rank // max(local_world, 1))))
    if env_nodes != num_nodes:
        log.warning(
            "num_nodes=%d in the config but the environment describes %d node(s) "
            "(WORLD_SIZE=%d, LOCAL_WORLD_SIZE=%d): following the environment",
            num_nodes,
            env_nodes,
            world_size,
            local_world,
        )
    gpu = bool(use_gpu) and _visible_gpus() > 0
    if not gpu:
        _cpu_notice(use_gpu)
    device = f"cuda:{local_rank}" if gpu else "cpu"
    return LaunchPlan(
        num_nodes=env_nodes,
        node_index=node_index,
        procs_per_node=local_world,
        world_size=world_size,
        ranks=(rank,),
        devices=(device,),
        backend="nccl" if gpu else "gloo",
        init_method="env://",
        mode="env",
        run_id=run_id or env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID"),
    )


def _run_id_from_env(env: Mapping[str, str], num_nodes: int) -> str | None:
    # A Slurm job id namespaces the rendezvous only when that one job spans all the nodes;
    # nodes started as separate Slurm jobs have different ids and must still meet.
    job = env.get("SLURM_JOB_ID")
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    if job and nodes and nodes.isdigit() and int(nodes) == num_nodes:
        return job
    return None


def _visible_gpus() -> int:
    import torch

    # device_count() honours CUDA_VISIBLE_DEVICES and does not create a CUDA context, so
    # the spawned children can still initialise CUDA themselves.
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cpu_procs(explicit: int | None, env: Mapping[str, str]) -> int:
    raw: int | str | None = explicit if explicit is not None else env.get(CPU_PROCS_ENV)
    if raw is None or raw == "":
        return 1
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(
            f"{CPU_PROCS_ENV} / cpu_procs_per_node must be an integer >= 1 (got {raw!r})"
        )
    return n


def _check_file_init_method(init_method: str) -> None:
    parsed = urlparse(init_method)
    if parsed.scheme != "file" or not parsed.path.startswith("/") or parsed.netloc:
        raise ConfigError(
            'init_method must be an absolute "file:///path" on the filesystem shared by all '
            f"nodes (got {init_method!r})"
        )
    if parsed.path.endswith("/"):
        raise ConfigError(f"init_method must name a file, not a directory (got {init_method!r})")


def _sanitize_run_id(run_id: str | None) -> str | None:
    if not run_id:
        return None
    # It becomes a directory name: keep it to characters every filesystem accepts.
    return re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:64]
