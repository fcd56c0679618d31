from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.distributed import CPU_PROCS_ENV, LaunchPlan, plan_launch
from reagent_lite.errors import ConfigError
from tests.config.test_cli import run_workflow

SHIPPED = Path(__file__).resolve().parents[2] / "sample_configs"


def _plan(**kw: Any) -> LaunchPlan:
    args: dict[str, Any] = dict(
        num_nodes=1,
        node_index=0,
        use_gpu=False,
        use_all_avail_gpus=True,
        init_method=None,
        env={},
    )
    args.update(kw)
    return plan_launch(**args)


def test_single_process_cpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        plan = _plan()
    assert plan.mode == "single"
    assert (plan.world_size, plan.ranks, plan.devices, plan.backend) == (1, (0,), ("cpu",), "gloo")
    assert plan.init_method is None
    assert "use_gpu is false: training on CPU" in caplog.text
    assert "single process" in plan.describe()


needs_cpu_box = pytest.mark.skipif(
    torch.cuda.device_count() > 0, reason="tests the notice on a machine without a GPU"
)


@needs_cpu_box
@pytest.mark.parametrize(
    "env", [{}, {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}]
)
@pytest.mark.parametrize(("use_gpu", "warns"), [("auto", False), (False, False), (True, True)])
def test_cpu_notice_warns_only_when_a_gpu_was_asked_for(
    caplog: pytest.LogCaptureFixture,
    env: dict[str, str],
    use_gpu: bool | str,
    warns: bool,
) -> None:
    with caplog.at_level(logging.INFO):
        plan = _plan(use_gpu=use_gpu, env=env)
    assert plan.devices == ("cpu",)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == (
        ["use_gpu is true but no CUDA device is visible: training on CPU (gloo)"] if warns else []
    )
    assert "training on CPU (gloo)" in caplog.text  # said at INFO otherwise


def test_multi_node_ranks_follow_node_index() -> None:
    plan = _plan(
        num_nodes=3, node_index=2, init_method="file:///nfs/job/rdzv", cpu_procs_per_node=2
    )
    assert plan.mode == "spawn"
    assert plan.world_size == 6
    assert plan.ranks == (4, 5)  # node_index x procs_per_node + local_rank
    assert plan.devices == ("cpu", "cpu")
    assert plan.rendezvous_dir == Path("/nfs/job/rdzv.rdzv")
    text = plan.describe()
    assert "world size: 6" in text and "global rank 5" in text and "/nfs/job/rdzv.rdzv" in text


def test_cpu_procs_from_env_var() -> None:
    plan = _plan(init_method="file:///tmp/x/r", env={CPU_PROCS_ENV: "2"})
    assert (plan.mode, plan.procs_per_node, plan.world_size) == ("spawn", 2, 2)


def test_single_node_multi_proc_gets_default_rendezvous(tmp_path: Path) -> None:
    plan = _plan(cpu_procs_per_node=2, default_rendezvous_dir=tmp_path)
    assert plan.init_method == (tmp_path / ".rendezvous").as_uri()
    private = _plan(cpu_procs_per_node=2)
    assert private.init_method is not None and private.init_method.startswith("file:///")


def test_run_id_namespaces_directory() -> None:
    plan = _plan(num_nodes=2, init_method="file:///nfs/r", run_id="job 7/a")
    assert plan.rendezvous_dir == Path("/nfs/r.rdzv/run-job_7_a")
    # A Slurm job id counts only when that job spans all the nodes.
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2"}
    assert _plan(num_nodes=2, init_method="file:///nfs/r", env=env).run_id == "42"
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1"}
    assert _plan(num_nodes=2, init_method="file:///nfs/r", env=env).run_id is None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(num_nodes=2, node_index=2, init_method="file:///x/r"), "node_index must be in"),
        (dict(num_nodes=2, node_index=0), "init_method is required"),
        (dict(num_nodes=2, init_method="tcp://h:1"), "file:///path"),
        (dict(num_nodes=2, init_method="file://relative/x"), "file:///path"),
        (dict(cpu_procs_per_node=0), "cpu_procs_per_node"),
    ],
)
def test_bad_combinations_are_config_errors(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _plan(**kw)


def test_env_mode_uses_torchrun_variables() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    plan = _plan(num_nodes=2, init_method="file:///ignored", env=env)
    assert plan.mode == "env"
    assert (plan.ranks, plan.world_size, plan.node_index, plan.num_nodes) == ((3,), 4, 1, 2)
    assert plan.init_method == "env://"
    assert "env://" in plan.describe()


@needs_cpu_box
@pytest.mark.parametrize(
    "config",
    sorted(p.relative_to(SHIPPED).as_posix() for p in SHIPPED.glob("*_action/*.json")),
)
def test_shipped_configs_ask_for_no_gpu_on_a_cpu_box(tmp_path: Path, config: str) -> None:
    path = SHIPPED / config
    workflow = json.loads(path.read_text()).get("workflow", "dqn")
    proc = run_workflow(["--config", str(path), "--dry_run"], tmp_path, f"{workflow}_workflow")
    # The launch plan was made (horizon_dqn_example then stops: it names no data here) ...
    assert "training on CPU (gloo)" in proc.stderr, proc.stderr
    # ... and said nothing alarming about a GPU nobody asked for.
    gpu_warnings = [
        line
        for line in proc.stderr.splitlines()
        if " WARNING " in line and ("GPU" in line or "CUDA" in line or "use_gpu" in line)
    ]
    assert gpu_warnings == []
