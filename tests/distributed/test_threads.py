"""Threads per CPU worker (distributed/threads.py): the share of the affinity mask and the
cgroup quota, the user's OMP_NUM_THREADS / OMP_WAIT_POLICY respected, and what real
workers — spawned children over gloo, the in-process worker, the CLI's run — get."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reagent_lite.distributed import DistContext, launch, plan_launch
from reagent_lite.distributed.threads import (
    CpuLimits,
    cgroup_quota_cores,
    cores_per_process,
    plan_threads,
)
from reagent_lite.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
HARD_TIMEOUT_S = 120.0


def _cores_here() -> int:
    return CpuLimits(len(os.sched_getaffinity(0)), cgroup_quota_cores()).cores


# ----------------------------------------------------------------------- the share


@pytest.mark.parametrize(
    ("affinity", "quota", "processes", "threads"),
    [
        (8, None, 1, 8),
        (8, None, 2, 4),
        (8, None, 3, 2),  # rounded down: 3 × 3 would be 9 threads on 8 cores
        (2, None, 4, 1),  # at least one
        (8, 2.0, 1, 2),  # the quota is the smaller
        (8, 1.5, 1, 2),  # a fractional quota rounds up
        (8, 0.2, 2, 1),
        (2, 6.0, 1, 2),  # the affinity is the smaller
    ],
)
def test_each_worker_takes_its_share_of_the_smaller_limit(
    affinity: int, quota: float | None, processes: int, threads: int
) -> None:
    plan = plan_threads(processes, CpuLimits(affinity, quota), {})
    assert plan.threads == threads
    assert plan.child_env() == {"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"}


def test_the_log_line_names_the_share_and_the_wait() -> None:
    plan = plan_threads(1, CpuLimits(2), {})
    assert plan.describe() == (
        "CPU threads: 2 per process (affinity 2 cores, 1 process), OpenMP wait passive"
    )
    quota = plan_threads(2, CpuLimits(8, 4.0), {}).describe()
    assert quota.startswith("CPU threads: 2 per process (affinity 8 cores, cgroup quota 4, 2 proc")


@pytest.mark.parametrize(("value", "threads"), [("3", 3), (" 4 ", 4), ("4,2", 4)])
def test_the_users_omp_num_threads_is_respected(value: str, threads: int) -> None:
    plan = plan_threads(2, CpuLimits(16), {"OMP_NUM_THREADS": value})
    assert plan.threads == threads
    assert "OMP_NUM_THREADS" not in plan.child_env()  # the child inherits the user's own
    assert f"(OMP_NUM_THREADS={threads}, yours, 2 processes)" in plan.describe()


@pytest.mark.parametrize("value", ["abc", "0", "-2", "2.5"])
def test_a_bad_omp_num_threads_is_a_config_error_naming_it(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_threads(1, CpuLimits(2), {"OMP_NUM_THREADS": value})
    assert "OMP_NUM_THREADS" in str(err.value) and repr(value) in str(err.value)
    assert "positive number of threads" in str(err.value)
    assert err.value.exit_code == 2


def test_the_users_wait_policy_is_respected() -> None:
    plan = plan_threads(1, CpuLimits(2), {}, user_wait="active")
    assert plan.wait_policy == "ACTIVE"
    assert "OMP_WAIT_POLICY" not in plan.child_env()
    assert plan.describe().endswith("OpenMP wait active (OMP_WAIT_POLICY, yours)")


def test_a_wait_policy_that_can_no_longer_be_set_is_said_so() -> None:
    plan = plan_threads(1, CpuLimits(2), {}, wait_settable=False)
    assert plan.wait_policy is None
    assert "OpenMP wait: OpenMP's default (torch was imported before" in plan.describe()


# ------------------------------------------------------------------ cgroup quotas


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_cgroup_v2_quota_is_the_smallest_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    _write(tmp_path / "job" / "step" / "cpu.max", "150000 100000")
    _write(tmp_path / "job" / "cpu.max", "max 100000")
    assert cgroup_quota_cores(tmp_path, "0::/job/step\n") == 1.5
    _write(tmp_path / "job" / "cpu.max", "50000 100000")
    assert cgroup_quota_cores(tmp_path, "0::/job/step\n") == 0.5


def test_cgroup_v2_without_a_quota(tmp_path: Path) -> None:
    _write(tmp_path / "job" / "cpu.max", "max 100000")
    assert cgroup_quota_cores(tmp_path, "0::/job\n") is None
    assert cgroup_quota_cores(tmp_path / "absent", "0::/\n") is None


def test_a_container_sees_its_own_cgroup_at_the_mount_point(tmp_path: Path) -> None:
    # /proc/self/cgroup names the host's path, which the container does not see.
    _write(tmp_path / "cpu.max", "200000 100000")
    assert cgroup_quota_cores(tmp_path, "0::/docker/abc123\n") == 2.0


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    mount = tmp_path / "cpu,cpuacct"
    _write(mount / "batch" / "cpu.cfs_quota_us", "300000")
    _write(mount / "batch" / "cpu.cfs_period_us", "100000")
    text = "5:memory:/batch\n4:cpu,cpuacct:/batch\n"
    assert cgroup_quota_cores(tmp_path, text) == 3.0
    _write(mount / "batch" / "cpu.cfs_quota_us", "-1")  # v1's "no quota"
    assert cgroup_quota_cores(tmp_path, text) is None


# ------------------------------------------------------------------- real workers


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    return {**env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def _node(tmp_path: Path, env: dict[str, str]) -> tuple[list[dict], str]:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tests.distributed._node", "--num_nodes", "1", "--cpu_procs"]
    cmd += ["2", "--init_method", (tmp_path / "rdzv").as_uri(), "--out", str(out)]
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=HARD_TIMEOUT_S
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))], log


def test_spawned_cpu_workers_start_with_their_share(tmp_path: Path) -> None:
    share = max(1, _cores_here() // 2)
    results, log = _node(tmp_path, _env(OMP_DISPLAY_ENV="VERBOSE"))
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["omp_num_threads"] == str(share)
        assert r["omp_wait_policy"] == "PASSIVE"
        assert r["torch_threads"] == share
    # Each child's OpenMP runtime started with them (it prints its settings as it loads).
    assert log.count(f"OMP_NUM_THREADS = '{share}'") >= 2, log
    assert log.count("GOMP_SPINCOUNT = '0'") >= 2, log  # passive: no spinning
    assert f"CPU threads: {share} per process (affinity " in log
    assert "2 processes), OpenMP wait passive" in log


def test_spawned_cpu_workers_keep_the_users_values(tmp_path: Path) -> None:
    results, log = _node(tmp_path, _env(OMP_NUM_THREADS="3", OMP_WAIT_POLICY="ACTIVE"))
    assert [(r["omp_num_threads"], r["omp_wait_policy"], r["torch_threads"]) for r in results] == [
        ("3", "ACTIVE", 3)
    ] * 2
    assert "CPU threads: 3 per process (OMP_NUM_THREADS=3, yours, 2 processes)" in log
    assert "OpenMP wait active (OMP_WAIT_POLICY, yours)" in log


def test_the_in_process_worker_takes_its_share_and_gives_the_count_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if _cores_here() < 2:
        pytest.skip("needs 2 usable cores to tell the share from one thread")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plan = plan_launch(
        num_nodes=1, node_index=0, use_gpu=False, use_all_avail_gpus=True, init_method=None
    )
    assert plan.mode == "single"
    seen: list[int] = []

    def worker(ctx: DistContext) -> None:
        seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        launch(plan, worker)
        assert seen == [_cores_here()]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_cli_run_waits_passively_from_the_start(tmp_path: Path) -> None:
    """The worker the command runs itself: OpenMP loads with torch in the entry point's
    process, so the wait policy must be in its environment before that."""
    cfg = json.loads((REPO / "sample_configs" / "ci" / "dqn_1node.json").read_text())
    cfg.update(
        training_data_path=str(tmp_path / "data" / "train.parquet"),
        eval_data_path=str(tmp_path / "data" / "eval.parquet"),
        model_output_path=str(tmp_path / "model"),
        epochs=1,
    )
    cfg["evaluation"]["online_episodes"] = 0
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "workflows.dqn_workflow", "--config", str(path)],
        cwd=REPO,
        env=_env(OMP_DISPLAY_ENV="VERBOSE"),
        capture_output=True,
        text=True,
        timeout=HARD_TIMEOUT_S * 2,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "GOMP_SPINCOUNT = '0'" in log and "GOMP_SPINCOUNT = '300000'" not in log, log
    cores = _cores_here()
    expected = f"CPU threads: {cores} per process (affinity {len(os.sched_getaffinity(0))} core"
    assert expected in log and "1 process), OpenMP wait passive" in log, log


def test_ranks_started_by_torchrun_or_srun_take_their_share_and_log_once(tmp_path: Path) -> None:
    """Two ranks of one node in env:// mode (as `srun` starts them, without torchrun's
    OMP_NUM_THREADS): each in-process worker takes half the cores; local rank 0 logs."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    share = max(1, _cores_here() // 2)
    out = tmp_path / "out"
    procs = []
    for rank in range(2):
        env = _env(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", RANK=str(rank),
            LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
        )  # fmt: skip
        cmd = [sys.executable, "-m", "tests.distributed._node", "--out", str(out)]
        with open(tmp_path / f"rank{rank}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log))
    logs = []
    try:
        for rank, p in enumerate(procs):
            p.wait(HARD_TIMEOUT_S)
            logs.append((tmp_path / f"rank{rank}.log").read_text())
            assert p.returncode == 0, logs[-1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    results = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert [(r["rank"], r["torch_threads"]) for r in results] == [(0, share), (1, share)]
    assert f"CPU threads: {share} per process (affinity" in logs[0]
    assert "2 processes)" in logs[0]
    assert "CPU threads:" not in logs[1], logs[1]


def test_a_ranks_share_of_the_cores_divides_what_this_process_may_use() -> None:
    mine = CpuLimits(len(os.sched_getaffinity(0)), cgroup_quota_cores()).cores
    assert cores_per_process(1) == mine
    assert cores_per_process(mine * 2) == 1  # never 0
    assert cores_per_process(2) == max(1, mine // 2)
