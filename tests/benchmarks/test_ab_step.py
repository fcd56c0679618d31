"""`benchmarks.ab_step` runs end to end on a CPU against a checkout (here: this one) and
refuses a directory that is not one (tiny blocks: this checks the command, not the speed)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.conftest import run_module

pytest.importorskip("gymnasium")  # the benchmark's sample data comes from CartPole

ROOT = Path(__file__).resolve().parents[2]


def test_ab_step_against_a_checkout_prints_the_paired_ratio(tmp_path: Path) -> None:
    proc = run_module(
        "benchmarks.ab_step",
        *("--base", str(ROOT), "--batch", "64", "--steps", "3", "--rounds", "2"),
        *("--data-dir", str(tmp_path / "data")),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"paired median (\S+) \(range (\S+)–(\S+)\)", proc.stdout)
    assert found, proc.stdout
    assert all(math.isfinite(float(x)) and float(x) > 0 for x in found.groups())


def test_ab_step_refuses_a_directory_without_the_trainer_modules(tmp_path: Path) -> None:
    proc = run_module("benchmarks.ab_step", "--base", str(tmp_path), timeout=120)
    assert proc.returncode != 0
    assert "--base: no " in proc.stdout + proc.stderr
