from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from reagent_lite.errors import ConfigError
from reagent_lite.models import build_q_network
from reagent_lite.models.bcq import BCQQNetwork
from reagent_lite.trainers import DQNHyperParams, DQNTrainer, reward_boost_vector
from tests.trainers.helpers import (
    Sync,
    constant_logits,
    discrete_batch,
    identity_q_net,
    random_discrete_batch,
    set_identity,
    slice_batch,
    train_step,
)

GAMMA = 0.95


def _trainer(net: nn.Module | None = None, **hp: object) -> DQNTrainer:
    params = DQNHyperParams(**{"gamma": GAMMA, "double_q_learning": False, **hp})  # type: ignore[arg-type]
    return DQNTrainer(identity_q_net() if net is None else net, params, n_actions=2)


@pytest.mark.parametrize("double_q", [False, True])
def test_constant_reward_converges_to_geometric_sum(double_q: bool) -> None:
    """ReAgent's sanity check: reward 1 forever, γ = 0.95 ⇒ Q = 1 / (1 − γ) = 20."""
    torch.manual_seed(0)
    net = build_q_network(
        in_dim=4, n_actions=2, layers=[-1, 32, 32, -1], activations=["relu", "relu", "linear"]
    )
    trainer = _trainer(net, double_q_learning=double_q, target_update_rate=0.5, learning_rate=1e-2)
    for _ in range(800):
        train_step(trainer, [random_discrete_batch(64, 4, 2)])
    q = net(torch.randn(512, 4)).detach()
    assert q.mean().item() == pytest.approx(20.0, rel=0.1)
    assert ((q - 20.0).abs() < 2.0).all()


def test_sarsa_uses_logged_next_action() -> None:
    trainer = _trainer(maxq_learning=False)
    batch = discrete_batch(
        [[0, 0], [0, 0]], [0, 0], [1.0, 2.0], [[1.0, 5.0], [3.0, 2.0]], next_action=[0, 1]
    )
    expect = torch.tensor([1.0 + GAMMA * 1.0, 2.0 + GAMMA * 2.0])
    torch.testing.assert_close(trainer.compute_target(batch), expect)
    # A missing next action (−1) contributes nothing.
    batch.next_action = torch.tensor([-1, 1])
    expect = torch.tensor([1.0, 2.0 + GAMMA * 2.0])
    torch.testing.assert_close(trainer.compute_target(batch), expect)


@pytest.mark.parametrize("double_q", [False, True])
def test_impossible_next_actions_are_masked(double_q: bool) -> None:
    trainer = _trainer(double_q_learning=double_q)
    next_state = [[1.0, 5.0], [3.0, 2.0]]
    batch = discrete_batch([[0, 0], [0, 0]], [0, 0], [1.0, 1.0], next_state)
    torch.testing.assert_close(
        trainer.compute_target(batch), torch.tensor([1 + GAMMA * 5, 1 + GAMMA * 3])
    )
    # Row 0 may only take action 0 (worth 1, not 5); row 1 has no possible action → 0.
    batch.possible_next_actions_mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(trainer.compute_target(batch), torch.tensor([1 + GAMMA * 1, 1.0]))


def test_double_q_picks_with_online_and_values_with_target() -> None:
    batch = discrete_batch([[0, 0]], [0], [0.0], [[1.0, 5.0]])
    plain, double = _trainer(double_q_learning=False), _trainer(double_q_learning=True)
    for trainer in (plain, double):
        set_identity(trainer.target, -1.0)  # target Q(s') = [-1, -5]; online = [1, 5]
    # Plain: max of target = −1. Double: online picks action 1, target values it at −5.
    torch.testing.assert_close(plain.compute_target(batch), torch.tensor([GAMMA * -1.0]))
    torch.testing.assert_close(double.compute_target(batch), torch.tensor([GAMMA * -5.0]))


@pytest.mark.parametrize("use_time_diff", [False, True])
def test_discount_by_time_diff(use_time_diff: bool) -> None:
    trainer = _trainer(use_seq_num_diff_as_time_diff=use_time_diff)
    batch = discrete_batch(
        [[0, 0], [0, 0]], [0, 0], [0.0, 0.0], [[2.0, 0.0], [2.0, 0.0]], time_diff=[1, 3]
    )
    power = torch.tensor([1.0, 3.0]) if use_time_diff else torch.ones(2)
    torch.testing.assert_close(trainer.compute_target(batch), 2.0 * GAMMA**power)


