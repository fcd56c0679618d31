"""A 2-node CPU job (gloo, file:// rendezvous) under preemption, mismatched nodes and a
Spark directory with empty part files: real processes, a hard timeout on each."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from reagent_lite.training.checkpoint import latest_checkpoint, load_checkpoint
from tests.workflows.nodes import Job, make_dqn_parts, write_config

# Epochs enough that the job is still training when the signal comes.
LONG = {"epochs": 100_000, "checkpoint_every_epochs": 0, "log_every_steps": 1,
        "stop_check_every_steps": 2, "training": {"steps_per_epoch": 5}}  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dqn_parts(tmp_path_factory.mktemp("data"), parts=2)


def _config(root: Path, data: Path, **overrides: object) -> Path:
    return write_config(
        root / "c.json", "dqn", data, root / "out", num_nodes=2,
        init_method=(root / "rdzv").as_uri(), **{**LONG, **overrides},
    )  # fmt: skip


def _wait_for_training(out: Path, nodes: list, timeout: float = 120) -> None:  # type: ignore[type-arg]
    metrics = out / "metrics.jsonl"
    end = time.monotonic() + timeout
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 3):
        for node in nodes:
            assert node.proc.poll() is None, node.text()[-3000:]
        assert time.monotonic() < end, "training did not start"
        time.sleep(0.05)


def test_sigterm_to_one_node_stops_both_with_a_checkpoint(tmp_path: Path, data: Path) -> None:
    job = Job("dqn", _config(tmp_path, data), tmp_path / "logs")
    try:
        nodes = [job.start(0), job.start(1)]
        _wait_for_training(tmp_path / "out", nodes)
        sent = time.monotonic()
        nodes[1].proc.send_signal(signal.SIGTERM)  # only node 1: the ranks must agree
        codes = [node.wait(60) for node in nodes]
        took = time.monotonic() - sent
    finally:
        job.close()
    assert codes == [143, 143], [n.text()[-2000:] for n in nodes]
    assert took < 30, f"stopping took {took:.1f}s"
    newest = latest_checkpoint(tmp_path / "out")
    assert newest is not None and "_step_" in newest.name
    state = load_checkpoint(newest)
    assert state["position"]["world_size"] == 2
    last = nodes[0].text().strip().splitlines()[-1]
    assert "SIGTERM" in last and str(newest) in last and "--resume" in last
    assert "Traceback" not in nodes[0].text() + nodes[1].text()

    # Both nodes resume from it and finish (fewer epochs: the allow-list permits it).
    cfg = json.loads((tmp_path / "c.json").read_text())
    cfg["epochs"] = state["epoch"] + 1
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    job = Job("dqn", tmp_path / "c.json", tmp_path / "logs2")
    try:
        job.run(2, "--resume")
    finally:
        job.close()
    assert (tmp_path / "out" / "model_meta.json").is_file()


@pytest.mark.parametrize("how", ["config", "resume"])
def test_nodes_started_differently_exit_2_on_every_node(
    tmp_path: Path, data: Path, how: str
) -> None:
    config = _config(tmp_path, data, epochs=1)
    job = Job("dqn", config, tmp_path / "logs")
    try:
        if how == "config":
            other = _config(tmp_path / "other", data, epochs=1, training={"learning_rate": 0.01})
            other_cfg = json.loads(other.read_text())
            other_cfg.update(model_output_path=str(tmp_path / "out"),
                             init_method=(tmp_path / "rdzv").as_uri())  # fmt: skip
            other.write_text(json.dumps(other_cfg))
            nodes = [job.start(0), Job("dqn", other, tmp_path / "logs1").start(1)]
            job.nodes.append(nodes[1])
        else:
            nodes = [job.start(0, "--resume"), job.start(1)]
        codes = [node.wait(120) for node in nodes]
    finally:
        job.close()
    assert codes == [2, 2], [n.text()[-2000:] for n in nodes]
    for node in nodes:
        text = node.text()
        assert "not started alike" in text and "Traceback" not in text
        want = "training.learning_rate (0.001 -> 0.01)" if how == "config" else "--resume"
        assert want in text


def test_spark_directory_with_empty_part_files_trains_on_two_nodes(
    tmp_path: Path, data: Path
) -> None:
    spark = tmp_path / "spark"
    spark.mkdir()
    parts = sorted(data.iterdir())
    empty = pq.read_table(parts[0]).slice(0, 0)
    for i, part in enumerate(parts):  # data, empty, data, empty: round-robin would starve rank 1
        (spark / f"part-{2 * i:05d}.snappy.parquet").write_bytes(part.read_bytes())
        pq.write_table(empty, spark / f"part-{2 * i + 1:05d}.snappy.parquet")
    (spark / "_SUCCESS").write_text("")
    job = Job("dqn", _config(tmp_path, spark, epochs=1), tmp_path / "logs")
    try:
        job.run(2)
    finally:
        job.close()
    assert (tmp_path / "out" / "model_meta.json").is_file()


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)
def test_sigterm_stops_a_two_gpu_node_that_replays_cuda_graphs(tmp_path: Path, data: Path) -> None:
    """NCCL's finalize waits for every CUDA graph that captured its all-reduces: a graph
    still alive when the group is left (held by the stop's exception) hung both ranks."""
    config = write_config(
        tmp_path / "c.json", "dqn", data, tmp_path / "out",
        use_gpu=True, use_all_avail_gpus=True, **LONG,
    )  # fmt: skip
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_NVLS_ENABLE": "0"}
    job = Job("dqn", config, tmp_path / "logs", env=env)
    try:
        node = job.start(0)
        _wait_for_training(tmp_path / "out", [node])
        sent = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        code = node.wait(60)
        took = time.monotonic() - sent
    finally:
        job.close()
    text = node.text()
    assert code == 143, text[-3000:]
    assert took < 30, f"stopping took {took:.1f}s"
    assert "one CUDA graph per step" in text
    assert "--resume" in text.strip().splitlines()[-1]
