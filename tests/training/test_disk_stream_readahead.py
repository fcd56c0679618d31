"""`stream_read_ahead` through the real workflow: the choice is in the training step's
description, and a run trains on the same chunks, to the same losses, at every depth."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.data.test_ingest import rows, write
from tests.training.test_disk_stream import _cfg, _run
from tests.workflows.nodes import epoch_losses


def test_same_losses_at_every_read_ahead_named_in_the_step_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = write(tmp_path / "t.parquet", rows(700), 40)  # windows of 3 row groups: 120 rows
    losses = {}
    for depth in (1, 3):
        out = tmp_path / str(depth)
        with caplog.at_level(logging.INFO):
            caplog.clear()
            wf = _run(_cfg(data, out, epochs=3, stream_read_ahead=depth))
        assert wf.disk is not None and wf.disk.depth == depth
        lines = [r.getMessage() for r in caplog.records if "training step:" in r.getMessage()]
        ahead = "1 window read ahead," if depth == 1 else f"{depth} windows read ahead,"
        assert lines and ahead in lines[0], lines
        losses[depth] = epoch_losses(out)
    assert len(losses[1]) == 3 and losses[3] == losses[1]
    auto = _run(_cfg(data, tmp_path / "auto"))  # the default: on the CPU one window
    assert auto.disk is not None and auto.disk.depth == 1
