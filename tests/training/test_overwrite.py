"""A finished model is not replaced silently: a fresh run (no --resume) into a
model_output_path holding model.pt2 + model_meta.json exits 2 naming the path and the way
out (--overwrite, overwrite: true, --resume, another path), in the run and in --dry_run.
Real runs of the console script in subprocesses with hard timeouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.data.test_ingest import ACTIONS, rows, write


def _run(cfg: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "reagent_lite.console", "dqn", "--config", str(cfg), *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_a_finished_model_is_replaced_only_when_asked(tmp_path: Path) -> None:
    data = write(tmp_path / "t.parquet", rows(60), 60)
    out = tmp_path / "out"
    cfg = tmp_path / "c.json"
    cfg.write_text(
        json.dumps(
            {
                "training_data_path": str(data),
                "model_output_path": str(out),
                "actions": ACTIONS,
                "use_gpu": False,
                "epochs": 1,
                "training": {"minibatch_size": 16, "steps_per_epoch": 2},
            }
        )
    )
    first = _run(cfg)
    assert first.returncode == 0, first.stderr[-2000:]
    meta = (out / "model_meta.json").read_text()

    for flags in ((), ("--dry_run",)):
        again = _run(cfg, *flags)
        assert again.returncode == 2, (flags, again.stderr[-2000:])
        assert "Traceback" not in again.stderr
        message = again.stderr.strip().splitlines()[-1]
        for part in (f"model_output_path: '{out}'", "--overwrite", "overwrite: true", "--resume"):
            assert part in message, (flags, message)
    assert (out / "model_meta.json").read_text() == meta  # untouched

    # The way out: --overwrite, or the config key.
    replaced = _run(cfg, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    assert json.loads((out / "model_meta.json").read_text())["run_id"] != json.loads(meta)["run_id"]
    assert _run(cfg, "--dry_run", "overwrite=true").returncode == 0
