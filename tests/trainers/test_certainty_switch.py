"""`training.cql_weighting = "certainty_switch"`: cql_alpha on every row when the top 1% of
the batch's rows by the logger's certainty (1 − H(π̂_b) / log n from BCQ's imitator, no
threshold) reach 0.1, else no penalty: plain double DQN on uniformly random logs, full CQL
wherever some logger was sure of itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.config import DQNWorkflowConfig, load_config
from reagent_lite.errors import ConfigError
from reagent_lite.kinds import get_kind
from reagent_lite.kinds.base import DiscreteSpace
from reagent_lite.models import build_q_network
from reagent_lite.models.bcq import BCQQNetwork
from reagent_lite.trainers import DQNHyperParams, DQNTrainer
from reagent_lite.trainers.gradient_step import GradientStep
from reagent_lite.trainers.masked import (
    SWITCH_FIRST_STEPS,
    SWITCH_LEVEL,
    behavior_certainty,
    certainty_switch,
    masked_logsumexp,
)
from reagent_lite.trainers.optim import OptimizerKernel
from tests.trainers.helpers import (
    constant_logits,
    discrete_batch,
    identity_q_net,
    random_discrete_batch,
    train_step,
)


def _trainer(net: nn.Module, n_actions: int = 2, **hp: object) -> DQNTrainer:
    params = DQNHyperParams(**{"gamma": 0.9, "double_q_learning": False, **hp})  # type: ignore[arg-type]
    return DQNTrainer(net, params, n_actions=n_actions)


def _sharp_imitator() -> nn.Linear:
    """Logits 40 · s: uniform at s = (0, 0), all but one-hot at s = (1, 0)."""
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(40.0 * torch.eye(2))
        lin.bias.zero_()
    return lin


def _gaps(q_all: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    return masked_logsumexp(q_all, torch.ones_like(q_all)) - q_all.gather(
        1, action.unsqueeze(1)
    ).squeeze(1)


def test_one_sure_row_switches_the_full_penalty_on_by_hand() -> None:
    # Q(s) = s. Row 0: logger uniform (w = 0), row 1: logger all but certain (w ≈ 1): the
    # top row is sure, so both rows get the full term (per row, row 0 would get none).
    batch = discrete_batch([[0.0, 0.0], [1.0, 0.0]], [0, 1], [0.0, 0.0], [[0, 0], [0, 0]])
    net = BCQQNetwork(identity_q_net(), _sharp_imitator(), None)
    w = behavior_certainty(_sharp_imitator()(batch.state), torch.ones(2, 2))
    assert w[0].item() < 1e-6 and w[1].item() > 1 - 1e-6
    gaps = _gaps(batch.state, batch.action)
    got = _trainer(net, cql_alpha=0.5, cql_weighting="certainty_switch").compute_loss(batch)  # type: ignore[arg-type]
    assert got.cql_loss.item() == pytest.approx(gaps.mean().item(), abs=1e-6)
    per_row = _trainer(net, cql_alpha=0.5, cql_weighting="behavior_entropy").compute_loss(batch)  # type: ignore[arg-type]
    assert per_row.cql_loss.item() == pytest.approx((w * gaps).mean().item(), abs=1e-6)
    assert abs(per_row.cql_loss.item() - got.cql_loss.item()) > 0.1
    # The total carries cql_alpha × that term (plus the imitator's cross-entropy).
    ce = F.cross_entropy(_sharp_imitator()(batch.state), batch.action)
    want = got.td_loss + 0.5 * got.cql_loss + ce
    assert got.total.item() == pytest.approx(want.item(), abs=1e-5)


def test_switch_looks_at_the_top_percent_of_rows() -> None:
    level = SWITCH_LEVEL
    # 200 rows: the top 1% is the 2 largest; both must reach the level.
    low = torch.full((200,), level / 10)
    assert certainty_switch(low).item() == 0.0
    one = low.clone()
    one[7] = 0.9  # a single sure row of 200 is noise, not a region
    assert certainty_switch(one).item() == 0.0
    two = one.clone()
    two[150] = level
    assert certainty_switch(two).item() == 1.0
    assert certainty_switch(torch.tensor([level - 1e-3])).item() == 0.0
    assert certainty_switch(torch.tensor([level])).shape == ()


def test_full_penalty_bits_equal_plain_cql_when_on() -> None:
    """Switched on, the term is plain CQL's to the bit (weight 1 × gap = gap)."""
    torch.manual_seed(0)
    net = BCQQNetwork(_mlp(), _sharp3(), None)
    batch = _logged_batch(True, torch.Generator().manual_seed(3), 64)
    on = _trainer(net, n_actions=3, cql_alpha=1.0, cql_weighting="certainty_switch")
    record = on.compute_loss(batch)  # type: ignore[arg-type]
    with torch.no_grad():
        q_all = net(batch.state)  # type: ignore[attr-defined]
        want = _gaps(q_all, batch.action).mean()  # type: ignore[attr-defined]
    assert torch.equal(record.cql_loss, want)


