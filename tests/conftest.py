"""Shared test fixtures: the repository root and a subprocess runner with a hard timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device; none is visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _prepared_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Disk-streamed runs prepare their row groups (`stream_prepare`) in a fresh directory
    of the test's own (processes the test starts inherit it), never in the user's cache."""
    monkeypatch.setenv("REAGENT_LITE_PREPARED_DIR", str(tmp_path_factory.mktemp("prepared")))


def run_module(
    module: str,
    *args: str,
    cwd: Path | None = None,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs `python -m module args...` with the repo importable and a hard timeout."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), full_env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    # Tiny networks on a small shared CPU: one thread per process avoids oversubscription
    # (several test processes at once), which slows small matmuls by an order of magnitude.
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd or REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cpu_rank(rank: int, world_size: int = 2) -> Any:
    """The `DistContext` of CPU rank `rank` of a one-node gloo job (multi-process tests)."""
    from reagent_lite.distributed import DistContext

    return DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        node_index=0,
        procs_per_node=world_size,
        device=torch.device("cpu"),
        backend="gloo",
    )
