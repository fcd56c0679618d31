"""The README's first command from a fresh clone, on a quiet box and beside three CPU-bound
neighbours: how much longer a user on a busy machine waits (goal: at most about 2×).

Each round clones the repository's HEAD into a new directory and times, in a clean
environment (no OMP_* variables, so the workflow's own thread choice applies), the two parts
of `bash scripts/run_sample.sh`: the set-up (`scripts/bootstrap.sh`: a new .venv and its
installs, served by pip's cache after the first round) and the sample job itself (generate
CartPole data, train, evaluate, export, roll out). The conditions alternate inside a round,
in a rotating order; the neighbours are `bench_neighbours`' (one single-threaded matrix
product loop each, killed with their process group).

    python -m benchmarks.busy_sample [--rounds 2] [--config sample_configs/...json] [--logs DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.bench_neighbours import NEIGHBOURS, neighbours

REPO = Path(__file__).resolve().parents[1]
STEP_TIMEOUT_S = 1800


def user_env() -> dict[str, str]:
    """A user's shell: no OpenMP settings, and nothing pointing at this checkout."""
    drop = ("OMP_", "GOMP_", "PYTHONPATH", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def timed(cmd: list[str], cwd: Path, log: Path) -> float:
    start = time.perf_counter()
    with log.open("a") as out:
        proc = subprocess.run(
            cmd, cwd=cwd, env=user_env(), stdout=out, stderr=subprocess.STDOUT,
            timeout=STEP_TIMEOUT_S, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} in {cwd}:\n{tail}")
    return time.perf_counter() - start


def one_run(work: Path, logs: Path, name: str, config: str) -> dict[str, float]:
    clone = work / name
    subprocess.run(
        ["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300, env=user_env()
    )
    log = logs / f"{name}.log"
    log.unlink(missing_ok=True)
    setup = timed(["bash", "scripts/bootstrap.sh"], clone, log)
    job = timed(["bash", "scripts/run_sample.sh", config], clone, log)
    shutil.rmtree(clone, ignore_errors=True)
    return {"setup_s": setup, "job_s": job, "total_s": setup + job}


def ratios(runs: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """Per round, busy / quiet of each part; the median over rounds."""
    pairs = list(zip(runs["quiet"], runs["neighbours"], strict=True))
    return {
        part: statistics.median(busy[part] / quiet[part] for quiet, busy in pairs)
        for part in ("setup_s", "job_s", "total_s")
    }


def table(runs: dict[str, list[dict[str, float]]]) -> str:
    lines = [f"{'condition':12s}{'part':10s}{'median s':>10s}   rounds"]
    for condition, figs in runs.items():
        for part in ("setup_s", "job_s", "total_s"):
            values = [f[part] for f in figs]
            rounds = ", ".join(f"{v:.1f}" for v in values)
            lines.append(f"{condition:12s}{part:10s}{statistics.median(values):10.1f}   {rounds}")
    for part, value in ratios(runs).items():
        goal = "  (goal <= 2)" if part != "setup_s" else ""
        lines.append(f"{'busy/quiet':12s}{part:10s}{value:10.2f}{goal}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--config", default="sample_configs/discrete_action/cartpole_dqn.json")
    p.add_argument("--json", default="")
    p.add_argument("--logs", default="outputs/busy_sample", help="where each run's log is kept")
    args = p.parse_args(argv)
    logs = Path(args.logs).resolve()
    logs.mkdir(parents=True, exist_ok=True)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    print(f"HEAD {head}, {os.cpu_count()} cores, load {os.getloadavg()}", flush=True)
    runs: dict[str, list[dict[str, float]]] = {"quiet": [], "neighbours": []}
    with tempfile.TemporaryDirectory(prefix="busy_sample_") as tmp:
        for r in range(args.rounds):
            order = ["quiet", "neighbours"] if r % 2 == 0 else ["neighbours", "quiet"]
            for condition in order:
                count = NEIGHBOURS if condition == "neighbours" else 0
                with neighbours(count):
                    fig = one_run(Path(tmp), logs, f"{condition}-{r}", args.config)
                runs[condition].append(fig)
                parts = ", ".join(f"{k} {v:.1f}" for k, v in fig.items())
                print(f"  round {r}: {condition:10s} {parts}", flush=True)
    print(table(runs))
    print(f"load {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
