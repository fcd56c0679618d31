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


@pytest.mark.slow
def test_ours_compiled_below_the_compiled_bare_loop_fails_the_command(tmp_path: Path) -> None:
    """The floor check fires on a CPU run (`--floor`, a ratio no step reaches, makes it fire
    whatever the machine's speed): exit 1, a line naming the pair, the figures and JSON
    still written; `--no-floor-check` runs the same and exits 0."""
    args = (
        *("--device", "cpu", "--batch", "64", "--steps", "2", "--rounds", "1", "--compile"),
        *("--no-d3rlpy", "--no-cpe", "--floor", "1e9", "--data-dir", str(tmp_path / "data")),
    )
    out = tmp_path / "runs.json"
    proc = run_module("benchmarks.bench_train", *args, "--json", str(out), timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [ln for ln in proc.stdout.splitlines() if ln.startswith("FLOOR CHECK FAILED: ")]
    assert len(failed) == 1 and failed[0].startswith("FLOOR CHECK FAILED: ours-c "), failed
    assert " x bare-c " in failed[0] and "--no-floor-check" in failed[0]
    assert "  ours-c / bare-c: " in proc.stdout
    assert {"ours-c", "bare-c"} <= set(json.loads(out.read_text())["runs"])
    proc = run_module("benchmarks.bench_train", *args, "--no-floor-check", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FLOOR CHECK" not in proc.stdout and "  ours-c / bare-c: " in proc.stdout
