"""Multi-GPU runs of the real workflow entry points (issue 8), on one host with G ≥ 2 GPUs.

    python -m benchmarks.multi_gpu --out /tmp/mgpu [--batches 1024,8192] [--steps 3000] \\
        [--epochs 3] [--eager-baseline] [--skip parametric,nodes] \\
        [--counts 1,4] [--independent] [--verify-every 200] [--compile --precision bf16] \\
        [--kind parametric]

1. `use_all_avail_gpus: true` with 1, 2, … G visible GPUs (CUDA_VISIBLE_DEVICES): one
   process per GPU, NCCL; replicas checked every 200 steps (REAGENT_LITE_VERIFY_REPLICAS);
   per-GPU throughput from metrics.jsonl with the per-process batch held fixed, and the
   weak-scaling efficiency (per-GPU throughput at G GPUs / at 1 GPU). `--eager-baseline`
   adds, per batch, G GPUs with `cuda_graphs: false` (the DDP wrapper's eager step);
   `--independent` G one-GPU runs at once, one per GPU, which share
   only the host: the per-GPU rate weak scaling would keep if the gradient sum were free.
   `--verify-every 0` turns the replica check off (it costs throughput). `--kind parametric`
   runs these with the parametric workflow on `bench_train`'s parametric data (16
   candidates per state) instead of dqn on CartPole.
2. Two "nodes" on one host: `--node_index=0/1`, each given half of the GPUs through
   CUDA_VISIBLE_DEVICES, rendezvous in a shared directory.
3. The parametric sample config on all GPUs.
Every run must exit 0 and leave exactly one model.pt2. The figures are printed as a table
and written to <out>/summary.json, with rank 0's lines on the training step (CUDA graph or
eager) and on the replica check. NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and
friends), as the machines' notes require.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from reagent_lite.training.verify import VERIFY_ENV

REPO = Path(__file__).resolve().parents[1]
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
VERIFY = {"REAGENT_LITE_VERIFY_REPLICAS": "200"}
MLP = {"layers": [-1, 256, 256, -1], "activations": ["relu", "relu", "linear"]}


def _env(visible: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES=visible, **SAFE_ENV, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _config(path: Path, **fields: Any) -> Path:
    # Reruns of the benchmark train into the same directories: replacing their models is meant.
    path.write_text(json.dumps({"overwrite": True, **fields}, indent=1))
    return path


def _steady_throughput(out: Path) -> float:
    """Median transitions/s of the epochs after the first (which pays warm-up and capture)."""
    records = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    epochs = [r["transitions_per_s"] for r in records if "transitions_per_s" in r]
    return statistics.median(epochs[1:] if len(epochs) > 1 else epochs)


def _log_facts(log: Path) -> dict[str, str]:
    """Rank 0's lines on the training step and on the replica check."""
    text = log.read_text(errors="replace")
    facts = {}
    for key, pattern in (("step", r"training step: [^;\n]*"), ("replicas", r"replica check: .*")):
        found = re.findall(pattern, text)
        facts[key] = found[-1] if found else "(not in the log)"
    return facts


def _run(cmds: list[tuple[list[str], dict[str, str]]], log: Path, timeout: float) -> float:
    start = time.perf_counter()
    procs = []
    with log.open("w") as f:
        for cmd, env in cmds:
            procs.append(
                subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
            )
        try:
            codes = [p.wait(timeout=timeout) for p in procs]
        finally:
            for p in procs:
                p.kill()
    if any(codes):
        print(log.read_text()[-4000:])
        raise SystemExit(f"run failed ({codes}); log {log}")
    return time.perf_counter() - start


def scaling_fields(
    common: dict[str, Any], args: argparse.Namespace, batch: int, graphs: bool
) -> dict[str, Any]:
    """The config fields of one weak-scaling run (paths and rendezvous added per run)."""
    fields: dict[str, Any] = {
        **common,
        "cuda_graphs": graphs,
        "training": {
            **MLP,
            "minibatch_size": batch,
            "steps_per_epoch": args.steps,
            "precision": args.precision,
            "compile": args.compile,
        },
    }
    if args.stop_check_every:
        fields["stop_check_every_steps"] = args.stop_check_every
    return fields


def parametric_common(common: dict[str, Any], data: Path) -> dict[str, Any]:
    """`common`'s run settings for the parametric workflow on the data in `data` (no
    action names, no sample data, no eval table)."""
    drop = ("actions", "sample_data", "eval_data_path")
    return {
        **{k: v for k, v in common.items() if k not in drop},
        "training_data_path": str(data / "train.parquet"),
    }


