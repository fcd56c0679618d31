"""Throughput through the real entry point: `python -m workflows.<kind>_workflow --config`.

For each (batch, cuda_graphs, data placement) it writes a config over the benchmark data of
`bench_train` (CartPole ≈110k transitions, or the 16-candidate parametric set), runs the
workflow as a user would, and reads `transitions_per_s` from `metrics.jsonl` (median over
the epochs after the first, which carries the CUDA graph capture and warm-up).

    python -m benchmarks.bench_workflow --batches 1024,8192 --graphs on,off
    python -m benchmarks.bench_workflow --kind parametric --batches 1024 --graphs on
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_train import bench_config, sample_data


def run_one(kind: str, data: Path, out: Path, batch: int, graphs: bool, **extra: Any) -> dict:
    cfg = bench_config(
        kind,
        data,
        out,
        batch,
        use_gpu=True,
        use_all_avail_gpus=True,
        epochs=extra.pop("epochs", 5),
        cuda_graphs=graphs,
        **extra,
    )
    out.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(cfg, indent=1))
    module = "workflows.dqn_workflow" if kind == "dqn" else "workflows.parametric_dqn_workflow"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", module, "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    wall = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {log[-2000:]}"}
    epochs = [
        r
        for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
        if "transitions_per_s" in r
    ]
    rates = [r["transitions_per_s"] for r in epochs]
    step_line = next((line for line in log.splitlines() if "training step:" in line), "")
    return {
        "median_after_first": statistics.median(rates[1:] or rates),
        "epochs": rates,
        "wall_s": wall,
        "step": step_line.split("training step:")[-1].strip(),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kind", default="dqn", choices=["dqn", "parametric"])
    p.add_argument("--batches", default="1024,8192")
    p.add_argument("--graphs", default="on,off")
    p.add_argument("--modes", default="resident", help="resident,streamed")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--transitions-per-epoch", type=float, default=16e6,
                   help="steps_per_epoch = this / batch (0: one pass over the data)")  # fmt: skip
    p.add_argument("--cpe", action="store_true")
    p.add_argument("--data-dir", default="outputs/bench_data")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    data = sample_data(args.kind, Path(args.data_dir))
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                for g in args.graphs.split(","):
                    name = f"{args.kind}_b{batch}_{'graph' if g == 'on' else 'eager'}_{mode}"
                    spe = int(args.transitions_per_epoch // batch) or None
                    res = run_one(
                        "dqn" if args.kind == "dqn" else "parametric_dqn", data,
                        Path(tmp) / name, batch, g == "on", epochs=args.epochs,
                        steps_per_epoch=spe, cpe=args.cpe,
                        device_resident_data=mode == "resident",
                    )  # fmt: skip
                    results[name] = res
                    shown = res.get("error") or (
                        f"{res['median_after_first']:14,.0f} transitions/s  "
                        f"(epochs {[round(x / 1e6, 2) for x in res['epochs']]} M/s; {res['step']})"
                    )
                    print(f"{name:36s} {shown}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
