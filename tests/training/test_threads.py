"""`reagent_lite.train` called from a thread other than the main one (a notebook's or a
service's worker thread): signal handlers can only be set in the main thread, so there
the run goes on without them rather than failing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import reagent_lite
from reagent_lite.distributed.plan import CPU_PROCS_ENV
from tests.test_api import tiny_config


def test_train_from_a_worker_thread_with_two_cpu_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CPU_PROCS_ENV, "2")
    outcome: list[object] = []

    def train() -> None:
        try:
            outcome.append(
                reagent_lite.train(
                    tiny_config(tmp_path), overrides={"epochs": 1, "training.steps_per_epoch": 4}
                )
            )
        except BaseException as err:  # handed to the test's thread
            outcome.append(err)

    thread = threading.Thread(target=train, name="not-main")
    thread.start()
    thread.join(timeout=400)
    assert not thread.is_alive(), "train() did not return"
    (result,) = outcome
    assert isinstance(result, reagent_lite.RunResult), repr(result)
    assert result.model_path.is_file() and result.epoch_metrics[-1]["steps"] == 4