def _weak_scaling(
    out: Path, common: dict[str, Any], args: argparse.Namespace, gpus: int, summary: dict[str, Any]
) -> None:
    py = sys.executable
    kind = args.kind
    module = "workflows.dqn_workflow" if kind == "dqn" else "workflows.parametric_dqn_workflow"
    if kind == "parametric":  # bench_train's data: ≈110k transitions, 16 candidates per state
        from benchmarks.bench_train import sample_data

        common = parametric_common(common, sample_data("parametric", out / "data_parametric"))
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        per_gpu: dict[int, float] = {}
        counts = [int(c) for c in args.counts.split(",")] if args.counts else range(1, gpus + 1)
        runs = [(n, True, "") for n in counts]
        if args.independent:
            runs.append((gpus, True, "independent"))
        if args.eager_baseline:
            runs.append((gpus, False, ""))
        for n, graphs, variant in runs:
            tag = (
                f"{kind}_b{batch}_g{n}"
                + ("" if graphs else "_eager")
                + (f"_{variant}" if variant else "")
            )
            # "independent": n one-GPU runs at once, one per GPU, sharing nothing but the
            # host — the ceiling weak scaling could reach with a free gradient sum.
            alone = variant == "independent"
            run_dirs = [out / f"{tag}_{i}" for i in range(n)] if alone else [out / tag]
            cmds = []
            extra: dict[str, str] = {}
            if args.verify_every:
                extra[VERIFY_ENV] = str(args.verify_every)
            fields = scaling_fields(common, args, batch, graphs)
            for i, run_dir in enumerate(run_dirs):
                cfg = _config(
                    out / f"{run_dir.name}.json",
                    **fields,
                    init_method=(out / f"rdzv_{run_dir.name}").as_uri(),
                    model_output_path=str(run_dir),
                )
                visible = str(i) if alone else ",".join(str(k) for k in range(n))
                cmd = [py, "-m", module, "--config", str(cfg)]
                cmds.append((cmd, _env(visible, **extra)))
            log = out / f"{tag}.log"
            wall = _run(cmds, log, args.timeout)
            total = 0.0
            for run_dir in run_dirs:
                meta = json.loads((run_dir / "model_meta.json").read_text())
                assert meta["world_size"] == (1 if alone else n), meta["world_size"]
                total += _steady_throughput(run_dir)
            per = total / n
            if graphs and not variant:
                per_gpu[n] = per
            name = (
                f"{kind} b={batch}"
                + ("" if graphs else " eager")
                + (f" {variant}" if variant else "")
            )
            eff = per / per_gpu[1] if 1 in per_gpu else float("nan")
            rows.append((name, n, total, per, eff, wall))
            facts = _log_facts(log)
            summary["runs"].append(
                {
                    "run": name,
                    "gpus": n,
                    "transitions_per_s": total,
                    "per_gpu": per,
                    "efficiency": eff,
                    "wall_s": wall,
                    **facts,
                }
            )
            print(f"{tag}: {facts['step']} | {facts['replicas']}", flush=True)
    print(
        f"{'run':<22}{'GPUs':>5}{'transitions/s':>16}{'per GPU':>14}{'efficiency':>12}{'wall s':>9}"
    )
    for name, n, total, per, eff, wall in rows:
        print(f"{name:<22}{n:>5}{total:>16,.0f}{per:>14,.0f}{eff:>11.1%}{wall:>9.1f}")


def _parametric(out: Path, gpus: int, timeout: float, summary: dict[str, Any]) -> None:
    """The parametric sample config, unchanged but for its paths, on every GPU."""
    sample = json.loads(
        (REPO / "sample_configs/parametric_action/synthetic_parametric_dqn.json").read_text()
    )
    sample.pop("$schema", None)
    sample.update(
        training_data_path=str(out / "pdata/train.parquet"),
        eval_data_path=str(out / "pdata/eval.parquet"),
        model_output_path=str(out / "parametric"),
        init_method=(out / "rdzv_parametric").as_uri(),
        use_gpu=True,
        use_all_avail_gpus=True,
    )
    cfg = _config(out / "parametric.json", **sample)
    visible = ",".join(str(i) for i in range(gpus))
    log = out / "parametric.log"
    cmd = [sys.executable, "-m", "workflows.parametric_dqn_workflow", "--config", str(cfg)]
    wall = _run([(cmd, _env(visible, **VERIFY))], log, timeout)
    meta = json.loads((out / "parametric/model_meta.json").read_text())
    facts = _log_facts(log)
    models = list((out / "parametric").glob("**/model.pt2"))
    final = {k: v for k, v in (meta.get("final_metrics") or {}).items() if k != "cpe"}
    print(
        f"parametric sample config on {gpus} GPUs: world size {meta['world_size']}, "
        f"{wall:.0f} s, model files {len(models)}, final {final} | {facts['step']} | "
        f"{facts['replicas']}"
    )
    summary["parametric"] = {
        "world_size": meta["world_size"],
        "wall_s": wall,
        "models": len(models),
        "final_metrics": final,
        **facts,
    }


