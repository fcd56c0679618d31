"""The training step runner: lazy gathers on CPU; on CUDA the graph-captured step (and the
host-streamed data path) equals the eager step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig, config_from_dict
from reagent_lite.data.rows import Rows
from reagent_lite.distributed.context import DistContext
from reagent_lite.training import steps
from reagent_lite.training.loop import Workflow
from reagent_lite.training.sources import LazyBatch, training_columns


def test_lazy_batch_gathers_what_index_gathers() -> None:
    g = torch.Generator().manual_seed(0)
    data = Rows(
        {
            "state": torch.randn(50, 3, generator=g),
            "action": torch.randint(0, 2, (50,), generator=g),
            "mdp_id": torch.arange(50),
        }
    )
    idx = torch.randperm(50, generator=g)[:7]
    lazy, eager = LazyBatch(training_columns(data), idx), data.index(idx)
    assert torch.equal(lazy.state, eager.state)
    assert torch.equal(lazy["action"], eager.action)
    assert "mdp_id" not in lazy  # evaluation-only columns are not training inputs
    with pytest.raises(AttributeError):
        _ = lazy.mdp_id
    assert torch.equal(LazyBatch(data._tensors, slice(2, 5)).state, data.state[2:5])


def _workflow(tmp_path: Path, kind: str, name: str, **overrides: Any) -> Workflow:
    from reagent_lite.samples.generate import generate_sample_data

    data = tmp_path / f"data_{kind}"
    if not (data / "train.parquet").exists():
        if kind == "dqn":
            generate_sample_data(kind="gym", episodes=80, seed=1, output_dir=data)
        else:
            generate_sample_data(
                kind="synthetic_parametric", episodes=1500, seed=1, output_dir=data
            )
    cfg: dict[str, Any] = {
        "training_data_path": str(data / "train.parquet"),
        "model_output_path": str(tmp_path / name),
        "epochs": 3,
        "seed": 5,
        "checkpoint_every_epochs": 0,
        "training": {
            "layers": [-1, 64, 64, -1],
            "activations": ["relu", "relu", "linear"],
            "minibatch_size": 128,
            "minibatches_per_step": 2,
            "lr_decay": 0.9,
        },
        "evaluation": {"calc_cpe_in_training": True},
        **overrides,
    }
    cls: Any = DQNWorkflowConfig if kind == "dqn" else ParametricDQNWorkflowConfig
    if kind == "dqn":
        cfg["actions"] = ["0", "1"]
    wf = Workflow(kind, config_from_dict(cfg, cls), DistContext.single("cuda:0"))
    wf.setup()
    return wf


def _params(wf: Workflow) -> list[torch.Tensor]:
    nets = [wf.q_net, wf.trainer.target]
    if wf.cpe is not None:
        nets.append(wf.cpe_nets)
    return [p.detach().cpu() for net in nets for p in net.parameters()]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn", "dqn_bcq"])
def test_cuda_graph_step_equals_eager_step(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small chunks, so that the streamed run crosses several chunk boundaries per epoch.
    monkeypatch.setattr(steps, "DEFAULT_CHUNK_ROWS", 512)
    # TF32 off: the comparison is about the graph, not about matmul precision modes.
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    # dqn_bcq: BCQ's imitation network trained inside the captured step too.
    extra: dict[str, Any] = {"rainbow": {"bcq_drop_threshold": 0.3}} if kind == "dqn_bcq" else {}
    kind = kind.removesuffix("_bcq")
    eager = _workflow(tmp_path, kind, "eager", cuda_graphs=False, **extra)
    graph = _workflow(tmp_path, kind, "graph", cuda_graphs=True, **extra)
    streamed = _workflow(
        tmp_path, kind, "streamed", cuda_graphs=True, device_resident_data=False, **extra
    )
    for wf in (eager, graph, streamed):
        wf.train()
    assert eager.step_runner().mode == "eager"
    assert graph.step_runner().mode == "graph", graph.step_runner().describe()
    assert streamed.step_runner().mode == "graph", streamed.step_runner().describe()
    assert streamed.step_runner().streamed
    # Same epochs, same batches, same maths: the same parameters up to float rounding.
    for other in (graph, streamed):
        for a, b in zip(_params(eager), _params(other), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        # The per-epoch lr decay reached the graph (it reads the lr from a device tensor).
        assert [r["learning_rate"] for r in other.history] == pytest.approx(
            [r["learning_rate"] for r in eager.history]
        )
        assert [r["loss"] for r in other.history] == pytest.approx(
            [r["loss"] for r in eager.history], rel=1e-4
        )


two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)
# NVLink multicast off (the lent machines' notes); the replica check on.
_TWO_GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "REAGENT_LITE_VERIFY_REPLICAS": "1",
}


def _two_gpu_data(tmp_path: Path, kind: str) -> Path:
    from reagent_lite.samples.generate import generate_sample_data

    data = tmp_path / "data"
    if kind == "dqn":
        generate_sample_data(kind="gym", episodes=80, seed=1, output_dir=data)
    else:
        generate_sample_data(kind="synthetic_parametric", episodes=1500, seed=1, output_dir=data)
    return data


def _two_gpu_config(tmp_path: Path, data: Path, kind: str, name: str, graphs: bool) -> Path:
    """A 2-GPU run's config (`use_all_avail_gpus`, NCCL), written to `tmp_path/name.json`."""
    cfg: dict[str, Any] = {
        "training_data_path": str(data / "train.parquet"),
        "model_output_path": str(tmp_path / name),
        "use_gpu": True,
        "use_all_avail_gpus": True,
        "init_method": (tmp_path / f"rdzv_{name}").as_uri(),
        "cuda_graphs": graphs,
        "epochs": 3,
        "seed": 5,
        "checkpoint_every_epochs": 0,
        "log_every_steps": 7,
        "collective_timeout_s": 120,
        "training": {
            "layers": [-1, 64, 64, -1],
            "activations": ["relu", "relu", "linear"],
            "minibatch_size": 128,
            "minibatches_per_step": 2,
            "steps_per_epoch": 25,  # 75 steps: one heartbeat (every 64)
            "lr_decay": 0.9,
        },
        "evaluation": {"calc_cpe_in_training": True, "model_selection": "last"},
    }
    if kind == "dqn":
        cfg["actions"] = ["0", "1"]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_two_gpu_graph_step_equals_ddp_eager_step(tmp_path: Path, kind: str) -> None:
    """Two processes over NCCL: the captured step (gradients all-reduced inside the graph,
    CPE models too) trains what the eager DDP step trains, and the replicas stay equal."""
    from tests.conftest import run_module

    data = _two_gpu_data(tmp_path, kind)
    outs = {}
    for graphs in (False, True):
        name = "graph" if graphs else "eager"
        path = _two_gpu_config(tmp_path, data, kind, name, graphs)
        proc = run_module(
            f"workflows.{kind}_workflow", "--config", str(path), timeout=240, env=_TWO_GPU_ENV
        )
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-4000:]
        assert "world size 2" in text, text[-4000:]
        assert "replica check: all 2 ranks held identical parameters" in text, text[-4000:]
        want = "inside the graph over 2 ranks" if graphs else "training step: eager"
        assert want in text, text[-4000:]
        if graphs:  # the sum the graph holds is named
            assert "2 ranks: NCCL all-reduce" in text, text[-4000:]
        outs[name] = tmp_path / name
    eager = torch.load(outs["eager"] / "model_state.pt")["q_net"]
    graph = torch.load(outs["graph"] / "model_state.pt")["q_net"]
    assert eager.keys() == graph.keys()
    for key in eager:
        torch.testing.assert_close(graph[key], eager[key], rtol=1e-4, atol=1e-4)


