"""The CPU fast path of ReLU MLPs (`models.fused`) against the same layers run one by one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.models import MLP, DuelingQNetwork, ParametricQNetwork, build_q_network, fused


def reference(net: MLP, x: torch.Tensor, *, start: int = 0) -> torch.Tensor:
    """The layers of `net` from `start`, module by module (`start > 0`: x is layer
    start-1's pre-activation, as `forward_after_first` takes it)."""
    if start:
        x = net.tails[start - 1](x)
    for i in range(start, len(net.linears)):
        layer = net.linear(i)
        x = net.tails[i](F.linear(x, layer.weight, layer.bias))
    return x


def grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters() if p.grad is not None]


def fused_node(out: torch.Tensor) -> bool:
    return out.grad_fn is not None and "_FusedMLP" in out.grad_fn.name()


@pytest.mark.parametrize(
    ("layers", "acts"),
    [
        ([-1, 256, 256, -1], ["relu", "relu", "linear"]),
        ([-1, 8, -1], ["relu", "relu"]),  # ReLU on the output too
        ([-1, 16, -1], ["linear", "linear"]),  # no ReLU at all
    ],
)
def test_outputs_and_gradients_match_the_layer_by_layer_path(layers, acts) -> None:
    torch.manual_seed(0)
    net = build_q_network(in_dim=4, n_actions=3, layers=layers, activations=acts)
    assert isinstance(net, MLP)
    x = torch.randn(257, 4, requires_grad=True)
    out = net(x)
    assert fused_node(out)
    (out.square() * torch.arange(out.shape[1])).sum().backward()
    fused_grads, fused_x = grads(net), x.grad.clone()
    net.zero_grad(set_to_none=True)
    x.grad = None
    ref = reference(net, x)
    (ref.square() * torch.arange(ref.shape[1])).sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    for a, b in zip(fused_grads, grads(net), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused_x, x.grad, rtol=1e-5, atol=1e-6)


def test_no_input_gradient_is_computed_when_none_is_needed() -> None:
    net = build_q_network(
        in_dim=4, n_actions=2, layers=[-1, 32, -1], activations=["relu", "linear"]
    )
    x = torch.randn(64, 4)
    net(x).sum().backward()
    assert x.grad is None
    assert all(p.grad is not None for p in net.parameters())


def test_grad_free_forward_equals_the_reference() -> None:
    net = build_q_network(
        in_dim=4, n_actions=2, layers=[-1, 64, 64, -1], activations=["relu"] * 2 + ["linear"]
    )
    x = torch.randn(100, 4)
    with torch.no_grad():
        out = net(x)
        assert out.grad_fn is None
        torch.testing.assert_close(out, reference(net, x), rtol=1e-6, atol=1e-6)


def test_parametric_split_first_layer_uses_the_fast_path_and_matches() -> None:
    torch.manual_seed(1)
    net = ParametricQNetwork(5, 3)
    state, actions = torch.randn(32, 5), torch.randn(32, 7, 3)
    out = net(state, actions)
    out.sum().backward()
    fast = grads(net)
    net.zero_grad(set_to_none=True)
    # The same scores from the concatenated input, layer by layer.
    pairs = torch.cat([state.unsqueeze(1).expand(-1, 7, -1), actions], dim=-1)
    ref = reference(net.mlp, pairs).squeeze(-1)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(fast, grads(net), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_consumed_input_is_overwritten_only_without_autograd() -> None:
    """`consume=True` (the parametric network's candidate tensor): without autograd the
    leading ReLU runs in place on the input and the output is unchanged; with autograd, or
    without `consume`, the input is left as it was."""
    torch.manual_seed(2)
    net = MLP([6, 32, 16, 1], ["relu", "relu", "linear"])
    weights, biases, relu = net.relu_layers()  # type: ignore[misc]
    x = torch.randn(40, 32)
    want = reference(net, x, start=1)
    for consume in (False, True):
        with torch.no_grad():
            h = x.clone()
            out = fused.fused_mlp(
                h, weights[1:], biases[1:], relu[1:], pre_relu=True, consume=consume
            )
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
        assert torch.equal(h, x.relu() if consume else x)
    h = x.clone().requires_grad_()
    out = fused.fused_mlp(h, weights[1:], biases[1:], relu[1:], pre_relu=True, consume=True)
    assert fused_node(out) and torch.equal(h.detach(), x)


def test_parametric_candidate_scores_are_the_same_with_and_without_grad() -> None:
    torch.manual_seed(3)
    net = ParametricQNetwork(5, 3)
    state, actions = torch.randn(32, 5), torch.randn(32, 7, 3)
    kept = actions.clone()
    with torch.no_grad():
        free = net(state, actions)
    assert torch.equal(actions, kept)  # only the network's own scratch tensor is consumed
    torch.testing.assert_close(net(state, actions).detach(), free, rtol=0, atol=0)


def test_dueling_trunk_is_fused() -> None:
    net = build_q_network(
        in_dim=4, n_actions=3, layers=[-1, 16, 16, -1], activations=["relu"] * 2 + ["linear"],
        dueling=True,
    )  # fmt: skip
    assert isinstance(net, DuelingQNetwork) and isinstance(net.trunk, MLP)
    assert fused_node(net.trunk(torch.randn(5, 4)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"activations": ["tanh", "linear"]},
        {"activations": ["relu", "linear"], "dropout_ratio": 0.1},
        {"activations": ["relu", "linear"], "layer_norm": True},
    ],
)
def test_other_layer_stacks_keep_the_module_path(kwargs) -> None:
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, 8, -1], **kwargs)
    out = net(torch.randn(4, 3))
    assert out.grad_fn is not None and not fused_node(out)


