"""`benchmarks.bench_neighbours --quick` runs end to end: every variant beside three
neighbours (the quiet part is left to full runs), the table and its ratios printed, the neighbours gone afterwards
(tiny runs: this checks the command, not the speed)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.conftest import run_module

pytest.importorskip("gymnasium")  # the benchmark's data comes from CartPole


@pytest.mark.bench_smoke
@pytest.mark.timeout(1800)  # ten short runs and their start-up, on a possibly busy box
def test_quick_run_prints_the_table_and_ends_its_neighbours(tmp_path: Path) -> None:
    out = tmp_path / "neighbours.json"
    proc = run_module(
        "benchmarks.bench_neighbours",
        *("--quick", "--data-dir", str(tmp_path / "data"), "--json", str(out)),
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = json.loads(out.read_text())
    cores = measured["cores"]
    names = {
        "ours",
        "ours, wait active",
        "plain, 1 thread",
        f"plain, {cores} threads passive",
        f"plain, {cores} threads default",
        f"plain, {cores} threads active",
    }
    assert set(measured["results"]) == {"neighbours"}  # --quick: the part with neighbours
    for condition, figures in measured["results"].items():
        assert set(figures) == names, condition
        for name, figs in figures.items():
            assert len(figs) == 1 and all(math.isfinite(f) and f > 0 for f in figs), name
    assert "transitions/s (median)" in proc.stdout
    for condition, goal in (("neighbours", "0.8"),):
        row = next(
            line for line in proc.stdout.splitlines()
            if line.startswith(condition) and "ours / better plain" in line
        )  # fmt: skip
        assert float(row.split("(goal")[0].split()[-1]) > 0 and row.endswith(f"(goal >= {goal})"), (
            row
        )
    assert len(measured["neighbour_pids"]) == 3
    for pid in measured["neighbour_pids"]:  # SIGKILLed and reaped: gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_an_unknown_condition_is_refused_naming_it() -> None:
    proc = run_module("benchmarks.bench_neighbours", "--conditions", "quiet,noisy", timeout=120)
    assert proc.returncode == 2
    assert "--conditions: unknown ['noisy']" in proc.stderr
