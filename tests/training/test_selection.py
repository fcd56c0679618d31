"""`ModelSelection`: which epoch's model a run exports."""

from __future__ import annotations

import pytest
import torch

from reagent_lite.training.selection import ModelSelection


def _offer(selection: ModelSelection, records: list[dict[str, object]]) -> list[float]:
    """Offers one model per record (its weight: the epoch), returns the selected weight."""
    net = torch.nn.Linear(1, 1, bias=False)
    for epoch, record in enumerate(records):
        with torch.no_grad():
            net.weight.fill_(float(epoch))
        selection.offer(epoch, record, net)
    return selection.model(net).weight.flatten().tolist()


def _cpe(dr: float | None) -> dict[str, object]:
    return {"cpe": {"doubly_robust": {"raw": dr}}}


@pytest.mark.parametrize(
    ("criterion", "records", "epoch"),
    [
        ("td_error", [{"eval_td_loss": 0.5}, {"eval_td_loss": 0.2}, {"eval_td_loss": 0.3}], 1),
        ("cpe", [_cpe(1.0), _cpe(3.0), _cpe(None), _cpe(2.0)], 1),
        ("cpe", [_cpe(None), _cpe(None)], 1),  # never an estimate: the newest model
        ("last", [{"eval_td_loss": 0.1}, {"eval_td_loss": 0.9}], 1),
        ("td_error", [{}, {}, {}], 2),  # no eval data: the newest model
    ],
)
def test_the_preferred_epoch_is_kept(
    criterion: str, records: list[dict[str, object]], epoch: int
) -> None:
    selection = ModelSelection(criterion)
    assert _offer(selection, records) == [float(epoch)]
    assert selection.epoch == epoch
    assert selection.best["state"]["weight"].device.type == "cpu"


def test_nothing_offered_exports_the_current_model() -> None:
    selection = ModelSelection("last")
    net = torch.nn.Linear(1, 1)
    model = selection.model(net)
    assert selection.epoch == -1 and not model.training and model is not net
