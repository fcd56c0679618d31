"""The `reagent-lite` console script: subcommands, --help without torch, one set of exit
codes for every tool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

_HELP_WITHOUT_TORCH = """
import sys
from reagent_lite.console import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    assert exc.code == 0, exc.code
assert "torch" not in sys.modules, "torch was imported"
"""


def console(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reagent_lite.console", *args],
        cwd=cwd,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command",
    ["", "dqn", "parametric_dqn", "parametric-dqn", "predict", "report", "timeline",
     "make-sample-data", "schema"],
)  # fmt: skip
def test_help_answers_without_importing_torch(command: str) -> None:
    args = [command, "--help"] if command else ["--help"]
    proc = subprocess.run(
        [sys.executable, "-c", _HELP_WITHOUT_TORCH, *args],
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_unknown_command_exits_2_with_a_suggestion() -> None:
    proc = console("predcit")
    assert proc.returncode == 2
    assert "unknown command 'predcit'; did you mean 'predict'?" in proc.stderr


def test_workflow_subcommand_takes_flags_and_overrides(tmp_path: Path) -> None:
    cfg = REPO_ROOT / "sample_configs/ci/dqn_1node.json"
    proc = console("dqn", "--config", str(cfg), "--dry-run", "epochs=4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage: reagent-lite dqn" not in proc.stderr
    assert "epochs: 4" in proc.stdout
    proc = console("dqn", "--config", str(cfg), "--dry_run", "rl.gama=0.5", cwd=tmp_path)
    assert proc.returncode == 2
    assert "rl.gama: unknown key; did you mean 'gamma'?" in proc.stderr


def test_every_tool_uses_the_same_exit_codes(tmp_path: Path) -> None:
    # Bad flags: 2, from any subcommand.
    for command in ("predict", "report", "timeline", "schema"):
        proc = console(command, "--no-such-flag")
        assert proc.returncode == 2, (command, proc.stderr)
    # predict: an output format it cannot write is a flag error (2), before any model loads.
    proc = console("predict", "--model", str(tmp_path), "--data", "x.parquet", "--output", "s.txt")
    assert proc.returncode == 2 and "--output: cannot tell the format" in proc.stderr
    # report: no run there is 2; a run without any epoch record is bad data (3).
    proc = console("report", "--run", str(tmp_path))
    assert proc.returncode == 2 and "no metrics.jsonl" in proc.stderr
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"epoch": 0, "steps": 5, "loss": 1}) + "\n")
    proc = console("report", "--run", str(tmp_path))
    assert proc.returncode == 3 and "no epoch record" in proc.stderr
    assert "Traceback" not in proc.stderr
    # timeline: bad data is 3.
    (tmp_path / "steps.jsonl").write_text("not json\n")
    proc = console("timeline", "--input", str(tmp_path / "steps.parquet"), "--output", "o.parquet")
    assert proc.returncode == 3, proc.stderr
