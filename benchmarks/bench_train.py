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
  floor. Ratios are printed against the fp32 `bare-graph` floor.

    python -m benchmarks.bench_train --device cpu --batch 1024
    python -m benchmarks.bench_train --device cuda --batch 8192 --no-d3rlpy
    python -m benchmarks.bench_train --kind parametric --batch 1024     # 16 candidates
    python -m benchmarks.bench_train --device cuda --rows 1000000 --modes resident,streamed
    python -m benchmarks.bench_train --device cuda --batch 65536 --rows 8000000 --no-d3rlpy \
        --no-cpe --no-eager --compile --precisions fp32,tf32,bf16
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig, config_from_dict
from reagent_lite.data.tensordict import TensorDict
from reagent_lite.distributed.context import DistContext
from reagent_lite.torch_private import foreach_lerp_
from reagent_lite.training.loop import Workflow
from reagent_lite.training.precision import step_precision

GAMMA, TAU, LR = 0.99, 0.01, 1e-3
# Untimed steps before each contender's timed block. The contenders take turns, and the
# first steps after another one ran pay for its leftovers (caches, sleeping OpenMP
# threads): ≈ 5% of the figure of whichever contender came first in a round, measured.
WARMUP_STEPS = 3


# ---------------------------------------------------------------------------- data
def sample_data(kind: str, root: Path) -> Path:
    """≈110k training transitions, generated once into `root` (seeded, so reusable)."""
    from reagent_lite.samples.generate import generate_sample_data

    out = root / ("cartpole_5000" if kind == "dqn" else "parametric_110k_k16")
    if (out / "train.parquet").exists():
        return out
    if kind == "dqn":
        generate_sample_data(
            kind="gym", env="CartPole-v1", episodes=5000, policy="random", seed=0,
            eval_fraction=0.0, output_dir=out,
        )  # fmt: skip
    else:
        generate_sample_data(
            kind="synthetic_parametric", states=110_000, episodes=110_000, min_candidates=16,
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
    big = TensorDict({k: v.repeat(reps, *([1] * (v.dim() - 1)))[:rows] for k, v in data.items()})
    wf.train_data = big.to(wf.device) if wf.cfg.device_resident_data else big
    wf._plan_steps()
    wf._runner = None


# ------------------------------------------------------------------------- timing
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


class Bare:
    """The same maths as our DQN / parametric trainer, written the way one would by hand."""

    def __init__(
        self,
        data: TensorDict,
        batch: int,
        parametric: bool,
        graph: bool,
        compiled: bool = False,
        precision: str = "fp32",
    ):
        self.device = data.state.device
        self.precision = precision
        self._loss = torch.compile(self.loss, dynamic=False) if compiled else self.loss
        self.parametric = parametric
        self.batch = batch
        keep = ["state", "action", "reward", "next_state", "terminal", "possible_next_actions_mask"]
        if parametric:
            keep.append("possible_next_actions")
        self.data = {k: data[k] for k in keep}
        d = data.state.shape[1]
        d_in = d + data.action.shape[1] if parametric else d
        out = 1 if parametric else int(data.possible_next_actions_mask.shape[1])
        self.net = nn.Sequential(
            nn.Linear(d_in, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, out)
        ).to(self.device)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        cuda = self.device.type == "cuda"
        self.opt = torch.optim.Adam(
            self.net.parameters(), lr=LR, fused=cuda or None, capturable=cuda and graph
        )
        self.n = len(data)
        self.steps = self.n // batch
        self.perm = torch.randperm(self.n, device=self.device)[: self.steps * batch]
        self.perm = self.perm.view(self.steps, batch)
        self.pos = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.k = 0
        self.loss_sum = torch.zeros((), device=self.device)
        self.graph: torch.cuda.CUDAGraph | None = None
        if graph:
            self._capture()

    def q(self, net: nn.Module, s: Tensor, a: Tensor | None = None) -> Tensor:
        if not self.parametric:
            return net(s)
        assert a is not None  # [B, K, G] candidates → [B, K]
        return net(torch.cat([s.unsqueeze(1).expand(-1, a.shape[1], -1), a], -1)).squeeze(-1)

    def loss(self, idx: Tensor) -> Tensor:
        d = self.data
        s, r, ns = d["state"][idx], d["reward"][idx], d["next_state"][idx]
        mask, done = d["possible_next_actions_mask"][idx], d["terminal"][idx]
        cands = d["possible_next_actions"][idx] if self.parametric else None
        with torch.no_grad():
            best = self.q(self.net, ns, cands).masked_fill(mask == 0, -torch.inf).argmax(1)
            v = self.q(self.target, ns, cands).gather(1, best[:, None]).squeeze(1)
            done = torch.maximum(done, (mask == 0).all(1).float())
            y = r + GAMMA * (1.0 - done) * v
        if self.parametric:
            q = self.q(self.net, s, d["action"][idx].unsqueeze(1)).squeeze(1)
        else:
            q = self.net(s).gather(1, d["action"][idx][:, None]).squeeze(1)
        return F.mse_loss(q.float(), y.float())

    def body(self, idx: Tensor) -> None:
        with self._precision():
            loss = self._loss(idx)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
        self.opt.step()
        with torch.no_grad():
            foreach_lerp_(list(self.target.parameters()), list(self.net.parameters()), TAU)
        self.loss_sum += loss.detach()

    def _precision(self) -> Any:
        """The workflow's own precision context: bf16 autocast without the cast cache (as
        in a graph), TF32 matmuls for tf32."""
        return step_precision(self.precision, torch.device("cuda"))

    def _graph_body(self) -> None:
        self.body(self.perm.index_select(0, self.pos).view(-1))
        self.pos.add_(1)

    def _capture(self) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                self._graph_body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.opt.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._graph_body()

    def step(self) -> None:
        if self.graph is not None:
            if self.k % self.steps == 0:
                self.pos.zero_()
            self.graph.replay()
        else:
            self.body(self.perm[self.k % self.steps])
        self.k += 1

    def time(self, steps: int) -> float:
        for _ in range(WARMUP_STEPS):
            self.step()
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync(self.device)
        return steps * self.batch / (time.perf_counter() - t0)


class Products:
    """The step's large products and nothing else (CPU, dqn): the three forwards' hidden
    256×256 layer (online on s and s', target on s'), its input and weight gradients, as
    torch's CPU kernels compute them. No fp32 implementation of the reference
    step beats this on the machine; `ours / products` is how close ours gets to it and
    `products / d3rlpy` the highest ratio to d3rlpy the arithmetic allows."""

    def __init__(self, batch: int, hidden: int = 256):
        g = torch.Generator().manual_seed(0)
        self.h = torch.randn(batch, hidden, generator=g).relu_()
        self.w = torch.randn(hidden, hidden, generator=g) / hidden**0.5
        self.b = torch.zeros(hidden)
        self.batch = batch

    @torch.no_grad()
    def step(self) -> None:
        h, w, b = self.h, self.w, self.b
        for _ in range(3):
            torch.addmm(b, h, w.t()).relu_()
        torch.mm(h, w)  # input gradient g·W (g: a [B, H] gradient)
        torch.mm(h.t(), h)  # weight gradient gᵀ·h

    def time(self, steps: int) -> float:
        for _ in range(WARMUP_STEPS):
            self.step()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        return steps * self.batch / (time.perf_counter() - t0)


def d3rlpy_runner(data: TensorDict, batch: int, device: str) -> Callable[[int], float] | None:
    try:
        import d3rlpy
        from d3rlpy.logging import NoopAdapterFactory
    except ImportError:
        return None
    import numpy as np

    order = torch.argsort(data.mdp_id.cpu() * (1 << 32) + data.sequence_number.cpu())
    mdp = data.mdp_id.cpu()[order].numpy()
    terminal = data.terminal.cpu()[order].numpy()
    ends = np.r_[mdp[1:] != mdp[:-1], True]
    dataset = d3rlpy.dataset.MDPDataset(
        observations=data.state.cpu()[order].numpy(),
        actions=data.action.cpu()[order].numpy().reshape(-1, 1),
        rewards=data.reward.cpu()[order].numpy().reshape(-1, 1),
        terminals=(terminal > 0).astype(np.float32),
        timeouts=(ends & (terminal == 0)).astype(np.float32),
        action_space=d3rlpy.ActionSpace.DISCRETE,
        action_size=2,
    )
    algo = d3rlpy.algos.DoubleDQNConfig(
        batch_size=batch,
        learning_rate=LR,
        gamma=GAMMA,
        target_update_interval=100,
        encoder_factory=d3rlpy.models.VectorEncoderFactory(hidden_units=[256, 256]),
    ).create(device="cuda:0" if device == "cuda" else False)
    algo.build_with_dataset(dataset)

    def run(steps: int) -> float:
        # Timed from the end of its WARMUP_STEPS-th step to the end of the last one, by
        # `fit`'s per-step callback: the steps (sampling, update, its bookkeeping), not the
        # set-up `fit` does on each call (≈ 8% of a 75-step call here).
        marks: dict[int, float] = {}

        def mark(_algo: Any, _epoch: int, total_step: int) -> None:
            marks[total_step] = time.perf_counter()

        n = WARMUP_STEPS + steps
        algo.fit(
            dataset, n_steps=n, n_steps_per_epoch=n, show_progress=False,
            logger_adapter=NoopAdapterFactory(), save_interval=10**9, callback=mark,
        )  # fmt: skip
        return steps * batch / (marks[n] - marks[WARMUP_STEPS])

    return run


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
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
        if args.compile and dev.type == "cuda":
            for prec in args.precisions.split(","):
                name = f"{tag}ours-graph-c" + ("" if prec == "fp32" else f"-{prec}")
                wf = workflow(kind, data, Path(tmp.name) / name, args.device, args.batch,
                              cuda_graphs=True, compile=True, precision=prec)  # fmt: skip
                if args.rows:
                    tile(wf, args.rows)
                contenders[name] = lambda n, e, wf=wf: time_ours(wf, n, e)
                bare = Bare(resident, args.batch, kind != "dqn", graph=True, compiled=True,
                            precision=prec)  # fmt: skip
                contenders[name.replace("ours", "bare")] = lambda n, e, b=bare: b.time(n)
                if prec == "fp32" and not args.no_cpe:  # the CPE side models compiled too
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


if __name__ == "__main__":
    sys.exit(main())
