"""Training throughput: our workflow's real step vs a bare-PyTorch loop vs d3rlpy, one process.

The reference task of issue 7: Double DQN, MLP 256×256, CartPole (4 features, 2 actions,
~110k logged transitions from `reagent_lite.samples`), Adam, soft target updates. Every
contender trains on the same normalized tensors; the contenders run interleaved, round
after round, each round in its own seeded random order, and the median of the rounds is
reported (a shared machine is noisy: compare the ratios, which come from the same
minutes). Each timed block follows `WARMUP_STEPS` untimed steps of the same contender;
d3rlpy's steps are timed inside `fit`, without the set-up of each `fit` call.

* `ours`: a real `Workflow` set up from a config, stepped by `Workflow.step_runner()` — the
  object and calls `Workflow.train()` runs (CPE side models off, and `ours+cpe` with them).
* `bare`: the same maths written directly in PyTorch, tensors already on the device, minibatch
  rows gathered by index from a per-epoch permutation (`bare-graph` on CUDA: that step in
  one CUDA graph).
* `d3rlpy`: `DoubleDQN.fit` on the same transitions (when d3rlpy is installed).
* `products` (CPU, dqn): the step's five large matrix products alone, the arithmetic floor.
* `--compile` (CUDA): `ours-graph-c[-P]`, our step with `training.compile` in precision P
  (`--precisions fp32,tf32,bf16`; `ours-graph-c+cpe`: with the CPE side models, whose loss
  is compiled too), beside `bare-graph-c[-P]`, the bare loop whose loss
  forward/backward is compiled by Inductor inside the same CUDA graph — the compiled
  floor. Ratios are printed against the fp32 `bare-graph` floor. On a CPU: `ours-c` and
  `bare-c`, compiled without a graph.

The floor check: where ours compiled and the compiled bare loop both ran (`ours-graph-c-P`
and `bare-graph-c-P`, `ours-c` and `bare-c`), ours must reach `--floor` (1.0) times the
bare loop's median, else the command prints a `FLOOR CHECK FAILED` line per pair and
exits 1, after the figures and the JSON are written; `--no-floor-check` skips it.

    python -m benchmarks.bench_train --device cpu --batch 1024
    python -m benchmarks.bench_train --device cuda --batch 8192 --no-d3rlpy
    python -m benchmarks.bench_train --kind parametric --batch 1024     # 16 candidates
    python -m benchmarks.bench_train --device cuda --rows 1000000 --modes resident,streamed
    python -m benchmarks.bench_train --device cuda --batch 65536 --rows 8000000 --no-d3rlpy \
        --no-cpe --no-eager --compile --precisions fp32,tf32,bf16
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.bare_loops import GAMMA, LR, TAU, WARMUP_STEPS, Bare, Products, d3rlpy_runner, sync
from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig, config_from_dict
from reagent_lite.data.rows import Rows
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.loop import Workflow


# ---------------------------------------------------------------------------- data
def sample_data(kind: str, root: Path, *, quick: bool = False) -> Path:
    """≈110k training transitions (`quick`: ≈3k, to check a command, not a speed),
    generated once into `root` (seeded, so reusable)."""
    from reagent_lite.samples.generate import generate_sample_data

    episodes, states = (150, 3000) if quick else (5000, 110_000)
    name = f"cartpole_{episodes}" if kind == "dqn" else f"parametric_{states // 1000}k_k16"
    out = root / name
    if (out / "train.parquet").exists():
        return out
    if kind == "dqn":
        generate_sample_data(
            kind="gym", env="CartPole-v1", episodes=episodes, policy="random", seed=0,
            eval_fraction=0.0, output_dir=out,
        )  # fmt: skip
    else:
        generate_sample_data(
            kind="synthetic_parametric", states=states, episodes=states, min_candidates=16,
            max_candidates=16, seed=0, eval_fraction=0.0, output_dir=out,
        )  # fmt: skip
    return out


def bench_config(kind: str, data: Path, out: Path, batch: int, **extra: Any) -> dict[str, Any]:
    """The reference task's config (Double DQN, MLP 256×256, Adam, soft targets); `extra`
    overrides top-level keys, `steps_per_epoch` goes into `training`, `cpe` switches CPE."""
    cfg: dict[str, Any] = {
        "training_data_path": str(data / "train.parquet"),
        "model_output_path": str(out),
        "use_all_avail_gpus": False,
        "epochs": 1,
        "seed": 0,
        "checkpoint_every_epochs": 0,
        "rl": {"gamma": GAMMA, "target_update_rate": TAU},
        "rainbow": {"double_q_learning": True},
        "training": {
            "layers": [-1, 256, 256, -1],
            "activations": ["relu", "relu", "linear"],
            "minibatch_size": batch,
            "learning_rate": LR,
            "optimizer": "adam",
            "steps_per_epoch": extra.pop("steps_per_epoch", None),
            "precision": extra.pop("precision", "fp32"),
            "compile": extra.pop("compile", False),
        },
        "evaluation": {"calc_cpe_in_training": extra.pop("cpe", False)},
        **extra,
    }
    if kind == "dqn":
        cfg["actions"] = ["0", "1"]
    return cfg


def workflow(kind: str, data: Path, out: Path, device: str, batch: int, **extra: Any) -> Workflow:
    """A real workflow, set up (data read, normalized, moved to the device, nets built)."""
    cfg = bench_config(kind, data, out, batch, use_gpu=device != "cpu", **extra)
    cls: Any = DQNWorkflowConfig if kind == "dqn" else ParametricDQNWorkflowConfig
    wf = Workflow(kind if kind == "dqn" else "parametric_dqn", config_from_dict(cfg, cls),
                  DistContext.single(device))  # fmt: skip
    wf.setup()
    return wf


def tile(wf: Workflow, rows: int) -> None:
    """Grow the shard to `rows` by repetition (the cost curve as the table grows)."""
    data = wf.train_data.to("cpu")
    reps = -(-rows // len(data))
    big = Rows({k: v.repeat(reps, *([1] * (v.dim() - 1)))[:rows] for k, v in data.items()})
    wf.train_data = big.to(wf.device) if wf.cfg.device_resident_data else big
    wf._plan_steps()
    wf._runner = None


# ------------------------------------------------------------------------- timing
def time_ours(wf: Workflow, steps: int, epoch: int) -> float:
    """Transitions/s of `steps` steps of the workflow's own step runner (as train() runs)."""
    runner = wf.step_runner()
    torch.manual_seed(epoch)
    runner.begin_epoch(epoch)  # (first call on CUDA: captures the graph, untimed)
    warm = min(WARMUP_STEPS, wf.steps_per_epoch - 1)
    for _ in range(warm):
        runner.step()
    n = min(steps, wf.steps_per_epoch - warm)
    sync(wf.device)
    t0 = time.perf_counter()
    for _ in range(n):
        runner.step()
    sync(wf.device)
    return n * runner.step_rows / (time.perf_counter() - t0)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--kind", default="dqn", help="dqn, parametric, or dqn,parametric")
    p.add_argument("--steps", type=int, default=0, help="steps per contender per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-d3rlpy", action="store_true")
    p.add_argument("--no-cpe", action="store_true", help="skip the ours+cpe contender")
    p.add_argument("--modes", default="resident", help="resident,streamed (data placement)")
    p.add_argument("--rows", type=int, default=0, help="tile the shard to this many rows")
    p.add_argument("--data-dir", default="outputs/bench_data")
    p.add_argument("--json", default="", help="also write the results here")
    p.add_argument("--compile", action="store_true", help="add the compiled contenders (CUDA)")
    p.add_argument("--precisions", default="fp32", help="with --compile: fp32,tf32,bf16")
    p.add_argument("--no-eager", action="store_true", help="CUDA: graph contenders only")
    p.add_argument(
        "--floor",
        type=float,
        default=1.0,
        help="the floor check: ours compiled / compiled bare loop must reach this",
    )
    p.add_argument(
        "--no-floor-check",
        action="store_true",
        help="do not fail when ours compiled is below the compiled bare loop",
    )
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    steps = args.steps or (150 if args.device == "cpu" else 2000)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {dev}"
          + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")
          + f", load {os.getloadavg()}", flush=True)  # fmt: skip
    results: dict[str, list[float]] = {}
    contenders: dict[str, Callable[[int, int], float]] = {}
    tmp = tempfile.TemporaryDirectory()
    for kind in args.kind.split(","):
        data = sample_data(kind, Path(args.data_dir))
        tag = "" if kind == "dqn" else "param:"
        graphs = ([] if args.no_eager else [False]) + [True] if dev.type == "cuda" else [False]
        base: Workflow | None = None
        for mode in args.modes.split(","):
            for g in graphs:
                name = (
                    f"{tag}ours{'-graph' if g else ''}{'-streamed' if mode == 'streamed' else ''}"
                )
                wf = workflow(kind, data, Path(tmp.name) / name, args.device, args.batch,
                              cuda_graphs=g, device_resident_data=mode == "resident")  # fmt: skip
                if args.rows:
                    tile(wf, args.rows)
                where = wf.train_data.state.device
                print(f"{name}: shard {len(wf.train_data):,} rows, "
                      f"{wf.train_data.nbytes() / 2**20:,.0f} MiB on {where}", flush=True)  # fmt: skip
                contenders[name] = lambda n, e, wf=wf: time_ours(wf, n, e)
                base = base or wf
        assert base is not None
        if not args.no_cpe:
            for g in graphs:
                name = f"{tag}ours{'-graph' if g else ''}+cpe"
                wf = workflow(kind, data, Path(tmp.name) / name, args.device, args.batch,
                              cuda_graphs=g, cpe=True)  # fmt: skip
                contenders[name] = lambda n, e, wf=wf: time_ours(wf, n, e)
        resident = base.train_data.to(dev)
        if args.compile:
            cuda = dev.type == "cuda"  # a CPU has no graph: `ours-c`, `bare-c`
            for prec in args.precisions.split(","):
                name = f"{tag}ours{'-graph' if cuda else ''}-c" + (
                    "" if prec == "fp32" else f"-{prec}"
                )
                wf = workflow(kind, data, Path(tmp.name) / name, args.device, args.batch,
                              cuda_graphs=cuda, compile=True, precision=prec)  # fmt: skip
                if args.rows:
                    tile(wf, args.rows)
                contenders[name] = lambda n, e, wf=wf: time_ours(wf, n, e)
                bare = Bare(resident, args.batch, kind != "dqn", graph=cuda, compiled=True,
                            precision=prec)  # fmt: skip
                contenders[name.replace("ours", "bare")] = lambda n, e, b=bare: b.time(n)
                if prec == "fp32" and not args.no_cpe and cuda:  # CPE models compiled too
                    wf = workflow(kind, data, Path(tmp.name) / f"{name}+cpe", args.device,
                                  args.batch, cuda_graphs=True, compile=True, cpe=True)  # fmt: skip
                    contenders[f"{name}+cpe"] = lambda n, e, wf=wf: time_ours(wf, n, e)
        for g in graphs:
            bare = Bare(resident, args.batch, kind != "dqn", graph=g)
            contenders[f"{tag}bare{'-graph' if g else ''}"] = lambda n, e, b=bare: b.time(n)
        if kind == "dqn" and dev.type == "cpu":
            products = Products(args.batch)
            contenders["products"] = lambda n, e, p=products: p.time(n)
        if kind == "dqn" and not args.no_d3rlpy:
            run = d3rlpy_runner(resident, args.batch, args.device)
            if run is None:
                print("d3rlpy not installed: skipped (pip install -e '.[bench]')")
            else:
                contenders["d3rlpy"] = lambda n, e, run=run: run(max(20, n // 2))
    names = list(contenders)
    for r in range(args.rounds):
        # Each round in its own (seeded) order: whoever runs right after another pays for
        # its leftovers, so no contender may always follow the same one.
        order = random.Random(r).sample(names, len(names))
        for name in order:
            results.setdefault(name, []).append(contenders[name](steps, r + 1))
        print(f"round {r + 1}: " + ", ".join(f"{n} {results[n][-1] / 1e3:.0f}k" for n in names),
              flush=True)  # fmt: skip
    med = {n: statistics.median(results[n]) for n in names}
    print(f"\nbatch {args.batch}, {args.device}, median of {args.rounds} rounds, load "
          f"{os.getloadavg()}")  # fmt: skip
    for k, v in med.items():
        print(f"  {k:28s} {v:14,.0f} transitions/s")
    pairs = [("ours", "bare"), ("ours", "d3rlpy"), ("ours", "products"), ("products", "d3rlpy"),
             ("ours+cpe", "ours"),
             ("ours-graph", "bare-graph"), ("ours-graph+cpe", "ours-graph"),
             ("ours-graph-streamed", "ours-graph"), ("ours-streamed", "ours"),
             ("param:ours", "param:bare"), ("param:ours-graph", "param:bare-graph"),
             ("param:ours", "ours"), ("param:ours-graph", "ours-graph")]  # fmt: skip
    for tag in ("", "param:"):
        for prec in ("", "-tf32", "-bf16"):
            pairs += [(f"{tag}ours-graph-c{prec}", f"{tag}bare-graph"),
                      (f"{tag}bare-graph-c{prec}", f"{tag}bare-graph"),
                      (f"{tag}ours-graph-c{prec}", f"{tag}bare-graph-c{prec}")]  # fmt: skip
    pairs += [
        (f"param:ours-graph-c{prec}", f"ours-graph-c{prec}") for prec in ("", "-tf32", "-bf16")
    ]
    pairs += [("ours-graph-c+cpe", "ours-graph+cpe"),
              ("ours-graph-c+cpe", "ours-graph-c")]  # fmt: skip
    pairs += [(f"{tag}ours-c{prec}", f"{tag}bare-c{prec}") for tag in ("", "param:")
              for prec in ("", "-tf32", "-bf16")]  # fmt: skip
    for a, b in pairs:
        if a in med and b in med:
            # Paired: the ratio within each round (same minutes), then the median and the
            # range over rounds — steadier than a ratio of medians on a shared machine.
            per_round = [x / y for x, y in zip(results[a], results[b], strict=True)]
            print(f"  {a} / {b}: {med[a] / med[b]:.3f} (paired by round: median "
                  f"{statistics.median(per_round):.3f}, range {min(per_round):.3f}–"
                  f"{max(per_round):.3f})")  # fmt: skip
    if dev.type == "cuda":
        print(f"  peak GPU memory {torch.cuda.max_memory_allocated(dev) / 2**20:.0f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": results}, indent=1))
    tmp.cleanup()
    below = [] if args.no_floor_check else floor_failures(med, args.floor)
    for line in below:
        print(line, flush=True)
    return 1 if below else 0


# Ours compiled and the compiled bare loop of the same precision: `ours-graph-c-bf16`
# beside `bare-graph-c-bf16`, `param:ours-c` beside `param:bare-c`.
_COMPILED_OURS = re.compile(r"^(param:)?ours(-graph)?-c(-\w+)?$")


def floor_failures(medians: dict[str, float], floor: float) -> list[str]:
    """A `FLOOR CHECK FAILED` line for each compiled pair that ran where ours is below
    `floor` × the bare loop's median (none where only one of a pair ran)."""
    out = []
    for ours, value in medians.items():
        bare = ours.replace("ours", "bare", 1)
        if _COMPILED_OURS.match(ours) and bare in medians and value < floor * medians[bare]:
            out.append(
                f"FLOOR CHECK FAILED: {ours} {value:,.0f} transitions/s is below {floor:g} x "
                f"{bare} {medians[bare]:,.0f} ({value / medians[bare]:.3f}): our compiled step "
                "is slower than the compiled bare loop of the same run (--no-floor-check "
                "skips this check)"
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
