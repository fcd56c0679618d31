"""Every speed-up beside its plain path, in one run: does each still earn its place?

For each speed-up that can run on the device given, the workflow's own step (`bench_train`'s
workflow builder and timing) with the speed-up and with its plain path, interleaved round
after round (speed-up first in odd rounds, plain first in even ones); per row the median
transitions/s of each and the ratio speed-up / plain, paired by round (its median and range)
— the figure the 5% rule of docs/DESIGN.md ("Adding a speed-up") reads. The switches are the
config's (`training.step_variants.*`, `training.step_plan.*`); each arm's `training step:`
plan is checked, so a row whose speed-up was not taken (or whose plain arm took it) is
reported as not measured, with the plan's reason. Rows that cannot run here are listed with
why.

| row | where it is used | speed-up / plain |
|---|---|---|
| keep_freed_memory | CPU, parametric step | `training.step_plan.keep_freed_memory` on / off; each arm in a fresh process every round (mallopt is process-wide and is never undone) |
| output_sum | compiled steps (CUDA; a CPU too without `--quick`) | `training.step_variants.output_sum` auto / off (dqn fp32, and parametric fp32 on CUDA) |
| pad_first_layer | compiled CUDA steps with TF32 products: parametric tf32 | `training.step_variants.pad_first_layer` on / off |
| candidate_kernel | compiled CUDA parametric fp32, tf32, bf16 | `training.step_variants.candidate_kernel` on / off |
| compile_cache | compiled CUDA dqn bf16 | `training.step_plan.compile_cache` off (the plan's auto on CUDA) / on (torch's default); one GPU, one process: the on arm compiles after the off arm, with whatever the cache holds (the slowdown it avoids was measured on 2 GPUs loading a 1-GPU entry) |

    python -m benchmarks.speedups --device cpu [--rounds 5] [--json out.json]
    python -m benchmarks.speedups --device cuda [--batch 1024] [--rows output_sum,pad_first_layer]
    python -m benchmarks.speedups --quick        # the smoke test: tiny data, CPU rows, < 1 min
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.bare_loops import WARMUP_STEPS
from benchmarks.bench_train import bench_config, sample_data, time_ours
from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig, config_from_dict
from reagent_lite.distributed.context import DistContext
from reagent_lite.training.loop import Workflow

CHILD = "SPEEDUPS_CHILD "  # the line a child process answers on
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Row:
    """One speed-up against its plain path: `kind` "dqn" / "parametric"; `training`, the
    config's `training` keys both arms share; `speed` / `plain`, each arm's own (nested
    under `training`); `plan_key`, the `training step:` plan entry that must read "on" for
    the speed-up and "off (...)" for the plain arm; `isolated`: each arm in a fresh
    process."""

    name: str
    devices: tuple[str, ...]
    plan_key: str
    kind: str = "dqn"
    training: dict[str, Any] = field(default_factory=dict)
    speed: dict[str, Any] = field(default_factory=dict)
    plain: dict[str, Any] = field(default_factory=dict)
    graph: bool = False
    isolated: bool = False
    cpu_compile: bool = False  # a compiled row on a CPU: minutes of compiling per arm
    # The plan's speed-up is switching something of torch's off (the compile cache): its
    # arm reads "off (...)", the plain arm (torch's default) "on".
    speed_is_off: bool = False


def _variants(key: str, speed: str, plain: str = "off") -> dict[str, Any]:
    return {"speed": {"step_variants": {key: speed}}, "plain": {"step_variants": {key: plain}}}


def _plan(key: str, speed: str = "on", plain: str = "off") -> dict[str, Any]:
    return {"speed": {"step_plan": {key: speed}}, "plain": {"step_plan": {key: plain}}}


COMPILED = {"compile": True}
ROWS = [
    Row("keep_freed_memory", ("cpu",), kind="parametric", isolated=True,
        plan_key="keep_freed_memory", **_plan("keep_freed_memory")),
    Row("output_sum", ("cpu",), training=COMPILED, cpu_compile=True, plan_key="output_sum",
        **_variants("output_sum", "auto")),
    Row("output_sum", ("cuda",), training=COMPILED, graph=True, plan_key="output_sum",
        **_variants("output_sum", "auto")),
    Row("output_sum", ("cuda",), kind="parametric", training=COMPILED, graph=True,
        plan_key="output_sum", **_variants("output_sum", "auto")),
    Row("pad_first_layer", ("cuda",), kind="parametric", graph=True,
        training={**COMPILED, "precision": "tf32"}, plan_key="pad_first_layer",
        **_variants("pad_first_layer", "on")),
    *(Row("candidate_kernel", ("cuda",), kind="parametric", graph=True,
          training={**COMPILED, "precision": precision}, plan_key="candidate_kernel",
          **_variants("candidate_kernel", "on"))
      for precision in ("fp32", "tf32", "bf16")),
    Row("compile_cache", ("cuda",), graph=True, training={**COMPILED, "precision": "bf16"},
        plan_key="compile_cache", speed_is_off=True, **_plan("compile_cache", "off", "on")),
]  # fmt: skip
# Why a row has no arm on a device (printed among the skipped rows).
NOT_HERE = {
    ("keep_freed_memory", "cuda"): "auto keeps it to CPU runs (a GPU step's activations "
    "live on the device)",
    ("pad_first_layer", "cpu"): "auto pads compiled CUDA steps only",
    ("candidate_kernel", "cpu"): "a Triton kernel: CUDA only",
    ("compile_cache", "cpu"): "auto leaves torch's cache on for a CPU: nothing is switched",
}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def arm_training(row: Row, arm: str) -> dict[str, Any]:
    """The `training` keys of one arm ("speed" or "plain") beyond the reference task's."""
    return _merge(row.training, row.speed if arm == "speed" else row.plain)


