"""Throughput and peak host memory of the data placements as the table grows.

    python -m benchmarks.bench_stream --rows 1e5,1e6,1e7 --modes resident,host,disk,prepared
    python -m benchmarks.bench_stream --kind parametric --rows 1e5,1e6
    python -m benchmarks.bench_stream --rows 1e6 --row-group 8192 --modes resident,disk,prepared
    python -m benchmarks.bench_stream --rows 1e6 --row-group 8192 --device cuda --batch 8192 \
        --modes resident,prepared,units --read-ahead 1,3
    python -m benchmarks.bench_stream --rows 111506 --row-group 8192 --window 32768 --batch 512 \
        --layers 128,128 --epochs 4 --modes pair [--shape sparse] [--kind parametric]

For each table size a synthetic dqn table (CartPole-shaped: 4 dense features, 2 actions,
episodes of 20 steps, row groups of `--row-group` rows) — with `--kind parametric` a
parametric_dqn one (the same states, 4 candidate actions of 4 features each, the logged
one among them) — is written once under `--root`; each
(size, mode) then runs in a fresh process — a real `Workflow` set up from a config and
stepped by its own step runner, as `Workflow.train()` does — which reports the setup
time, transitions/s (median of the epochs, each `--steps` steps: the disk mode's window
loads included, as far as the background thread does not hide them) and its peak RSS
(`ru_maxrss`), also relative to the RSS before any data was read.

* `resident`: `device_resident_data: true` (the whole shard in memory / on the device).
* `host`: `device_resident_data: false` — on CUDA chunks of the host-resident shard are
  prefetched to the device; on the CPU this is the resident path (the host is the device).
* `disk`: `stream_from_disk: true, stream_prepare: false`, windows of `--window` rows
  decoded from the Parquet file every epoch.
* `prepared`: `stream_from_disk: true` with prepared row groups (`stream_prepare`), in a
  cache directory emptied first: a first run prepares the row groups (`prepare` row: its
  epochs include preparing, the first one most), a second run — a later run on the same
  data and config — reads them back (`prepared` row).

`--shape sparse`: the state maps are wide and sparse instead (200 feature ids, 20 present
on each row, a different set row by row). `--modes pair`: resident and prepared streaming
of the same table and config in one process, epochs interleaved (resident, streamed,
resident, ...), after a run that prepares the row groups and a warm-up epoch each; it
prints each one's best epoch and their ratio, and how many threads besides the stream's
own Python threads the streamed run started while training (OpenMP teams of loader threads: issue 41 —
they make every team stop spinning between parallel regions; the pair shares one OpenMP
runtime, so only this count, or separate `resident` / `prepared` runs, shows them).

`/resident` divides by the resident row of the same table size and round; `per CPU-s` is
transitions per CPU-second of the process (all its threads: a background window loader
costs CPU time even where it hides behind the step's wall time); `1st epoch` is the first
epoch's rate (the others' median is the main figure). `--rounds N` runs the
modes N times in turn and ends with each mode's median and its median ratio to the
resident run of the same round — on a shared machine, where the load moves between runs.

`--read-ahead 1,3` (`stream_read_ahead`; default: the config's "auto") runs each streaming
mode (`disk`, `prepare`d once, `prepared`, `units`, `pair`) once per depth in every round,
labelled `prepared (read ahead 3)` etc., the depths in turn (reversed every other round);
with one depth the output is as without it. With several, a `units` line also gives its
stream's rows/s over the same round's resident transitions/s (`/resident`: whether the
host alone could feed the GPU at the resident rate) and, with `--rounds`, a median row.
`units`' "whole window loads" seconds add up the loads' times, several at once with
read-ahead: they can exceed the epochs' wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("mdp_id", pa.int64()),
        ("sequence_number", pa.int64()),
        ("state_features", pa.map_(pa.string(), pa.float64())),
        ("action", pa.string()),
        ("reward", pa.float64()),
        ("next_state_features", pa.map_(pa.string(), pa.float64())),
        ("next_action", pa.string()),
        ("possible_actions", pa.list_(pa.string())),
        ("possible_next_actions", pa.list_(pa.string())),
        ("action_probability", pa.float64()),
        ("time_diff", pa.int64()),
    ]
)
EPISODE = 20
FEATURES = 4
CANDIDATES = 4  # parametric: candidate actions per row, of FEATURES features ("100"...)
_MAP = pa.map_(pa.string(), pa.float64())
PARAMETRIC_SCHEMA = pa.schema(
    [
        f if f.name not in ("action", "next_action", "possible_actions", "possible_next_actions")
        else pa.field(f.name, pa.list_(_MAP) if f.name.startswith("possible") else _MAP)
        for f in SCHEMA
    ]
)  # fmt: skip


def _offsets(present: np.ndarray, per_row: int) -> pa.Array:
    """List offsets: `per_row` entries on the rows where `present`, none elsewhere."""
    lengths = np.where(present, per_row, 0)
    return pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))


def _features(
    values: np.ndarray, first_id: int = 0, present: np.ndarray | None = None
) -> pa.MapArray:
    """A map column: row i maps ids first_id... to `values[i]` (an empty map where not
    `present`)."""
    present = np.ones(values.shape[0], bool) if present is None else present
    ids = pa.array([str(first_id + i) for i in range(FEATURES)])
    # From codes: numpy strings this long would come back from pa.array in chunks.
    codes = np.tile(np.arange(FEATURES, dtype=np.int32), int(present.sum()))
    keys = pa.DictionaryArray.from_arrays(codes, ids).dictionary_decode()
    items = pa.array(values[present].reshape(-1))
    return pa.MapArray.from_arrays(_offsets(present, FEATURES), keys, items)


SPARSE_IDS, SPARSE_PRESENT = 200, 20  # --shape sparse: ids of a state map, present per row


def _sparse(n: int, rng: np.random.Generator) -> pa.MapArray:
    """Row i maps SPARSE_PRESENT distinct ids of 0..SPARSE_IDS-1 (start + k * step, the
    step odd and not a multiple of 5, so coprime with 200) to normal values."""
    start = rng.integers(0, SPARSE_IDS, n)[:, None]
    step = rng.choice([1, 3, 7, 9, 11, 13, 17, 19, 21, 23], n)[:, None]
    codes = (start + np.arange(SPARSE_PRESENT) * step) % SPARSE_IDS
    ids = pa.array([str(i) for i in range(SPARSE_IDS)])
    keys = pa.DictionaryArray.from_arrays(codes.reshape(-1).astype(np.int32), ids)
    items = pa.array(rng.normal(size=n * SPARSE_PRESENT))
    offsets = pa.array(np.arange(0, n * SPARSE_PRESENT + 1, SPARSE_PRESENT, dtype=np.int32))
    return pa.MapArray.from_arrays(offsets, keys.dictionary_decode(), items)


def _parametric(table: pa.Table, rng: np.random.Generator) -> pa.Table:
    """The parametric form of a dqn batch: candidate feature vectors instead of names."""
    n = table.num_rows
    more = np.asarray(table.column("sequence_number")) != EPISODE - 1  # not terminal
    cands = rng.normal(size=(n, CANDIDATES, FEATURES))
    nxt = np.roll(cands, -1, axis=0)
    rows = np.arange(n)

    def lists(values: np.ndarray, present: np.ndarray) -> pa.ListArray:
        maps = _features(values[present].reshape(-1, FEATURES), first_id=100)
        return pa.ListArray.from_arrays(_offsets(present, CANDIDATES), maps)

    columns = {
        "action": _features(cands[rows, rng.integers(0, CANDIDATES, n)], 100),
        "next_action": _features(nxt[rows, rng.integers(0, CANDIDATES, n)], 100, more),
        "possible_actions": lists(cands, np.ones(n, bool)),
        "possible_next_actions": lists(nxt, more),
    }
    for name, col in columns.items():
        table = table.set_column(table.schema.get_field_index(name), name, col)
    return table.cast(PARAMETRIC_SCHEMA)


def _batch(start: int, n: int, rng: np.random.Generator, shape: str = "cartpole") -> pa.Table:
    i = np.arange(start, start + n)
    seq = i % EPISODE
    last = seq == EPISODE - 1
    state = rng.normal(size=(n, FEATURES))
    nxt = state + rng.normal(scale=0.1, size=(n, FEATURES))
    action = rng.integers(0, 2, n).astype(str)
    next_action = np.where(last, "", rng.integers(0, 2, n).astype(str))
    both = _lists(np.full(n, 2, np.int32))
    possible_next = _lists(np.where(last, 0, 2).astype(np.int32))
    return pa.table(
        {
            "mdp_id": pa.array(i // EPISODE),
            "sequence_number": pa.array(seq),
            "state_features": _features(state) if shape == "cartpole" else _sparse(n, rng),
            "action": pa.array(action),
            "reward": pa.array(rng.normal(size=n)),
            "next_state_features": _features(nxt) if shape == "cartpole" else _sparse(n, rng),
            "next_action": pa.array(next_action),
            "possible_actions": both,
            "possible_next_actions": possible_next,
            "action_probability": pa.array(np.full(n, 0.5)),
            "time_diff": pa.array(np.ones(n, np.int64)),
        },
        schema=SCHEMA,
    )


def _lists(lengths: np.ndarray) -> pa.ListArray:
    """A list<string> column: `lengths[i]` of ["0", "1"] (0 or 2) on row i, from offsets."""
    values = np.tile(np.array(["0", "1"]), int(lengths.sum()) // 2)
    return pa.ListArray.from_arrays(_offsets(lengths > 0, 2), pa.array(values))


def make_table(
    path: Path,
    rows: int,
    row_group: int = 65_536,
    seed: int = 0,
    kind: str = "dqn",
    shape: str = "cartpole",
) -> Path:
    """`rows` synthetic dqn (or parametric) transitions in `path`, written in pieces
    (bounded memory); `shape` "sparse": wide sparse state maps."""
    if path.exists() and pq.ParquetFile(path).metadata.num_rows == rows:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, SCHEMA if kind == "dqn" else PARAMETRIC_SCHEMA) as writer:
        # Small pieces for the bulkier parametric rows: the children inherit this process's
        # peak RSS as the start of theirs (Linux keeps ru_maxrss across fork and exec).
        piece = row_group * (16 if kind == "dqn" else 1)
        for start in range(0, rows, piece):
            batch = _batch(start, min(piece, rows - start), rng, shape)
            writer.write_table(batch if kind == "dqn" else _parametric(batch, rng), row_group)
    tmp.rename(path)
    return path


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s() -> float:
    """CPU seconds of this process, all threads (the window loaders' included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# The modes that stream from disk: run once per `--read-ahead` depth.
STREAMING = ("disk", "prepared", "units", "pair")


def _depth(value: str) -> int | str:
    """A `--read-ahead` entry as the config takes it: "auto" or a count."""
    return value if value == "auto" else int(value)


def _workflow(args: argparse.Namespace, mode: str, out: str) -> Any:
    """A real `Workflow` of `mode`, set up from a config (not yet trained)."""
    from reagent_lite.config import (
        DQNWorkflowConfig,
        ParametricDQNWorkflowConfig,
        config_from_dict,
    )
    from reagent_lite.distributed.context import DistContext
    from reagent_lite.training.loop import Workflow

    dqn = args.kind == "dqn"
    hidden = [int(w) for w in str(getattr(args, "layers", "256,256")).split(",")]
    cfg = config_from_dict(
        {
            "training_data_path": args.data,
            "model_output_path": out,
            **({"actions": ["0", "1"]} if dqn else {}),
            "use_gpu": args.device != "cpu",
            "use_all_avail_gpus": False,
            "epochs": args.epochs,
            "checkpoint_every_epochs": 0,
            "device_resident_data": mode == "resident",
            "stream_from_disk": mode in ("disk", "prepare", "prepared"),
            "stream_window_rows": args.window,
            **({"stream_read_ahead": _depth(args.read_ahead)} if args.read_ahead else {}),
            "stream_prepare": mode in ("prepare", "prepared"),
            "stream_prepared_dir": args.prepared_dir,
            "training": {
                "layers": [-1, *hidden, -1],
                "activations": ["relu"] * len(hidden) + ["linear"],
                "minibatch_size": args.batch,
                "steps_per_epoch": args.steps or None,
            },
            "evaluation": {"calc_cpe_in_training": False},
        },
        DQNWorkflowConfig if dqn else ParametricDQNWorkflowConfig,
    )
    return Workflow(cfg.workflow, cfg, DistContext.single(args.device))


def _epoch(wf: Any, runner: Any, epoch: int) -> tuple[float, float]:
    """Epoch `epoch` run by `runner`: (transitions/s, transitions per CPU-second)."""
    import torch

    runner.begin_epoch(epoch)
    t, cpu = time.perf_counter(), _cpu_s()
    for _ in range(wf.steps_per_epoch):
        runner.step()
    if wf.device.type == "cuda":
        torch.cuda.synchronize(wf.device)
    n = wf.steps_per_epoch * runner.step_rows
    return n / (time.perf_counter() - t), n / (_cpu_s() - cpu)


def child(args: argparse.Namespace) -> None:
    if args.mode == "pair":
        pair(args)
        return
    if args.mode == "units":
        from benchmarks.stream_host import host_only

        print("RESULT " + json.dumps(host_only(args, _workflow)), flush=True)
        return
    wf = _workflow(args, args.mode, args.out)
    base = _rss_mib()
    t0 = time.perf_counter()
    wf.setup()
    setup_s = time.perf_counter() - t0
    after_setup = _rss_mib()
    runner = wf.step_runner()
    rates, cpu_rates, waits = [], [], []
    for epoch in range(args.epochs):
        rate, per_cpu = _epoch(wf, runner, epoch)
        rates.append(rate)
        cpu_rates.append(per_cpu)
        waits.append(runner.source.waited)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    prepared = wf.disk.prepared if wf.disk is not None else None
    out = {
        "setup_s": setup_s,
        "transitions_per_s": statistics.median(rates[1:] or rates),
        "first_epoch_per_s": rates[0],
        "per_cpu_s": statistics.median(cpu_rates[1:] or cpu_rates),
        "units_prepared": prepared.prepared if prepared is not None else None,
        "units_reused": prepared.reused if prepared is not None else None,
        "rss_before_data_mib": base,
        "rss_after_setup_mib": after_setup,
        "peak_rss_mib": peak,
        "peak_over_base_mib": peak - base,
        "windows_loaded": wf.disk.windows_loaded if wf.disk is not None else None,
        # Seconds the step waited for rows per epoch (`data_wait_s`), and where the window
        # loads' time went (`DiskShardStream.stage_s`): where a streamed run loses time.
        "data_wait_s": statistics.median(waits[1:] or waits) if waits[0] is not None else None,
        "stage_s": dict(wf.disk.stage_s) if wf.disk is not None else None,
        "data": runner.describe(),
    }
    wf.cleanup()
    print("RESULT " + json.dumps(out), flush=True)


def _threads() -> set[int]:
    """This process's threads (Linux), Python's own left out."""
    import threading

    python = {t.native_id for t in threading.enumerate()}
    task = Path("/proc/self/task")
    return {int(t) for t in os.listdir(task)} - python if task.is_dir() else set()


def pair(args: argparse.Namespace) -> None:
    """Resident and prepared streaming of one table and config in this process, epochs
    interleaved (see the module notes)."""
    base = Path(args.out)
    # The row groups prepared (or found) by a run of their own first: reading Parquet grows
    # Arrow's thread pools, which are not the stream's and must not count below.
    prepare = _workflow(args, "prepare", str(base / "prepare"))
    prepare.setup()
    _epoch(prepare, prepare.step_runner(), 0)
    prepare.cleanup()
    resident = _workflow(args, "resident", str(base / "resident"))
    resident.setup()
    r_runner = resident.step_runner()
    _epoch(resident, r_runner, 0)  # warm-up: the resident one's first epoch
    streamed = _workflow(args, "prepared", str(base / "streamed"))
    streamed.setup()
    s_runner = streamed.step_runner()
    before = _threads()  # those set-up started (Arrow's pools...) are not the stream's
    _epoch(streamed, s_runner, 0)  # warm-up: reads the prepared row groups back
    rates: dict[str, list[float]] = {"resident": [], "streamed": []}
    for epoch in range(1, args.epochs):
        rates["resident"].append(_epoch(resident, r_runner, epoch)[0])
        rates["streamed"].append(_epoch(streamed, s_runner, epoch)[0])
    time.sleep(1.0)  # the next epoch's window, read ahead, loaded: its loader threads joined
    out = {
        "resident": rates["resident"],
        "streamed": rates["streamed"],
        "stream_threads": len(_threads() - before),
        "data": s_runner.describe(),
    }
    streamed.cleanup()
    resident.cleanup()
    print("RESULT " + json.dumps(out), flush=True)


def run_child(data: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.bench_stream", "--child", "--data", str(data)]
    cmd += ["--mode", mode, "--out", str(Path(args.root) / f"out_{mode}")]
    cmd += ["--prepared-dir", str(Path(args.root) / "prepared")]
    for k in ("device", "batch", "steps", "epochs", "window"):
        cmd += [f"--{k}", str(getattr(args, k))]
    if getattr(args, "read_ahead", None):  # one depth: the caller's round picks it
        cmd += ["--read-ahead", str(args.read_ahead)]
    cmd += ["--kind", getattr(args, "kind", "dqn"), "--layers", getattr(args, "layers", "256,256")]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=getattr(args, "timeout", 3600), env=os.environ
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise RuntimeError(f"{mode} on {data} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1e5,1e6", help="table sizes, comma-separated")
    p.add_argument("--modes", default="resident,host,disk,prepared")
    p.add_argument("--row-group", type=int, default=65_536, help="rows per Parquet row group")
    p.add_argument(
        "--rounds", type=int, default=1, help="repeat the modes, alternating (a shared box)"
    )
    p.add_argument("--kind", default="dqn", choices=["dqn", "parametric"])
    p.add_argument("--shape", default="cartpole", choices=["cartpole", "sparse"])
    p.add_argument("--layers", default="256,256", help="hidden layer widths")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200, help="steps per epoch (0: one pass)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--window", type=int, default=262_144, help="stream_window_rows")
    p.add_argument(
        "--read-ahead",
        default=None,
        help='stream_read_ahead: "auto" or counts, comma-separated, each run in turn '
        "(default: the config's default)",
    )
    p.add_argument("--root", default="/tmp/reagent_lite_bench_stream")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--prepared-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    depths: list[str | None] = [None]
    if args.read_ahead:
        depths = [d.strip() for d in args.read_ahead.split(",")]
        bad = [d for d in depths if d != "auto" and not (d.isdigit() and 1 <= int(d) <= 64)]
        if bad:
            p.error(f"--read-ahead {args.read_ahead}: {bad[0]!r} is neither \"auto\" nor a "
                    "count from 1 to 64")  # fmt: skip
    print(f"{args.kind} ({args.shape}), device {args.device}, batch {args.batch}, layers {args.layers}, "
          f"{args.steps or 'one pass of'} steps × {args.epochs} epochs, row groups of "
          f"{args.row_group:,} rows, window {args.window:,} rows, OMP_NUM_THREADS "
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    header = "| rows | mode | transitions/s | /resident | per CPU-s | 1st epoch | setup s | peak RSS MiB | peak − before data MiB |"
    print(header + "\n|---|---|---|---|---|---|---|---|---|", flush=True)
    for rows in (int(float(r)) for r in args.rows.split(",")):
        t = time.perf_counter()
        name = f"{args.kind}_{rows}" + (f"_rg{args.row_group}" if args.row_group != 65_536 else "")
        name += "_sparse" if args.shape == "sparse" else ""
        path = Path(args.root) / f"{name}.parquet"
        data = make_table(path, rows, args.row_group, kind=args.kind, shape=args.shape)
        made = time.perf_counter() - t
        if made > 1:
            print(f"(wrote {rows:,} rows in {made:.0f} s)", file=sys.stderr, flush=True)
        ratios: dict[str, list[float]] = {}
        rates: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}  # transitions per CPU-second, ratio to resident's
        for round_ in range(args.rounds):
            resident = None
            for mode in args.modes.split(","):
                order = depths if round_ % 2 == 0 else depths[::-1]  # drift cancels out
                for depth in order if mode in STREAMING else [None]:
                    sub = argparse.Namespace(**{**vars(args), "read_ahead": depth})
                    label = mode if len(depths) == 1 or depth is None else f"{mode} (read ahead {depth})"  # fmt: skip
                    if mode == "pair":
                        _pair_row(rows, run_child(data, "pair", sub), label)
                        continue
                    if mode == "units":
                        r = run_child(data, "units", sub)
                        several = len(depths) > 1  # one depth: the lines as they were
                        _units_rows(rows, r, label, resident if several else None)
                        if several:
                            label += " host rows/s"
                            rates.setdefault(label, []).append(r["rates"]["stream"])
                        if several and resident:
                            ratios.setdefault(label, []).append(
                                r["rates"]["stream"] / resident["transitions_per_s"]
                            )
                            cpu.setdefault(label, []).append(
                                r["stream_per_cpu_s"] / resident["per_cpu_s"]
                            )
                        continue
                    # A first run prepares, later ones read back.
                    if mode == "prepared" and round_ == 0 and depth == order[0]:
                        shutil.rmtree(Path(args.root) / "prepared", ignore_errors=True)
                        r = run_child(data, "prepare", sub)
                        _row(rows, label.replace("prepared", "prepare"), r, resident)
                    r = run_child(data, mode, sub)
                    resident = r if mode == "resident" else resident
                    _row(rows, label, r, resident)
                    rates.setdefault(label, []).append(r["transitions_per_s"])
                    if resident:
                        ratios.setdefault(label, []).append(
                            r["transitions_per_s"] / resident["transitions_per_s"]
                        )
                        cpu.setdefault(label, []).append(r["per_cpu_s"] / resident["per_cpu_s"])
        if args.rounds > 1:
            print(f"\nmedians over {args.rounds} rounds (ratios paired within a round):")
            print("| rows | mode | transitions/s | /resident | per CPU-s /resident |")
            print("|---|---|---|---|---|")
            for mode, got in rates.items():
                ratio = statistics.median(ratios.get(mode, [float("nan")]))
                per_cpu = statistics.median(cpu.get(mode, [float("nan")]))
                print(f"| {rows:.0e} | {mode} | {statistics.median(got):,.0f} | {ratio:.2f} | "
                      f"{per_cpu:.2f} |")  # fmt: skip


def _row(rows: int, mode: str, r: dict[str, Any], resident: dict[str, Any] | None) -> None:
    ratio = f"{r['transitions_per_s'] / resident['transitions_per_s']:.2f}" if resident else "–"
    print(f"| {rows:.0e} | {mode} | {r['transitions_per_s']:,.0f} | {ratio} | "
          f"{r['per_cpu_s']:,.0f} | {r['first_epoch_per_s']:,.0f} | {r['setup_s']:.1f} | "
          f"{r['peak_rss_mib']:,.0f} | {r['peak_over_base_mib']:,.0f} |{_units(r)}", flush=True)  # fmt: skip


def _pair_row(rows: int, r: dict[str, Any], label: str = "pair") -> None:
    """The pair mode's line: each one's epochs, best epochs and their ratio."""
    res, st = max(r["resident"], default=float("nan")), max(r["streamed"], default=float("nan"))
    each = " ".join(f"{a:,.0f}/{b:,.0f}" for a, b in zip(r["resident"], r["streamed"], strict=True))
    print(f"| {rows:.0e} | {label}: resident {res:,.0f}, prepared {st:,.0f} (best epochs) | "
          f"{st / res:.2f} | epochs resident/streamed {each} | threads the stream started "
          f"training, besides its own: {r['stream_threads']} |", flush=True)  # fmt: skip


def _units_rows(
    rows: int, r: dict[str, Any], label: str = "units", resident: dict[str, Any] | None = None
) -> None:
    """The host-only mode's lines (`benchmarks/stream_host.py`): rows/s of the stream and
    of the floors, where its time went, its host memory; with the same round's `resident`
    run, the stream's rows/s over its transitions/s."""
    rates, spent = r["rates"], r["spent_s"]
    over = ""
    if resident is not None:
        over = f" ({rates['stream'] / resident['transitions_per_s']:.2f} /resident)"
    print(f"| {rows:.0e} | {label} (host only): stream {rates['stream']:,.0f} rows/s{over}, "
          f"{r['stream_per_cpu_s']:,.0f} per CPU-s | floors: "
          f"read {rates['read']:,.0f}, sha256 {rates['sha256']:,.0f}, gather "
          f"{rates['gather']:,.0f} | stream / read {rates['stream'] / rates['read']:.2f} | "
          f"seconds in load {spent.get('load', 0):.2f}, gather {spent.get('gather', 0):.2f}, "
          f"stage {spent.get('stage', 0):.2f}; whole window loads {spent.get('window', 0):.2f} | "
          f"{r['row_bytes']:.0f} B/row, window "
          f"{r['window_mib']:.0f} MiB, staging {r['staging_mib']:.0f} MiB, RSS "
          f"{r['rss_before_stream_mib']:,.0f} → peak {r['peak_rss_mib']:,.0f} MiB |", flush=True)  # fmt: skip
    print("  epochs: " + "; ".join(f"{k} " + " ".join(f"{x:,.0f}" for x in v)
                                   for k, v in r["epochs"].items()), flush=True)  # fmt: skip


def _units(r: dict[str, Any]) -> str:
    text = ""
    if r.get("data_wait_s") is not None:
        text += f" (step waited {r['data_wait_s']:.3f} s an epoch for rows)"
    if r.get("stage_s") is not None:
        spent = ", ".join(f"{k} {v:.2f}" for k, v in r["stage_s"].items())
        text += f" (window loads, s: {spent}; {r['windows_loaded']} windows)"
    if r["units_prepared"] is not None:
        text += f" (row groups prepared {r['units_prepared']}, read back {r['units_reused']})"
    return text


if __name__ == "__main__":
    main()
