"""`benchmarks.step_kernels` and `benchmarks.candidate_scores` need a GPU: here, that they
import and parse their flags (the figures come from a CUDA machine, RESULTS.md)."""

from __future__ import annotations

import pytest

from tests.conftest import run_module


@pytest.mark.parametrize("module", ["benchmarks.step_kernels", "benchmarks.candidate_scores"])
def test_the_gpu_tools_start(module: str) -> None:
    done = run_module(module, "--help", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout
