"""Where a CPU training step's time goes: every operator of real workflow steps timed.

The reference task's workflow (`bench_train`'s config: Double DQN, MLP 256×256, CartPole)
is stepped by its own runner under a `TorchDispatchMode` that times each operator call
(the mode's own overhead falls between the calls, outside the figures). The calls are
grouped into the step's parts and printed in µs per step, with the step's wall time
measured before and after without the mode: when the operators add up to the wall time,
what is left to cut is operators, not the Python between them.

    python -m benchmarks.step_ops --batch 1024 --steps 50 --runs 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.bench_train import sample_data, workflow

PARTS = (
    "large products, forward",
    "large products, weight gradient",
    "large products, input gradient",
    "narrow layers, forward",
    "narrow products, gradients",
    "ReLU, threshold backward, bias-gradient sums",
    "Adam, soft update, batch gathers",
    "other operators",
)
LARGE = 64  # every dimension of a "large" product at least this


def part_of(op: str, shapes: tuple[tuple[int, ...], ...]) -> str:
    """The step's part an operator call belongs to, from its name and argument shapes."""
    mats = [s for s in shapes if len(s) == 2]
    large = len(mats) >= 2 and min(min(s) for s in mats[:2]) >= LARGE
    if op.startswith(("mkldnn._linear_pointwise", "aten.addmm", "aten.mm")):
        if not large:
            return PARTS[3] if op.startswith(("mkldnn", "aten.addmm")) else PARTS[4]
        if op.startswith("aten.addmm") or len(shapes) == 3:
            return PARTS[0]  # x·Wᵀ + b
        rows = mats[0][0]
        return PARTS[1] if rows == mats[1][1] and rows != mats[1][0] else PARTS[2]
    if op.startswith(("aten.relu", "aten.threshold_backward")):
        return PARTS[5]
    if op.startswith("aten.sum") and mats and min(mats[0]) >= LARGE:
        return PARTS[5]
    if op.startswith(("aten._fused_adam", "aten._foreach_lerp", "aten.lerp", "aten.index_select")):
        return PARTS[6]
    return PARTS[7]


class OpTimer(TorchDispatchMode):
    """Sums each operator call's time by (operator, argument shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[tuple[str, tuple[tuple[int, ...], ...]], float] = defaultdict(float)
        self.calls: dict[tuple[str, tuple[tuple[int, ...], ...]], int] = defaultdict(int)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        key = (str(func), shapes)
        self.seconds[key] += time.perf_counter() - t0
        self.calls[key] += 1
        return out


def stepper(wf: Any) -> Callable[[], None]:
    """One training step per call, starting a new epoch whenever one runs out."""
    runner = wf.step_runner()
    state = {"epoch": 0, "left": wf.steps_per_epoch}
    runner.begin_epoch(0)

    def step() -> None:
        if state["left"] == 0:
            state["epoch"] += 1
            state["left"] = wf.steps_per_epoch
            runner.begin_epoch(state["epoch"])
        runner.step()
        state["left"] -= 1

    return step


def wall_ms(step: Callable[[], None], steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=50, help="timed steps per run")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "rl_bench")
    args = p.parse_args(argv)
    data = sample_data("dqn", args.data_dir)
    with tempfile.TemporaryDirectory() as out:
        wf = workflow("dqn", data, Path(out), "cpu", args.batch)
        step = stepper(wf)
        for _ in range(10):
            step()
        print(f"batch {args.batch}, {torch.get_num_threads()} threads, {args.steps} steps a run")
        for run in range(args.runs):
            before = wall_ms(step, args.steps)
            timer = OpTimer()
            with timer:
                for _ in range(args.steps):
                    step()
            after = wall_ms(step, args.steps)
            parts: dict[str, float] = dict.fromkeys(PARTS, 0.0)
            for key, sec in timer.seconds.items():
                parts[part_of(*key)] += sec * 1e6 / args.steps
            calls = sum(timer.calls.values()) / args.steps
            print(f"run {run + 1}: µs per step")
            for name, us in parts.items():
                print(f"  {name:46s} {us:8.0f}")
            print(f"  {'all operators (' + f'{calls:.0f} calls a step)':46s} "
                  f"{sum(parts.values()):8.0f}")  # fmt: skip
            print(f"  {'wall time without the mode, before / after':46s} "
                  f"{before * 1e3:8.0f} / {after * 1e3:.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