def build(row: Row, arm: str, data: Path, out: Path, args: argparse.Namespace) -> Workflow:
    """A real workflow of one arm, set up: `bench_train`'s reference task (its config and
    data) with the arm's `training` keys."""
    cfg = bench_config(row.kind, data, out, args.batch, use_gpu=args.device != "cpu")
    cfg["cuda_graphs"] = row.graph
    # Epochs long enough for a timed block (a pass over the table may be shorter), and
    # for the loader not to warn that a model barely trains in so few steps.
    cfg["training"]["steps_per_epoch"] = max(100, WARMUP_STEPS + args.steps + 1)
    cfg["training"] = _merge(cfg["training"], arm_training(row, arm))
    cls: Any = DQNWorkflowConfig if row.kind == "dqn" else ParametricDQNWorkflowConfig
    kind = "dqn" if row.kind == "dqn" else "parametric_dqn"
    wf = Workflow(kind, config_from_dict(cfg, cls), DistContext.single(args.device))
    wf.setup()
    return wf


def took(row: Row, wf: Workflow) -> str:
    """The choice the arm's step took, as its plan names it ("on" / "off (why)")."""
    return wf.step_runner().plan()[row.plan_key]


Timer = Callable[[int, int], float]  # (steps, round) -> transitions/s


def in_process_arm(
    row: Row, arm: str, data: Path, out: Path, args: argparse.Namespace
) -> tuple[Timer, str]:
    """An arm in this process: built and warmed up at once, so that a compiled arm compiles
    under its own process-wide settings (the compile cache) before the next is built."""
    wf = build(row, arm, data, out, args)
    time_ours(wf, 1, 0)  # capture and compilation, untimed
    return (lambda n, r: time_ours(wf, n, r)), took(row, wf)


def child_main(spec: dict[str, Any]) -> None:
    """One isolated arm in this fresh process: one timed block, answered on a `CHILD` line."""
    args = argparse.Namespace(**spec["args"])
    row = next(r for r in ROWS if label(r) == spec["row"] and args.device in r.devices)
    timer, choice = in_process_arm(row, spec["arm"], Path(spec["data"]), Path(spec["out"]), args)
    rate = timer(args.steps, spec["round"])
    print(CHILD + json.dumps({"rate": rate, "took": choice}), flush=True)


def isolated_arm(
    row: Row, data: Path, work: Path, args: argparse.Namespace, arm: str, r: int
) -> tuple[float, str]:
    """The arm in a fresh `python -m benchmarks.speedups --child` process (hard timeout),
    its run in `work`/<arm>_<round>."""
    out = work / f"{arm}_{r}"
    spec = {"row": label(row), "arm": arm, "data": str(data), "out": str(out), "round": r}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "benchmarks.speedups", "--child"]
    proc = subprocess.run(
        [*cmd, json.dumps({**spec, "args": vars(args)})],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
        check=False,
    )
    answer = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD)]
    if proc.returncode != 0 or not answer:
        raise RuntimeError(f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}")
    got = json.loads(answer[-1][len(CHILD) :])
    return float(got["rate"]), str(got["took"])


def label(row: Row) -> str:
    precision = row.training.get("precision", "fp32")
    step = "compiled" if row.training.get("compile") else "graph" if row.graph else "eager"
    return f"{row.name} [{row.kind} {step} {precision}]"


def select(args: argparse.Namespace) -> tuple[list[Row], dict[str, str]]:
    """The rows this invocation runs, and why each other one does not."""
    rows, skipped = [], {}
    here = {r.name for r in ROWS if args.device in r.devices}
    for name in dict.fromkeys(r.name for r in ROWS):
        if name not in here:
            skipped[name] = f"{args.device}: " + NOT_HERE.get((name, args.device), "")
    for row in (r for r in ROWS if args.device in r.devices):
        if args.rows and row.name not in args.rows:
            skipped[label(row)] = "not in --rows"
        elif row.cpu_compile and args.quick:
            skipped[label(row)] = "--quick: compiling a CPU step (minutes with a cold cache)"
        else:
            rows.append(row)
    return rows, skipped


Arm = Callable[[str, int], tuple[float, str]]  # (arm, round) -> (transitions/s, choice taken)


