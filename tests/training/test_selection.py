"""Model selection: which epoch's model a run exports."""

from __future__ import annotations

import pytest
import torch

from reagent_lite.training.selection import offer, selected_model
from reagent_lite.training.state import Best


def _offer(criterion: str, records: list[dict[str, object]]) -> tuple[Best, list[float]]:
    """Offers one model per record (its weight: the epoch); the best and its weight."""
    net = torch.nn.Linear(1, 1, bias=False)
    best = Best()
    for epoch, record in enumerate(records):
        with torch.no_grad():
            net.weight.fill_(float(epoch))
        best = offer(criterion, best, epoch, record, net)
    return best, selected_model(net, best).weight.flatten().tolist()


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
    best, weight = _offer(criterion, records)
    assert weight == [float(epoch)]
    assert best.epoch == epoch
    assert best.state is not None and best.state["weight"].device.type == "cpu"


def test_nothing_offered_exports_the_current_model() -> None:
    net = torch.nn.Linear(1, 1)
    model = selected_model(net, Best())
    assert Best().epoch == -1 and not model.training and model is not net
