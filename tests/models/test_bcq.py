"""Discrete BCQ's network: the allowed actions by hand, and the exported masked policy."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest
import torch
from torch import nn

from reagent_lite.export import export_program
from reagent_lite.kinds import DiscreteSpace, get_kind
from reagent_lite.models.bcq import BCQQNetwork
from reagent_lite.normalization.identify import fit_normalization
from reagent_lite.normalization.module import Preprocessor

LOWEST = torch.finfo(torch.float32).min


def fixed(rows: list[list[float]]) -> nn.Module:
    """A [B, 1] → [B, A] linear map whose output for state x (0, 1, 2, ...) is rows[x]:
    weight 0 and the bias of row 0 for x = 0, a slope giving the other rows."""
    table = torch.tensor(rows)
    lin = nn.Linear(1, table.shape[1])
    with torch.no_grad():
        lin.bias.copy_(table[0])
        lin.weight.copy_((table[1] - table[0]).unsqueeze(1))
    return lin


def test_actions_below_the_threshold_relative_to_the_most_likely_are_dropped() -> None:
    # Imitation probabilities: state 0 → (0.6, 0.3, 0.1); state 1 → (0.1, 0.1, 0.8).
    logp = [[math.log(0.6), math.log(0.3), math.log(0.1)], [math.log(0.1)] * 2 + [math.log(0.8)]]
    q = fixed([[1.0, 2.0, 5.0], [7.0, 3.0, 0.0]])
    net = BCQQNetwork(q, fixed(logp), threshold=0.4)
    state = torch.tensor([[0.0], [1.0]])
    # State 0: 0.3/0.6 = 0.5 ≥ 0.4 allowed, 0.1/0.6 < 0.4 dropped (its Q of 5 is not served).
    # State 1: only the most likely action (ratio 1) stays; 0.1/0.8 < 0.4.
    want = torch.tensor([[1.0, 2.0, LOWEST], [LOWEST, LOWEST, 0.0]])
    torch.testing.assert_close(net(state), want, rtol=1e-5, atol=1e-5)
    assert net(state).argmax(dim=1).tolist() == [1, 2]
    loose = BCQQNetwork(q, fixed(logp), threshold=0.1)  # 0.1/0.6 and 0.1/0.8 > 0.1: all kept
    assert loose(state).argmax(dim=1).tolist() == [2, 0]
    # Training reads the raw Q and the logits side by side.
    raw_q, logits = BCQQNetwork.split(net(state, imitation=True))
    torch.testing.assert_close(raw_q, q(state))
    torch.testing.assert_close(logits.log_softmax(1).exp()[0], torch.tensor([0.6, 0.3, 0.1]))
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\)"):
        BCQQNetwork(q, fixed(logp), threshold=1.0)


@torch.no_grad()
def test_model_pt2_and_predict_serve_the_masked_policy() -> None:
    """The exported serving module carries the imitator: `model.pt2`'s Q of a dropped
    action is the lowest float, and `predict`'s best action is never a dropped one, also
    among a row's candidates."""
    logp = [[math.log(0.6), math.log(0.3), math.log(0.1)], [math.log(0.1)] * 2 + [math.log(0.8)]]
    net = BCQQNetwork(fixed([[1.0, 2.0, 5.0], [7.0, 3.0, 0.0]]), fixed(logp), 0.4).eval()
    kind, space = get_kind("dqn"), DiscreteSpace(state_ids=["0"], actions=["a", "b", "c"])
    # An identity normalization would need a fitted one: fit on states spread over [0, 1]
    # and feed states that normalize to 0 and 1.
    norm = fit_normalization(torch.rand(200, 1).double().numpy(), ["0"])
    pre = Preprocessor(["0"], norm)
    raw = torch.linspace(-3, 3, 2001).unsqueeze(1)
    normalized = pre(raw, torch.ones_like(raw)).squeeze(1)
    pick = [int((normalized - target).abs().argmin()) for target in (0.0, 1.0)]
    states = raw[pick]
    assert pre(states, torch.ones_like(states)).squeeze(1).tolist() == pytest.approx(
        [0.0, 1.0], abs=0.01
    )
    program = export_program(kind.serving_module({"state": pre}, net), kind, space).module()
    q = program(states, torch.ones_like(states))
    assert (q == LOWEST).tolist() == [[False, False, True], [True, True, False]]
    table = pa.table({"state": pa.array(states.tolist())})
    scored = kind.score_rows(program, table, (states, torch.ones_like(states)), space, 8, "s")
    assert scored.column("best_action").to_pylist() == ["b", "c"]
    # Among candidates: row 0 without b → a (c is dropped although its raw Q is the best).
    with_candidates = table.append_column("possible_actions", pa.array([["a", "c"], ["c"]]))
    scored = kind.score_rows(
        program, with_candidates, (states, torch.ones_like(states)), space, 8, "s"
    )
    assert scored.column("best_action").to_pylist() == ["a", "c"]
