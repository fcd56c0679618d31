"""`benchmarks.bench_train` runs end to end on a CPU: every contender, the paired ratios and
the JSON of the rounds (tiny steps: this checks the command, not the speed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.conftest import run_module

pytest.importorskip("gymnasium")  # the benchmark's sample data comes from CartPole


def test_cpu_benchmark_runs_every_contender_and_prints_the_ratios(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    proc = run_module(
        "benchmarks.bench_train",
        *("--device", "cpu", "--batch", "256", "--steps", "3", "--rounds", "2"),
        *("--no-d3rlpy", "--data-dir", str(tmp_path / "data"), "--json", str(out)),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"ours", "ours+cpe", "bare", "products"}
    for name, figures in runs.items():
        assert len(figures) == 2, name
        assert all(math.isfinite(f) and f > 0 for f in figures), (name, figures)
    for pair in (
        "ours / bare",
        "ours / products",
        "ours+cpe / ours",
    ):
        assert f"  {pair}: " in proc.stdout, proc.stdout
    assert "d3rlpy" not in runs and "products / d3rlpy" not in proc.stdout
