"""`reagent-lite train` (the kind from the config), `configs list|copy`, did-you-mean,
`reagent-lite …` in every usage line, `schema --check` saying OK, and the log-level flags:
through the real console script in subprocesses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

CI = REPO_ROOT / "sample_configs" / "ci"


def console(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reagent_lite.console", *args],
        cwd=cwd,
        env={
            "PYTHONPATH": str(REPO_ROOT),
            "PATH": "/usr/bin:/bin",
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_train_runs_the_kind_the_config_names(tmp_path: Path) -> None:
    proc = console(
        "train", "--config", str(CI / "parametric_1node.json"), "--dry_run", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "workflow: parametric_dqn" in proc.stdout
    # No `workflow` key: the registry's rule (a parametric-only key says parametric_dqn).
    data = json.loads((CI / "parametric_1node.json").read_text())
    del data["workflow"], data["$schema"]
    data["max_candidates"] = 16
    (tmp_path / "p.json").write_text(json.dumps(data))
    proc = console("train", "--config", "p.json", "--dry_run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "workflow: parametric_dqn" in proc.stdout
    # An override of the key picks the kind as the key in the file would (without the
    # key or a parametric-only key the file alone would be read as dqn).
    del data["max_candidates"]
    (tmp_path / "q.json").write_text(json.dumps(data))
    proc = console(
        "train", "--config", "q.json", "--dry_run", "workflow=parametric_dqn", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "workflow: parametric_dqn" in proc.stdout
    # Flag errors name the console script's command.
    proc = console("train", "--dry_run", cwd=tmp_path)
    assert proc.returncode == 2 and "usage: reagent-lite train" in proc.stderr
    proc = console("train", "--config", "missing.json", cwd=tmp_path)
    assert proc.returncode == 2 and "missing.json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_misspelt_train_gets_a_suggestion() -> None:
    proc = console("trian")
    assert proc.returncode == 2
    assert "did you mean 'train'?" in proc.stderr


@pytest.mark.parametrize("command", ["timeline", "make-sample-data", "schema", "configs"])
def test_every_usage_line_names_the_console_script(command: str) -> None:
    proc = console(command, "--no-such-flag")
    assert proc.returncode == 2, proc.stderr
    assert f"usage: reagent-lite {command}" in proc.stderr
    assert "python -m" not in proc.stderr


def test_a_kind_mismatch_names_the_console_subcommands(tmp_path: Path) -> None:
    proc = console("dqn", "--config", str(CI / "parametric_1node.json"), "--dry_run", cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        "run it with reagent-lite parametric_dqn, or make it a dqn config (reagent-lite dqn)"
        in (proc.stderr)
    )
    assert "python -m" not in proc.stderr


def test_schema_check_says_ok() -> None:
    proc = console("schema", "--check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK: ")


def test_configs_list_names_every_sample_config_with_what_it_runs() -> None:
    proc = console("configs", "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    names = sorted(p.relative_to(REPO_ROOT / "sample_configs").as_posix()
                   for p in (REPO_ROOT / "sample_configs").rglob("*.json"))  # fmt: skip
    assert [line.split()[0] for line in lines] == names
    cartpole = next(line for line in lines if line.startswith("discrete_action/cartpole_dqn"))
    assert "dqn, 1 node; generates its data (gym CartPole-v1" in cartpole


def test_configs_copy_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    source = REPO_ROOT / "sample_configs/discrete_action/cartpole_dqn.json"
    proc = console("configs", "copy", "cartpole_dqn", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    copied = tmp_path / "cartpole_dqn.json"
    assert copied.read_bytes() == source.read_bytes()
    copied.write_text("{}")
    proc = console("configs", "copy", "discrete_action/cartpole_dqn.json", str(copied))
    assert proc.returncode == 2
    assert f"{copied}: exists already (give --force to replace it)" in proc.stderr
    assert copied.read_text() == "{}"
    proc = console("configs", "copy", "cartpole_dqn.json", str(copied), "--force")
    assert proc.returncode == 0, proc.stderr
    assert copied.read_bytes() == source.read_bytes()
    proc = console("configs", "copy", "cartpol", str(tmp_path / "x.json"))
    assert proc.returncode == 2 and "no sample config named 'cartpol'" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def _no_data_run(
    *flags: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A run that logs its plan (INFO) and then stops at the missing data (exit 2)."""
    return console(
        "train", *flags, "--config", str(CI / "dqn_1node.json"),
        "training_data_path=missing.parquet", "eval_data_path=null", "sample_data=null",
        "evaluation.online_episodes=0", "model_output_path=out", cwd=cwd, env=env,
    )  # fmt: skip


def test_quiet_leaves_warnings_and_errors_only(tmp_path: Path) -> None:
    loud = _no_data_run(cwd=tmp_path)
    assert loud.returncode == 2 and "INFO reagent_lite: dqn workflow" in loud.stderr
    for flags in (["-q"], ["--log-level", "warning"], ["--quiet"]):
        quiet = _no_data_run(*flags, cwd=tmp_path)
        assert quiet.returncode == 2, flags
        assert " INFO " not in quiet.stderr, flags
        assert "missing.parquet' does not exist" in quiet.stderr
    # The environment variable does the same (and reaches every process the run starts).
    quiet = _no_data_run(cwd=tmp_path, env={"REAGENT_LITE_LOG_LEVEL": "WARNING"})
    assert quiet.returncode == 2 and " INFO " not in quiet.stderr


def test_a_bad_log_level_is_a_flag_error() -> None:
    proc = console("schema", "--log-level", "LOUD", "--check")
    assert proc.returncode == 2
    assert "--log-level: unknown log level (got 'LOUD')" in proc.stderr


_VERBOSE = """
import logging
from reagent_lite.cli import configure_logging
from reagent_lite.console import _take_log_level
assert _take_log_level(["--config", "x.json", "-v"]) == ["--config", "x.json"]
configure_logging()
logging.getLogger("reagent_lite.deep").debug("a debug line")
logging.getLogger("other_library").debug("not ours")
"""


def test_verbose_shows_reagent_lites_debug_lines() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _VERBOSE],
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "DEBUG reagent_lite.deep: a debug line" in proc.stderr
    assert "not ours" not in proc.stderr


_API_LEVEL = """
import logging, reagent_lite
from reagent_lite.errors import ConfigError
try:
    reagent_lite.train("missing.json")
except ConfigError:
    pass
print(logging.getLevelName(logging.getLogger("reagent_lite").level))
"""


def test_the_api_reads_the_log_level_from_the_environment(tmp_path: Path) -> None:
    def level(value: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", _API_LEVEL],
            cwd=tmp_path,
            env={
                "PYTHONPATH": str(REPO_ROOT),
                "PATH": "/usr/bin:/bin",
                "REAGENT_LITE_LOG_LEVEL": value,
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    assert level("warning") == "WARNING"
    assert level("") == "NOTSET"