# Fault injection for the test below, loaded by every process of the run (launcher and
# ranks) through PYTHONPATH: rank 1's first eager step before capture raises.
_FAIL_WARMUP = """
import os
import torch.distributed as dist
from reagent_lite.training import graphs

_body = graphs.GraphStep._body


def _failing_body(self):
    if self.graph is None and dist.get_rank() == 1:
        raise RuntimeError("injected fault in rank 1's step before capture")
    return _body(self)


graphs.GraphStep._body = _failing_body
"""


@pytest.mark.gpu
@two_gpus
def test_two_gpu_failure_before_capture_on_one_rank_stops_the_run(tmp_path: Path) -> None:
    """Rank 1 fails in an eager step before capture while rank 0 is inside that step's
    gradient all-reduce: rank 1 cannot fall back to eager alone (the all-reduce agreeing
    on it would pair with rank 0's), so the run stops at once with the cause — not after
    `collective_timeout_s`, and with no model written."""
    import os
    import time

    from tests.conftest import REPO_ROOT, run_module

    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_FAIL_WARMUP)
    env = dict(_TWO_GPU_ENV)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(inject), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    path = _two_gpu_config(tmp_path, _two_gpu_data(tmp_path, "dqn"), "dqn", "run", True)
    cfg = json.loads(path.read_text())
    cfg["collective_timeout_s"] = 150
    path.write_text(json.dumps(cfg))
    t0 = time.monotonic()
    proc = run_module("workflows.dqn_workflow", "--config", str(path), timeout=240, env=env)
    took = time.monotonic() - t0
    text = proc.stdout + proc.stderr
    assert proc.returncode == 5, text[-4000:]  # TrainingError
    assert "injected fault in rank 1" in text, text[-4000:]
    assert "CUDA graph warm-up failed" in text and "on rank 1 of 2" in text, text[-4000:]
    assert "cuda_graphs: false" in text, text[-4000:]
    assert took < 150, f"took {took:.0f} s: waited for the collective timeout"
    assert not (tmp_path / "run" / "model_state.pt").exists()


