"""The training step runner: lazy gathers on CPU; on CUDA the graph-captured step (and the
host-streamed data path) equals the eager step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig, config_from_dict
from reagent_lite.distributed.context import DistContext
from reagent_lite.training import steps
from reagent_lite.training.loop import Workflow
from reagent_lite.training.steps import LazyBatch, training_columns
from reagent_lite.training.tensordict import TensorDict


def test_lazy_batch_gathers_what_index_gathers() -> None:
    g = torch.Generator().manual_seed(0)
    data = TensorDict(
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
@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_cuda_graph_step_equals_eager_step(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small chunks, so that the streamed run crosses several chunk boundaries per epoch.
    monkeypatch.setattr(steps, "DEFAULT_CHUNK_ROWS", 512)
    # TF32 off: the comparison is about the graph, not about matmul precision modes.
    torch.backends.cuda.matmul.allow_tf32 = False
    eager = _workflow(tmp_path, kind, "eager", cuda_graphs=False)
    graph = _workflow(tmp_path, kind, "graph", cuda_graphs=True)
    streamed = _workflow(tmp_path, kind, "streamed", cuda_graphs=True, device_resident_data=False)
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