def test_export_traces_the_plain_layers() -> None:
    net = build_q_network(
        in_dim=4, n_actions=2, layers=[-1, 16, -1], activations=["relu", "linear"]
    )
    x = torch.randn(6, 4)
    program = torch.export.export(net.eval(), (x,))
    graph = str(program.graph)
    assert "_FusedMLP" not in graph and "linear" in graph
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), reference(net, x))


def test_double_backward_is_refused_not_wrong() -> None:
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["linear"] * 2)
    x = torch.randn(5, 3, requires_grad=True)
    (gx,) = torch.autograd.grad(net(x).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=r"once_differentiable|does not require grad"):
        gx.square().sum().backward()


def test_torch_func_and_autocast_take_the_module_path() -> None:
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, 8, -1], activations=["relu", "linear"])
    params = dict(net.named_parameters())
    x = torch.randn(4, 3)

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(net, p, (x,)).square().sum()

    grads_func = torch.func.grad(loss)(params)
    loss(params).backward()
    for name, p in net.named_parameters():
        torch.testing.assert_close(grads_func[name], p.grad)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
    assert out.dtype == torch.bfloat16 and not fused_node(out)
    out.float().sum().backward()  # the module path's backward copes with the mixed dtypes


needs_onednn = pytest.mark.skipif(
    not fused._onednn_available(), reason="this torch build has no usable oneDNN linear op"
)


@needs_onednn
def test_large_products_go_to_onednn_and_match_mkl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward products and input gradients of ≥ 64-wide layers run on oneDNN; outputs
    and gradients equal the MKL-only path to float rounding."""
    calls: list[tuple[int, ...]] = []
    real = fused._onednn_linear

    def counting(x, w, *args):
        calls.append((*x.shape, *w.shape))
        return real(x, w, *args)

    monkeypatch.setattr(fused, "_onednn_linear", counting)
    torch.manual_seed(0)
    net = build_q_network(
        in_dim=4, n_actions=2, layers=[-1, 128, 96, -1], activations=["relu", "relu", "linear"]
    )
    x = torch.randn(200, 4)
    results = []
    for use in (True, False):
        monkeypatch.setattr(fused, "USE_ONEDNN", use)
        net.zero_grad(set_to_none=True)
        out = net(x)
        (out.square() * torch.tensor([1.0, 2.0])).sum().backward()
        results.append((out.detach(), grads(net)))
        if use:
            # forward 200×128 · 128×96 (ReLU fused), backward g·W of that layer; the
            # 4-wide first and 2-wide last layers stay with MKL.
            assert calls == [(200, 128, 96, 128), (200, 96, 128, 96)]
    (out_dnn, g_dnn), (out_mkl, g_mkl) = results
    torch.testing.assert_close(out_dnn, out_mkl, rtol=1e-5, atol=1e-5)
    for a, b in zip(g_dnn, g_mkl, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_onednn_never_sees_inputs_that_need_gradients() -> None:
    """The oneDNN op has no backward: under autograd the products stay with addmm."""
    w = torch.randn(128, 128, requires_grad=True)
    b = torch.zeros(128, requires_grad=True)
    x = torch.randn(100, 128)
    outs = fused.layers_forward(x, [w], [b], [True])
    assert outs[-1].grad_fn is not None
    outs[-1].sum().backward()
    assert w.grad is not None


def test_library_rule_follows_the_cpu_vendor() -> None:
    """oneDNN by default exactly on AMD CPUs (where it measured faster than MKL)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists() or "vendor_id" not in cpuinfo.read_text():
        pytest.skip("no vendor_id in /proc/cpuinfo here")
    vendor = fused._cpu_vendor()
    assert vendor and vendor in cpuinfo.read_text()
    assert fused.USE_ONEDNN is (vendor == "AuthenticAMD")


@pytest.mark.parametrize("onednn", [True, False])
def test_nan_in_a_weight_reaches_the_output(monkeypatch: pytest.MonkeyPatch, onednn: bool) -> None:
    """A diverged parameter must show in the output (and so in the loss the divergence
    guard reads) on either library: no ReLU may turn NaN into 0."""
    if onednn and not fused._onednn_available():
        pytest.skip("this torch build has no usable oneDNN linear op")
    monkeypatch.setattr(fused, "USE_ONEDNN", onednn)
    torch.manual_seed(0)
    net = build_q_network(
        in_dim=5, n_actions=3, layers=[-1, 128, 128, -1], activations=["relu", "relu", "linear"]
    )
    with torch.no_grad():
        net.linear(0).weight[7, 2] = float("nan")
    x = torch.randn(256, 5)
    with torch.no_grad():
        assert net(x).isnan().all()
    assert net(x).isnan().all()  # the autograd node's forward too
