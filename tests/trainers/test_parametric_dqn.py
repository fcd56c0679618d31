from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from reagent_lite.models import ParametricQNetwork
from reagent_lite.trainers import DQNHyperParams, ParametricDQNTrainer
from reagent_lite.trainers.masked import double_q_value
from tests.trainers.helpers import (
    action_valued_net,
    random_parametric_batch,
    set_action_scale,
    slice_batch,
    train_step,
)

GAMMA = 0.95


def _trainer(net: ParametricQNetwork | None = None, **hp: object) -> ParametricDQNTrainer:
    params = DQNHyperParams(**{"gamma": GAMMA, "double_q_learning": False, **hp})  # type: ignore[arg-type]
    return ParametricDQNTrainer(action_valued_net() if net is None else net, params)


def _tiny_batch(
    next_actions: list[list[float]], next_mask: list[list[float]], **kw: torch.Tensor
) -> Any:
    """Rows with 1-d states/actions; candidates given as scalars."""
    pna = torch.tensor(next_actions).unsqueeze(-1)
    b = pna.shape[0]
    fields = {
        "state": torch.zeros(b, 1),
        "action": torch.zeros(b, 1),
        "reward": torch.ones(b),
        "next_state": torch.zeros(b, 1),
        "next_action": pna[:, 0],
        "possible_actions": torch.zeros_like(pna),
        "possible_actions_mask": torch.ones(pna.shape[:2]),
        "possible_next_actions": pna,
        "possible_next_actions_mask": torch.tensor(next_mask),
        "time_diff": torch.ones(b),
        "terminal": torch.zeros(b),
    }
    fields.update(kw)
    return type("Batch", (), fields)()


@pytest.mark.parametrize("double_q", [False, True])
def test_constant_reward_with_varying_candidate_counts(double_q: bool) -> None:
    torch.manual_seed(0)
    net = ParametricQNetwork(4, 3, [-1, 32, 32, -1], ["relu", "relu", "linear"])
    trainer = _trainer(net, double_q_learning=double_q, target_update_rate=0.5, learning_rate=1e-2)
    for _ in range(800):
        train_step(trainer, [random_parametric_batch(64, 4, 3, 5)])
    q = net(torch.randn(256, 4), torch.randn(256, 5, 3)).detach()
    assert q.mean().item() == pytest.approx(20.0, rel=0.1)
    assert ((q - 20.0).abs() < 2.0).all()


def test_max_over_valid_next_candidates_only() -> None:
    trainer = _trainer()
    batch = _tiny_batch([[1.0, 7.0, 3.0], [2.0, 9.0, 0.0]], [[1, 0, 1], [1, 1, 0]])
    # Row 0: 7 is padding → max(1, 3) = 3; row 1: max(2, 9) = 9.
    torch.testing.assert_close(
        trainer.compute_target(batch), torch.tensor([1 + GAMMA * 3, 1 + GAMMA * 9])
    )


def test_double_q_selects_with_online_values_with_target() -> None:
    batch = _tiny_batch([[1.0, 2.0]], [[1, 1]])
    plain, double = _trainer(double_q_learning=False), _trainer(double_q_learning=True)
    for trainer in (plain, double):
        set_action_scale(trainer.target, -1.0)  # target Q = −a; online Q = a
    # Plain: max(−1, −2) = −1. Double: online picks a = 2, the target values it at −2.
    torch.testing.assert_close(plain.compute_target(batch), torch.tensor([1 + GAMMA * -1.0]))
    torch.testing.assert_close(double.compute_target(batch), torch.tensor([1 + GAMMA * -2.0]))


def test_double_q_scores_only_the_chosen_candidate_with_the_target() -> None:
    # The trainer runs the target net on the online net's choice alone; the value must be
    # what scoring every candidate with the target net and picking that one gives.
    torch.manual_seed(3)
    trainer = _trainer(
        ParametricQNetwork(4, 3, [-1, 16, 16, -1], ["relu", "relu", "linear"]),
        double_q_learning=True,
    )
    with torch.no_grad():
        for p in trainer.target.parameters():
            p.add_(torch.randn_like(p))  # a target net unlike the online one
    batch = random_parametric_batch(64, 4, 3, 6, min_candidates=0)
    assert (batch.possible_next_actions_mask.sum(1) == 0).any()  # rows with no candidate
    candidates, mask = batch.possible_next_actions, batch.possible_next_actions_mask
    with torch.no_grad():
        online = trainer.online(batch.next_state, candidates)
        every = trainer.target(batch.next_state, candidates)
        calls: list[int] = []
        handle = trainer.target.register_forward_hook(
            lambda _m, args, _out: calls.append(args[1].shape)
        )
        got = trainer._next_value(batch)
        handle.remove()
    torch.testing.assert_close(got, double_q_value(online, every, mask))
    assert calls == [(64, 3)]  # one candidate per row reached the target net


