"""Multi-node workflows with every node a separate OS process (gloo, file:// rendezvous).

What the distributed contract (docs/DISTRIBUTED.md) promises, checked on tiny data:

* 2 nodes (dqn, whole-file shards) and 3 nodes (parametric_dqn, 1001 rows in row-range
  shards of 333/334/334) train to completion; with ``REAGENT_LITE_VERIFY_REPLICAS=1`` every
  rank compares a hash of its parameters after every optimizer step (and the step count),
  so a pass means the replicas were identical after every step and all ranks ran equally
  many steps; only node 0 writes outputs.
* The result equals a single-process run over the same global batches in the same order
  (``REAGENT_LITE_EMULATE_WORLD_SIZE=W``: one process reads the W shards end to end and
  trains on the union of what the W ranks draw, W·B rows a step), to within float
  tolerance: DDP's mean of per-rank mean gradients is the mean over the union.
* Faults: a node missing, a duplicate --node_index, a node SIGKILLed mid-training (the
  survivor exits 4 within collective_timeout_s, no model written), then a re-run over the
  dead run's rendezvous leftovers with --resume ends with exactly the parameters of an
  uninterrupted run.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from reagent_lite.training.checkpoint import latest_checkpoint
from tests.workflows.nodes import (
    Job,
    assert_close_states,
    assert_outputs_once,
    epoch_losses,
    make_dqn_parts,
    make_parametric_rows,
    model_state,
    run_single,
    write_config,
)

VERIFY = {"REAGENT_LITE_VERIFY_REPLICAS": "1"}
# 2-node dqn: 4 epochs of 5 steps (checkpoints after each epoch, to kill a node between).
DQN_2 = {"epochs": 4, "training": {"steps_per_epoch": 5}}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    return {
        "dqn": make_dqn_parts(root / "dqn", parts=2),
        "parametric": make_parametric_rows(root / "parametric", rows=1001),
    }


@pytest.fixture(scope="module")
def dqn_two_nodes(tmp_path_factory: pytest.TempPathFactory, data: dict[str, Path]) -> Path:
    """An uninterrupted 2-node dqn run (replicas checked every step); its root directory."""
    root = tmp_path_factory.mktemp("dqn2")
    cfg = write_config(
        root / "c.json",
        "dqn",
        data["dqn"],
        root / "out",
        num_nodes=2,
        init_method=(root / "rdzv").as_uri(),
        **DQN_2,
    )
    job = Job("dqn", cfg, root / "logs", env=VERIFY)
    try:
        nodes = job.run(2)
    finally:
        job.close()
    (root / "node0.log").write_text(nodes[0].text())
    (root / "node1.log").write_text(nodes[1].text())
    return root


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for job in started:
        job.close()


def _replica_checks(log: str, world: int) -> int:
    marker = f"replica check: all {world} ranks held identical parameters at "
    assert marker in log, log[-3000:]
    return int(log.split(marker, 1)[1].split()[0])


def test_two_nodes_dqn_replicas_identical_and_equal_to_one_process(
    tmp_path: Path, dqn_two_nodes: Path, data: dict[str, Path]
) -> None:
    out = dqn_two_nodes / "out"
    log0, log1 = [(dqn_two_nodes / f"node{k}.log").read_text() for k in (0, 1)]
    assert _replica_checks(log0, 2) == 4 * 5 + 1
    assert_outputs_once(out)
    assert "model: " in log0 and "model: " not in log1  # only node 0 reports (and writes)
    for k, log in enumerate((log0, log1)):  # every node says it joined and finished
        assert f"node {k} joined session" in log and f"node {k} finished session" in log, k
    assert len(epoch_losses(out)) == 4  # one record per epoch: one writer
    assert json.loads((out / "model_meta.json").read_text())["world_size"] == 2
    assert not (dqn_two_nodes / "rdzv.rdzv").exists(), "rendezvous files left after a clean run"

    single = write_config(tmp_path / "c.json", "dqn", data["dqn"], tmp_path / "out", **DQN_2)
    log = run_single("dqn", single, tmp_path, {"REAGENT_LITE_EMULATE_WORLD_SIZE": "2"}).text()
    assert "emulating world size 2" in log and "global batch 64" in log
    assert_close_states(tmp_path / "out", out, atol=1e-5)
    assert epoch_losses(tmp_path / "out") == pytest.approx(epoch_losses(out), rel=1e-4)


def test_three_nodes_parametric_uneven_shards_equal_to_one_process(
    tmp_path: Path, data: dict[str, Path], jobs: list[Job]
) -> None:
    shared = tmp_path / "nfs"
    cfg = write_config(
        shared / "c.json",
        "parametric_dqn",
        data["parametric"],
        shared / "out",
        num_nodes=3,
        init_method=(shared / "rdzv").as_uri(),
        training={"minibatch_size": 64},
    )
    job = Job("parametric_dqn", cfg, tmp_path / "logs", env=VERIFY)
    jobs.append(job)
    nodes = job.run(3)
    log0 = nodes[0].text()
    # 1001 rows over 3 ranks; every rank runs one pass over the largest shard: 6 steps.
    assert "shard rows [333, 334, 334]" in log0 and "6 optimizer steps per epoch" in log0
    assert _replica_checks(log0, 3) == 2 * 6 + 1  # step counts are compared too
    assert_outputs_once(shared / "out")
    assert all("model: " not in n.text() for n in nodes[1:])

    single = write_config(
        tmp_path / "c1.json",
        "parametric_dqn",
        data["parametric"],
        tmp_path / "out",
        training={"minibatch_size": 64},
    )
    log = run_single(
        "parametric_dqn", single, tmp_path / "l1", {"REAGENT_LITE_EMULATE_WORLD_SIZE": "3"}
    ).text()
    assert "shard rows [333, 334, 334]" in log and "global batch 192" in log
    assert_close_states(tmp_path / "out", shared / "out", atol=1e-5)


def test_node_killed_mid_training_then_resume_matches_uninterrupted(
    tmp_path: Path, dqn_two_nodes: Path, data: dict[str, Path], jobs: list[Job]
) -> None:
    out = tmp_path / "out"
    cfg = write_config(
        tmp_path / "c.json",
        "dqn",
        data["dqn"],
        out,
        num_nodes=2,
        init_method=(tmp_path / "rdzv").as_uri(),
        collective_timeout_s=20,
        **DQN_2,
    )
    job = Job("dqn", cfg, tmp_path / "logs", env=VERIFY)
    jobs.append(job)
    node0, node1 = job.start(0), job.start(1)
    end = time.monotonic() + 180
    while latest_checkpoint(out) is None:
        assert node0.proc.poll() is None and node1.proc.poll() is None, node0.text()[-3000:]
        assert time.monotonic() < end, "no checkpoint within 180 s"
        time.sleep(0.01)
    # Freeze the job where it is (mid-training, after the first checkpoint), kill node 1,
    # let node 0 go on: it must notice the dead peer, however fast this machine trains.
    for node in (node0, node1):
        node.proc.send_signal(signal.SIGSTOP)
    assert not (out / "model.pt2").exists(), "training finished before the kill"
    node1.kill()
    node0.proc.send_signal(signal.SIGCONT)
    killed = time.monotonic()
    rc = node0.wait(timeout=20 + 60)
    survivor = node0.text()
    assert rc == 4, survivor[-3000:]
    assert time.monotonic() - killed < 20 + 15, "survivor outlived collective_timeout_s"
    assert "collective failed" in survivor and "Traceback" not in survivor
    assert not (out / "model.pt2").exists() and not (out / "model_meta.json").exists()
    assert not list(out.glob(".*.tmp*")), "half-written files left behind"
    rdzv = tmp_path / "rdzv.rdzv"
    assert (rdzv / "node_1.lock").exists(), "expected the killed node's stale claim"

    # Same command plus --resume, over the dead run's rendezvous leftovers.
    resumed = [job.start(k, "--resume") for k in (0, 1)]
    for node in resumed:
        assert node.wait() == 0, node.text()[-3000:]
    assert "resumed from" in resumed[0].text()
    assert "stale rendezvous claim" in resumed[1].text()
    assert_outputs_once(out)
    want, got = model_state(dqn_two_nodes / "out"), model_state(out)
    assert all(torch.equal(want[k], got[k]) for k in want), "resumed run diverged"


def test_missing_node_makes_the_others_exit_4_naming_it(
    tmp_path: Path, data: dict[str, Path], jobs: list[Job]
) -> None:
    timeout_s = 8
    cfg = write_config(
        tmp_path / "c.json",
        "dqn",
        data["dqn"],
        tmp_path / "out",
        num_nodes=3,
        init_method=(tmp_path / "rdzv").as_uri(),
        rendezvous_timeout_s=timeout_s,
    )
    job = Job("dqn", cfg, tmp_path / "logs")
    jobs.append(job)
    start = time.monotonic()
    nodes = [job.start(0), job.start(1)]  # node_index 2 never comes
    for node in nodes:
        assert node.wait(timeout=timeout_s + 90) == 4, node.text()[-3000:]
    # Start-up (imports) under load plus the timeout; far below an unbounded wait.
    assert time.monotonic() - start < timeout_s + 60
    log0, log1 = nodes[0].text(), nodes[1].text()
    assert "2 of 3 nodes arrived; missing node_index [2]" in log0, log0[-3000:]
    assert "missing node_index [2]" in log1, log1[-3000:]
    assert "Traceback" not in log0 + log1
    assert not (tmp_path / "out" / "model.pt2").exists()


def test_duplicate_node_index_fails_at_once(
    tmp_path: Path, data: dict[str, Path], jobs: list[Job]
) -> None:
    cfg = write_config(
        tmp_path / "c.json",
        "dqn",
        data["dqn"],
        tmp_path / "out",
        num_nodes=2,
        init_method=(tmp_path / "rdzv").as_uri(),
        rendezvous_timeout_s=120,
    )
    job = Job("dqn", cfg, tmp_path / "logs")
    jobs.append(job)
    first = job.start(1)
    claim = tmp_path / "rdzv.rdzv" / "node_1.lock"
    end = time.monotonic() + 90
    while not claim.exists():
        assert first.proc.poll() is None, first.text()[-3000:]
        assert time.monotonic() < end, "node 1 never claimed its index"
        time.sleep(0.05)
    second = job.start(1)
    rc = second.wait(timeout=90)
    elapsed = time.monotonic() - second.started
    log = second.text()
    assert rc == 4, log[-3000:]
    assert "node_index 1 is already claimed" in log and "Traceback" not in log
    # Import time plus the liveness window (5 heartbeats), not the 120 s rendezvous timeout.
    assert elapsed < 60, f"took {elapsed:.0f}s"
    assert first.proc.poll() is None, "the legitimate node 1 must be left alone"


def test_torchrun_style_ranks_wait_for_rank_zeros_sample_data(tmp_path: Path) -> None:
    """Under torchrun every rank runs the command: rank 0 generates the config's sample
    data while rank 1 starts; rank 1 must not fail on the not-yet-written data (it reads
    it only after joining the process group, which rank 0 does once the data exists)."""
    import os
    import socket
    import subprocess
    import sys

    from tests.workflows.nodes import HARD_TIMEOUT_S, REPO_ROOT

    data = tmp_path / "generated" / "train.parquet"
    cfg = write_config(tmp_path / "c.json", "dqn", data, tmp_path / "out", epochs=1)
    raw = json.loads(cfg.read_text())
    raw["sample_data"] = {"kind": "gym", "env": "CartPole-v1", "episodes": 300, "seed": 0}
    cfg.write_text(json.dumps(raw))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {
            **os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
            "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
        }  # fmt: skip
        log = tmp_path / f"rank{rank}.log"
        with open(log, "wb") as f:
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "workflows.dqn_workflow", "--config", str(cfg)],
                cwd=REPO_ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
            ), log))  # fmt: skip
    try:
        for proc, log in procs:
            rc = proc.wait(HARD_TIMEOUT_S)
            assert rc == 0, log.read_text()[-3000:]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
    assert "generating sample data" in procs[0][1].read_text()
    assert_outputs_once(tmp_path / "out")
