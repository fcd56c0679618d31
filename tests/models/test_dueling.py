from __future__ import annotations

import torch

from reagent_lite.models import DuelingQNetwork, build_q_network


def test_dueling_output_is_value_plus_centered_advantage() -> None:
    torch.manual_seed(0)
    net = build_q_network(
        in_dim=4,
        n_actions=3,
        layers=[-1, 8, 8, -1],
        activations=["relu", "relu", "linear"],
        dueling=True,
    )
    assert isinstance(net, DuelingQNetwork)
    x = torch.randn(6, 4)
    q = net(x)
    assert q.shape == (6, 3)
    h = net.trunk(x)
    value, adv = net.value(h), net.advantage(h)
    torch.testing.assert_close(q, value + adv - adv.mean(dim=1, keepdim=True))
    # The mean over actions of Q is the state value.
    torch.testing.assert_close(q.mean(dim=1, keepdim=True), value)


def test_dueling_without_hidden_layers() -> None:
    net = build_q_network(
        in_dim=4, n_actions=2, layers=[-1, -1], activations=["linear"], dueling=True
    )
    assert net(torch.randn(3, 4)).shape == (3, 2)


def test_dueling_exports() -> None:
    net = build_q_network(
        in_dim=4, n_actions=3, layers=[-1, 8, -1], activations=["relu", "linear"], dueling=True
    ).eval()
    prog = torch.export.export(
        net, (torch.randn(5, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    x = torch.randn(9, 4)
    torch.testing.assert_close(prog.module()(x), net(x))
