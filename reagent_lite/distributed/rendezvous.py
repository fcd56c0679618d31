"""File rendezvous on a shared filesystem that survives crashed runs, missing and duplicate nodes.

torch's `FileStore` must start from a brand-new file: a file left behind by a crashed run
makes the next run hang or talk to dead ports. So the user's ``file:///nfs/dir/name`` only
names a *base*; one coordinator per node (the launcher, before it spawns local workers)
meets the others in ``<base>.rdzv/`` and node 0 hands out a fresh store file per run:

* node k claims ``node_<k>.lock`` and heartbeats it (touches it every `heartbeat_s`) for
  the whole run (`claims.py`: when a claim is stale); a stale claim is taken over, a live
  one means the node index is used twice: `DistributedError` at once;
* node 0 waits until every node's claim is seen heartbeating, checks they agree on
  processes per node, and writes ``session.json`` atomically (temp + rename) naming a new
  ``store-<uuid>`` file and the claim ids of the members; the other nodes wait until a
  session lists their own claim id, so a session of a dead run is never joined;
* after a clean run node 0 waits for the other nodes to release their claims (their ranks
  have exited, so none reopens the store), then removes the store and the session; every
  node removes its own claim on the way out, on error too. Node 0 also clears leftovers of earlier runs.
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
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from reagent_lite.distributed.claims import Claim, ClaimBoard, read_json, unlink
from reagent_lite.errors import DistributedError

log = logging.getLogger(__name__)

SESSION_FILE = "session.json"


@dataclass(frozen=True)
class Session:
    """What a successful rendezvous yields: the fresh store file every rank initialises from."""

    session_id: str
    store_path: Path
    members: tuple[str, ...]  # claim ids, by node index
    procs_per_node: int

    @property
    def init_method(self) -> str:
        return self.store_path.as_uri()


class FileRendezvous:
    """One node's side of the handshake; use as a context manager around the whole run."""

    def __init__(
        self,
        directory: str | Path,
        *,
        num_nodes: int,
        node_index: int,
        procs_per_node: int,
        timeout_s: float = 600.0,
        heartbeat_s: float = 1.0,
        stale_after_s: float | None = None,
        liveness_window_s: float | None = None,
        poll_s: float = 0.1,
    ) -> None:
        self.dir = Path(directory)
        self.num_nodes = num_nodes
        self.node_index = node_index
        self.procs_per_node = procs_per_node
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s if stale_after_s is not None else 10 * heartbeat_s
        self.liveness_window_s = liveness_window_s or 5 * heartbeat_s
        self.poll_s = poll_s
        self.claim_id = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.session: Session | None = None
        self.lost_claim = False
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.board = ClaimBoard(
            self.dir,
            claim_id=self.claim_id,
            host=self.host,
            timeout_s=timeout_s,
            stale_after_s=self.stale_after_s,
            liveness_window_s=self.liveness_window_s,
            poll_s=poll_s,
        )

    # ---------------------------------------------------------------- public
    def __enter__(self) -> Session:
        return self.join()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(success=exc_type is None)

    def join(self) -> Session:
        """Claim this node's index, meet the others and return the run's session."""
        deadline = time.monotonic() + self.timeout_s
        try:
            fields = {
                "node_index": self.node_index,
                "num_nodes": self.num_nodes,
                "procs_per_node": self.procs_per_node,
            }
            self.board.acquire(self.node_index, fields, deadline)
            self._heartbeat = threading.Thread(
                target=self._beat, name=f"rdzv-heartbeat-node{self.node_index}", daemon=True
            )
            self._heartbeat.start()
            if self.node_index == 0:
                self._clear_leftovers()
                self.session = self._lead(deadline)
            else:
                self.session = self._follow(deadline)
        except BaseException:
            self.close(success=False)
            raise
        return self.session

    def close(self, success: bool) -> None:
        """Stop heartbeating and remove what this node owns (store + session: node 0, clean runs)."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5 * self.heartbeat_s)
        if self.node_index == 0 and success and self.session is not None:
            # torch's FileStore reopens its file (O_CREAT) while a rank shuts down, so a
            # store removed while another node's ranks still exit is written again and left
            # behind: remove it once the other members have released their claims.
            self._await_members_leaving()
            unlink(self.session.store_path)
            current = read_json(self.dir / SESSION_FILE)
            if current and current.get("session_id") == self.session.session_id:
                unlink(self.dir / SESSION_FILE)
        claim = self.board.read(self.board.lock(self.node_index))
        if claim is not None and claim.data.get("uuid") == self.claim_id:
            unlink(self.board.lock(self.node_index))
        # Best effort: the directory goes when the last node leaves a clean run.
        for d in (self.dir, self.dir.parent):
            if d.name.endswith(".rdzv") or d == self.dir:
                with contextlib.suppress(OSError):
                    d.rmdir()

    def _await_members_leaving(self) -> None:
        """Wait (at most `stale_after_s`) until no other member of the session holds its claim.

        A node releases its claim after its ranks exit; one that crashed leaves a claim that
        stops heartbeating, which is not waited for beyond the bound (the next run's node 0
        clears what it left)."""
        assert self.session is not None
        members = set(self.session.members) - {self.claim_id}
        deadline = time.monotonic() + self.stale_after_s
        while time.monotonic() < deadline:
            claims = (self.board.read(self.board.lock(k)) for k in range(1, self.num_nodes))
            if not any(c is not None and c.data.get("uuid") in members for c in claims):
                return
            time.sleep(self.poll_s)
        log.info(
            "rendezvous: nodes still hold claims after the run; the store stays for the next run"
        )

    def _beat(self) -> None:
        lock = self.board.lock(self.node_index)
        while not self._stop.wait(self.heartbeat_s):
            data = read_json(lock)
            if data is not None and data.get("uuid") != self.claim_id:
                self.lost_claim = True
                log.error("rendezvous claim %s was taken over by another process", lock)
                return
            with contextlib.suppress(OSError):
                os.utime(lock)

    # ---------------------------------------------------------------- node 0
    def _clear_leftovers(self) -> None:
        # Holding node 0's claim makes this process the only leader of this directory, so
        # whatever session or store is here belongs to a finished or crashed run.
        unlink(self.dir / SESSION_FILE)
        now = self.board.fs_now_ns()
        for p in self.dir.iterdir():
            if p.name.startswith(("store-", "session.json.tmp")) or ".stale-" in p.name:
                unlink(p)
            elif p.name.startswith("probe_"):
                with contextlib.suppress(OSError):
                    if now - p.stat().st_mtime_ns > self.stale_after_s * 1e9:
                        unlink(p)

    def _lead(self, deadline: float) -> Session:
        first: dict[int, Claim] = {}
        live: dict[int, Claim] = {}
        while True:
            for k in range(1, self.num_nodes):
                if k in live:
                    continue
                claim = self.board.read(self.board.lock(k))
                if claim is None or not claim.data:
                    continue
                seen = first.get(k)
                if seen is None or seen.data.get("uuid") != claim.data.get("uuid"):
                    first[k] = claim
                elif claim.mtime_ns != seen.mtime_ns:
                    live[k] = claim  # its heartbeat moved while we watched: a live node
            if len(live) == self.num_nodes - 1:
                break
            self._check_cancelled()
            if time.monotonic() > deadline:
                missing = [k for k in range(1, self.num_nodes) if k not in live]
                error = (
                    f"rendezvous timed out after {self.timeout_s:g}s: {len(live) + 1} of "
                    f"{self.num_nodes} nodes arrived; missing node_index {missing} "
                    f"(rendezvous directory {self.dir})"
                )
                # Tell the nodes that did arrive, so they fail now with this message rather
                # than later with a guess (node 0's claim is gone by then).
                waiting = [c.data["uuid"] for c in first.values() if c.data.get("uuid")]
                self._publish({"session_id": uuid.uuid4().hex, "members": waiting, "error": error})
                raise DistributedError(error)
            time.sleep(self.poll_s)

        members = [self.claim_id] + [live[k].data["uuid"] for k in range(1, self.num_nodes)]
        problems = [
            f"node_index {k} ({c.who()}) has {c.data.get('procs_per_node')} processes per node "
            f"and num_nodes={c.data.get('num_nodes')}"
            for k, c in sorted(live.items())
            if c.data.get("procs_per_node") != self.procs_per_node
            or c.data.get("num_nodes") != self.num_nodes
        ]
        session_id = uuid.uuid4().hex
        record: dict[str, Any] = {
            "session_id": session_id,
            "store": f"store-{session_id}",
            "members": members,
            "procs_per_node": self.procs_per_node,
            "num_nodes": self.num_nodes,
            "error": None,
        }
        if problems:
            record["error"] = (
                "all nodes must agree on processes per node and num_nodes, but node_index 0 "
                f"({self.host} pid {os.getpid()}) has {self.procs_per_node} processes per node "
                f"and num_nodes={self.num_nodes} while " + "; ".join(problems)
            )
        self._publish(record)
        if record["error"]:
            raise DistributedError(record["error"])
        return Session(session_id, self.dir / record["store"], tuple(members), self.procs_per_node)

    def _publish(self, record: dict[str, Any]) -> None:
        tmp = self.dir / f"{SESSION_FILE}.tmp-{record['session_id']}"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.dir / SESSION_FILE)

    # ---------------------------------------------------------------- nodes > 0
    def _follow(self, deadline: float) -> Session:
        while True:
            rec = read_json(self.dir / SESSION_FILE)
            if rec is not None and self.claim_id in rec.get("members", ()):
                if rec.get("error"):
                    raise DistributedError(str(rec["error"]))
                return Session(
                    rec["session_id"],
                    self.dir / rec["store"],
                    tuple(rec["members"]),
                    int(rec["procs_per_node"]),
                )
            self._check_cancelled()
            if self.lost_claim:
                raise DistributedError(
                    f"the rendezvous claim of node_index {self.node_index} was taken over by "
                    "another process: is --node_index given to two nodes?"
                )
            if time.monotonic() > deadline:
                raise DistributedError(self._follow_timeout_message())
            time.sleep(self.poll_s)

    def _check_cancelled(self) -> None:
        if self._stop.is_set():
            raise DistributedError(f"rendezvous of node_index {self.node_index} was cancelled")

    def _follow_timeout_message(self) -> str:
        head = (
            f"rendezvous timed out after {self.timeout_s:g}s on node_index {self.node_index}: "
            "node 0 never published a session including this node"
        )
        lead = self.board.read(self.board.lock(0))
        if lead is None:
            why = "node 0 never arrived (no node_0.lock)"
        elif self.board.is_stale(lead):
            why = f"node 0's claim is stale ({lead.who()} stopped heartbeating)"
        else:
            absent = [
                k for k in range(1, self.num_nodes) if self.board.read(self.board.lock(k)) is None
            ]
            why = (
                f"node 0 ({lead.who()}) is up but still waiting for other nodes"
                + (f"; missing node_index {absent}" if absent else "")
                + f"; check that all {self.num_nodes} nodes were started with the same num_nodes"
            )
        return f"{head}: {why} (rendezvous directory {self.dir})"
