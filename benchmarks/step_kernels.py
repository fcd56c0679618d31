"""Where a GPU training step's time goes: the kernels of the workflow's own step, per step.

Builds `bench_train`'s workflows (Double DQN, MLP 256×256; dqn on CartPole, parametric on
16 candidates per state), steps each with its own runner (with `--compile` and CUDA
graphs, one graph replay a step), then records `--steps` steps under `torch.profiler` and
prints, per workflow and precision, the wall time of a step (timed without the profiler),
the kernel time of a step and its kernels by time, largest first: what to cut, kernel by
kernel, when a step is bound by the GPU.

    python -m benchmarks.step_kernels --kind dqn,parametric --precisions fp32,tf32 --compile
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_train import sample_data, workflow


def wall_us(step: object, steps: int, device: torch.device) -> float:
    """Wall time of one step (µs), the median of 3 blocks of `steps` steps."""
    times = []
    for _ in range(3):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()  # type: ignore[operator]
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return sorted(times)[1]


def kernel_table(step: object, steps: int, device: torch.device) -> dict[str, tuple[float, int]]:
    """Kernel name → (device µs per step, launches per step) over `steps` profiled steps."""
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()  # type: ignore[operator]
        torch.cuda.synchronize(device)
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            total[ev.name] += ev.device_time
            count[ev.name] += 1
    return {k: (total[k] / steps, round(count[k] / steps)) for k in total}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kind", default="dqn,parametric")
    p.add_argument("--precisions", default="fp32")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200, help="profiled (and timed) steps")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--data-dir", default="outputs/bench_data")
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}", flush=True)
    tmp = tempfile.TemporaryDirectory()
    for kind in args.kind.split(","):
        data = sample_data(kind, Path(args.data_dir))
        for prec in args.precisions.split(","):
            name = f"{kind}-{prec}"
            wf = workflow(kind, data, Path(tmp.name) / name, "cuda", args.batch, cuda_graphs=True,
                          compile=args.compile, precision=prec,
                          steps_per_epoch=5 * args.steps + 10)  # fmt: skip
            runner = wf.step_runner()
            runner.begin_epoch(1)
            n = args.steps
            for _ in range(5):
                runner.step()
            wall = wall_us(runner.step, n, dev)
            table = kernel_table(runner.step, n, dev)
            busy = sum(t for t, _ in table.values())
            launches = sum(c for _, c in table.values())
            print(f"\n== {name}: {runner.describe()}\n   wall {wall:.1f} µs/step "
                  f"({args.batch / wall:.2f}M transitions/s), kernels {busy:.1f} µs/step, "
                  f"{launches} launches/step", flush=True)  # fmt: skip
            for k, (t, c) in sorted(table.items(), key=lambda kv: -kv[1][0])[: args.top]:
                print(f"   {t:7.2f} µs  ×{c:<3d} {k[:110]}")
            runner.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
