"""The closed-loop benchmark's side of HTTP: a `reagent-lite serve` subprocess and its clients.

`ServerProcess` starts the real console command on a free loopback port, waits for
`GET /v1/health`, deploys a trained model by hot reload (the files replaced atomically in
the served directory, then `POST /v1/reload`, then `GET /v1/model` until it names the new
model's SHA-256) and stops it with SIGTERM (the server drains and flushes its log: the
benchmark then checks decisions answered == decisions logged). The server picks its own
port (`--port 0`) and names it on its first line of output: no port is guessed.
`Client` is one keep-alive
`http.client` connection, one per client thread: no dependency beyond the standard library.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.dataset as ds

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0  # importing torch + FastAPI and loading the model, on a busy box
STOP_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 60.0
# What a deploy copies from a run's output directory into the served one (model last: the
# server checks the model against the meta's SHA-256, so a reload sees a matching pair).
MODEL_FILES = ("model_meta.json", "normalization.json", "model.pt2")

JSON = dict[str, object]
# The line `reagent-lite serve` prints once it listens.
BANNER = re.compile(r"serving \S+ model \S+ on http://127\.0\.0\.1:(\d+)")


class ServerError(RuntimeError):
    """The server did not start, answered an error, or stopped badly (the message says which)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def subprocess_env() -> dict[str, str]:
    """The environment of every process the benchmark starts: this checkout first on the
    path, one intra-op thread unless set (small networks; extra threads only contend)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class Client:
    """One keep-alive connection to the server; not thread-safe (one per thread)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_S)

    def request(self, method: str, path: str, body: JSON | None = None) -> tuple[int, JSON]:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for attempt in (0, 1):
            try:
                self._conn.request(method, path, body=payload, headers=headers)
                response = self._conn.getresponse()
                raw = response.read()
                break
            except (ConnectionError, http.client.HTTPException):
                # A keep-alive connection the server closed: reconnect once.
                self._conn.close()
                self._conn = http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S
                )
                if attempt:
                    raise
        data = json.loads(raw) if raw else {}
        return response.status, data if isinstance(data, dict) else {"body": data}

    def ok(self, method: str, path: str, body: JSON | None = None) -> JSON:
        status, data = self.request(method, path, body)
        if status != 200:
            raise ServerError(f"{method} {path}: HTTP {status}: {data}")
        return data

    def act(
        self,
        state: Mapping[str, float],
        possible_actions: Sequence[str] | Sequence[Mapping[str, float]],
        mdp_id: str,
        sequence_number: int,
    ) -> JSON:
        return self.ok(
            "POST",
            "/v1/act",
            {
                "state_features": dict(state),
                "possible_actions": list(possible_actions),
                "mdp_id": mdp_id,
                "sequence_number": sequence_number,
            },
        )

    def feedback(self, decision_id: str, reward: float) -> None:
        self.ok("POST", "/v1/feedback", {"decision_id": decision_id, "reward": reward})

    def close(self) -> None:
        self._conn.close()