@pytest.mark.parametrize("use_time_diff", [False, True])
def test_time_diff_is_gathered_only_when_gaps_count(use_time_diff: bool) -> None:
    """A training batch gathers a column when it is read: the loss reads `time_diff` only
    when time gaps count (an unused gather is one more kernel in every step)."""
    from reagent_lite.training.sources import LazyBatch

    trainer = _trainer(use_seq_num_diff_as_time_diff=use_time_diff)
    plain = discrete_batch(
        [[0, 0], [0, 0]], [0, 0], [0.0, 0.0], [[2.0, 0.0], [2.0, 0.0]], time_diff=[1, 3]
    )
    batch = LazyBatch(dict(vars(plain)), torch.arange(2))
    trainer.compute_loss(batch)  # type: ignore[arg-type]
    assert ("time_diff" in object.__getattribute__(batch, "_cache")) == use_time_diff


def test_terminal_rows_use_only_reward() -> None:
    trainer = _trainer()
    batch = discrete_batch(
        [[0, 0], [0, 0]], [0, 0], [1.5, 2.5], [[9.0, 9.0], [9.0, 9.0]], terminal=[1, 0]
    )
    torch.testing.assert_close(trainer.compute_target(batch), torch.tensor([1.5, 2.5 + GAMMA * 9]))


@pytest.mark.parametrize(
    ("kind", "expect"), [("mse", (9.0 + 0.25) / 2), ("huber", (2.5 + 0.125) / 2)]
)
def test_td_loss_kinds(kind: str, expect: float) -> None:
    trainer = _trainer(q_network_loss=kind)
    # Terminal rows with reward 0: TD errors are the logged Q-values 3 and 0.5.
    batch = discrete_batch(
        [[3.0, 0.0], [0.0, 0.5]], [0, 1], [0.0, 0.0], [[0, 0], [0, 0]], terminal=[1, 1]
    )
    record = trainer.compute_loss(batch)
    assert record.td_loss.item() == pytest.approx(expect)
    assert record.total.item() == pytest.approx(expect)
    assert record.mean_q.item() == pytest.approx(1.75)


def test_cql_term_by_hand() -> None:
    trainer = _trainer(cql_alpha=0.5)
    batch = discrete_batch(
        [[1.0, 2.0], [0.0, 3.0]],
        [0, 0],
        [1.0, 0.0],
        [[0, 0], [0, 0]],
        mask=[[1, 1], [1, 0]],
        terminal=[1, 1],
    )
    # Row 0: logsumexp(1, 2) − 1; row 1: only action 0 is possible, logsumexp(0) − 0 = 0.
    cql = (math.log(math.exp(1) + math.exp(2)) - 1.0 + 0.0) / 2
    td = ((1.0 - 1.0) ** 2 + (0.0 - 0.0) ** 2) / 2
    record = trainer.compute_loss(batch)
    assert record.cql_loss.item() == pytest.approx(cql)
    assert record.total.item() == pytest.approx(td + 0.5 * cql)
    assert record.total.requires_grad and not record.cql_loss.requires_grad


