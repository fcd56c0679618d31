"""`training.cql_weighting = "behavior_entropy"`: the CQL term of each row × how far the
logging policy there (BCQ's imitator, no threshold) is from uniform."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.config import DQNWorkflowConfig, ParametricDQNWorkflowConfig, load_config
from reagent_lite.errors import ConfigError
from reagent_lite.kinds import get_kind
from reagent_lite.kinds.base import DiscreteSpace
from reagent_lite.models.bcq import BCQQNetwork
from reagent_lite.trainers import DQNHyperParams, DQNTrainer
from reagent_lite.trainers.masked import behavior_certainty, masked_logsumexp
from tests.trainers.helpers import (
    constant_logits,
    discrete_batch,
    identity_q_net,
    random_discrete_batch,
)


def _trainer(net: nn.Module, **hp: object) -> DQNTrainer:
    params = DQNHyperParams(**{"gamma": 0.9, "double_q_learning": False, **hp})  # type: ignore[arg-type]
    return DQNTrainer(net, params, n_actions=2)


def _batch() -> object:
    # Q(s) = s (identity net): row 0 logs action 0 of Q [1, 2], row 1 action 1 of [0, 3].
    return discrete_batch(
        [[1.0, 2.0], [0.0, 3.0]], [0, 1], [1.0, 0.0], [[0, 0], [0, 0]], terminal=[1, 1]
    )


def _gaps() -> torch.Tensor:
    return torch.tensor(
        [math.log(math.exp(1) + math.exp(2)) - 1.0, math.log(math.exp(0) + math.exp(3)) - 3.0]
    )


def test_certainty_is_zero_for_uniform_and_one_for_one_hot() -> None:
    uniform = torch.zeros(4, 3)
    one_hot = torch.tensor([[40.0, 0.0, 0.0]] * 4)
    ones = torch.ones(4, 3)
    assert behavior_certainty(uniform, ones).abs().max().item() < 1e-6
    assert behavior_certainty(one_hot, ones).min().item() > 1 - 1e-6
    # Uniform over the *possible* actions is still 0, whatever the impossible one says;
    # a row with one possible action (no choice) gets 1, one with none too.
    logits = torch.tensor([[0.0, 0.0, 9.0], [0.0, 5.0, 1.0], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(behavior_certainty(logits, mask), torch.tensor([0.0, 1.0, 1.0]))
    # In between: 1 − H(0.9, 0.1) / log 2.
    p = torch.tensor([[0.9, 0.1]])
    h = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert behavior_certainty(p.log(), torch.ones(1, 2)).item() == pytest.approx(
        1 - h / math.log(2), abs=1e-6
    )


@pytest.mark.parametrize(
    ("probs", "weight"),
    [
        ([0.5, 0.5], 0.0),
        ([0.9, 0.1], 1 + (0.9 * math.log(0.9) + 0.1 * math.log(0.1)) / math.log(2)),
    ],
)
def test_weighted_cql_term_by_hand(probs: list[float], weight: float) -> None:
    net = BCQQNetwork(identity_q_net(), constant_logits(probs), None)
    record = _trainer(net, cql_alpha=0.5, cql_weighting="behavior_entropy").compute_loss(
        _batch()  # type: ignore[arg-type]
    )
    assert record.cql_loss.item() == pytest.approx(weight * _gaps().mean().item(), abs=1e-6)
    # The constant weighting on the same network: the full term.
    plain = _trainer(net, cql_alpha=0.5).compute_loss(_batch())  # type: ignore[arg-type]
    assert plain.cql_loss.item() == pytest.approx(_gaps().mean().item(), abs=1e-6)


def test_no_gradient_flows_through_the_weight() -> None:
    """The imitator's gradient is its cross-entropy's alone: the weight is a constant."""
    torch.manual_seed(0)
    imitator = nn.Linear(2, 2)
    net = BCQQNetwork(identity_q_net(), imitator, None)
    trainer = _trainer(net, cql_alpha=1.0, cql_weighting="behavior_entropy")
    batch = _batch()
    trainer.compute_loss(batch).total.backward()  # type: ignore[arg-type]
    got = [p.grad.clone() for p in imitator.parameters()]  # type: ignore[union-attr]
    imitator.zero_grad()
    F.cross_entropy(imitator(batch.state), batch.action).backward()  # type: ignore[attr-defined]
    for g, want in zip(got, (p.grad for p in imitator.parameters()), strict=True):
        torch.testing.assert_close(g, want)


def test_constant_weighting_keeps_the_plain_cql_bits() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
    batch = random_discrete_batch(64, 4, 3)
    batch.possible_actions_mask[::3, 2] = 0.0
    record = _trainer(net, cql_alpha=1.0).compute_loss(batch)  # type: ignore[arg-type]
    with torch.no_grad():
        q_all = net(batch.state)
        q = q_all.gather(1, batch.action.unsqueeze(1)).squeeze(1)
        want = (masked_logsumexp(q_all, batch.possible_actions_mask) - q).mean()
    assert torch.equal(record.cql_loss, want)


def test_imitator_without_threshold_drops_nothing() -> None:
    imitator = constant_logits([0.99, 0.01])
    net = BCQQNetwork(identity_q_net(), imitator, None)
    state = torch.tensor([[1.0, 5.0], [3.0, 2.0]])
    # The served Q is the Q-network's own (no action dropped, no imitator run).
    assert torch.equal(net(state), state)
    assert net.allowed(imitator(state)).all()
    # The next-state max is the plain one: action 1 (p = 0.01) still counts.
    trainer = _trainer(net, cql_alpha=1.0, cql_weighting="behavior_entropy")
    batch = discrete_batch([[0, 0]], [0], [1.0], [[1.0, 5.0]])
    torch.testing.assert_close(trainer.compute_target(batch), torch.tensor([1 + 0.9 * 5.0]))


def test_trainer_refuses_the_weighting_without_an_imitator() -> None:
    with pytest.raises(ValueError, match="BCQQNetwork"):
        _trainer(identity_q_net(), cql_alpha=1.0, cql_weighting="behavior_entropy")
    with pytest.raises(ConfigError, match=r"training\.cql_weighting.*'entropy'"):
        DQNHyperParams(cql_weighting="entropy")


def _load_error(tmp_path: Path, data: dict[str, object], cls: type) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        load_config(path, cls)
    return str(info.value)


def test_config_key_is_validated_and_builds_an_imitator(tmp_path: Path) -> None:
    base = {"training_data_path": "t.parquet", "model_output_path": "out", "actions": ["a", "b"]}
    msg = _load_error(tmp_path, {**base, "training": {"cql_weighting": "behavior_entropy"}},
                      DQNWorkflowConfig)  # fmt: skip
    assert "training.cql_weighting" in msg and "cql_alpha > 0" in msg
    msg = _load_error(tmp_path, {**base, "training": {"cql_weighting": "entropy"}},
                      DQNWorkflowConfig)  # fmt: skip
    assert "training.cql_weighting" in msg and "entropy" in msg and "behavior_entropy" in msg
    parametric = {"training_data_path": "t.parquet", "model_output_path": "out",
                  "training": {"cql_alpha": 1.0, "cql_weighting": "behavior_entropy"}}  # fmt: skip
    msg = _load_error(tmp_path, parametric, ParametricDQNWorkflowConfig)
    assert "training.cql_weighting" in msg and "parametric_dqn" in msg

    cfg = DQNWorkflowConfig.model_validate(
        {**base, "training": {"cql_alpha": 1.0, "cql_weighting": "behavior_entropy"}}
    )
    kind = get_kind("dqn")
    space = DiscreteSpace(state_ids=["1", "2", "3"], actions=["a", "b"])
    net = kind.build_policy_network(cfg, {"state": 3}, space)
    assert isinstance(net, BCQQNetwork) and net.threshold is None
    training = cfg.training.model_copy(update={"cql_weighting": "constant"})
    plain = cfg.model_copy(update={"training": training})
    assert not isinstance(kind.build_policy_network(plain, {"state": 3}, space), BCQQNetwork)


def test_dry_run_names_the_weighting() -> None:
    from reagent_lite.dry_run import hyperparameter_lines

    base = {"training_data_path": "t.parquet", "model_output_path": "out", "actions": ["a", "b"]}
    on = DQNWorkflowConfig.model_validate(
        {**base, "training": {"cql_alpha": 1.0, "cql_weighting": "behavior_entropy"}}
    )
    off = DQNWorkflowConfig.model_validate({**base, "training": {"cql_alpha": 1.0}})
    assert any("cql_alpha: 1.0 (behavior_entropy)" in line for line in
               hyperparameter_lines(on, 1, None, []))  # fmt: skip
    assert not any("behavior_entropy" in line for line in hyperparameter_lines(off, 1, None, []))
