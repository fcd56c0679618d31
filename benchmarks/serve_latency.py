"""Serving latency and throughput: `reagent-lite serve` over loopback HTTP beside calling
`model.pt2` in process, on the same requests (issue 40).

For each client count (default 1, 16, 64) every client is a thread holding one keep-alive
connection (`http.client`) and sending `/v1/act` requests back to back until the run has
sent `--requests` of them or `--seconds` have passed; latency is measured per request at
the client. The in-process rows call the exported program on the same states, one row per
call, from the same number of threads. `http, unbatched` is the same server with
`--max-batch 1`: batching must beat it at the largest client count, or the run exits 1
(a fast path that is not faster is a defect). The load average is printed with the table:
on a shared machine the absolute figures mean little, the side-by-side ratios more.

    python -m benchmarks.serve_latency --model outputs/cartpole_dqn
    python -m benchmarks.serve_latency --quick          # a tiny model trained on the spot

Goals on a quiet 2-core machine: p99 <= 20 ms at 16 clients, >= 1000 decisions/s at 64.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Result:
    mode: str
    clients: int
    latencies_s: list[float]
    wall_s: float
    batch: float | None = None  # decisions per model call (the server's counters)

    def row(self) -> str:
        lat = np.asarray(self.latencies_s) * 1000.0
        p50, p99 = np.percentile(lat, [50, 99]) if len(lat) else (float("nan"),) * 2
        rate = len(lat) / self.wall_s if self.wall_s > 0 else float("nan")
        batch = "" if self.batch is None else f"{self.batch:10.1f}"
        return (f"{self.mode:<22}{self.clients:>8}{len(lat):>10}{p50:>9.2f}{p99:>9.2f}"
                f"{rate:>13.0f}{batch}")  # fmt: skip

    @property
    def rate(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s > 0 else 0.0


HEADER = f"{'mode':<22}{'clients':>8}{'requests':>10}{'p50 ms':>9}{'p99 ms':>9}{'decisions/s':>13}{'batch':>10}"


def drive(
    clients: int, total: int, seconds: float, call: Callable[[int], None]
) -> tuple[list[float], float]:
    """`call(i)` from `clients` threads until `total` calls or `seconds`; latencies, wall."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(total))
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(worker: int) -> None:
        own: list[float] = []
        start.wait()
        while time.perf_counter() < stop_at[0]:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            t0 = time.perf_counter()
            call(i * 7919 + worker)
            own.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(own)

    threads = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join(seconds + 60)
    return latencies, time.perf_counter() - t0


