"""A missing optional package is found before anything starts, by the run, `--dry_run`,
`make-sample-data` and `train()`: exit 2 (ConfigError) naming the config key and the extra
to install, never a traceback, nothing written. gymnasium is made to fail for real: a
directory ahead of site-packages holds a `gymnasium` package whose import raises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

CONFIG = REPO_ROOT / "sample_configs" / "ci" / "dqn_1node.json"
GYM_HINT = "needs the gymnasium package, which is not installed: pip install 'reagent-lite[gym]'"


@pytest.fixture
def no_gym(tmp_path: Path) -> Path:
    shim = tmp_path / "shim" / "gymnasium"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('gymnasium blocked by the test')\n")
    return shim.parent


def run(args: list[str], cwd: Path, shim: Path | None = None) -> subprocess.CompletedProcess[str]:
    path = f"{shim}:{REPO_ROOT}" if shim else str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )


def console(*args: str, cwd: Path, shim: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run(["-m", "reagent_lite.console", *args], cwd, shim)


def test_run_and_dry_run_refuse_sample_data_without_gym(tmp_path: Path, no_gym: Path) -> None:
    for flags in (["--dry_run"], []):
        proc = console("train", "--config", str(CONFIG), *flags, cwd=tmp_path, shim=no_gym)
        assert proc.returncode == 2, (flags, proc.stderr)
        assert f"sample_data: generating sample data from gym env CartPole-v1 {GYM_HINT}" in (
            proc.stderr
        )
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "outputs").exists(), "nothing is written before the check"


def test_online_check_without_gym_names_its_key(tmp_path: Path, no_gym: Path) -> None:
    # Data already there: only the online check needs gymnasium.
    data = tmp_path / "t.jsonl"
    data.write_text("")
    proc = console(
        "train", "--config", str(CONFIG), "--dry_run", f"training_data_path={data}",
        cwd=tmp_path, shim=no_gym,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"evaluation.online_episodes: the online check in gym env CartPole-v1 {GYM_HINT}" in (
        proc.stderr
    )


def test_make_sample_data_without_gym(tmp_path: Path, no_gym: Path) -> None:
    proc = console("make-sample-data", "--output-dir", "d", cwd=tmp_path, shim=no_gym)
    assert proc.returncode == 2, proc.stderr
    assert f"--kind gym: logging env CartPole-v1 {GYM_HINT}" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "d").exists()


_API = f"""
import reagent_lite
from reagent_lite.errors import ConfigError
try:
    reagent_lite.train({str(CONFIG)!r})
except ConfigError as err:
    print("ConfigError", err)
"""


def test_api_train_without_gym(tmp_path: Path, no_gym: Path) -> None:
    proc = run(["-c", _API], tmp_path, no_gym)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ConfigError sample_data:") and GYM_HINT in proc.stdout
    assert not (tmp_path / "outputs").exists()


def _missing(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return True
    return False


@pytest.mark.skipif(not _missing("tensorboard"), reason="tensorboard is installed here")
def test_tensorboard_without_the_package(tmp_path: Path) -> None:
    proc = console("train", "--config", str(CONFIG), "--dry_run", "tensorboard=true", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "tensorboard: tensorboard: true needs the tensorboard package" in proc.stderr
    assert "pip install 'reagent-lite[tensorboard]'" in proc.stderr


def test_an_mlflow_file_store_that_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for flags in (["--dry_run"], []):
        proc = console(
            "train", "--config", str(CONFIG), *flags,
            f'mlflow={{"tracking_uri": "file://{blocker}/mlruns"}}', cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 2, (flags, proc.stderr)
        assert f"mlflow.tracking_uri: 'file://{blocker}/mlruns' cannot be created" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "outputs").exists()
