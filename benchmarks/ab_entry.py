"""Before/after through the real entry point, in one call: the same configs run by two (or
more) source trees, interleaved case by case, read from each run's `metrics.jsonl`.

A change that must hold the step's figures ("within 3% of the code before it") is checked
on the same machine in the same call: check the earlier commit out into a folder
(`git archive BASE | tar -x -C ab_before`) and name both trees. Each run is
`python -m workflows.<kind>_workflow --config` with `PYTHONPATH` set to that tree, so the
entry point, the loader and the step are the tree's own; the data and the configs are made
once by this tree (keys both trees know).

    python -m benchmarks.ab_entry --trees before=ab_before,after=. \\
        --cases dqn:graph:fp32:1024,dqn:compiled:bf16:1024,parametric:compiled:fp32:1024

A case is `kind:step:precision:batch`, step one of `graph` (CUDA graph, not compiled),
`compiled` (compiled and captured) or `eager`. Printed per case: each tree's median
transitions/s over the epochs after the first (which carries capture and compilation), the
ratio to the first tree, and each run's `training step:` line. `--both-orders` runs the
trees again in reverse and prints each tree's mean over both runs: on a 4-GPU host running
one A/B per GPU, the arm run second was 3% slower on three GPUs and 13-19% faster on the
fourth, whatever its code (benchmarks/RESULTS.md), so one order cannot show 3%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_train import bench_config, sample_data


def parse_case(text: str) -> tuple[str, str, str, int]:
    kind, step, precision, batch = text.split(":")
    if kind not in ("dqn", "parametric") or step not in ("graph", "compiled", "eager"):
        raise SystemExit(f"ab_entry: bad case {text!r} (kind:step:precision:batch)")
    return kind, step, precision, int(batch)


def run_case(
    tree: Path, case: tuple[str, str, str, int], data: Path, out: Path, args: argparse.Namespace
) -> dict[str, object]:
    kind, step, precision, batch = case
    workflow = "dqn" if kind == "dqn" else "parametric_dqn"
    cfg = bench_config(
        workflow,
        data,
        out,
        batch,
        use_gpu=args.device == "cuda",
        epochs=args.epochs,
        cuda_graphs=step != "eager",
        compile=step == "compiled",
        precision=precision,
        steps_per_epoch=max(args.min_steps, int(args.transitions_per_epoch // batch)),
    )
    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(cfg, indent=1))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tree.resolve()), os.environ.get("AB_SITE", "")) if p
    )
    proc = subprocess.run(
        [sys.executable, "-m", f"workflows.{workflow}_workflow", "--config", str(path)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
        check=False,
    )
    metrics = out / "metrics.jsonl"
    return measured(
        proc.returncode,
        proc.stdout + proc.stderr,
        metrics.read_text() if metrics.is_file() else "",
        args.epochs,
    )


def measured(returncode: int, log: str, metrics: str, epochs: int) -> dict[str, object]:
    """A run's figures from its exit status, its log and its `metrics.jsonl` text.

    A run that trained every epoch and then refused to export because its Q-values diverged
    (exit 5, "diverged": a tree with the divergence check) measured its steps like any other:
    the benchmark data is a random logger's, and plain Q-learning on it may diverge within
    a long enough run; the refusal comes after the last epoch, so the rates are kept, with a
    note. Any other failure is an error."""
    rates = [
        r["transitions_per_s"]
        for r in (json.loads(line) for line in metrics.splitlines() if line.strip())
        if "transitions_per_s" in r
    ]
    note = ""
    if returncode == 5 and "diverged" in log and len(rates) == epochs:
        note = " [export refused: the Q-network diverged; every epoch trained]"
    elif returncode != 0:
        return {"error": f"exit {returncode}: {log[-1500:]}"}
    line = next((ln for ln in log.splitlines() if "training step:" in ln), "")
    return {
        "median": statistics.median(rates[1:] or rates),
        "epochs": rates,
        "step": line.split("training step:")[-1].strip() + note,
    }


def both_orders_summary(label: str, names: list[str], runs: dict[str, list[float]]) -> list[str]:
    """Each tree's mean over its runs in both orders, and the ratio to the first tree's: an
    arm's place in the sequence moves both trees alike, so it cancels in the ratio."""
    means = {n: statistics.fmean(runs[n]) for n in names if runs.get(n)}
    first = means.get(names[0])
    # A tree that failed in one order has one place only: its place does not cancel.
    one = {n for n in means if len(runs[n]) < 2}
    return [
        f"{label:28s} {name:8s} {mean:14,.0f} tr/s  both orders: x{mean / first:.3f}"
        + (" (one place only: not comparable)" if one & {name, names[0]} else "")
        for name, mean in means.items()
        if first
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trees", required=True, help="name=path,name=path (first = baseline)")
    p.add_argument("--cases", required=True, help="kind:step:precision:batch,...")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--transitions-per-epoch", type=float, default=8e6)
    p.add_argument("--min-steps", type=int, default=1, help="steps per epoch at least")
    p.add_argument("--timeout", type=int, default=400)
    p.add_argument("--data-dir", default="outputs/bench_data")
    p.add_argument("--json", default="")
    p.add_argument(
        "--both-orders",
        action="store_true",
        help="run each case's trees in order, then in reverse, and compare each tree's mean "
        "of its two runs' medians: on a shared host the arm's place in the sequence alone moved it 3-19%%",
    )
    args = p.parse_args(argv)
    trees = [(n, Path(t)) for n, t in (item.split("=", 1) for item in args.trees.split(","))]
    cases = [parse_case(c) for c in args.cases.split(",")]
    results: dict[str, dict[str, object]] = {}
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            data = sample_data("dqn" if case[0] == "dqn" else "parametric", Path(args.data_dir))
            label = ":".join(map(str, case))
            base: float | None = None
            order = trees + trees[::-1] if args.both_orders else trees
            runs: dict[str, list[float]] = {}
            for place, (name, tree) in enumerate(order):
                res = run_case(
                    tree, case, data.resolve(), Path(tmp) / f"{name}_{len(results)}", args
                )
                results[f"{label} {name}" + (f" #{place + 1}" if args.both_orders else "")] = res
                if "error" in res:
                    bad += 1
                    print(f"{label:28s} {name:8s} {res['error']}", flush=True)
                    continue
                median = float(res["median"])  # type: ignore[arg-type]
                runs.setdefault(name, []).append(median)
                base = median if base is None else base
                print(
                    f"{label:28s} {name:8s} {median:14,.0f} tr/s  x{median / base:.3f}  "
                    f"epochs {[round(float(x) / 1e6, 2) for x in res['epochs']]}M  {res['step']}",  # type: ignore[union-attr]
                    flush=True,
                )
            if args.both_orders:
                for line in both_orders_summary(label, [n for n, _ in trees], runs):
                    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