class ServerProcess:
    """`reagent-lite serve` in a subprocess; its output goes to `log_path`."""

    def __init__(
        self,
        model_dir: Path,
        log_dir: Path,
        exploration: str,
        log_path: Path,
        *,
        seed: int = 0,
        flush_interval_s: float = 1.0,
    ) -> None:
        self.model_dir, self.log_dir, self.exploration = model_dir, log_dir, exploration
        # --reload-poll-s 0: the model changes only when `deploy` says so (POST /v1/reload
        # after both files are in place), never half-way through a deploy.
        cmd = [
            *(sys.executable, "-m", "reagent_lite.console", "serve"),
            *("--model", str(model_dir), "--log-dir", str(log_dir)),
            *("--exploration", exploration, "--host", "127.0.0.1", "--port", "0"),
            *("--seed", str(seed), "--flush-interval-s", str(flush_interval_s)),
            *("--reload-poll-s", "0"),
        ]
        self.log_path = log_path
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=subprocess_env(), stdout=self._log, stderr=subprocess.STDOUT
        )
        try:
            self.port = self._wait_listening()
        except BaseException:
            self.kill()
            raise
        self.client = Client(self.port)
        try:
            self.client.ok("GET", "/v1/health")
        except BaseException:
            self.kill()
            raise

    def _wait_listening(self) -> int:
        """The port of the server's banner line, once it is printed."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = BANNER.search(self.output_tail(100_000))
            if found:
                return int(found.group(1))
            if self.proc.poll() is not None:
                raise ServerError(
                    f"reagent-lite serve exited with code {self.proc.returncode} before "
                    f"listening; its output:\n{self.output_tail()}"
                )
            time.sleep(0.2)
        raise ServerError(
            f"reagent-lite serve printed no 'serving ... on http://...' line within "
            f"{START_TIMEOUT_S:.0f} s; its output:\n{self.output_tail()}"
        )

    def output_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def model_id(self) -> str:
        return str(self.client.ok("GET", "/v1/model")["model_id"])

    def stats(self) -> dict[str, int]:
        """The decision log's counters (`GET /v1/model`'s `stats`)."""
        stats = self.client.ok("GET", "/v1/model").get("stats")
        return {str(k): int(v) for k, v in stats.items()} if isinstance(stats, dict) else {}

    def deploy(self, run_dir: Path) -> str:
        """Hot reload: the run's model files replace the served ones (each renamed into
        place), then `POST /v1/reload`; returns the model_id the server then serves."""
        want = sha256_of(run_dir / "model.pt2")
        for name in MODEL_FILES:
            if not (run_dir / name).exists():
                continue
            partial = self.model_dir / f".{name}.deploy"
            shutil.copyfile(run_dir / name, partial)
            os.replace(partial, self.model_dir / name)
        self.client.ok("POST", "/v1/reload")
        served = self.model_id()
        if served != want:
            raise ServerError(
                f"the server serves model {served} after the reload, not {want} (the "
                f"model deployed); its output:\n{self.output_tail()}"
            )
        return served

    def stop(self) -> int:
        """SIGTERM (the server drains and flushes), then wait; the exit code."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
                raise ServerError(
                    f"reagent-lite serve did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM"
                ) from None
        self._log.close()
        return int(self.proc.returncode)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def read_decision_log(log_dir: Path, columns: list[str] | None = None) -> pa.Table:
    """Every closed Parquet part under `log_dir` (names starting with `.` or `_` skipped,
    as the timeline skips them: partial parts and the journal)."""
    parts = sorted(
        p
        for p in log_dir.rglob("*.parquet")
        if not any(s.startswith((".", "_")) for s in p.relative_to(log_dir).parts)
    )
    if not parts:
        return pa.table({"mdp_id": pa.array([], pa.string())})
    return ds.dataset([str(p) for p in parts], format="parquet").to_table(columns=columns)


def logged_decisions(log_dir: Path, mdp_prefix: str) -> tuple[int, int]:
    """(rows, rows without feedback) of the decision log whose episode id starts with
    `mdp_prefix` (one round's); a row whose feedback never came is `feedback_missing`."""
    table = read_decision_log(log_dir)
    ids = table.column("mdp_id").to_pylist()
    missing = (
        table.column("feedback_missing").to_pylist()
        if "feedback_missing" in table.column_names
        else [False] * len(ids)
    )
    mine = [bool(m) for i, m in zip(ids, missing, strict=True) if str(i).startswith(mdp_prefix)]
    return len(mine), sum(mine)


def wait_logged(
    log_dir: Path, mdp_prefix: str, answered: int, timeout_s: float = 60.0
) -> tuple[int, int]:
    """Waits (a few flush intervals at most) until the round's `answered` decisions are all
    in closed parts; returns `logged_decisions` (fewer only when the timeout ran out)."""
    deadline = time.monotonic() + timeout_s
    logged = logged_decisions(log_dir, mdp_prefix)
    while logged[0] < answered and time.monotonic() < deadline:
        time.sleep(0.25)
        logged = logged_decisions(log_dir, mdp_prefix)
    return logged