class Server:
    def __init__(self, model: Path, log_dir: Path, *flags: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reagent_lite.console", "-q", "serve", "--model", str(model),
             "--log-dir", str(log_dir), "--port", "0", *flags],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the banner, once it listens
        if not line.startswith("serving "):
            self.proc.kill()
            raise SystemExit(f"serve_latency: the server did not start ({line.strip()!r})")
        self.host, port = line.split(" on http://", 1)[1].split()[0].rsplit(":", 1)
        self.port = int(port)
        self._local = threading.local()

    def call(self, method: str, path: str, body: bytes | None = None) -> dict:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
        if resp.status != 200:
            raise RuntimeError(f"{path}: {resp.status} {data}")
        return data

    def counters(self) -> tuple[int, int]:
        # A connection of its own: the main thread's would idle past the server's
        # keep-alive timeout between rows and be closed under it.
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request("GET", "/v1/model")
            stats = json.loads(conn.getresponse().read())["stats"]
        finally:
            conn.close()
        return stats["decisions"], stats["model_calls"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def http_rows(
    name: str, server: Server, states: list[bytes], counts: list[int], args: argparse.Namespace
) -> list[Result]:
    out = []
    for clients in counts:
        drive(
            clients,
            2 * clients,
            30.0,
            lambda i: server.call("POST", "/v1/act", states[i % len(states)]),
        )  # warm-up
        d0, c0 = server.counters()
        lat, wall = drive(clients, args.requests, args.seconds,
                          lambda i: server.call("POST", "/v1/act", states[i % len(states)]))  # fmt: skip
        d1, c1 = server.counters()
        out.append(Result(name, clients, lat, wall, (d1 - d0) / max(1, c1 - c0)))
        print(out[-1].row(), flush=True)
    return out


def in_process_rows(
    model: Path, states: list[dict[str, float]], counts: list[int], args: argparse.Namespace
) -> list[Result]:
    import torch

    from reagent_lite.predict import Predictor

    predictor = Predictor(model)
    ids = predictor.space.state_ids
    rows = [torch.tensor([[s.get(f, 0.0) for f in ids]], dtype=torch.float32) for s in states]
    ones = torch.ones_like(rows[0])

    def call(i: int) -> None:
        with torch.no_grad():
            predictor.program(rows[i % len(rows)], ones).argmax()

    out = []
    for clients in counts:
        drive(clients, 2 * clients, 30.0, call)
        lat, wall = drive(clients, args.requests, args.seconds, call)
        out.append(Result("in-process model.pt2", clients, lat, wall))
        print(out[-1].row(), flush=True)
    return out


def tiny_model(directory: Path) -> Path:
    """A CartPole dqn model from the CI sample config, trained briefly (for `--quick`)."""
    import reagent_lite

    cfg = json.loads((REPO / "sample_configs/ci/dqn_1node.json").read_text())
    cfg.pop("$schema", None)
    cfg.update(training_data_path=str(directory / "data/train.parquet"), eval_data_path=None,
               model_output_path=str(directory / "model"), epochs=1)  # fmt: skip
    cfg["training"] = {**cfg["training"], "steps_per_epoch": 3}
    cfg["evaluation"] = {"calc_cpe_in_training": False, "online_episodes": 0}
    return reagent_lite.train(cfg).model_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, help="a dqn model_output_path (default: train a tiny one)")
    p.add_argument("--clients", default="1,16,64", help="comma-separated client counts")
    p.add_argument("--requests", type=int, default=3000, help="requests per row (at most)")
    p.add_argument("--seconds", type=float, default=20.0, help="time per row (at most)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 and 4 clients, 40 requests")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]
    if args.quick:
        counts, args.requests, args.seconds = [1, 4], 40, 10.0
    with tempfile.TemporaryDirectory(prefix="serve_latency.") as tmp:
        model = args.model or tiny_model(Path(tmp))
        meta = json.loads((Path(model) / "model_meta.json").read_text())
        if meta.get("workflow") != "dqn":
            raise SystemExit("serve_latency: --model must be a dqn model")
        rng = np.random.default_rng(0)
        states = [{f: float(rng.normal()) for f in meta["state_feature_ids"]} for _ in range(256)]
        bodies = [json.dumps({"state_features": s}).encode() for s in states]
        print(f"serve_latency: {meta['workflow']} model {meta['model_sha256'][:12]}, "
              f"{len(meta['state_feature_ids'])} features, {os.cpu_count()} CPUs, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (a busy machine inflates every row)")  # fmt: skip
        print(HEADER)
        results = in_process_rows(Path(model), states, counts, args)
        server = Server(Path(model), Path(tmp) / "log")
        try:
            results += http_rows("http serve", server, bodies, counts, args)
        finally:
            server.stop()
        plain = Server(
            Path(model), Path(tmp) / "log_unbatched", "--max-batch", "1", "--max-wait-ms", "0"
        )
        try:
            results += http_rows("http, unbatched", plain, bodies, counts[-1:], args)
        finally:
            plain.stop()
    batched = next(r for r in results if r.mode == "http serve" and r.clients == counts[-1])
    unbatched = results[-1]
    by = {(r.mode, r.clients): r for r in results}
    p99_16 = by.get(("http serve", 16))
    if p99_16 is not None:
        p99 = float(np.percentile(p99_16.latencies_s, 99)) * 1000.0
        print(f"goal p99 <= 20 ms at 16 clients: {p99:.1f} ms ({'met' if p99 <= 20 else 'missed'})")
    if ("http serve", 64) in by:
        rate = by[("http serve", 64)].rate
        print(
            f"goal >= 1000 decisions/s at 64 clients: {rate:.0f} ({'met' if rate >= 1000 else 'missed'})"
        )
    print(
        f"batching at {counts[-1]} clients: {batched.rate:.0f} vs {unbatched.rate:.0f} decisions/s unbatched"
    )
    if not args.quick and batched.rate < unbatched.rate:
        print("serve_latency: batching was slower than no batching in this run", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
