"""docs/TUTORIAL.md's code runs as written: its python blocks, in order, in a fresh
interpreter in an empty directory (a real subprocess with a hard timeout)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_tutorial_runs(tmp_path: Path) -> None:
    text = (REPO / "docs/TUTORIAL.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 3
    script = tmp_path / "tutorial.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the best action points the way x does in" in done.stdout
    assert (tmp_path / "model/model.pt2").is_file()


def test_the_minimal_config_in_the_reference_is_valid() -> None:
    import json

    import reagent_lite

    text = (REPO / "docs/CONFIG.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```json\n(.*?)```", text, flags=re.S)
    data = json.loads(block)
    assert len(data) == 3
    cfg = reagent_lite.load_config(data)
    assert cfg.actions == ["left", "right"]
