"""Whole nodes as real processes (tests/distributed/_node.py): gloo, file:// rendezvous in tmp_path.

Every subprocess has a hard timeout; no fixed ports (env:// picks a free one).
"""

from __future__ import annotations

import builtins
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HARD_TIMEOUT_S = 90.0


@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    log: Path

    def finish(self, timeout: float = HARD_TIMEOUT_S) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            pytest.fail(f"node did not exit within {timeout}s:\n{self.log.read_text()}")
        return rc, self.log.read_text()


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.out = tmp / "out"
        self.init_method = (tmp / "shared" / "rdzv").as_uri()
        self.rdzv_dir = tmp / "shared" / "rdzv.rdzv"
        self.nodes: list[Node] = []

    def start(self, k: int, n: int, *extra: str, env: dict[str, str] | None = None) -> Node:
        log = self.tmp / f"node{k}-{len(self.nodes)}.log"
        cmd = [sys.executable, "-m", "tests.distributed._node", "--num_nodes", str(n)]
        cmd += ["--node_index", str(k), "--out", str(self.out), *extra]
        if env is None:
            cmd += ["--init_method", self.init_method]
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        with open(log, "wb") as f:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=full_env)
        node = Node(proc, log)
        self.nodes.append(node)
        return node

    def run(self, n: int, *extra: str) -> list[tuple[int, str]]:
        nodes = [self.start(k, n, *extra) for k in range(n)]
        return [node.finish() for node in nodes]

    def results(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.out.glob("rank*.json"))]

    def wait_for(self, path: Path, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > end:
                logs = "\n".join(n.log.read_text() for n in self.nodes)
                pytest.fail(f"{path} did not appear within {timeout}s\n{logs}")
            time.sleep(0.05)

    def kill_all(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    yield c
    c.kill_all()


def _assert_all_agree(cluster: Cluster, world_size: int) -> None:
    results = cluster.results()
    assert [r["rank"] for r in results] == list(range(world_size))
    expected = world_size * (world_size + 1) / 2
    for r in results:
        assert r["world_size"] == world_size
        assert r["sums"] and all(s == expected for s in r["sums"])
        assert r["mean"] == pytest.approx((world_size - 1) / 2)
        assert r["broadcast"] == {"stop": True, "from": 0}
        assert r["gathered"] == [10 * i for i in range(world_size)]


def _assert_clean(cluster: Cluster) -> None:
    leftovers = list(cluster.rdzv_dir.iterdir()) if cluster.rdzv_dir.exists() else []
    assert leftovers == []


def test_three_nodes_complete_agree_and_clean_up(cluster: Cluster) -> None:
    # Two-node runs are covered by the re-run tests below.
    num_nodes = 3
    for rc, log in cluster.run(num_nodes):
        assert rc == 0, log
    _assert_all_agree(cluster, num_nodes)
    assert [r["node_index"] for r in cluster.results()] == list(range(num_nodes))
    _assert_clean(cluster)


def test_two_processes_per_node_via_spawn(cluster: Cluster) -> None:
    ((rc, log),) = cluster.run(1, "--cpu_procs", "2")
    assert rc == 0, log
    _assert_all_agree(cluster, 2)
    assert [(r["local_rank"], r["procs_per_node"]) for r in cluster.results()] == [(0, 2), (1, 2)]
    assert len({r["pid"] for r in cluster.results()}) == 2
    _assert_clean(cluster)


def test_spawned_worker_error_keeps_class_and_message(cluster: Cluster) -> None:
    ((rc, log),) = cluster.run(1, "--cpu_procs", "2", "--fail_rank", "1", "--steps", "50")
    assert rc == 3, log  # DataError's exit code
    assert "column reward: 3 bad rows" in log
    assert "Traceback" not in log


def test_release_frames_reaches_causes_contexts_and_group_members() -> None:
    """What a failed rank lets go of: the locals of every frame its error, the errors it
    was raised from or while handling, and an exception group's members, still hold."""
    from reagent_lite.distributed.worker import _release_frames

    group_type = getattr(builtins, "ExceptionGroup", None)
    if group_type is None:
        pytest.skip("exception groups need Python 3.11")

    class Model:
        pass

    held: list[weakref.ref[Model]] = []

    def fail(kind: type[Exception]) -> None:
        model = Model()
        held.append(weakref.ref(model))
        raise kind("inner")

    def grouped() -> None:
        errors = []
        try:
            fail(ValueError)
        except ValueError as err:
            errors.append(err)
        raise group_type("group", errors)  # no context: the member is reachable only here

    try:
        try:
            grouped()
        except group_type:
            try:
                fail(KeyError)  # raised while handling: the group is its context
            except KeyError as ctx_err:
                raise RuntimeError("outer") from ctx_err
    except RuntimeError as top:
        assert all(ref() is not None for ref in held)
        _release_frames(top)
        gc.collect()
        assert len(held) == 2 and all(ref() is None for ref in held)


@pytest.mark.parametrize("fail_rank", [-1, 1])
def test_ddp_wrappers_are_freed_before_the_group_is_destroyed(
    cluster: Cluster, fail_rank: int
) -> None:
    """A DDP wrapper freed after its gloo group was destroyed destroys the group itself,
    under the GIL, which can deadlock with gloo's worker thread; a failed rank's traceback
    (here the traceback of the error the raised one came from) would keep it alive that
    long, and so would DDP's own reference cycle without a collection. Whether the run
    ends or a rank fails, every wrapper goes while the group is still there. (The other
    rank ignores the launcher's SIGTERM, so it always reaches its own error.)"""
    ((rc, log),) = cluster.run(
        1,
        *("--cpu_procs", "2", "--ddp", "--fail_rank", str(fail_rank), "--steps", "4"),
        "--ignore_sigterm",
    )
    assert rc == (0 if fail_rank < 0 else 3), log
    for rank in (0, 1):
        freed = cluster.out / f"ddp_freed_rank{rank}"
        assert freed.exists(), log
        assert freed.read_text() == "group alive", (rank, log)


@pytest.mark.parametrize("fail_rank", [-1, 1])
def test_a_real_runs_ddp_wrappers_go_before_its_group(tmp_path: Path, fail_rank: int) -> None:
    """The same through the command: a dqn run on two CPU processes (eager DDP over gloo),
    finished or with rank 1 failing mid-training (`ddp_watch/sitecustomize.py` watches the
    wrappers and injects the failure)."""
    from tests.training.runs import tiny_dqn_config

    cfg = tiny_dqn_config(tmp_path, epochs=3, checkpoint_every_epochs=0)
    path = tmp_path / "c.json"
    path.write_text(cfg.model_copy(update={"use_all_avail_gpus": True}).model_dump_json())
    watch = tmp_path / "watch"
    watch.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests/distributed/ddp_watch"), str(REPO)]),
        "REAGENT_LITE_CPU_PROCS_PER_NODE": "2",
        "WATCH_DDP_DIR": str(watch),
        "WATCH_DDP_FAIL_RANK": str(fail_rank),
    }
    cmd = [sys.executable, "-m", "workflows.dqn_workflow", "--config", str(path)]
    done = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=HARD_TIMEOUT_S
    )
    if fail_rank < 0:
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        assert done.returncode != 0 and "injected failure" in done.stderr, done.stderr[-3000:]
    for rank in (0, 1):
        freed = watch / f"ddp_freed_rank{rank}"
        assert freed.exists(), done.stderr[-3000:]
        assert freed.read_text() == "group alive", (rank, done.stderr[-3000:])


