"""The CPE side models' training step (the step factory's `cpe_step`) against the maths
written out: expected-SARSA targets of the softmax policy, squared reward error and smooth
L1 value error over the rows with a logged action."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.data.rows import Rows
from reagent_lite.evaluation.cpe_models import (
    CpeModelTrainer,
    CpeNets,
    EvaluatedPolicy,
    gather_logged,
    masked_softmax,
)
from reagent_lite.kinds import KINDS
from reagent_lite.models import build_q_network
from tests.trainers.helpers import Sync, cpe_train_step

D, A, B = 5, 3, 64


def batch(seed: int) -> Rows:
    """Transitions with rewards large enough that the smooth-L1 value loss meets both of
    its branches, some rows without a logged action (−1) and next states with none
    possible."""
    g = torch.Generator().manual_seed(seed)
    action = torch.randint(0, A, (B,), generator=g)
    action[:5] = -1
    next_mask = (torch.rand(B, A, generator=g) > 0.3).float()
    next_mask[5:8] = 0.0
    return Rows(
        {
            "state": torch.randn(B, D, generator=g),
            "next_state": torch.randn(B, D, generator=g),
            "action": action,
            "reward": 3.0 * torch.randn(B, generator=g),
            "terminal": (torch.rand(B, generator=g) > 0.8).float(),
            "time_diff": torch.randint(1, 4, (B,), generator=g).float(),
            "possible_actions_mask": torch.ones(B, A),
            "possible_next_actions_mask": next_mask,
        }
    )


def net(activations: list[str] | None = None) -> nn.Module:
    return build_q_network(
        in_dim=D,
        n_actions=A,
        layers=[-1, 32, 16, -1],
        activations=activations or ["relu", "relu", "linear"],
    )


def trainer(
    nets: CpeNets, kind: str = "dqn", *, use_time_diff: bool = True, greedy: bool = False
) -> CpeModelTrainer:
    return CpeModelTrainer(
        KINDS[kind],
        nets,
        gamma=0.9,
        policy=EvaluatedPolicy("greedy") if greedy else EvaluatedPolicy("softmax", 0.5),
        target_update_rate=0.1,
        learning_rate=0.01,
        use_time_diff=use_time_diff,
    )


def reference_step(
    nets: CpeNets,
    target_value: nn.Module,
    q_net: nn.Module,
    data: Rows,
    use_time_diff: bool,
    greedy: bool = False,
) -> tuple[torch.Tensor, CpeNets]:
    """One step of the two CPE models written out with autograd and a per-tensor Adam:
    the loss and the nets after the step."""
    nets = copy.deepcopy(nets)
    opt = torch.optim.Adam(nets.parameters(), lr=0.01)
    with torch.no_grad():
        mask = data.possible_next_actions_mask
        q_next = q_net(data.next_state)
        if greedy:  # one-hot of the first best possible action; no action where none is
            best = torch.where(mask > 0, q_next, float("-inf")).argmax(dim=1)
            pi = F.one_hot(best, A).float() * (mask.sum(1, keepdim=True) > 0)
        else:
            pi = masked_softmax(q_next, mask, 0.5)
        v = (pi * target_value(data.next_state)).sum(-1)
        discount = 0.9**data.time_diff if use_time_diff else 0.9
        target = data.reward + (1.0 - data.terminal) * discount * v
    keep = data.action >= 0
    a = data.action[keep]
    r_hat = nets.reward_net(data.state)[keep].gather(1, a.unsqueeze(1)).squeeze(1)
    q_hat = nets.value_net(data.state)[keep].gather(1, a.unsqueeze(1)).squeeze(1)
    loss = F.mse_loss(r_hat, data.reward[keep], reduction="sum") / keep.sum()
    loss = loss + F.smooth_l1_loss(q_hat, target[keep], reduction="sum") / keep.sum()
    loss.backward()
    opt.step()
    return loss.detach(), nets


@pytest.mark.parametrize(("use_time_diff", "greedy"), [(True, False), (False, False), (True, True)])
def test_step_equals_the_maths_written_out(use_time_diff: bool, greedy: bool) -> None:
    torch.manual_seed(0)
    nets = CpeNets(net(), net())
    cpe = trainer(copy.deepcopy(nets), use_time_diff=use_time_diff, greedy=greedy)
    torch.manual_seed(1)
    q_net = net()
    data = batch(0)
    # The value errors meet both branches of the smooth L1 (|x| < 1 and > 1).
    with torch.no_grad():
        q_hat = gather_logged(nets.value_net(data.state), data.action)
        err = (q_hat - data.reward).abs()[data.action >= 0]
    assert (err < 1.0).any() and (err > 1.0).any()
    want_loss, want = reference_step(nets, cpe.target_value, q_net, data, use_time_diff, greedy)
    got_loss = cpe_train_step(cpe, data, q_net)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    for x, y, before in zip(
        cpe.nets.parameters(), want.parameters(), nets.parameters(), strict=True
    ):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
        assert not torch.equal(x, before)  # every layer of both nets got a gradient
    # The target value net follows the value net softly (τ = 0.1).
    for t, v, v0 in zip(
        cpe.target_value.parameters(),
        want.value_net.parameters(),
        nets.value_net.parameters(),
        strict=True,
    ):
        torch.testing.assert_close(t, 0.9 * v0 + 0.1 * v, rtol=1e-5, atol=1e-6)


def test_rows_without_a_logged_action_add_nothing_even_with_a_bad_reward() -> None:
    """A row whose logged action is −1 gets no gradient from either loss, also when its
    reward is not finite (inf · 0 must not become NaN parameters)."""
    torch.manual_seed(0)
    nets = CpeNets(net(), net())
    bad, good = trainer(copy.deepcopy(nets)), trainer(copy.deepcopy(nets))
    q_net = net()
    data, clean = batch(0), batch(0)
    data.reward[0] = float("inf")  # row 0 has action −1
    clean.reward[0] = 0.0
    bad_loss, good_loss = cpe_train_step(bad, data, q_net), cpe_train_step(good, clean, q_net)
    assert torch.isfinite(bad_loss) and torch.equal(bad_loss, good_loss)
    for p, q in zip(bad.nets.parameters(), good.nets.parameters(), strict=True):
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p, q, rtol=0, atol=0)


class _Unusable(nn.Module):
    """Stands in for a DDP wrapper whose forward must not run."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: object) -> object:
        raise AssertionError("forward through the wrapper")


def test_grad_sync_steps_the_plain_nets_and_runs_once() -> None:
    torch.manual_seed(0)
    nets = CpeNets(net(), net())
    plain, wrapped = trainer(copy.deepcopy(nets)), trainer(_Unusable(copy.deepcopy(nets)))
    assert isinstance(wrapped.plain, CpeNets)
    q_net, data = net(), batch(1)
    calls: list[int] = []
    with pytest.raises(AssertionError, match="through the wrapper"):
        cpe_train_step(wrapped, data, q_net)
    want = cpe_train_step(plain, data, q_net)
    got = cpe_train_step(wrapped, data, q_net, sync=Sync(lambda: calls.append(1)))
    assert calls == [1]
    torch.testing.assert_close(got, want)
    for a, b in zip(plain.plain.parameters(), wrapped.plain.parameters(), strict=True):
        torch.testing.assert_close(a, b)