def test_reward_boost_applied_to_logged_action() -> None:
    boost = reward_boost_vector(["left", "right"], {"right": 10.0})
    assert boost is not None
    trainer = DQNTrainer(
        identity_q_net(), DQNHyperParams(gamma=GAMMA), n_actions=2, reward_boost_vector=boost
    )
    batch = discrete_batch([[0, 0], [0, 0]], [0, 1], [1.0, 1.0], [[0, 0], [0, 0]], terminal=[1, 1])
    torch.testing.assert_close(trainer.compute_target(batch), torch.tensor([1.0, 11.0]))
    assert reward_boost_vector(["a"], {}) is None
    with pytest.raises(ConfigError, match="unknown action"):
        reward_boost_vector(["left"], {"up": 1.0})


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_accumulation_equals_one_big_batch(optimizer: str) -> None:
    torch.manual_seed(1)
    net = build_q_network(
        in_dim=3, n_actions=2, layers=[-1, 16, -1], activations=["relu", "linear"]
    )
    hp = {"optimizer": optimizer, "learning_rate": 0.05, "cql_alpha": 0.3, "clip_grad_norm": 10.0}
    big = _trainer(copy.deepcopy(net), **hp)
    accum = _trainer(copy.deepcopy(net), minibatches_per_step=2, **hp)
    for _ in range(3):
        batch = random_discrete_batch(32, 3, 2)
        rec_big = train_step(big, [batch])
        rec_acc = train_step(accum, [slice_batch(batch, 0, 16), slice_batch(batch, 16, 32)])
        torch.testing.assert_close(rec_big.total, rec_acc.total, rtol=1e-5, atol=1e-6)
    for a, b in zip(big.online.parameters(), accum.online.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    for a, b in zip(big.target.parameters(), accum.target.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_soft_target_update_is_exact() -> None:
    torch.manual_seed(2)
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["relu", "linear"])
    trainer = _trainer(net, target_update_rate=0.25, optimizer="sgd", learning_rate=0.1)
    with torch.no_grad():
        for p in trainer.target.parameters():
            p.add_(torch.randn_like(p))
    before = [p.clone() for p in trainer.target.parameters()]
    train_step(trainer, [random_discrete_batch(8, 3, 2)])
    for t_new, t_old, o in zip(trainer.target.parameters(), before, net.parameters(), strict=True):
        torch.testing.assert_close(t_new, 0.75 * t_old + 0.25 * o.detach(), rtol=0, atol=1e-6)
        assert not t_new.requires_grad


def test_soft_update_follows_parameters_replaced_by_a_state_dict_load() -> None:
    """The cached parameter lists of the soft update must see tensors that a checkpoint
    load puts in place (`assign=True` replaces the Parameter objects)."""
    torch.manual_seed(3)
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["relu", "linear"])
    trainer = _trainer(net, target_update_rate=1.0, optimizer="sgd", learning_rate=0.1)
    state = trainer.state_dict()
    state["q_net"] = {k: torch.randn_like(v) for k, v in state["q_net"].items()}
    trainer.online.load_state_dict(state["q_net"], assign=True)
    trainer.load_state_dict({**state, "q_net": trainer.online.state_dict()})
    train_step(trainer, [random_discrete_batch(8, 3, 2)])  # τ = 1: target := online
    for t, o in zip(trainer.target.parameters(), trainer.online.parameters(), strict=True):
        torch.testing.assert_close(t, o.detach())


def test_loading_an_unfused_optimizer_state_keeps_this_runs_fused_adam() -> None:
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["relu", "linear"])
    trainer = _trainer(net, optimizer="adam")
    assert trainer.optimizer.param_groups[0]["fused"]
    train_step(trainer, [random_discrete_batch(8, 3, 2)])
    state = trainer.state_dict()
    for group in state["optimizer"]["param_groups"]:
        group.update(fused=None, foreach=None)  # as written before CPU Adam was fused
    trainer.load_state_dict(state)
    assert trainer.optimizer.param_groups[0]["fused"]
    train_step(trainer, [random_discrete_batch(8, 3, 2)])


def test_clip_grad_norm_bounds_the_update() -> None:
    trainer = _trainer(optimizer="sgd", learning_rate=1.0, clip_grad_norm=0.1)
    before = [p.clone() for p in trainer.online.parameters()]
    batch = discrete_batch([[30.0, 0.0]], [0], [0.0], [[0, 0]], terminal=[1])
    train_step(trainer, [batch])
    step = torch.cat(
        [(p - b).flatten() for p, b in zip(trainer.online.parameters(), before, strict=True)]
    )
    assert step.norm().item() == pytest.approx(0.1, rel=1e-4)


