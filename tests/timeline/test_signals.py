"""SIGTERM and Ctrl-C in the middle of a real timeline run (a subprocess, hard timeouts):
one line, exit 143 / 130, and neither the hidden temporary outputs nor the spill
directory left behind. (SIGTERM used to leave both; Ctrl-C printed a traceback.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks.bench_timeline import step_log
from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~200k steps: with a 4MB limit on one thread, seconds of spilled buckets."""
    path = tmp_path_factory.mktemp("big") / "steps.parquet"
    pq.write_table(step_log(np.random.default_rng(2), 0, 10_000), path, row_group_size=20_000)
    return path


def _wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"finished before the signal: {proc.communicate()}"
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.02)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_run_cleans_up_and_exits_128_plus_the_signal(
    big_log: Path, tmp_path: Path, sig: int, code: int
) -> None:
    out, spill = tmp_path / "out", tmp_path / "spill"
    out.mkdir()
    spill.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "workflows.timeline", "--input", str(big_log),
            "--output", str(out / "train.parquet"), "--eval-output", str(out / "eval.parquet"),
            "--memory-limit", "4MB", "--threads", "1", "--temp-dir", str(spill),
        ],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Mid-run: the temporary outputs exist and the sort has spilled buckets.
        _wait_for(lambda: len(list(out.iterdir())) == 2, proc, timeout=120)
        _wait_for(lambda: any(p.suffix == ".arrow" for p in spill.rglob("*")), proc, 120)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, stderr
    name = signal.Signals(sig).name
    assert stderr.strip() == (
        f"stopped by {name}: no table written (temporary outputs and the spill directory removed)"
    ), stderr
    assert list(out.iterdir()) == [] and list(spill.iterdir()) == []
    assert stdout == ""
