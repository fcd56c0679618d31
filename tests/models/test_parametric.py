from __future__ import annotations

import torch

from reagent_lite.models import ParametricQNetwork
from reagent_lite.models.traced import ForwardOptions, traced_variant


def _net(**kw: object) -> ParametricQNetwork:
    torch.manual_seed(0)
    return ParametricQNetwork(5, 3, [-1, 16, 8, -1], ["relu", "tanh", "linear"], **kw)  # type: ignore[arg-type]


def test_forward_matches_per_candidate_pairs() -> None:
    net = _net(layer_norm=True)
    state, actions = torch.randn(4, 5), torch.randn(4, 6, 3)
    q = net(state, actions)
    assert q.shape == (4, 6)
    per_candidate = torch.stack([net(state, actions[:, k]) for k in range(6)], dim=1)
    torch.testing.assert_close(q, per_candidate, rtol=1e-5, atol=1e-5)
    assert net(state, actions[:, 0]).shape == (4,)


def test_single_linear_layer() -> None:
    net = ParametricQNetwork(2, 1, [-1, -1], ["linear"])
    lin = net.mlp.linear(0)
    state, actions = torch.randn(3, 2), torch.randn(3, 4, 1)
    expect = torch.cat([state.unsqueeze(1).expand(-1, 4, -1), actions], -1) @ lin.weight.T
    torch.testing.assert_close(net(state, actions), (expect + lin.bias).squeeze(-1))


def test_exports_with_dynamic_batch_and_candidates() -> None:
    net = _net().eval()
    b, k = torch.export.Dim("batch"), torch.export.Dim("candidates")
    prog = torch.export.export(
        net,
        (torch.randn(4, 5), torch.randn(4, 6, 3)),
        dynamic_shapes=({0: b}, {0: b, 1: k}),
    )
    state, actions = torch.randn(7, 5), torch.randn(7, 2, 3)
    torch.testing.assert_close(prog.module()(state, actions), net(state, actions))


def test_candidates_shared_by_all_states_and_vmap() -> None:
    """One candidate set [1, K, G] for every state broadcasts, and so does a vmap over an
    extra leading dimension of the states only (the in-place sum of the first layer must
    step aside for both)."""
    torch.manual_seed(1)
    net = ParametricQNetwork(5, 3)
    state, shared = torch.randn(4, 5), torch.randn(1, 6, 3)
    with torch.no_grad():
        got = net(state, shared)
        want = net(state, shared.expand(4, -1, -1).contiguous())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        states = torch.randn(3, 4, 5)
        actions = torch.randn(4, 6, 3)
        mapped = torch.func.vmap(net, in_dims=(0, None))(states, actions)
        looped = torch.stack([net(s, actions) for s in states])
    torch.testing.assert_close(mapped, looped, rtol=1e-5, atol=1e-6)


def test_the_variant_for_tensor_cores_pads_the_first_layer_in_both_forms() -> None:
    """The variant for TF32 products (`row_align=4`): 5 + 3 state and action features
    (32 bytes, aligned) are not padded, 5 + 4 are: the candidate set through a state block
    cut from the padded weight, one action per state through padded rows. Scores and
    gradients are the plain network's."""
    traced: list[int] = []

    def keep(gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        traced.append(sum("pad" in str(n.target) for n in gm.graph.nodes))
        return gm.forward

    for g, pads in ((3, 0), (4, 1)):
        torch.manual_seed(0)
        net = ParametricQNetwork(5, g, [-1, 16, 8, -1], ["relu", "relu", "linear"])
        state, cands = torch.randn(4, 5), torch.randn(4, 6, g)
        for actions, want_pads in ((cands, pads), (cands[:, 0], 2 * pads)):
            traced.clear()
            torch._dynamo.reset()
            variant = traced_variant(net, ForwardOptions(row_align=4, sum_outputs=4))
            got = torch.compile(variant, backend=keep, fullgraph=True)(state, actions)
            assert traced == [want_pads], (g, actions.shape)
            got.sum().backward()
            got_grads = [p.grad.clone() for p in net.parameters()]  # type: ignore[union-attr]
            net.zero_grad()
            want = net(state, actions)
            want.sum().backward()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            for a, b in zip(got_grads, (p.grad for p in net.parameters()), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            net.zero_grad()