def test_train_step_returns_detached_tensors_and_lr_decays() -> None:
    trainer = _trainer(lr_decay=0.5, learning_rate=0.1)
    record = train_step(trainer, [random_discrete_batch(4, 2, 2)])
    for value in (record.td_loss, record.cql_loss, record.total, record.mean_q):
        assert isinstance(value, torch.Tensor) and value.ndim == 0 and not value.requires_grad
    assert set(record.as_floats()) == {"td_loss", "cql_loss", "loss", "mean_q"}
    trainer.on_epoch_end()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_state_dict_round_trip() -> None:
    torch.manual_seed(3)

    def make() -> DQNTrainer:
        net = build_q_network(
            in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["relu", "linear"]
        )
        return _trainer(net, lr_decay=0.9, target_update_rate=0.1)

    first = make()
    for _ in range(3):
        train_step(first, [random_discrete_batch(8, 3, 2)])
    first.on_epoch_end()
    second = make()
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    batch = random_discrete_batch(8, 3, 2)
    train_step(first, [batch])
    train_step(second, [batch])
    for a, b in zip(
        first.state_dict()["q_net"].values(), second.state_dict()["q_net"].values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(first.target.parameters(), second.target.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert second.scheduler.get_last_lr() == first.scheduler.get_last_lr()


class _Wrapper(nn.Module):
    """Stands in for DDP: the real module sits under `.module`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def test_wrapped_network_keeps_unwrapped_target_and_state_dict() -> None:
    inner = identity_q_net()
    trainer = _trainer(_Wrapper(inner))
    assert trainer.online is inner
    assert type(trainer.target) is type(inner)
    assert all(not k.startswith("module.") for k in trainer.state_dict()["q_net"])
    train_step(trainer, [random_discrete_batch(4, 2, 2)])


@pytest.mark.parametrize("bcq", [False, True], ids=["dqn", "bcq"])
def test_real_ddp_with_accumulation(tmp_path: object, bcq: bool) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def ddp_step_equals_plain() -> None:
        torch.manual_seed(4)

        def mlp() -> nn.Module:
            return build_q_network(
                in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["relu", "linear"]
            )

        # BCQ: the imitator's parameters are DDP's too (one forward gives both outputs).
        net = _bcq(mlp(), mlp()) if bcq else mlp()
        plain = _trainer(copy.deepcopy(net), optimizer="sgd", learning_rate=0.1)
        ddp = _trainer(DistributedDataParallel(net), optimizer="sgd", learning_rate=0.1)
        assert ddp.online is net
        batch = random_discrete_batch(16, 3, 2)
        train_step(plain, [batch])
        train_step(ddp, [slice_batch(batch, 0, 8), slice_batch(batch, 8, 16)])
        for a, b in zip(plain.online.parameters(), net.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp_step_equals_plain()
    finally:
        # The DDP wrapper is gone before the group: a reducer left holding the group's last
        # reference destroys it under the GIL, and gloo's worker thread, finishing a work
        # item, waits for the GIL — a deadlock (seen as a rare hang at this test's end).
        dist.destroy_process_group()


class _Unusable(_Wrapper):
    """A wrapper whose forward must not run (as DDP's may talk to other ranks)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("forward through the wrapper")


def test_grad_sync_goes_around_the_wrapper_and_runs_once_before_the_step() -> None:
    torch.manual_seed(2)
    inner = build_q_network(
        in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["relu", "linear"]
    )
    plain = _trainer(copy.deepcopy(inner), clip_grad_norm=0.5, minibatches_per_step=2)
    wrapped = _trainer(_Unusable(inner), clip_grad_norm=0.5, minibatches_per_step=2)
    batch = random_discrete_batch(16, 3, 2)
    halves = [slice_batch(batch, 0, 8), slice_batch(batch, 8, 16)]
    seen: list[list[torch.Tensor]] = []

    def sync() -> None:  # sees the accumulated, not yet clipped gradients
        seen.append([p.grad.clone() for p in inner.parameters() if p.grad is not None])

    with pytest.raises(AssertionError, match="through the wrapper"):
        train_step(wrapped, halves)
    want = train_step(plain, halves)
    got = train_step(wrapped, halves, sync=Sync(sync))
    assert len(seen) == 1 and len(seen[0]) == len(list(inner.parameters()))
    torch.testing.assert_close(got.total, want.total)
    for a, b in zip(plain.online.parameters(), inner.parameters(), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("micro", [1, 2])
def test_loss_scale_multiplies_every_gradient_exactly(micro: int) -> None:
    """`loss_scale` (the 1/world size a summing all-reduce leaves to the backward) comes out
    in every gradient, bit for bit for a power of two, with or without micro-batches; the
    recorded loss is the unscaled one."""
    torch.manual_seed(4)
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["relu", "linear"])
    batch = random_discrete_batch(16, 3, 2)
    batches = [batch] if micro == 1 else [slice_batch(batch, 0, 8), slice_batch(batch, 8, 16)]
    grads, losses = [], []
    for scale in (1.0, 0.25):
        trainer = _trainer(copy.deepcopy(net), minibatches_per_step=micro)
        # A no-op sync, as a summing all-reduce over one rank: the scale is its business.
        record = train_step(trainer, batches, sync=Sync(loss_scale=scale), apply=lambda: None)
        grads.append([p.grad.clone() for p in trainer.online.parameters()])
        losses.append(record.total)
    assert torch.equal(losses[0], losses[1])
    for plain, scaled in zip(*grads, strict=True):
        assert plain.abs().sum() > 0
        assert torch.equal(scaled, plain * 0.25)


def test_eval_td_loss_uses_the_plain_module_without_gradient() -> None:
    torch.manual_seed(3)
    inner = identity_q_net()
    trainer = _trainer(_Unusable(inner))
    batch = random_discrete_batch(8, 2, 2)
    td = trainer.eval_td_loss(batch)
    assert not td.requires_grad
    torch.testing.assert_close(td, _trainer(copy.deepcopy(inner)).compute_loss(batch).td_loss)


def _bcq(q: nn.Module, imitator: nn.Module, threshold: float = 0.3) -> BCQQNetwork:
    return BCQQNetwork(q, imitator, threshold)


@pytest.mark.parametrize("double_q", [False, True])
def test_bcq_next_state_max_skips_actions_the_imitator_drops(double_q: bool) -> None:
    # Next Q = [1, 5]; the logger takes action 1 with probability 0.1 (0.1/0.9 < 0.3).
    net = _bcq(identity_q_net(), constant_logits([0.9, 0.1]))
    trainer = _trainer(net, double_q_learning=double_q)
    batch = discrete_batch([[0, 0]], [0], [1.0], [[1.0, 5.0]])
    torch.testing.assert_close(trainer.compute_target(batch), torch.tensor([1 + GAMMA * 1.0]))
    # Only action 1 possible, and it is dropped: the row is worth its reward only.
    batch.possible_next_actions_mask = torch.tensor([[0.0, 1.0]])
    torch.testing.assert_close(trainer.compute_target(batch), torch.tensor([1.0]))
    # A looser threshold keeps action 1: the plain max again.
    loose = _trainer(_bcq(identity_q_net(), constant_logits([0.9, 0.1]), 0.05))
    batch.possible_next_actions_mask = torch.ones(1, 2)
    torch.testing.assert_close(loose.compute_target(batch), torch.tensor([1 + GAMMA * 5.0]))
    # SARSA values the logged next action as it is, dropped or not.
    sarsa = _trainer(_bcq(identity_q_net(), constant_logits([0.9, 0.1])), maxq_learning=False)
    batch.next_action = torch.tensor([1])
    torch.testing.assert_close(sarsa.compute_target(batch), torch.tensor([1 + GAMMA * 5.0]))


def test_bcq_trains_the_imitator_in_the_same_step_and_serves_the_logged_behaviour() -> None:
    """The logger plays action (state₀ > 0); with the imitation loss in the step the
    imitator learns it, and the served policy (forward's argmax) keeps to it even though
    Q alone would prefer the other action everywhere (reward 1 for action 1 only)."""
    torch.manual_seed(0)

    def net() -> nn.Module:
        return build_q_network(in_dim=4, n_actions=2, layers=[-1, 32, -1],
                               activations=["relu", "linear"])  # fmt: skip

    bcq = _bcq(net(), net(), 0.3)
    trainer = _trainer(bcq, learning_rate=1e-2, target_update_rate=0.1)
    for _ in range(300):
        batch = random_discrete_batch(128, 4, 2)
        batch.action = (batch.state[:, 0] > 0).long()
        batch.reward = batch.action.float()
        batch.terminal = torch.ones(128)
        train_step(trainer, [batch])
    state = torch.randn(2000, 4)
    behaviour = (state[:, 0] > 0).long()
    with torch.no_grad():
        q, logits = BCQQNetwork.split(bcq(state, imitation=True))
        served = bcq(state).argmax(dim=1)
    assert (logits.argmax(dim=1) == behaviour).float().mean() > 0.95
    assert (q.argmax(dim=1) == 1).float().mean() > 0.95  # Q alone: always action 1
    assert (served == behaviour).float().mean() > 0.9
    # The imitator is part of the trainer's state: a fresh trainer loaded from it serves
    # the same policy.
    other = _trainer(_bcq(net(), net(), 0.3))
    other.load_state_dict(copy.deepcopy(trainer.state_dict()))
    assert any(k.startswith("imitator.") for k in trainer.state_dict()["q_net"])
    with torch.no_grad():
        assert torch.equal(other.online(state), bcq(state))
