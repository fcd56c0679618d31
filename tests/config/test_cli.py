"""The workflow command line: flags, exit codes and messages, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reagent_lite.cli import parse_workflow_args, run_cli
from reagent_lite.errors import ConfigError, DataError
from tests.config.conftest import REPO, minimal_dqn, minimal_parametric

Writer = Callable[..., Path]


def run_workflow(
    args: list[str], cwd: Path, workflow: str = "dqn_workflow", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("SLURM_NODEID", None)
    return subprocess.run(
        [sys.executable, "-m", f"workflows.{workflow}", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def dqn(**changes: Any) -> dict[str, Any]:
    return {**minimal_dqn(), **changes}


def without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


# (case id, file content, extra flags, workflow, text the message must contain)
BAD_CONFIGS: list[tuple[str, Any, list[str], str, str]] = [
    ("unknown key", dqn(epoch=3), [], "dqn_workflow", "epoch: unknown key; did you mean 'epochs'?"),
    ("removed key", dqn(training={"step_plan": {"p2p_allreduce": "off"}}), [], "dqn_workflow",
     "training.step_plan.p2p_allreduce: removed key: the peer-to-peer gradient sum it switched "
     "gained under 5% where used (+3% measured on 2 and 4 GPUs), so it was removed and "
     "gradients are summed by the process group's all-reduce (NCCL or gloo); delete the key "
     '(got "off")'),
    ("wrong type", dqn(epochs="ten"), [], "dqn_workflow", "epochs: input should be a valid integer"),
    ("out of range", dqn(rl={"gamma": 1.5}), [], "dqn_workflow", "rl.gamma: input should be less"),
    ("missing key", without(dqn(), "model_output_path"), [], "dqn_workflow",
     "model_output_path: required key is missing"),
    ("-1 inside layers", dqn(training={"layers": [-1, 64, -1, -1], "activations": ["relu"] * 3}),
     [], "dqn_workflow", "training.layers[2]: -1 is only allowed as the first or last entry"),
    ("layers/activations", dqn(training={"layers": [-1, 64, -1], "activations": ["relu"]}),
     [], "dqn_workflow", "training.activations: needs len(layers) - 1 = 2 entries"),
    ("unknown activation", dqn(training={"activations": ["relu", "relu", "swish"]}), [],
     "dqn_workflow", "training.activations[2]: unknown activation"),
    ("duplicate actions", dqn(actions=["a", "b", "a"]), [], "dqn_workflow",
     "actions[2]: duplicate action name"),
    ("empty actions", dqn(actions=[]), [], "dqn_workflow", "actions: list should have at least 1"),
    ("node_index out of range", dqn(), ["--node_index", "1"], "dqn_workflow",
     "--node_index: must be in [0, 1)"),
    ("negative node_index", dqn(num_nodes=2, init_method="file:///tmp/x/rdzv"),
     ["--node-index=-1"], "dqn_workflow", "--node_index: must be in [0, 2)"),
    ("not JSON", '{"epochs": 3,,}', [], "dqn_workflow", "not valid JSON"),
    ("bad init_method", dqn(init_method="tcp://host:29500"), [], "dqn_workflow",
     "init_method: must be a file:// URL"),
    ("relative init_method", dqn(num_nodes=2, init_method="file://shared/rdzv"), [],
     "dqn_workflow", "init_method: must be an absolute file URL"),
    ("init_method missing for 2 nodes", dqn(num_nodes=2), [], "dqn_workflow",
     "init_method: required when num_nodes > 1"),
    ("unsupported Horizon option", dqn(rainbow={"categorical": True}), [], "dqn_workflow",
     "rainbow.categorical: Horizon option not supported"),
    ("dqn config into parametric", dqn(), [], "parametric_dqn_workflow",
     "this is a dqn config"),
    ("parametric config into dqn", {**minimal_parametric(), "workflow": "parametric_dqn"}, [],
     "dqn_workflow", "this is a parametric_dqn config"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "flags", "workflow", "expected"),
    [case[1:] for case in BAD_CONFIGS],
    ids=[case[0] for case in BAD_CONFIGS],
)
def test_bad_config_exits_2_with_message(
    tmp_path: Path, content: Any, flags: list[str], workflow: str, expected: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    proc = run_workflow(["--config", str(path), *flags], tmp_path, workflow)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    if "not valid JSON" not in expected and "--node" not in expected:
        assert str(path) in proc.stderr


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    proc = run_workflow(["--config", "nope.json"], tmp_path)
    assert proc.returncode == 2
    assert "nope.json: config file not found" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--config", "x.json", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "the following arguments are required: --config"),
        (["--config", "x.json", "--node_index", "abc"], "--node_index"),
    ],
)
def test_bad_flags_exit_2(tmp_path: Path, flags: list[str], expected: str) -> None:
    proc = run_workflow(flags, tmp_path)
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "usage:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("config", "workflow"),
    [
        ("ci/dqn_1node.json", "dqn_workflow"),
        ("ci/parametric_1node.json", "parametric_dqn_workflow"),
        ("ci/dqn_2nodes.json", "dqn_workflow"),
        ("discrete_action/cartpole_dqn.json", "dqn_workflow"),
    ],
)
def test_dry_run_prints_plan_and_exits_0(tmp_path: Path, config: str, workflow: str) -> None:
    path = REPO / "sample_configs" / config
    proc = run_workflow(["--config", str(path), "--dry_run", "--run_id", "t1"], tmp_path, workflow)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"config: {path}" in out
    assert f"workflow: {workflow.removesuffix('_workflow')}" in out
    assert "data will be generated" in out
    # Relative paths in the config resolve against the working directory.
    assert str(tmp_path.resolve() / "outputs" / "ci") in out or "outputs/" in out
    assert "model.pt2" in out
    assert not (tmp_path / "outputs").exists(), "a dry run must not write anything"


def test_dry_run_without_data_is_the_runs_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(dqn(use_gpu=False)))
    proc = run_workflow(["--config", str(path), "--dry-run"], tmp_path)
    assert proc.returncode == ConfigError.exit_code  # as the run itself: 2
    assert "MISSING" in proc.stdout
    assert "training_data_path" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"eval_data_path": "nope/eval.parquet"}, "eval_data_path"),
        ({"state_norm_data_path": "nope/norm.json"}, "state_norm_data_path"),
        ({"model_output_path": "a_file/out"}, "model_output_path"),
        ({"model_output_path": "a_file"}, "model_output_path"),
    ],
)
def test_dry_run_refuses_what_the_run_refuses_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, str], key: str
) -> None:
    from reagent_lite import runner
    from tests.data.test_ingest import ACTIONS, rows, write

    good = write(tmp_path / "good.parquet", rows(20), 10)
    (tmp_path / "a_file").write_text("a file where a directory should be")
    cfg = dqn(
        training_data_path=str(good),
        model_output_path=str(tmp_path / "out"),
        actions=ACTIONS,
        use_gpu=False,
    )
    cfg.update({k: str(tmp_path / v) for k, v in change.items()})
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SystemExit) as info:
        runner.main("dqn", ["--config", str(path), "--dry_run"])
    assert info.value.code == ConfigError.exit_code
    assert f"{key}: '{cfg[key]}'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_horizon_config_warns_about_ignored_keys(tmp_path: Path) -> None:
    path = REPO / "sample_configs" / "discrete_action" / "horizon_dqn_example.json"
    proc = run_workflow(["--config", str(path), "--dry_run"], tmp_path)
    assert "WARNING reagent_lite.config" in proc.stderr
    assert "rl.reward_burnin ignored" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- parse_workflow_args / run_cli in-process ---------------------------------------------


def test_parse_defaults_and_aliases() -> None:
    args = parse_workflow_args(["--config", "c.json"], env={})
    assert args.config == Path("c.json") and args.node_index == 0
    assert not args.dry_run and not args.resume and args.run_id is None
    args = parse_workflow_args(
        ["-p", "c.json", "--node-index=3", "--dry-run", "--resume", "--run-id", "r7"], env={}
    )
    assert (args.node_index, args.dry_run, args.resume, args.run_id) == (3, True, True, "r7")
    args = parse_workflow_args(["--config=c.json", "--node_index=2", "--dry_run"], env={})
    assert args.node_index == 2 and args.dry_run


def test_node_index_from_slurm() -> None:
    assert parse_workflow_args(["--config", "c"], env={"SLURM_NODEID": "4"}).node_index == 4
    flag_wins = parse_workflow_args(
        ["--config", "c", "--node_index", "1"], env={"SLURM_NODEID": "4"}
    )
    assert flag_wins.node_index == 1
    with pytest.raises(ConfigError, match="SLURM_NODEID"):
        parse_workflow_args(["--config", "c"], env={"SLURM_NODEID": "x"})


def test_run_cli_maps_errors_to_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    def fail() -> None:
        raise DataError("t.parquet: column reward: 3 bad rows")

    with pytest.raises(SystemExit) as info:
        run_cli(fail)
    assert info.value.code == 3
    assert "t.parquet: column reward: 3 bad rows" in capsys.readouterr().err

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as info:
        run_cli(interrupted)
    assert info.value.code == 130
    run_cli(lambda: None)  # success returns normally


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_dry_run_checks_the_data_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    from reagent_lite import runner
    from tests.data.test_ingest import ACTIONS, rows, write

    good = write(tmp_path / "good.parquet", rows(20), 10)
    data = [{k: v for k, v in r.items() if k != "reward"} for r in rows(20)]
    bad = tmp_path / f"bad.{fmt}"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(data), bad)
    else:
        bad.write_text("".join(json.dumps(r) + "\n" for r in data))
    cfg = dqn(
        training_data_path=str(good),
        eval_data_path=str(bad),
        model_output_path=str(tmp_path / "out"),
        actions=ACTIONS,
        use_gpu=False,
    )
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SystemExit) as info:
        runner.main("dqn", ["--config", str(path), "--dry_run"])
    assert info.value.code == DataError.exit_code
    err = capsys.readouterr().err
    assert f"{bad}: missing required column(s) 'reward'" in err

    path.write_text(json.dumps({**cfg, "eval_data_path": str(good)}))
    runner.main("dqn", ["--config", str(path), "--dry_run"])  # returns: exit 0
    assert "shard" in capsys.readouterr().out
