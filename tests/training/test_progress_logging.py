"""A run whose stderr is not a terminal (Slurm, CI, a file): no `\\r` progress frames but
periodic log lines with the running loss, and one log format on every record."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO_ROOT, run_module

RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR) [\w.]+: ")


def test_log_lines_instead_of_progress_frames(tmp_path: Path) -> None:
    cfg = REPO_ROOT / "sample_configs/ci/dqn_1node.json"
    proc = run_module(
        "workflows.dqn_workflow",
        "--config",
        str(cfg),
        "epochs=1",
        "training.steps_per_epoch=10",
        "log_every_steps=5",
        "evaluation.online_episodes=0",
        cwd=tmp_path,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stderr
    assert "epoch 1/1: 10 optimizer steps" in proc.stderr
    assert "epoch 1/1 step 5/10: running loss" in proc.stderr
    assert "epoch 1/1 step 10/10: running loss" in proc.stderr
    records = [line for line in proc.stderr.splitlines() if RECORD.match(line)]
    assert len(records) > 5
    # Every line is a record or the continuation of a multi-line one: the launch plan, and
    # the end-of-run summary, the last record, whose lines are summary.txt's.
    log, _, summary = proc.stderr.partition(" INFO reagent_lite: run summary (also in ")
    first = proc.stderr.splitlines()[0]
    assert RECORD.match(first), first
    assert all(
        RECORD.match(line)
        or line.startswith((" ", "mode:", "world size", "this node", "backend", "rendezvous"))
        for line in log.splitlines()[:-1]  # the last: the summary record's date and time
    ), proc.stderr
    summary_txt = tmp_path / "outputs/ci/dqn_1node/model/summary.txt"
    assert summary.splitlines()[1:] == summary_txt.read_text().splitlines()
