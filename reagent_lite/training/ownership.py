"""One run owns its `model_output_path`: a lock while it runs, and a run id for its files.

* `OutputLock`: `model_output_path/.lock`, created with `O_EXCL` by the process of global
  rank 0 and heartbeated (its mtime touched) while the run lasts. A second run on the same
  directory refuses with exit code 2 naming the holder. A lock is stale — taken over with a
  warning — when its heartbeat is older than `STALE_AFTER_S` on the filesystem's clock, or
  when it belongs to a process of this host that is gone (its pid dead or reused).
  Holding the lock, a run also deletes temp files that killed writes left behind.
* `begin_run`: a fresh run draws a new run id and records it in `run.json`; `--resume`
  continues the run named there. Checkpoints live in `checkpoints/<run id>/`, so a fresh
  run never reads, prunes or resumes another run's; the id is also in every checkpoint
  and in `model_meta.json`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from reagent_lite.distributed.claims import pid_alive, read_json
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import atomic_write_json, remove_temp_files

log = logging.getLogger("reagent_lite")

LOCK_FILE = ".lock"
RUN_FILE = "run.json"
HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the pid, it names one
    process (a pid reused by a restarted container is another one)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19]
    except (OSError, IndexError):
        return None


class OutputLock:
    """Context manager holding `output_dir/.lock` (see the module notes)."""

    def __init__(self, output_dir: Path, *, stale_after_s: float = STALE_AFTER_S) -> None:
        self.dir = output_dir
        self.path = output_dir / LOCK_FILE
        self.stale_after_s = stale_after_s
        self.host = socket.gethostname()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def acquire(self) -> None:
        pid = os.getpid()
        payload = {
            "host": self.host,
            "pid": pid,
            "start": _process_start(pid),
            "since": time.time(),
        }
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            try:
                os.write(fd, json.dumps(payload).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            break
        else:
            raise ConfigError(f"model_output_path: could not lock '{self.dir}' ({self.path})")
        for directory in (self.dir, self.dir / "checkpoints", *self._run_dirs()):
            for tmp in remove_temp_files(directory):
                log.info("removed %s, left by a write that was cut short", tmp)
        self._thread = threading.Thread(target=self._heartbeat, name="output-lock", daemon=True)
        self._thread.start()

    def _run_dirs(self) -> list[Path]:
        root = self.dir / "checkpoints"
        return [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []

    def _take_over_if_stale(self) -> None:
        holder = read_json(self.path) or {}
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        who = f"host {holder.get('host', '?')} pid {holder.get('pid', '?')}"
        if self._live(holder, mtime):
            raise ConfigError(
                f"model_output_path: '{self.dir}' is in use by another run ({who}, lock file "
                f"{self.path}): wait for it to finish, or give this run another "
                "model_output_path"
            )
        log.warning("taking over the lock of %s left by %s (no longer running)", self.dir, who)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _live(self, holder: dict[str, object], mtime_ns: int) -> bool:
        if self._fs_now_ns() - mtime_ns > self.stale_after_s * 1e9:
            return False
        pid = holder.get("pid")
        if holder.get("host") == self.host and isinstance(pid, int):
            if not pid_alive(pid):
                return False
            start = holder.get("start")
            return start is None or _process_start(pid) == start
        return True

    def _fs_now_ns(self) -> int:
        # The filesystem's clock, not ours: on NFS the writer's host may disagree.
        probe = self.dir / f".lock-probe-{uuid.uuid4().hex[:8]}"
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            return os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        holder = read_json(self.path) or {}
        if holder.get("pid") == os.getpid() and holder.get("host") == self.host:
            self.path.unlink(missing_ok=True)


def current_run_id(output_dir: Path) -> str | None:
    """The run id recorded in `run.json` (None: no run has started here)."""
    data = read_json(output_dir / RUN_FILE) or {}
    run_id = data.get("run_id")
    return run_id if isinstance(run_id, str) and run_id.isalnum() else None


def begin_run(output_dir: Path, *, resume: bool) -> str:
    """The run id of this run (rank 0): `--resume` continues the recorded run; a fresh
    run draws a new id and records it."""
    if resume:
        found = current_run_id(output_dir)
        if found is not None:
            return found
    run_id = uuid.uuid4().hex[:12]
    atomic_write_json(output_dir / RUN_FILE, {"run_id": run_id, "started": time.time()})
    return run_id


def config_diff(a: Any, b: Any, allowed: tuple[str, ...] = ()) -> list[str]:
    """`key (a value -> b value)` for every dotted key whose values differ between two
    JSON configs, except the keys in `allowed`; values cut short."""
    out: list[str] = []
    stack: list[tuple[str, Any, Any]] = [("", a, b)]
    while stack:
        prefix, x, y = stack.pop()
        if isinstance(x, dict) and isinstance(y, dict):
            stack.extend((f"{prefix}{k}.", x.get(k), y.get(k)) for k in set(x) | set(y))
            continue
        key = prefix[:-1]
        if any(key == a or key.startswith(a + ".") for a in allowed):
            continue
        if x != y:
            out.append(f"{key} ({_short(x)} -> {_short(y)})")
    return sorted(out)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_same_job(ctx: DistContext, config: dict[str, Any], resume: bool) -> None:
    """`ConfigError` on every rank when the ranks were not started alike: another config
    (naming the differing keys) or `--resume` on some nodes only. Nodes read their own
    copy of the config; a mismatch would otherwise surface as a DDP shape error or a
    collective timeout."""
    views = ctx.all_gather_object({"resume": resume, "config": config})
    base = views[0]
    problems = []
    for rank, view in enumerate(views[1:], start=1):
        if view["resume"] != base["resume"]:
            problems.append(
                f"rank {rank} was started {'with' if view['resume'] else 'without'} --resume, "
                f"rank 0 {'with' if base['resume'] else 'without'}"
            )
        diff = config_diff(base["config"], view["config"])
        if diff:
            problems.append(f"rank {rank}'s config differs from rank 0's: {'; '.join(diff[:10])}")
    if problems:
        raise ConfigError(
            "the nodes of this job were not started alike: "
            + " | ".join(problems[:4])
            + " (start every node with the same config and flags)"
        )