def _sharp3() -> nn.Linear:
    """An imitator of 2-d states into 3 actions, sure of action 0 everywhere."""
    lin = nn.Linear(2, 3)
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.copy_(torch.tensor([30.0, 0.0, 0.0]))
    return lin


def _logged_batch(deterministic: bool, gen: torch.Generator, b: int = 256) -> object:
    state = torch.randn(b, 2, generator=gen)
    if deterministic:  # the logger's action is a function of the state
        action = (state[:, 0] > 0).long() + (state[:, 1] > 0).long()
    else:
        action = torch.randint(0, 3, (b,), generator=gen)
    return discrete_batch(
        state, action, torch.zeros(b), torch.randn(b, 2, generator=gen),
        mask=torch.ones(b, 3), next_mask=torch.ones(b, 3),
    )  # fmt: skip


def _mlp() -> nn.Module:
    return build_q_network(
        in_dim=2, n_actions=3, layers=[-1, 32, -1], activations=["relu", "linear"]
    )


@pytest.mark.parametrize(("deterministic", "share"), [(False, 0.0), (True, 1.0)])
def test_effective_alpha_follows_the_logger(deterministic: bool, share: float) -> None:
    """Trained through the real step on fresh logged batches: the CQL term's share of the
    unweighted one (α_eff / α) is 0 on uniform logging, 1 on a logger that always takes
    the same action in a state."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    net = BCQQNetwork(_mlp(), _mlp(), None)
    trainer = _trainer(
        net, n_actions=3, cql_alpha=1.0, cql_weighting="certainty_switch", learning_rate=1e-2
    )
    for _ in range(300):
        train_step(trainer, [_logged_batch(deterministic, gen)])
    batch = _logged_batch(deterministic, gen, 4096)
    record = trainer.compute_loss(batch)  # type: ignore[arg-type]
    with torch.no_grad():
        gaps = _gaps(net(batch.state), batch.action)  # type: ignore[attr-defined]
    assert record.cql_loss.item() / gaps.mean().item() == pytest.approx(share, abs=1e-6)


def test_no_gradient_flows_through_the_weight() -> None:
    """The imitator's gradient is its cross-entropy's alone: the batch mean is a constant."""
    torch.manual_seed(0)
    imitator = nn.Linear(2, 2)
    net = BCQQNetwork(identity_q_net(), imitator, None)
    trainer = _trainer(net, cql_alpha=1.0, cql_weighting="certainty_switch")
    batch = discrete_batch([[1.0, 2.0], [0.0, 3.0]], [0, 1], [1.0, 0.0], [[0, 0], [0, 0]])
    trainer.compute_loss(batch).total.backward()  # type: ignore[arg-type]
    got = [p.grad.clone() for p in imitator.parameters()]  # type: ignore[union-attr]
    imitator.zero_grad()
    F.cross_entropy(imitator(batch.state), batch.action).backward()
    for g, want in zip(got, (p.grad for p in imitator.parameters()), strict=True):
        torch.testing.assert_close(g, want)


def _past_first_steps(trainer: DQNTrainer) -> DQNTrainer:
    """`trainer` as a run resumed after its first steps (the public state round trip)."""
    state = trainer.state_dict()
    state["switch_first_steps"] = 0.0
    trainer.load_state_dict(state)
    return trainer


def test_uniform_imitator_turns_the_penalty_off() -> None:
    net = BCQQNetwork(identity_q_net(), constant_logits([0.5, 0.5]), None)
    batch = discrete_batch([[1.0, 2.0], [0.0, 3.0]], [0, 1], [1.0, 0.0], [[0, 0], [0, 0]])
    trainer = _trainer(net, cql_alpha=3.0, cql_weighting="certainty_switch")
    assert trainer.compute_loss(batch).cql_loss.item() > 0.1  # type: ignore[arg-type]
    record = _past_first_steps(trainer).compute_loss(batch)  # type: ignore[arg-type]
    assert abs(record.cql_loss.item()) < 1e-6


def _uniform_trainer() -> DQNTrainer:
    torch.manual_seed(0)
    uniform = nn.Linear(4, 3)
    with torch.no_grad():
        uniform.weight.zero_()
        uniform.bias.zero_()
    net = BCQQNetwork(_mlp4(), uniform, None)
    # lr 0: the imitator stays uniform, so only the count of steps decides.
    return _trainer(
        net, n_actions=3, cql_alpha=1.0, cql_weighting="certainty_switch", learning_rate=0.0
    )


def _mlp4() -> nn.Module:
    return build_q_network(
        in_dim=4, n_actions=3, layers=[-1, 16, -1], activations=["relu", "linear"]
    )


def test_the_first_steps_keep_the_full_penalty_and_a_resume_keeps_the_count() -> None:
    batch = random_discrete_batch(32, 4, 3)
    trainer = _uniform_trainer()
    cql = [train_step(trainer, [batch]).cql_loss.item() for _ in range(SWITCH_FIRST_STEPS - 50)]
    assert min(cql) > 0.1  # an untrained imitator looks uniform: not trusted yet
    resumed = _uniform_trainer()
    resumed.load_state_dict(trainer.state_dict())
    for trained in (trainer, resumed):
        rest = [train_step(trained, [batch]).cql_loss.item() for _ in range(51)]
        assert min(rest[:50]) > 0.1 and rest[50] == 0.0


def test_a_compiled_step_reads_the_count_as_it_changes() -> None:
    """The count is a tensor the compiled loss and update read and change (a captured
    CUDA graph replays the same memory), not a value baked into the trace."""
    from reagent_lite.config.models import StepVariants
    from reagent_lite.training.compiled import CompiledApply, CompiledLoss, forward_options
    from reagent_lite.training.sources import LazyBatch

    trainer = _uniform_trainer()
    trainer.build_optimizer(OptimizerKernel(foreach=True))
    fields = vars(random_discrete_batch(32, 4, 3))
    loss = CompiledLoss(trainer, forward_options(StepVariants(), torch.device("cpu"), "fp32"))
    apply = CompiledApply(trainer.optimizer, trainer.apply_update, "optimizer step")
    torch._dynamo.reset()
    step = GradientStep(loss=loss, net=trainer.online, params=trainer.parameters(), apply=apply)
    cql = [step([LazyBatch(fields, torch.arange(32))])[0].cql_loss.item() for _ in range(201)]
    assert not loss.failed and not apply.failed, (loss.failed, apply.failed)
    assert min(cql[:SWITCH_FIRST_STEPS]) > 0.1 and cql[SWITCH_FIRST_STEPS] == 0.0


def test_config_accepts_it_and_builds_an_imitator(tmp_path: Path) -> None:
    base = {"training_data_path": "t.parquet", "model_output_path": "out", "actions": ["a", "b"]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, "training": {"cql_weighting": "certainty_switch"}}))
    with pytest.raises(ConfigError) as info:
        load_config(path, DQNWorkflowConfig)
    assert "training.cql_weighting" in str(info.value) and "cql_alpha > 0" in str(info.value)
    cfg = DQNWorkflowConfig.model_validate(
        {**base, "training": {"cql_alpha": 1.0, "cql_weighting": "certainty_switch"}}
    )
    space = DiscreteSpace(state_ids=["1", "2", "3"], actions=["a", "b"])
    net = get_kind("dqn").build_policy_network(cfg, {"state": 3}, space)
    assert isinstance(net, BCQQNetwork) and net.threshold is None
    assert DQNHyperParams.from_config(cfg).cql_weighting == "certainty_switch"


def test_a_captured_steps_warm_up_leaves_the_count_where_it_was() -> None:
    """A CUDA graph's warm-up steps are undone (`graphs.WarmupSnapshot`): the count of
    full-penalty steps left too (`step_tensors`), or every capture would spend 3 of them
    and a resumed run would no longer match an uninterrupted one."""
    from reagent_lite.training.graphs import WarmupSnapshot

    trainer = _uniform_trainer()
    batch = random_discrete_batch(32, 4, 3)
    snapshot = WarmupSnapshot([trainer.online], [trainer.optimizer], trainer.step_tensors())
    for _ in range(3):  # the warm-up
        train_step(trainer, [batch])
    assert trainer.state_dict()["switch_first_steps"] == SWITCH_FIRST_STEPS - 3
    snapshot.restore()
    assert trainer.state_dict()["switch_first_steps"] == SWITCH_FIRST_STEPS
