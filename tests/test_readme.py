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
