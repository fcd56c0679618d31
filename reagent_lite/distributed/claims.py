"""Node claims of the file rendezvous: one lock file per node index, heartbeated by its owner.

A claim is a file ``node_<k>.lock`` created with ``O_CREAT | O_EXCL`` holding the owner's
claim id, host and pid. It is *stale* when its heartbeat (the file's mtime) is older than
`stale_after_s` — measured against a probe file just touched on the same filesystem, so
the clocks of different hosts never matter — when it belongs to a dead process on this
host, or when its heartbeat does not move for `liveness_window_s`. `rendezvous.py` holds the
protocol built on these claims.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reagent_lite.errors import DistributedError

log = logging.getLogger("reagent_lite.distributed.rendezvous")


@dataclass
class Claim:
    data: dict[str, Any]  # {} when the file could not be parsed (being written)
    mtime_ns: int

    def who(self) -> str:
        return f"host {self.data.get('host', '?')} pid {self.data.get('pid', '?')}"


class ClaimBoard:
    """The claims in one rendezvous directory, as seen by the process holding `claim_id`."""

    def __init__(
        self,
        directory: Path,
        *,
        claim_id: str,
        host: str,
        timeout_s: float,
        stale_after_s: float,
        liveness_window_s: float,
        poll_s: float,
    ) -> None:
        self.dir = directory
        self.claim_id = claim_id
        self.host = host
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self.liveness_window_s = liveness_window_s
        self.poll_s = poll_s

    def lock(self, k: int) -> Path:
        return self.dir / f"node_{k}.lock"

    def acquire(self, node_index: int, fields: dict[str, Any], deadline: float) -> None:
        """Claims `node_index` (its lock file holds our claim id, host, pid and `fields`),
        taking over a stale claim; a live one is a `DistributedError` at once."""
        lock = self.lock(node_index)
        payload = json.dumps(
            {"uuid": self.claim_id, "host": self.host, "pid": os.getpid(), **fields}
        ).encode()
        while True:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # not a directory we may create (a read-only or virtual
                # filesystem, a file in the way): waiting would not change that
                raise DistributedError(
                    f"cannot create the rendezvous directory {self.dir}: {exc.strerror} "
                    "(init_method must name a writable path on the filesystem shared by all "
                    "nodes)"
                ) from exc
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pass
            except FileNotFoundError:  # the directory vanished under us (a finishing run)
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"rendezvous timed out after {self.timeout_s:g}s trying to claim "
                        f"node_index {node_index} ({lock}): its directory kept vanishing"
                    ) from None
                continue
            except OSError as exc:
                raise DistributedError(
                    f"cannot create rendezvous file {lock}: {exc.strerror} (init_method must "
                    "name a writable path on the filesystem shared by all nodes)"
                ) from exc
            else:
                try:
                    os.write(fd, payload)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                return
            if time.monotonic() > deadline:
                raise DistributedError(
                    f"rendezvous timed out after {self.timeout_s:g}s trying to claim "
                    f"node_index {node_index} ({lock})"
                )
            existing = self.read(lock)
            if existing is None:
                continue  # removed meanwhile: try again
            if self.is_live(lock, existing):
                raise DistributedError(
                    f"node_index {node_index} is already claimed by {existing.who()} "
                    f"({lock}): was --node_index={node_index} given to two nodes, or is "
                    "an earlier run of this job still running?"
                )
            log.warning(
                "taking over stale rendezvous claim of node_index %d left by %s",
                node_index,
                existing.who(),
            )
            self.remove_if_same(lock, existing)

    def is_live(self, lock: Path, claim: Claim) -> bool:
        """Whether the claim's owner is still heartbeating (see module docstring)."""
        if self.fs_now_ns() - claim.mtime_ns > self.stale_after_s * 1e9:
            return False
        if claim.data.get("host") == self.host and not pid_alive(claim.data.get("pid")):
            return False
        end = time.monotonic() + self.liveness_window_s
        while time.monotonic() < end:
            time.sleep(self.poll_s)
            now = self.read(lock)
            if now is None:
                return False  # gone: claim again
            if now.mtime_ns != claim.mtime_ns or now.data.get("uuid") != claim.data.get("uuid"):
                return True
        return False

    def remove_if_same(self, lock: Path, stale: Claim) -> None:
        # Rename first so two nodes taking over at once cannot delete each other's new claim:
        # whoever moved a claim that is not the stale one puts it back.
        tomb = lock.with_name(f"{lock.name}.stale-{self.claim_id}")
        try:
            os.rename(lock, tomb)
        except FileNotFoundError:
            return
        moved = read_json(tomb)
        owner = stale.data.get("uuid")
        if moved is not None and moved.get("uuid") != owner:
            with contextlib.suppress(OSError):
                os.link(tomb, lock)
        elif isinstance(owner, str) and owner:
            # Its owner is gone: so is any probe it was killed between making and removing
            # (`fs_now_ns`), which a leader would otherwise keep until it went stale.
            for p in self.dir.iterdir():
                if p.name.startswith(f"probe_{owner}_"):
                    unlink(p)
        unlink(tomb)

    def fs_now_ns(self) -> int:
        """The shared filesystem's idea of "now": the mtime of a file created just now."""
        probe = self.dir / f"probe_{self.claim_id}_{uuid.uuid4().hex[:8]}"
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            return os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)
            unlink(probe)

    def read(self, lock: Path) -> Claim | None:
        # open + fstat rather than stat: on NFS, open() revalidates the attribute cache.
        try:
            with open(lock, "rb") as f:
                mtime = os.fstat(f.fileno()).st_mtime_ns
                raw = f.read()
        except (FileNotFoundError, NotADirectoryError):  # no claim (or no directory) there
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            data = {}  # still being written
        return Claim(data if isinstance(data, dict) else {}, mtime)

    def is_stale(self, claim: Claim) -> bool:
        """Whether the claim's heartbeat is older than `stale_after_s`."""
        return self.fs_now_ns() - claim.mtime_ns > self.stale_after_s * 1e9


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True  # unknown: let the heartbeat decide
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed process that nobody has reaped yet still answers signal 0.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