def _two_nodes(
    out: Path, common: dict[str, Any], gpus: int, timeout: float, summary: dict[str, Any]
) -> None:
    """Two "nodes" on one host, half of the GPUs each, file rendezvous in a shared dir."""
    half = gpus // 2
    shared = out / "nfs"
    shared.mkdir(exist_ok=True)
    cfg = _config(
        out / "two_nodes.json",
        **{**common, "epochs": 2},
        model_output_path=str(shared / "out"),
        num_nodes=2,
        init_method=(shared / "rendezvous").as_uri(),
        training={**MLP, "minibatch_size": 1024, "steps_per_epoch": 500},
    )
    halves = [
        ",".join(str(i) for i in range(half)),
        ",".join(str(i) for i in range(half, 2 * half)),
    ]
    cmd = [sys.executable, "-m", "workflows.dqn_workflow", "--config", str(cfg)]
    log = out / "two_nodes.log"
    wall = _run(
        [([*cmd, f"--node_index={k}"], _env(halves[k], **VERIFY)) for k in (0, 1)], log, timeout
    )
    meta = json.loads((shared / "out/model_meta.json").read_text())
    models = [str(p) for p in out.glob("nfs/**/model.pt2")]
    leftovers = [str(p) for p in shared.glob("rendezvous.rdzv/**/*")]
    facts = _log_facts(log)
    print(
        f"two nodes x {half} GPU(s): world size {meta['world_size']}, {wall:.0f} s, "
        f"model files {models} | {facts['step']} | {facts['replicas']}"
    )
    print(f"rendezvous leftovers after the clean run: {leftovers}")
    summary["two_nodes"] = {
        "world_size": meta["world_size"],
        "wall_s": wall,
        "models": models,
        "rendezvous_leftovers": leftovers,
        **facts,
    }


def run_common(data: Path, epochs: int) -> dict[str, Any]:
    """The dqn runs' shared config fields: CartPole sample data made in `data` by the first
    run, double Q, no CPE, the last epoch's model."""
    return {
        "training_data_path": str(data / "train.parquet"),
        "eval_data_path": str(data / "eval.parquet"),
        "use_gpu": True,
        "use_all_avail_gpus": True,
        "actions": ["0", "1"],
        "epochs": epochs,
        "seed": 0,
        "log_every_steps": 1_000_000,
        "checkpoint_every_epochs": 0,
        "evaluation": {"calc_cpe_in_training": False, "model_selection": "last"},
        "sample_data": {"kind": "gym", "env": "CartPole-v1", "episodes": 5000, "policy": "random"},
        "rainbow": {"double_q_learning": True},
        "rl": {"target_update_rate": 0.005},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/multi_gpu"))
    parser.add_argument("--batches", default="1024,8192")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps per epoch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("--eager-baseline", action="store_true", help="also G GPUs, eager")
    parser.add_argument(
        "--verify-every",
        type=int,
        default=200,
        help=f"{VERIFY_ENV} for the weak-scaling runs (0: no replica check)",
    )
    parser.add_argument(
        "--independent",
        action="store_true",
        help="also G one-GPU runs at once (one per GPU): the ceiling without communication",
    )
    parser.add_argument("--stop-check-every", type=int, default=0, help="stop_check_every_steps")
    parser.add_argument("--counts", default="", help="GPU counts to run, e.g. 1,4 (default 1..G)")
    parser.add_argument("--skip", default="", help="parts to skip: parametric,nodes")
    parser.add_argument("--precision", default="fp32", help="training.precision: fp32|tf32|bf16")
    parser.add_argument("--compile", action="store_true", help="training.compile: true")
    parser.add_argument(
        "--kind", default="dqn", choices=["dqn", "parametric"], help="the weak-scaling runs' kind"
    )
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit(f"needs at least 2 GPUs, found {gpus}")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    common = run_common(out / "data", args.epochs)
    summary: dict[str, Any] = {
        "gpus": gpus,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": [],
    }
    skip = set(args.skip.split(","))
    try:
        _weak_scaling(out, common, args, gpus, summary)
        if "nodes" not in skip:
            _two_nodes(out, common, gpus, args.timeout, summary)
        if "parametric" not in skip:
            _parametric(out, gpus, args.timeout, summary)
    finally:
        (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
