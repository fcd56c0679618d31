"""The step factory (`training/update.py`): the step a captured multi-rank graph runs
(`averaging`, a plan input) leaves the 1/world size to both models' backward
(`GradAverage.loss_scale`), through the one `GradientStep` both models take."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.training.update import Averaging, build_update, cpe_step, q_step
from tests.training.runs import tiny_cpe_workflow


@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_averaging_step_scales_both_models_gradients_by_the_world_size(
    tmp_path: Path, kind: str
) -> None:
    """Over "two ranks" (a context without a process group, so the sum is this rank's
    buffer alone) the averaging step's gradients are exactly half the plain step's, the
    Q-network's and the CPE models' alike: the backward carries the 1/2, the sum adds."""
    wf = tiny_cpe_workflow(tmp_path, kind, "run")
    assert wf.cpe is not None
    runner = wf.step_runner()
    runner.begin_epoch(0)
    batches = runner.source.batches()
    q_params = wf.trainer.parameters()
    cpe_params = wf.cpe.parameters()
    grads: dict[str, list[list[torch.Tensor]]] = {"q": [], "cpe": []}

    def grab(name: str, params: list[torch.nn.Parameter]) -> Any:
        # In place of the optimizer step: keep the gradients, change nothing.
        return lambda: grads[name].append([p.grad.clone() for p in params])

    averaging = Averaging(dataclasses.replace(wf.ctx, world_size=2))
    for averaged in (False, True):
        q_sync = averaging.over(q_params) if averaged else None
        cpe_sync = averaging.over(cpe_params) if averaged else None
        q_step(wf.trainer, apply=grab("q", q_params), sync=q_sync)(batches)
        cpe_step(wf.cpe, wf.trainer.online, apply=grab("cpe", cpe_params), sync=cpe_sync)(
            batches[:1]
        )
    for name in ("q", "cpe"):
        whole, averaged_grads = grads[name]
        assert len(whole) == len(averaged_grads) > 0
        for g, h in zip(whole, averaged_grads, strict=True):
            assert g.abs().sum() > 0
            assert torch.equal(h, g * 0.5), name


def test_the_reduction_is_a_plan_input_of_the_factory(tmp_path: Path) -> None:
    """Without `averaging` both models forward through what DDP would wrap and their steps
    carry no scale; with it, through the plain modules, the backward carrying 1/2, the
    same `GradientStep` code path for the Q-network and the CPE models."""
    wf = tiny_cpe_workflow(tmp_path, "dqn", "run")
    assert wf.cpe is not None
    plain = build_update(wf.trainer, wf.cpe, torch.zeros(()), precision="fp32")
    two = Averaging(dataclasses.replace(wf.ctx, world_size=2))
    averaged = build_update(wf.trainer, wf.cpe, torch.zeros(()), precision="fp32", averaging=two)
    assert plain.q_sync is None and plain.cpe_sync is None and plain.cpe_step is not None
    assert plain.q_step.net is wf.trainer.q_net and plain.cpe_step.net is wf.cpe.nets
    assert averaged.q_sync is not None and averaged.cpe_sync is not None
    assert averaged.cpe_step is not None and type(averaged.cpe_step) is type(averaged.q_step)
    assert averaged.q_step.net is wf.trainer.online and averaged.cpe_step.net is wf.cpe.plain
    assert averaged.q_step.scale == averaged.cpe_step.scale == 0.5
    assert (
        averaged.q_step.reduce is averaged.q_sync and averaged.cpe_step.reduce is averaged.cpe_sync
    )


def test_a_step_left_eager_says_its_optimizer_is_as_built_for_the_graph(tmp_path: Path) -> None:
    """Capture failed (a CUDA-only event, stood in for here): the step runs eagerly with
    the optimizer the plan built for the graph, and the `training step:` line says so;
    an eager plan's line does not."""
    from reagent_lite.trainers.optim import OptimizerKernel
    from reagent_lite.training.steps import StepRunner

    wf = tiny_cpe_workflow(tmp_path, "dqn", "run")
    runner = wf.step_runner()
    assert "optimizer as built" not in runner.describe()
    graph_kernel = OptimizerKernel(fused=True, capturable=True, tensor_lr=True)
    failed = StepRunner(
        runner.source, runner.update, None, "CUDA graph capture failed: X", runner.step_plan,
        graph_kernel,
    )  # fmt: skip
    assert failed.describe().startswith(
        "training step: eager (CUDA graph capture failed: X), optimizer as built for the "
        "graph (fused Adam, capturable, lr on the device), fp32"
    )