def test_missing_node_makes_others_fail_within_timeout(cluster: Cluster) -> None:
    leader = cluster.start(0, 3, "--rdzv_timeout", "4")
    follower = cluster.start(1, 3, "--rdzv_timeout", "3")
    start = time.monotonic()
    (rc0, log0), (rc1, log1) = leader.finish(), follower.finish()
    assert time.monotonic() - start < 40  # startup + 4 s, not a hang
    assert rc0 == 4 and "2 of 3 nodes arrived; missing node_index [2]" in log0, log0
    assert rc1 == 4 and "node 0" in log1 and "never published a session" in log1, log1


def test_duplicate_node_index_is_rejected_at_once(cluster: Cluster) -> None:
    first = cluster.start(1, 2, "--rdzv_timeout", "60")
    cluster.wait_for(cluster.rdzv_dir / "node_1.lock")
    dup = cluster.start(1, 2, "--rdzv_timeout", "60")
    rc, log = dup.finish(timeout=40)
    assert rc == 4, log
    assert "node_index 1 is already claimed by host" in log and f"pid {first.proc.pid}" in log
    assert first.proc.poll() is None  # the legitimate node is untouched


def test_rerun_after_kill_during_handshake(cluster: Cluster) -> None:
    lonely = cluster.start(0, 2, "--rdzv_timeout", "60")
    cluster.wait_for(cluster.rdzv_dir / "node_0.lock")
    lonely.proc.send_signal(signal.SIGKILL)
    lonely.proc.wait(10)
    for rc, log in cluster.run(2):
        assert rc == 0, log
    _assert_all_agree(cluster, 2)
    _assert_clean(cluster)