@pytest.mark.parametrize("maxq", [True, False])
def test_no_next_candidates_is_terminal(maxq: bool) -> None:
    trainer = _trainer(maxq_learning=maxq, double_q_learning=True)
    batch = _tiny_batch([[4.0, 5.0], [4.0, 5.0]], [[1, 1], [0, 0]])
    expect = torch.tensor([1 + GAMMA * (5.0 if maxq else 4.0), 1.0])
    torch.testing.assert_close(trainer.compute_target(batch), expect)


def test_sarsa_uses_logged_next_action() -> None:
    trainer = _trainer(maxq_learning=False)
    batch = _tiny_batch([[1.0, 9.0]], [[1, 1]], next_action=torch.tensor([[2.5]]))
    torch.testing.assert_close(trainer.compute_target(batch), torch.tensor([1 + GAMMA * 2.5]))


def test_time_diff_and_terminal() -> None:
    trainer = _trainer(use_seq_num_diff_as_time_diff=True)
    batch = _tiny_batch(
        [[2.0], [2.0], [2.0]],
        [[1], [1], [1]],
        time_diff=torch.tensor([1.0, 2.0, 2.0]),
        terminal=torch.tensor([0.0, 0.0, 1.0]),
    )
    expect = torch.tensor([1 + GAMMA * 2, 1 + GAMMA**2 * 2, 1.0])
    torch.testing.assert_close(trainer.compute_target(batch), expect)


def test_cql_over_current_candidate_set() -> None:
    trainer = _trainer(cql_alpha=2.0)
    batch = _tiny_batch(
        [[0.0], [0.0]],
        [[1], [1]],
        action=torch.tensor([[1.0], [0.5]]),
        possible_actions=torch.tensor([[1.0, 2.0, 8.0], [0.5, 3.0, 3.0]]).unsqueeze(-1),
        possible_actions_mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
        terminal=torch.ones(2),
    )
    # Q = a. Row 0: lse(1, 2) − 1 (8 is padding); row 1: lse(0.5) − 0.5 = 0.
    cql = (math.log(math.exp(1) + math.exp(2)) - 1.0) / 2
    td = ((1.0 - 1.0) ** 2 + (0.5 - 1.0) ** 2) / 2
    record = trainer.compute_loss(batch)
    assert record.cql_loss.item() == pytest.approx(cql, rel=1e-6)
    assert record.td_loss.item() == pytest.approx(td)
    assert record.total.item() == pytest.approx(td + 2.0 * cql, rel=1e-6)
    assert record.mean_q.item() == pytest.approx(0.75)


def test_accumulation_equals_one_big_batch() -> None:
    torch.manual_seed(1)
    net = ParametricQNetwork(3, 2, [-1, 16, -1], ["relu", "linear"])
    hp = {"optimizer": "sgd", "learning_rate": 0.05, "cql_alpha": 0.3}
    big = _trainer(copy.deepcopy(net), **hp)
    accum = _trainer(copy.deepcopy(net), minibatches_per_step=2, **hp)
    for _ in range(3):
        batch = random_parametric_batch(32, 3, 2, 4)
        train_step(big, [batch])
        train_step(accum, [slice_batch(batch, 0, 16), slice_batch(batch, 16, 32)])
    for a, b in zip(big.online.parameters(), accum.online.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_state_dict_round_trip() -> None:
    torch.manual_seed(2)
    first = _trainer(ParametricQNetwork(3, 2, [-1, 8, -1], ["relu", "linear"]))
    train_step(first, [random_parametric_batch(8, 3, 2, 3)])
    second = _trainer(ParametricQNetwork(3, 2, [-1, 8, -1], ["relu", "linear"]))
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    batch = random_parametric_batch(8, 3, 2, 3)
    train_step(first, [batch])
    train_step(second, [batch])
    for a, b in zip(first.online.parameters(), second.online.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