def _grad_sync_worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from reagent_lite.trainers.common import DQNHyperParams
    from reagent_lite.trainers.dqn import DQNTrainer
    from reagent_lite.training.update import q_step
    from tests.conftest import cpu_rank

    ctx = cpu_rank(rank)

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        g = torch.Generator().manual_seed(100 + rank)  # every rank its own rows
        n = 64
        batch = Rows(
            {
                "state": torch.randn(n, 4, generator=g),
                "next_state": torch.randn(n, 4, generator=g),
                "action": torch.randint(0, 2, (n,), generator=g),
                "next_action": torch.randint(0, 2, (n,), generator=g),
                "reward": torch.randn(n, generator=g),
                "terminal": (torch.rand(n, generator=g) < 0.1).float(),
                "time_diff": torch.ones(n),
                "possible_actions_mask": torch.ones(n, 2),
                "possible_next_actions_mask": torch.ones(n, 2),
            }
        )
        finals = []
        for variant in ("ddp", "explicit", "scaled"):
            torch.manual_seed(rank)  # different on purpose: DDP's broadcast must fix it
            net = torch.nn.Sequential(
                torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
            )
            ddp = torch.nn.parallel.DistributedDataParallel(net)
            hp = DQNHyperParams(clip_grad_norm=0.5, minibatches_per_step=2)
            trainer = DQNTrainer(ddp, hp, n_actions=2, unwrapped=net)
            # Explicit: what the captured multi-process step does.
            # the scaled variant (what `update.Averaging` builds) leaves the
            # 1/world size to the backward's seed and only sums.
            sync = (
                ctx.gradient_average(net.parameters(), scaled_backward=variant == "scaled")
                if variant != "ddp"
                else None
            )
            step = q_step(trainer, sync=sync)
            for _ in range(4):
                step([batch.index(torch.arange(0, 32)), batch.index(torch.arange(32, 64))])
            finals.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
        torch.save(finals, f"{out}/rank{rank}.pt")
        # Both ranks done with every collective before either tears the group down: gloo
        # aborts the process (std::terminate) when it is destroyed under a peer's traffic.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_explicit_grad_all_reduce_equals_ddp(tmp_path: Path) -> None:
    """The gradient averaging the multi-process CUDA graph captures (the context's
    `gradient_average` as the step's own reduction, forwards around the DDP wrapper) is
    DDP's, here over gloo."""
    import torch.multiprocessing as mp

    init = (tmp_path / "store").as_uri()
    mp.start_processes(
        _grad_sync_worker, args=(init, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    ddp, explicit, scaled = ranks[0]
    torch.testing.assert_close(explicit, ddp, rtol=1e-6, atol=1e-7)
    # Over two ranks the backward's 1/2 is exact: the same bits as dividing the sum.
    assert torch.equal(scaled, explicit)
    # Replicas identical on every path.
    assert all(torch.equal(a, b) for a, b in zip(ranks[0], ranks[1], strict=True))


def test_checkpointed_optimizer_state_resumes_without_graphs() -> None:
    """A graph run's optimizer (capturable, tensor lr) must load into a plain CPU Adam."""
    from reagent_lite.training.graphs import plain_lr

    net = torch.nn.Linear(3, 2)
    captured = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.ones(1, 3)).sum().backward()
    captured.step()
    for group in captured.param_groups:
        group["capturable"] = True
        group["lr"] = torch.tensor(5e-4)
    state = plain_lr(captured.state_dict())
    assert state["param_groups"][0]["capturable"] is False
    assert state["param_groups"][0]["lr"] == pytest.approx(5e-4)
    assert captured.param_groups[0]["capturable"] is True  # the live optimizer is untouched

    fresh_net = torch.nn.Linear(3, 2)
    fresh = torch.optim.Adam(fresh_net.parameters(), lr=1e-3)
    fresh.load_state_dict(state)
    fresh_net(torch.ones(1, 3)).sum().backward()
    fresh.step()  # raises on CPU if the state were still capturable
    assert fresh.param_groups[0]["lr"] == pytest.approx(5e-4)
