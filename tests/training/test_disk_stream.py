"""`stream_from_disk: true` through the real workflow: one process and two over gloo."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig, config_from_dict
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError
from reagent_lite.training.loop import Workflow
from tests.data.test_ingest import ACTIONS, rows, write
from tests.workflows.nodes import Job, assert_outputs_once, epoch_losses, write_config

TRAINING = {"layers": [-1, 16, -1], "activations": ["relu", "linear"], "minibatch_size": 32}


def _cfg(data: Path, out: Path, **extra: Any) -> DQNWorkflowConfig:
    cfg: dict[str, Any] = {
        "training_data_path": str(data),
        "model_output_path": str(out),
        "actions": ACTIONS,
        "use_gpu": False,
        "use_all_avail_gpus": False,
        "epochs": 2,
        "stream_from_disk": True,
        "stream_window_rows": 150,
        "normalization_sample_size": 100,
        "log_every_steps": 1000,
        "training": TRAINING,
        "evaluation": {"calc_cpe_in_training": False},
        **extra,
    }
    return config_from_dict(cfg, DQNWorkflowConfig)


def _run(cfg: DQNWorkflowConfig) -> Workflow:
    wf = Workflow("dqn", cfg, DistContext.single("cpu"))
    try:
        wf.setup()
        wf.train()
        wf.save()
    finally:
        wf.cleanup()
    return wf


def _parts(tmp: Path, n: int, files: int) -> Path:
    one = write(tmp / "all.parquet", rows(n, late_feature_at=n - 40), 10_000)
    table = pq.read_table(one)
    out = tmp / "parts"
    out.mkdir()
    step = -(-n // files)
    for i in range(files):
        pq.write_table(table.slice(i * step, step), out / f"part-{i:05d}", row_group_size=48)
    return out


@pytest.mark.parametrize("layout", ["file", "directory"])
def test_trains_to_completion_reading_windows(tmp_path: Path, layout: str) -> None:
    n = 700
    if layout == "file":
        data = write(tmp_path / "t.parquet", rows(n, late_feature_at=n - 40), 64)
    else:
        data = _parts(tmp_path, n, 3)
    wf = _run(_cfg(data, tmp_path / "out"))
    out = tmp_path / "out"
    assert_outputs_once(out)
    assert wf.steps_per_epoch == math.ceil(n / 32)  # from the footers: one pass
    # A feature only in the last rows is found (keys scan) though the sample may miss it.
    assert "11" in wf.space.state_ids
    assert len(wf.train_data) < n  # only the normalization sample was ever held whole
    assert wf.disk is not None and wf.disk.windows_loaded >= 2 * math.ceil(n / 150)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if "transitions_per_s" in r]
    assert [r["steps"] for r in epochs] == [wf.steps_per_epoch, 2 * wf.steps_per_epoch]
    assert all(math.isfinite(r["loss"]) for r in epochs)


def test_reproducible(tmp_path: Path) -> None:
    data = write(tmp_path / "t.parquet", rows(300), 40)
    a = _run(_cfg(data, tmp_path / "a"))
    b = _run(_cfg(data, tmp_path / "b"))
    assert epoch_losses(tmp_path / "a") == epoch_losses(tmp_path / "b")
    assert a.norm == b.norm


def test_parametric_refused_by_config() -> None:
    with pytest.raises((ConfigError, ValueError), match="stream_from_disk"):
        config_from_dict(
            {
                "training_data_path": "x",
                "model_output_path": "y",
                "stream_from_disk": True,
            },
            ParametricDQNWorkflowConfig,
        )


def test_two_processes_over_gloo_same_steps_uneven_shards(tmp_path: Path) -> None:
    # 11 row groups of 64 (the last 60): rank 0 reads 6 of them (380 rows), rank 1 5 (320).
    data = write(tmp_path / "t.parquet", rows(700), 64)
    assert pq.ParquetFile(data).metadata.num_row_groups == 11
    cfg = write_config(
        tmp_path / "c.json",
        "dqn",
        data,
        tmp_path / "out",
        actions=ACTIONS,
        num_nodes=2,
        init_method=(tmp_path / "rdzv").as_uri(),
        stream_from_disk=True,
        stream_window_rows=100,
        normalization_sample_size=100,
    )
    job = Job("dqn", cfg, tmp_path / "logs", env={"REAGENT_LITE_VERIFY_REPLICAS": "1"})
    try:
        nodes = job.run(2)
    finally:
        job.close()
    log0 = nodes[0].text()
    assert "shard rows [380, 320]" in log0
    assert "streamed from disk" in log0
    assert "replica check: all 2 ranks held identical parameters" in log0
    steps = math.ceil(380 / 32)
    records = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["steps"] for r in records if "transitions_per_s" in r] == [steps, 2 * steps]


def test_peak_memory_does_not_grow_with_the_table(tmp_path: Path) -> None:
    """Peak RSS of disk-streamed training (fresh processes) for 2e5 and 2e6 rows: the
    difference stays far below the ~150 MiB the extra 1.8M rows take as training tensors."""
    from argparse import Namespace

    from benchmarks.bench_stream import make_table, run_child

    args = Namespace(
        root=str(tmp_path), device="cpu", batch=512, steps=100, epochs=1, window=16_384,
        timeout=240,
    )  # fmt: skip
    peaks = {}
    for n in (200_000, 2_000_000):
        data = make_table(tmp_path / f"t{n}.parquet", n, row_group=8192)
        result = run_child(data, "disk", args)
        assert result["windows_loaded"] >= 3
        peaks[n] = result["peak_over_base_mib"]
    assert peaks[2_000_000] - peaks[200_000] < 40, peaks
