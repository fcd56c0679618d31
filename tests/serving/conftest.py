"""Tiny real models (one dqn, one parametric_dqn, trained once per session) and a real
`reagent-lite serve` subprocess on a free port, always killed, spoken to over HTTP."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import reagent_lite
from tests.conftest import REPO_ROOT
from tests.test_api import tiny_config


def _tiny_dqn(tmp: Path, seed: int) -> Path:
    cfg = tiny_config(tmp)
    cfg.update(epochs=1, eval_data_path=None, seed=seed)
    cfg["training"] = {**cfg["training"], "steps_per_epoch": 3}
    cfg["evaluation"] = {"calc_cpe_in_training": False, "online_episodes": 0}
    return reagent_lite.train(cfg).model_dir


@pytest.fixture(scope="session")
def dqn_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_dqn(tmp_path_factory.mktemp("serve_dqn"), seed=0)


@pytest.fixture(scope="session")
def dqn_model_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another dqn model of the same features and actions (the next round's)."""
    return _tiny_dqn(tmp_path_factory.mktemp("serve_dqn_b"), seed=1)


@pytest.fixture(scope="session")
def parametric_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("serve_parametric")
    cfg = {
        "workflow": "parametric_dqn",
        "training_data_path": str(tmp / "data/train.parquet"),
        "model_output_path": str(tmp / "model"),
        "use_gpu": False,
        "epochs": 1,
        "sample_data": {"kind": "synthetic_parametric", "episodes": 40, "seed": 0},
        "training": {"layers": [-1, 8, -1], "activations": ["relu", "linear"],
                     "minibatch_size": 32, "steps_per_epoch": 3},
        "evaluation": {"calc_cpe_in_training": False},
    }  # fmt: skip
    return reagent_lite.train(cfg).model_dir


def meta(model_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((model_dir / "model_meta.json").read_text())
    return out


class Server:
    """A `reagent-lite serve` subprocess and an HTTP client for it."""

    def __init__(self, proc: subprocess.Popen[str], host: str, port: int, banner: str):
        self.proc, self.host, self.port, self.banner = proc, host, port, banner

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 30.0
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw.decode(errors="replace")
        finally:
            conn.close()

    def act(self, body: Any) -> tuple[int, Any]:
        return self.request("POST", "/v1/act", body)

    def stop(self, timeout: float = 60.0) -> tuple[int, str]:
        """SIGTERM, then the exit code and stderr (SIGKILL if it does not end in time)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"server did not stop in {timeout} s:\n{err[-3000:]}") from None
        return self.proc.returncode, err


def start_server(model: Path, log_dir: Path, *flags: str, timeout: float = 120.0) -> Server:
    """Starts the server on a free port (`--port 0`) and waits for its banner line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "reagent_lite.console", "serve", "--model", str(model),
           "--log-dir", str(log_dir), "--port", "0", *flags]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            if line.startswith("serving "):
                address = line.split(" on http://", 1)[1].split()[0]
                host, port = address.rsplit(":", 1)
                return Server(proc, host, int(port), line.strip())
            if not line and proc.poll() is not None:
                break
        elif proc.poll() is not None:
            break
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"server did not start (rc {proc.returncode}):\n{err[-3000:]}")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """`serve(model, *flags)` starts a server logging under tmp_path; all are killed after."""
    started: list[Server] = []

    def start(model: Path, *flags: str, log_dir: Path | None = None) -> Server:
        server = start_server(model, log_dir or tmp_path / f"log{len(started)}", *flags)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.communicate(timeout=30)
