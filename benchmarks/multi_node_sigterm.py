"""Two "nodes" on one multi-GPU host, preempted and resumed (issue 24's second and third runs).

    python -m benchmarks.multi_node_sigterm --out /tmp/mns [--kind dqn] [--gpus-per-node 2]

Node 0 gets GPUs 0..g-1, node 1 the next g (CUDA_VISIBLE_DEVICES), each runs
`use_all_avail_gpus: true` (one process per GPU, NCCL), and both rendezvous through a file
in a shared directory. Once training runs, node 1 alone gets SIGTERM: every rank must stop
at the same step, rank 0 must write one mid-epoch checkpoint, and both nodes must exit 143.
Then both are started again with `--resume` and must finish: one `model.pt2`, replicas
identical at every check (REAGENT_LITE_VERIFY_REPLICAS), no rendezvous files left. NVLink
multicast stays off, as the machines' notes require. Prints one line per check.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "REAGENT_LITE_VERIFY_REPLICAS": "50",
    "PYTHONUNBUFFERED": "1",
}


def _start(kind: str, cfg: Path, node: int, gpus: str, log: Path, *extra: str) -> subprocess.Popen:  # type: ignore[type-arg]
    env = dict(os.environ, **ENV, CUDA_VISIBLE_DEVICES=gpus)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", f"workflows.{kind}_workflow", "--config", str(cfg)]
    with open(log, "wb") as f:
        return subprocess.Popen(
            [*cmd, f"--node_index={node}", *extra],
            cwd=REPO,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("/tmp/multi_node_sigterm"))
    p.add_argument("--kind", default="dqn", choices=["dqn", "parametric_dqn"])
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--stop-only", action="store_true", help="skip the --resume run")
    args = p.parse_args()
    out, g = args.out, args.gpus_per_node
    out.mkdir(parents=True, exist_ok=True)
    # A fresh job: an earlier run's model directory and rendezvous files would make this
    # one a different test (the sample data is kept: it depends only on the config).
    for left in ("model", "rdzv.rdzv"):
        shutil.rmtree(out / left, ignore_errors=True)
    sample = {"kind": "gym", "env": "CartPole-v1", "episodes": 2000, "policy": "random"}
    if args.kind != "dqn":
        sample = {"kind": "synthetic_parametric", "episodes": 20000}
    cfg = {
        "training_data_path": str(out / "data/train.parquet"),
        "model_output_path": str(out / "model"),
        "num_nodes": 2,
        "use_gpu": True,
        "use_all_avail_gpus": True,
        "init_method": (out / "rdzv").as_uri(),
        "epochs": 40,
        "checkpoint_every_epochs": 0,
        "stop_check_every_steps": 10,
        "sample_data": sample,
        "training": {"minibatch_size": 1024, "steps_per_epoch": 5000},
        "evaluation": {"calc_cpe_in_training": False, "model_selection": "last"},
    }
    if args.kind == "dqn":
        cfg["actions"] = ["0", "1"]
    path = out / "config.json"
    path.write_text(json.dumps(cfg, indent=1))
    gpus = [",".join(str(n * g + i) for i in range(g)) for n in (0, 1)]
    ok = True

    def check(what: str, good: bool) -> None:
        nonlocal ok
        ok &= good
        print(f"{'OK  ' if good else 'FAIL'} {what}", flush=True)

    # 1. Train; SIGTERM to node 1 once metrics show training.
    procs = [_start(args.kind, path, n, gpus[n], out / f"node{n}.log") for n in (0, 1)]
    metrics = out / "model/metrics.jsonl"
    end = time.monotonic() + args.timeout
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        if time.monotonic() > end or any(pr.poll() is not None for pr in procs):
            break
        time.sleep(0.2)
    time.sleep(1.0)  # mid-epoch
    sent = time.monotonic()
    procs[1].send_signal(signal.SIGTERM)
    codes = []
    for pr in procs:
        try:
            codes.append(pr.wait(60))
        except subprocess.TimeoutExpired:
            pr.kill()
            codes.append(-9)
    took = time.monotonic() - sent
    check(
        f"SIGTERM to node 1: exit codes {codes} (want [143, 143]) after {took:.1f} s",
        codes == [143, 143] and took < 30,
    )
    ckpts = sorted((out / "model/checkpoints").rglob("epoch_*_step_*.pt"))
    check(f"mid-epoch checkpoint written: {[c.name for c in ckpts]}", len(ckpts) >= 1)
    last = (out / "node0.log").read_text(errors="replace").strip().splitlines()[-1:]
    check(f"node 0's last line names --resume: {last}", bool(last) and "--resume" in last[0])
    if args.stop_only:
        return 0 if ok else 1
    # 2. Resume on both nodes: finish with fewer epochs (an allowed change).
    done_epochs = len(metrics.read_text().splitlines())
    cfg["epochs"] = done_epochs + 2
    path.write_text(json.dumps(cfg, indent=1))
    procs = [
        _start(args.kind, path, n, gpus[n], out / f"resume{n}.log", "--resume") for n in (0, 1)
    ]
    codes = []
    for pr in procs:
        try:
            codes.append(pr.wait(args.timeout))
        except subprocess.TimeoutExpired:
            pr.kill()
            codes.append(-9)
    check(f"--resume on both nodes: exit codes {codes} (want [0, 0])", codes == [0, 0])
    text = (out / "resume0.log").read_text(errors="replace")
    check("resumed from the mid-epoch checkpoint", "_step_" in text and "resum" in text.lower())
    rep = [ln for ln in text.splitlines() if "replica check" in ln]
    check(
        f"replicas identical: {rep[-1].split('reagent_lite: ')[-1] if rep else 'no line'}",
        bool(rep) and "identical" in rep[-1],
    )
    models = list((out / "model").glob("model.pt2"))
    check(f"one model.pt2 written ({len(models)})", len(models) == 1)
    left = [q.name for q in out.iterdir() if q.name.startswith("rdzv")]
    check(f"rendezvous files left: {left}", not left)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