def open_rows(
    rows: list[Row], args: argparse.Namespace, work: Path, skipped: dict[str, str]
) -> dict[str, Arm]:
    """Each row's arms, ready to time (in-process ones built and warmed up)."""
    runs: dict[str, Arm] = {}
    for i, row in enumerate(rows):
        key = label(row)
        data = sample_data(row.kind, Path(args.data_dir), quick=args.quick)
        if row.isolated:
            runs[key] = functools.partial(isolated_arm, row, data, work / f"row{i}", args)
            continue
        try:
            arms = {
                arm: in_process_arm(row, arm, data, work / f"row{i}_{arm}", args)
                for arm in ("speed", "plain")
            }
        except Exception as err:  # a row that cannot be built says why; the others run
            skipped[key] = f"failed to build: {type(err).__name__}: {err}"[:300]
            continue
        runs[key] = functools.partial(_timed, arms, args.steps)
    return runs


def _timed(arms: dict[str, tuple[Timer, str]], steps: int, arm: str, r: int) -> tuple[float, str]:
    timer, choice = arms[arm]
    return timer(steps, r), choice


def measure(
    runs: dict[str, Arm], args: argparse.Namespace, skipped: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """The rounds, interleaved (the speed-up first in odd rounds, the plain path in even
    ones), and each row's medians and paired ratio; a row whose arms did not take the
    choices asked is moved to `skipped`, saying what they took."""
    rounds: dict[str, dict[str, list[float]]] = {k: {"speed": [], "plain": []} for k in runs}
    took: dict[str, dict[str, str]] = {k: {} for k in runs}
    for r in range(1, args.rounds + 1):
        order = ("speed", "plain") if r % 2 else ("plain", "speed")
        for key in list(rounds):
            try:
                for arm in order:
                    rate, took[key][arm] = runs[key](arm, r)
                    rounds[key][arm].append(rate)
            except Exception as err:  # one row's failure leaves the others running
                skipped[key] = f"failed in round {r}: {type(err).__name__}: {err}"[:300]
                del rounds[key]
        print(
            f"round {r}: "
            + ", ".join(
                f"{k} {v['speed'][-1] / 1e3:.1f}k / {v['plain'][-1] / 1e3:.1f}k"
                for k, v in rounds.items()
            ),
            flush=True,
        )
    table: dict[str, dict[str, Any]] = {}
    for key, res in rounds.items():
        speed, plain = took[key]["speed"], took[key]["plain"]
        row = next(r for r in ROWS if label(r) == key)
        wanted = ("off", "on") if row.speed_is_off else ("on", "off")
        if not (speed.startswith(wanted[0]) and plain.startswith(wanted[1])):
            skipped[key] = f"not measured: the speed-up arm took {speed!r}, the plain {plain!r}"
            continue
        ratios = [a / b for a, b in zip(res["speed"], res["plain"], strict=True)]
        table[key] = {
            "speed": statistics.median(res["speed"]),
            "plain": statistics.median(res["plain"]),
            "ratio": statistics.median(ratios),
            "range": [min(ratios), max(ratios)],
            "rounds": res,
            "took": {"speed": speed, "plain": plain},
        }
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=0, help="default 1024 (--quick: 128)")
    p.add_argument("--steps", type=int, default=0, help="timed steps per arm and round")
    p.add_argument("--rounds", type=int, default=0, help="default 5 (--quick: 2)")
    p.add_argument("--rows", default="", help="only these rows, e.g. output_sum,compile_cache")
    p.add_argument("--timeout", type=int, default=900, help="seconds per child process")
    p.add_argument("--data-dir", default="outputs/bench_data")
    p.add_argument("--json", default="", help="also write the rounds and ratios here")
    p.add_argument("--quick", action="store_true", help="tiny data and steps: a smoke test")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return 0
    args.batch = args.batch or (128 if args.quick else 1024)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.steps = args.steps or (5 if args.quick else 100 if args.device == "cpu" else 2000)
    args.rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(args.rows) - {r.name for r in ROWS})
    if unknown:
        p.error(f"--rows: unknown {unknown}; rows: {sorted({r.name for r in ROWS})}")
    # Every compiled arm compiles the same loss function anew: one Dynamo entry each.
    torch._dynamo.config.recompile_limit = 64
    dev = torch.device(args.device)
    gpu = f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {dev}{gpu}, "
        f"batch {args.batch}, {args.steps} steps x {args.rounds} rounds, "
        f"load {os.getloadavg()}",
        flush=True,
    )
    rows, skipped = select(args)
    with tempfile.TemporaryDirectory() as tmp:
        table = measure(open_rows(rows, args, Path(tmp), skipped), args, skipped)
    print(f"\n{'row':44s} {'speed-up':>12s} {'plain':>12s}  speed-up / plain, paired (range)")
    for key, t in table.items():
        print(
            f"{key:44s} {t['speed']:12,.0f} {t['plain']:12,.0f}  {t['ratio']:.3f} "
            f"({t['range'][0]:.3f}-{t['range'][1]:.3f})  plain: {t['took']['plain']}"
        )
    for key, why in skipped.items():
        print(f"skipped: {key}: {why}")
    if args.json:
        out = {"args": vars(args), "rows": table, "skipped": skipped}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
