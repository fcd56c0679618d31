"""Helpers for multi-node workflow tests: tiny data, configs and nodes as real OS processes.

Every node is `python -m workflows.<kind>_workflow --config c.json --node_index=k` with its
output in a log file (no pipes to fill up) and a hard timeout on every wait.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import REPO_ROOT

HARD_TIMEOUT_S = 240.0


def make_dqn_parts(directory: Path, parts: int) -> Path:
    """CartPole logged data split into `parts` Parquet files (whole-file shards)."""
    from reagent_lite.samples.generate import generate_sample_data

    made = generate_sample_data(
        kind="gym", env="CartPole-v1", episodes=30, seed=0, output_dir=directory / "gen"
    )
    table = pq.read_table(made.training_data_path)
    out = directory / "train"
    out.mkdir(parents=True)
    step = -(-table.num_rows // parts)
    for i in range(parts):
        pq.write_table(table.slice(i * step, step), out / f"part-{i:05d}.parquet")
    return out


def make_parametric_rows(directory: Path, rows: int) -> Path:
    """Exactly `rows` synthetic parametric transitions in one file of one row group."""
    from reagent_lite.samples.generate import generate_sample_data

    made = generate_sample_data(
        kind="synthetic_parametric",
        episodes=rows + rows // 10 + 20,
        seed=0,
        eval_fraction=0.05,
        output_dir=directory / "gen",
    )
    table = pq.read_table(made.training_data_path)
    assert table.num_rows >= rows
    path = directory / "train.parquet"
    pq.write_table(table.slice(0, rows), path)
    return path


def write_config(path: Path, kind: str, data: Path, out: Path, **overrides: Any) -> Path:
    """A tiny CPU config: small network, no CPE, no eval data (training is what is tested)."""
    cfg: dict[str, Any] = {
        "training_data_path": str(data),
        "model_output_path": str(out),
        "use_gpu": False,
        "use_all_avail_gpus": False,
        "epochs": 2,
        "seed": 7,
        "log_every_steps": 1000,
        "rendezvous_timeout_s": 60,
        "collective_timeout_s": 30,
        "training": {
            "layers": [-1, 16, -1],
            "activations": ["relu", "linear"],
            "minibatch_size": 32,
        },
        "evaluation": {"calc_cpe_in_training": False, "model_selection": "last"},
    }
    if kind == "dqn":
        cfg["actions"] = ["0", "1"]
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=1))
    return path


@dataclass
class Node:
    index: int
    proc: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    def wait(self, timeout: float = HARD_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            pytest.fail(f"node {self.index} did not exit within {timeout}s:\n{self.text()[-4000:]}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


class Job:
    """Starts the nodes of one job; `close()` kills whatever is still running."""

    def __init__(
        self,
        kind: str,
        config: Path,
        logs: Path,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> None:
        self.kind, self.config, self.logs = kind, config, logs
        self.env = {
            **os.environ,
            # The repository first, then whatever the caller's path holds (site dirs).
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            **(env or {}),
        }
        self.prefix = prefix or []  # e.g. ["ip", "netns", "exec", "ns0"] (per node: see start)
        self.nodes: list[Node] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, k: int, *extra: str, prefix: list[str] | None = None) -> Node:
        log = self.logs / f"node{k}-{len(self.nodes)}.log"
        cmd = [*(prefix if prefix is not None else self.prefix), sys.executable, "-m"]
        cmd += [f"workflows.{self.kind}_workflow", "--config", str(self.config)]
        cmd += [f"--node_index={k}", *extra]
        with open(log, "wb") as f:
            proc = subprocess.Popen(
                cmd, cwd=REPO_ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT
            )
        node = Node(k, proc, log)
        self.nodes.append(node)
        return node

    def run(self, num_nodes: int, *extra: str) -> list[Node]:
        """Starts nodes 0..n-1, waits for all; fails the test unless every one exits 0."""
        nodes = [self.start(k, *extra) for k in range(num_nodes)]
        for node in nodes:
            rc = node.wait()
            assert rc == 0, f"node {node.index} exited {rc}:\n{node.text()[-4000:]}"
        return nodes

    def close(self) -> None:
        for node in self.nodes:
            node.kill()


def run_single(kind: str, config: Path, logs: Path, env: dict[str, str]) -> Node:
    job = Job(kind, config, logs, env=env)
    try:
        (node,) = job.run(1)
    finally:
        job.close()
    return node


def model_state(out: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(out / "model_state.pt")["q_net"]
    return state


def assert_close_states(got: Path, want: Path, atol: float = 1e-5) -> float:
    """Max abs difference of the exported weights; fails beyond `atol`."""
    a, b = model_state(got), model_state(want)
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= atol, f"parameters differ by up to {worst:g} (> {atol:g})"
    return worst


def epoch_losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if "transitions_per_s" in r]


def assert_outputs_once(out: Path) -> None:
    for name in ("model.pt2", "model_meta.json", "model_state.pt", "metrics.jsonl"):
        assert (out / name).is_file(), f"missing {name}"
    assert not list(out.glob(".*.tmp*")), "temp files left behind"
