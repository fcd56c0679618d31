"""The README's "From Python" example runs as written (in a fresh directory)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT


def python_example(section: str) -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert len(blocks) == 1, f"expected one python block under '{section}'"
    return str(blocks[0])


def test_from_python_example_runs(tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(python_example("From Python"))
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "did you mean 'learning_rate'" in proc.stdout
    assert "best_action" in proc.stdout
    assert "epoch records of" in proc.stdout
    assert (tmp_path / "outputs/ci/dqn_1node/model/model.pt2").is_file()


def test_the_quick_start_commands_are_the_scripts_ci_runs() -> None:
    """The two quick-start commands exist as written, and CI runs the test one (`.ci/run`
    ends with it), so the README's promise is checked on every CI run."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split("## Quick start — the two commands\n", 1)[1].split("\n## ", 1)[0]
    first = re.findall(r"```bash\n(.*?)```", body, flags=re.S)[0]
    commands = [line for line in first.splitlines() if line and not line.startswith("#")]
    assert commands == ["bash scripts/run_sample.sh", "bash scripts/test.sh"]
    assert all((REPO_ROOT / c.split()[1]).is_file() for c in commands)
    ci = (REPO_ROOT / ".ci/run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == "bash scripts/test.sh"
