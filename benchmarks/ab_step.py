"""A/B of the training step's code in one process: this checkout's trainer against another
checkout's (`--base DIR`), stepping the same workflow object, rounds in a seeded random
order, paired medians of the step times.

Separate processes running the same code differ by up to ±15% on a shared two-core box
(memory layout, neighbours), so a change of a few percent cannot be seen by comparing two
runs of `bench_train`; on one workflow inside one process it can. What is swapped: the
modules in `SWAPPED` (the base checkout's files loaded under other names, importing each
other), i.e. the DQN trainer class and the optimizer-step class of the workflow's trainer;
whatever else the step calls is this checkout's.

    git worktree add /tmp/base HEAD~1      # or any directory holding the other version
    python -m benchmarks.ab_step --base /tmp/base --batch 1024 --rounds 16
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from benchmarks.bench_train import sample_data, workflow
from reagent_lite.trainers import dqn, optim_step

SWAPPED = (  # dependency order: each one imports the ones before it
    "reagent_lite.trainers.optim_step",
    "reagent_lite.models.fused",
    "reagent_lite.trainers.common",
    "reagent_lite.trainers.dqn",
)


def load_base(root: Path) -> dict[str, ModuleType]:
    """The `SWAPPED` modules of the checkout at `root`, importing each other (not ours)."""
    ours = {name: sys.modules[name] for name in SWAPPED}
    loaded: dict[str, ModuleType] = {}
    try:
        for name in SWAPPED:
            path = root / (name.replace(".", "/") + ".py")
            if not path.is_file():
                raise SystemExit(f"--base: no {path} (expected a checkout of this repository)")
            spec = importlib.util.spec_from_file_location(f"base.{name}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = sys.modules[f"base.{name}"] = module
            spec.loader.exec_module(module)
            loaded[name] = module
    finally:
        sys.modules.update(ours)
    return loaded


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", required=True, type=Path, help="the other checkout's root")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=60, help="timed steps per block")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--data-dir", default="outputs/bench_data")
    args = p.parse_args(argv)
    base = load_base(args.base.resolve())
    classes: dict[str, tuple[Any, Any]] = {
        "base": (
            base["reagent_lite.trainers.dqn"].DQNTrainer,
            base["reagent_lite.trainers.optim_step"].OptimizerStep,
        ),
        "this": (dqn.DQNTrainer, optim_step.OptimizerStep),
    }
    tmp = tempfile.TemporaryDirectory()
    wf = workflow("dqn", sample_data("dqn", Path(args.data_dir)), Path(tmp.name), "cpu", args.batch)
    trainer = wf.trainer
    warm = 3
    steps = min(args.steps, wf.steps_per_epoch - warm)

    def block(name: str, epoch: int) -> float:
        """ms per step of `steps` steps with `name`'s classes (after `warm` untimed)."""
        trainer.__class__, trainer._optimizer_step.__class__ = classes[name]
        runner = wf.step_runner()
        torch.manual_seed(epoch)
        runner.begin_epoch(epoch)
        for _ in range(warm):
            runner.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            runner.step()
        return (time.perf_counter() - t0) / steps * 1e3

    times: dict[str, list[float]] = {"base": [], "this": []}
    ratios = []
    for r in range(args.rounds):
        for name in random.Random(r).sample(list(times), 2):
            times[name].append(block(name, r))
        ratios.append(times["this"][-1] / times["base"][-1])
    trainer.__class__, trainer._optimizer_step.__class__ = classes["this"]
    print(
        f"batch {args.batch}, {args.rounds} rounds of {steps} steps: base "
        f"{statistics.median(times['base']):.3f} ms/step, this "
        f"{statistics.median(times['this']):.3f} ms/step; this / base step time, paired "
        f"median {statistics.median(ratios):.3f} (range {min(ratios):.3f}–{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
