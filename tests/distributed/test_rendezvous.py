"""The file handshake alone, with nodes played by threads (fast heartbeats, small timeouts)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reagent_lite.distributed import FileRendezvous, Session
from reagent_lite.errors import DistributedError

FAST = dict(heartbeat_s=0.1, poll_s=0.02)


def _rdzv(d: Path, k: int, n: int, ppn: int = 1, timeout: float = 10.0) -> FileRendezvous:
    return FileRendezvous(
        d, num_nodes=n, node_index=k, procs_per_node=ppn, timeout_s=timeout, **FAST
    )


def _join_all(nodes: list[FileRendezvous]) -> list[Session | BaseException]:
    out: list[Any] = [None] * len(nodes)

    def run(i: int) -> None:
        try:
            out[i] = nodes[i].join()
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait(10)
    return p.pid


def _write_claim(d: Path, k: int, *, host: str, pid: int, age_s: float = 0.0) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    lock = d / f"node_{k}.lock"
    lock.write_text(
        json.dumps(
            {"uuid": f"old{k}", "host": host, "pid": pid, "procs_per_node": 1, "num_nodes": 2}
        )
    )
    t = time.time() - age_s
    os.utime(lock, (t, t))
    return lock


def test_three_nodes_meet_and_clean_up(tmp_path: Path) -> None:
    d = tmp_path / "r.rdzv"
    nodes = [_rdzv(d, k, 3) for k in range(3)]
    sessions = _join_all(nodes)
    assert all(isinstance(s, Session) for s in sessions), sessions
    first = sessions[0]
    assert isinstance(first, Session)
    assert {s.store_path for s in sessions if isinstance(s, Session)} == {first.store_path}
    assert first.members == tuple(n.claim_id for n in nodes)
    assert first.store_path.parent == d and not first.store_path.exists()
    first.store_path.write_text("")  # what init_process_group would have created
    for n in reversed(nodes):
        n.close(success=True)
    assert not d.exists()


def test_leader_removes_the_store_only_after_the_other_nodes_left(tmp_path: Path) -> None:
    # A rank of node 1 still shutting down reopens the store after node 0 finished (torch's
    # FileStore does so in its destructor); removed before that, the store would be left behind.
    d = tmp_path / "r.rdzv"
    nodes = [_rdzv(d, k, 2) for k in range(2)]
    sessions = _join_all(nodes)
    first = sessions[0]
    assert isinstance(first, Session), sessions
    first.store_path.write_text("")
    leader = threading.Thread(target=nodes[0].close, args=(True,))
    leader.start()
    time.sleep(0.3)
    assert leader.is_alive()  # waiting for node 1 to leave
    first.store_path.write_text("late write")  # node 1's rank exiting
    nodes[1].close(success=True)
    leader.join(10)
    assert not leader.is_alive()
    assert not d.exists()


def test_leader_does_not_wait_long_for_a_node_that_died(tmp_path: Path) -> None:
    d = tmp_path / "r.rdzv"
    nodes = [_rdzv(d, k, 2) for k in range(2)]
    assert all(isinstance(s, Session) for s in _join_all(nodes))
    nodes[1]._stop.set()  # node 1 dies: its claim stays, no longer heartbeating
    start = time.monotonic()
    nodes[0].close(success=True)
    assert time.monotonic() - start < nodes[0].stale_after_s + 2
    assert not (d / "session.json").exists()


def test_duplicate_node_index_fails_fast(tmp_path: Path) -> None:
    d = tmp_path / "r.rdzv"
    first = _rdzv(d, 1, 2, timeout=10)

    def wait_in_vain() -> None:
        with pytest.raises(DistributedError, match="cancelled"):
            first.join()

    waiter = threading.Thread(target=wait_in_vain)
    waiter.start()
    while not (d / "node_1.lock").exists():
        time.sleep(0.02)
    start = time.monotonic()
    with pytest.raises(DistributedError) as err:
        _rdzv(d, 1, 2).join()
    assert time.monotonic() - start < 2
    msg = str(err.value)
    assert "node_index 1 is already claimed by host" in msg and f"pid {os.getpid()}" in msg
    first.close(success=False)
    waiter.join(15)
    assert not (d / "node_1.lock").exists()  # the original owner removed its own claim


def test_missing_node_is_named_on_every_node(tmp_path: Path) -> None:
    d = tmp_path / "r.rdzv"
    start = time.monotonic()
    errors = _join_all([_rdzv(d, 0, 3, timeout=1.5), _rdzv(d, 1, 3, timeout=0.8)])
    assert time.monotonic() - start < 5
    assert all(isinstance(e, DistributedError) for e in errors), errors
    assert "2 of 3 nodes arrived; missing node_index [2]" in str(errors[0])
    assert "node 0" in str(errors[1]) and "still waiting for other nodes" in str(errors[1])
    assert "missing node_index [2]" in str(errors[1])
    assert not list(d.glob("node_*.lock"))


def test_leader_giving_up_tells_the_nodes_that_came(tmp_path: Path) -> None:
    d = tmp_path / "r.rdzv"
    start = time.monotonic()
    errors = _join_all([_rdzv(d, 0, 3, timeout=0.8), _rdzv(d, 1, 3, timeout=20)])
    assert time.monotonic() - start < 5  # node 1 did not wait for its own 20 s timeout
    assert all("2 of 3 nodes arrived; missing node_index [2]" in str(e) for e in errors), errors


def test_follower_without_leader_says_node_zero_never_arrived(tmp_path: Path) -> None:
    with pytest.raises(DistributedError, match="node 0 never arrived"):
        _rdzv(tmp_path / "r.rdzv", 1, 2, timeout=0.5).join()


def test_procs_per_node_mismatch_is_reported_to_all(tmp_path: Path) -> None:
    d = tmp_path / "r.rdzv"
    errors = _join_all([_rdzv(d, 0, 2, ppn=2), _rdzv(d, 1, 2, ppn=1)])
    for e in errors:
        assert isinstance(e, DistributedError)
        assert "must agree on processes per node" in str(e)
        assert "node_index 1" in str(e) and "has 1 processes per node" in str(e)


@pytest.mark.parametrize(
    "claim",
    [
        dict(host="other-host", pid=1, age_s=3600),  # old heartbeat, any host
        dict(host="other-host", pid=1, age_s=0),  # recent but never moves again
        dict(host=socket.gethostname(), pid=-1, age_s=0),  # dead process on this host
    ],
    ids=["old-heartbeat", "silent-remote", "dead-local-pid"],
)
def test_stale_leftovers_of_a_crashed_run_are_replaced(tmp_path: Path, claim: dict) -> None:
    d = tmp_path / "r.rdzv"
    if claim["pid"] == -1:
        claim["pid"] = _dead_pid()
    for k in (0, 1):
        _write_claim(d, k, **claim)
    (d / "session.json").write_text(
        json.dumps({"session_id": "dead", "store": "store-dead", "members": ["old0", "old1"]})
    )
    (d / "store-dead").write_text("garbage of a crashed run")
    # A probe the dead node 0 was killed between making and removing: fresh, yet its own.
    (d / "probe_old0_0123abcd").write_text("")
    nodes = [_rdzv(d, 0, 2), _rdzv(d, 1, 2)]
    sessions = _join_all(nodes)
    assert all(isinstance(s, Session) for s in sessions), sessions
    assert isinstance(sessions[0], Session)
    assert sessions[0].session_id != "dead"
    assert not (d / "store-dead").exists()
    for n in nodes:
        n.close(success=True)
    assert not d.exists()


def test_leftover_session_of_dead_run_is_never_joined(tmp_path: Path) -> None:
    # A follower ignores a session that does not list its own claim id.
    d = tmp_path / "r.rdzv"
    d.mkdir()
    (d / "session.json").write_text(
        json.dumps({"session_id": "dead", "store": "store-dead", "members": ["a", "b"]})
    )
    with pytest.raises(DistributedError, match="never published a session"):
        _rdzv(d, 1, 2, timeout=0.5).join()


@pytest.mark.parametrize("where", ["under_a_file", "virtual_fs"])
def test_a_directory_that_cannot_be_made_fails_at_once_naming_it(
    tmp_path: Path, where: str
) -> None:
    """A rendezvous path whose directory can never be created (a file in the way, /proc)
    is an error at once, not a retry loop that never reaches its timeout."""
    if where == "under_a_file":
        (tmp_path / "data.parquet").write_text("x")
        d = tmp_path / "data.parquet" / "r.rdzv"
    else:
        if not Path("/proc/self").exists():
            pytest.skip("needs Linux /proc")
        d = Path("/proc/no-such-dir/r.rdzv")
    out: list[BaseException | None] = [None]

    def run() -> None:
        try:
            _rdzv(d, 0, 2, timeout=60).join()
        except BaseException as exc:
            out[0] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "join() kept retrying instead of failing"
    assert isinstance(out[0], DistributedError), out[0]
    assert f"cannot create the rendezvous directory {d}" in str(out[0])