def test_dead_peer_mid_training_fails_survivor_then_rerun_succeeds(cluster: Cluster) -> None:
    slow = ("--steps", "400", "--step_sleep", "0.05", "--coll_timeout", "8")
    survivor = cluster.start(0, 2, *slow)
    victim = cluster.start(1, 2, *slow)
    cluster.wait_for(cluster.out / "started_rank1")
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    start = time.monotonic()
    rc, log = survivor.finish(timeout=30)
    assert time.monotonic() - start < 8 + 5
    assert rc == 4 and "a collective failed" in log, log
    # The crashed run left its claim, session and store behind; the same command works again.
    assert (cluster.rdzv_dir / "session.json").exists()
    for p in cluster.out.glob("*"):
        p.unlink()
    for rc, log in cluster.run(2):
        assert rc == 0, log
    _assert_all_agree(cluster, 2)
    _assert_clean(cluster)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # an unreaped zombie is dead


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_env_mode_under_torchrun_style_variables(cluster: Cluster) -> None:
    base = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2"}
    nodes = [cluster.start(r, 2, env={**base, "RANK": str(r), "LOCAL_RANK": "0"}) for r in range(2)]
    for node in nodes:
        rc, log = node.finish()
        assert rc == 0, log
        assert "mode: env" in log
    _assert_all_agree(cluster, 2)
    assert not cluster.rdzv_dir.exists()


def test_spawned_workers_die_with_their_launcher(cluster: Cluster) -> None:
    launcher = cluster.start(0, 1, "--cpu_procs", "2", "--steps", "400", "--step_sleep", "0.05")
    cluster.wait_for(cluster.out / "started_rank1")
    children_file = Path(f"/proc/{launcher.proc.pid}/task/{launcher.proc.pid}/children")
    if not children_file.exists():
        pytest.skip("needs Linux /proc")
    children = [int(p) for p in children_file.read_text().split()]
    assert len(children) >= 2
    launcher.proc.send_signal(signal.SIGKILL)
    launcher.proc.wait(10)
    end = time.monotonic() + 15
    while any(_running(pid) for pid in children):
        assert time.monotonic() < end, "orphaned workers kept running"
        time.sleep(0.1)


_ABORT_THEN_RESTART = """
import sys
import torch.distributed as dist
from reagent_lite.distributed.worker import _abort_groups

first, second = sys.argv[1:3]
dist.init_process_group("gloo", init_method=first, rank=0, world_size=1)
_abort_groups()
assert not dist.is_initialized(), "the aborted group is still registered"
dist.init_process_group("gloo", init_method=second, rank=0, world_size=1)
dist.barrier()
dist.destroy_process_group()
print("restarted")
"""


def test_aborted_groups_are_forgotten_so_the_process_can_start_another(tmp_path: Path) -> None:
    """After a failure over NCCL a worker aborts its groups (`_abort_groups`) instead of
    destroying them gracefully; a process that goes on (the worker ran in the launcher's
    own process) must be able to start a new group. Here over gloo, a world of one."""
    proc = subprocess.run(
        [sys.executable, "-c", _ABORT_THEN_RESTART,
         (tmp_path / "a").as_uri(), (tmp_path / "b").as_uri()],
        cwd=REPO, capture_output=True, text=True, timeout=HARD_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "restarted" in proc.stdout


def test_workers_that_ignore_a_forwarded_sigterm_are_ended_after_the_grace(
    cluster: Cluster,
) -> None:
    """Preemption: a launcher that got SIGTERM forwards it and waits; workers that do not
    stop within the grace (stuck in a collective or a driver call) are ended, and the node
    exits 143 with a line naming --resume, well before a scheduler's SIGKILL."""
    launcher = cluster.start(
        0, 1, "--cpu_procs", "2", "--steps", "4000", "--step_sleep", "0.05",
        "--ignore_sigterm", "--preempt_grace", "2",
    )  # fmt: skip
    cluster.wait_for(cluster.out / "started_rank1")
    sent = time.monotonic()
    launcher.proc.send_signal(signal.SIGTERM)
    rc, log = launcher.finish(timeout=60)
    took = time.monotonic() - sent
    assert rc == 143, log
    assert "did not stop within 2s of SIGTERM" in log and "--resume" in log
    # 2 s of grace, at most 5 s more for the SIGTERM/SIGKILL of the workers, plus polling.
    assert took < 12, took
    assert not cluster.results()  # the workers never finished their steps
