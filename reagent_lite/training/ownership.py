"""One run owns its `model_output_path`: a lock while it runs, and a run id for its files.

* `OutputLock`: `model_output_path/.lock`, holding the holder's host, pid and a fresh
  random token, created by the process of global rank 0 and heartbeated (its mtime
  touched) while the run lasts. A second run on the same directory refuses with exit code
  2 naming the holder. A lock is stale — taken over with a warning — when its heartbeat is
  older than `STALE_AFTER_S` on the filesystem's clock, or when it belongs to a process of
  this host that is gone (its pid dead or reused). Holding the lock, a run also deletes
  temp files that killed writes left behind.
* Take-over is atomic: creating, taking over and releasing the lock happen only while
  holding an exclusive `fcntl` lock on `.lock.guard` (held for milliseconds; the kernel
  drops it when its process dies), so of several runs that find one stale lock at once
  exactly one takes it and the others then find a live lock and refuse. The lock file is
  written whole beside it and `link`ed into place (atomic, and refusing an existing
  name, on NFS too). On NFS, `fcntl` locks work over NFSv4 and over NFSv3 with lockd; on
  a mount with `nolock` they hold only among the processes of one host, and where the
  filesystem has no such locks at all a warning says the take-over is not atomic.
* A run that was paused (Ctrl-Z, `scontrol suspend`, a VM pause) for longer than the
  staleness limit may have been taken over meanwhile. Every write that matters under the
  output directory checks the lock still holds this run's token first
  (`io_utils.check_owner`: `atomic_write`, `metrics.jsonl`; worker processes learn the
  token from the environment), and a run that lost it stops with `OwnershipLost` (exit
  5) before writing anything more; its heartbeat stops touching the other run's lock and
  its release leaves that lock alone. (A pause that falls between that check and the
  rename it guards can still land one write: the check narrows the window to
  microseconds, it cannot close it without fencing by the filesystem.)
* `begin_run`: a fresh run draws a new run id and records it in `run.json`; `--resume`
  continues the run named there. Checkpoints live in `checkpoints/<run id>/`, so a fresh
  run never reads, prunes or resumes another run's; the id is also in every checkpoint
  and in `model_meta.json`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from reagent_lite.distributed.claims import pid_alive, read_json
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError, ReagentLiteError
from reagent_lite.io_utils import (
    LOCK_FILE,
    OWNED_ENV,
    atomic_write_json,
    lock_holder,
    owned_dirs,
    remove_temp_files,
)

log = logging.getLogger("reagent_lite")

GUARD_FILE = ".lock.guard"
RUN_FILE = "run.json"
HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0
GUARD_WAIT_S = 30.0  # the guard is held for milliseconds; longer means a stuck holder
# fcntl errors of a filesystem without byte-range locks.
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


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
        self.token = uuid.uuid4().hex
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
            "token": self.token,
        }
        with self._guard():
            for _ in range(3):
                if self._create(payload):
                    break
                self._take_over_if_stale()
            else:
                raise ConfigError(f"model_output_path: could not lock '{self.dir}' ({self.path})")
        owned = owned_dirs()
        owned[str(self.dir.absolute())] = self.token
        os.environ[OWNED_ENV] = json.dumps(owned)  # for check_owner, here and in workers
        for directory in (self.dir, self.dir / "checkpoints", *self._run_dirs()):
            for tmp in remove_temp_files(directory):
                log.info("removed %s, left by a write that was cut short", tmp)
        self._thread = threading.Thread(target=self._heartbeat, name="output-lock", daemon=True)
        self._thread.start()

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Holds `.lock.guard` exclusively (see the module notes)."""
        fd = os.open(self.dir / GUARD_FILE, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            deadline = time.monotonic() + GUARD_WAIT_S
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno in _NO_LOCKS:
                        log.warning(
                            "%s: the filesystem has no fcntl locks (%s): taking over a stale "
                            "lock is not atomic here",
                            self.dir,
                            e.strerror,
                        )
                        break
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"model_output_path: could not lock '{self.dir}': "
                        f"{self.dir / GUARD_FILE} stayed locked for {GUARD_WAIT_S:.0f} s"
                    )
                time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # drops the fcntl lock

    def _create(self, payload: dict[str, Any]) -> bool:
        """The lock file with `payload`, written whole and linked into place; False when
        a lock file is there already."""
        tmp = self.dir / f".lock.{self.token}.new"
        try:
            tmp.write_text(json.dumps(payload))
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                # NFS: a retried LINK may report EEXIST though the first one made it.
                return os.stat(tmp).st_nlink == 2
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def _run_dirs(self) -> list[Path]:
        root = self.dir / "checkpoints"
        return [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []

    def _take_over_if_stale(self) -> None:
        # Under the guard: nobody else creates or removes the lock between these lines.
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

    def still_own(self) -> bool:
        """Whether the lock file still holds this run's token."""
        return (lock_holder(self.path) or {}).get("token") == self.token

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                if not self.still_own():  # taken over while paused: leave it to its owner
                    log.error("%s: the lock of this run was taken over by another run", self.dir)
                    return
                os.utime(self.path)

    def release(self) -> None:
        """Stops the heartbeat and removes the lock if it is still this run's. Never
        raises: a failure here (a filesystem turned read-only) is logged, so that it does
        not replace the error the run is stopping with."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        owned = owned_dirs()
        owned.pop(str(self.dir.absolute()), None)
        os.environ[OWNED_ENV] = json.dumps(owned)
        try:
            with self._guard():
                if self.still_own():
                    self.path.unlink(missing_ok=True)
        except (OSError, ReagentLiteError) as e:
            log.warning(
                "could not remove the lock %s (%s); a later run takes it over", self.path, e
            )


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
