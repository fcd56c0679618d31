"""`Update.averaging_gradients`: the step a captured multi-rank graph runs leaves the
1/world size to both models' backward (`GradAverage.loss_scale`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from reagent_lite.training.update import Update
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
    q_params = list(wf.trainer.online.parameters())
    cpe_params = list(wf.cpe.plain.parameters())
    grads: dict[str, list[list[torch.Tensor]]] = {"q": [], "cpe": []}

    def grab(name: str, params: list[torch.Tensor]) -> Any:
        # In place of the optimizer step: keep the gradients, change nothing.
        return lambda: grads[name].append([p.grad.clone() for p in params])

    plain = Update(
        wf.trainer,
        wf.cpe,
        torch.zeros(()),
        precision="fp32",
        apply=grab("q", q_params),
        cpe_apply=grab("cpe", cpe_params),
    )
    two = dataclasses.replace(wf.ctx, world_size=2)
    for update in (plain, plain.averaging_gradients(two, "auto")):
        update(batches)
    for name in ("q", "cpe"):
        whole, averaged = grads[name]
        assert len(whole) == len(averaged) > 0
        for g, h in zip(whole, averaged, strict=True):
            assert g.abs().sum() > 0
            assert torch.equal(h, g * 0.5), name
