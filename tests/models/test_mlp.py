from __future__ import annotations

import pytest
import torch

from reagent_lite.errors import ConfigError
from reagent_lite.export import export_program
from reagent_lite.kinds import DiscreteSpace, get_kind
from reagent_lite.models import MLP, build_q_network, resolve_layer_sizes
from reagent_lite.models.traced import ForwardOptions, traced_variant
from reagent_lite.normalization.identify import fit_normalization
from reagent_lite.normalization.module import Preprocessor


def test_shapes_and_placeholders() -> None:
    net = build_q_network(
        in_dim=5, n_actions=3, layers=[-1, 16, 8, -1], activations=["relu", "tanh", "linear"]
    )
    assert isinstance(net, MLP)
    assert [lin.in_features for lin in net.linears] == [5, 16, 8]
    assert net(torch.randn(7, 5)).shape == (7, 3)


@pytest.mark.parametrize(
    "name", ["relu", "tanh", "sigmoid", "leaky_relu", "elu", "gelu", "selu", "linear", "ReLU"]
)
def test_every_activation_builds(name: str) -> None:
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, 4, -1], activations=[name, "linear"])
    assert torch.isfinite(net(torch.randn(2, 3))).all()


def test_linear_only_network_is_affine() -> None:
    net = build_q_network(in_dim=3, n_actions=2, layers=[-1, -1], activations=["linear"])
    assert isinstance(net, MLP)
    x = torch.randn(4, 3)
    lin = net.linear(0)
    torch.testing.assert_close(net(x), x @ lin.weight.T + lin.bias)


def test_layer_norm_and_dropout_only_on_hidden_layers() -> None:
    net = build_q_network(
        in_dim=3,
        n_actions=2,
        layers=[-1, 8, -1],
        activations=["relu", "linear"],
        dropout_ratio=0.5,
        layer_norm=True,
    )
    assert isinstance(net, MLP)
    kinds = [type(m).__name__ for m in net.tails[0]]  # type: ignore[attr-defined]
    assert kinds == ["LayerNorm", "ReLU", "Dropout"]
    assert type(net.tails[1]).__name__ == "Identity"
    net.eval()
    x = torch.randn(4, 3)
    torch.testing.assert_close(net(x), net(x))


def test_bad_layers_and_activations() -> None:
    with pytest.raises(ConfigError, match="hidden sizes"):
        resolve_layer_sizes([-1, -1, 4, -1], 3, 2)
    with pytest.raises(ConfigError, match="does not match"):
        resolve_layer_sizes([5, 4, -1], 3, 2)
    assert resolve_layer_sizes([3, 4, 2], 3, 2) == [3, 4, 2]
    with pytest.raises(ConfigError, match="one entry per linear layer"):
        build_q_network(in_dim=3, n_actions=2, layers=[-1, 4, -1], activations=["relu"])
    with pytest.raises(ConfigError, match="unknown activation"):
        build_q_network(in_dim=3, n_actions=2, layers=[-1, 4, -1], activations=["swishy", "linear"])


def test_exports_with_dynamic_batch() -> None:
    net = build_q_network(
        in_dim=4, n_actions=3, layers=[-1, 8, -1], activations=["relu", "linear"], layer_norm=True
    ).eval()
    batch = torch.export.Dim("batch")
    prog = torch.export.export(net, (torch.randn(5, 4),), dynamic_shapes=({0: batch},))
    x = torch.randn(11, 4)
    torch.testing.assert_close(prog.module()(x), net(x))


def _traced_ops(net: torch.nn.Module, *args: torch.Tensor) -> list[str]:
    """The call targets of the graph `torch.compile` traces for `net(*args)`."""
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(net, backend=keep, fullgraph=True)(*args)
    return [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op.startswith("call_")]


def _compiled_equals_eager(
    net: MLP, x: torch.Tensor, options: ForwardOptions
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Asserts that `net`'s variant under `options`, compiled (aot_eager), gives the plain
    eager forward's values and gradients of a squared-sum loss on `x`; returns the
    compiled output and gradients."""
    torch._dynamo.reset()
    got = torch.compile(traced_variant(net, options), backend="aot_eager", fullgraph=True)(x)
    got.square().sum().backward()
    got_grads = [p.grad.clone() for p in net.parameters() if p.grad is not None]
    net.zero_grad()
    want = net(x)
    want.square().sum().backward()
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_grads, (p.grad for p in net.parameters()), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    return got, got_grads


SUM = ForwardOptions(sum_outputs=4)


def _traced_linears_and_sums(
    net: torch.nn.Module, options: ForwardOptions = SUM
) -> tuple[int, bool]:
    ops = _traced_ops(traced_variant(net, options), torch.randn(9, 5))
    return sum("linear" in op for op in ops), any("sum" in op for op in ops)


@pytest.mark.parametrize("outputs", [1, 2, 4])
def test_a_thin_last_layer_is_a_sum_in_the_variant(outputs: int) -> None:
    """With `sum_outputs`, a last layer of up to 4 outputs is a product and a sum (fused
    with the activation before it), with the value and gradients of the linear layer it
    replaces."""
    torch.manual_seed(0)
    net = MLP([5, 16, 8, outputs], ["relu", "relu", "linear"])
    assert _traced_linears_and_sums(net) == (2, True)
    got, _ = _compiled_equals_eager(net, torch.randn(9, 5), SUM)
    assert got.shape == (9, outputs)


def test_a_wider_last_layer_stays_a_matrix_product_in_the_variant() -> None:
    assert _traced_linears_and_sums(MLP([5, 16, 5], ["relu", "linear"])) == (2, False)


def test_a_trunks_thin_last_hidden_layer_stays_a_matrix_product() -> None:
    """Only an output layer is fused: a trunk (`ends_in_output=False`, the dueling
    network's) keeps its last layer, which its own activation and norm follow."""
    trunk = MLP([5, 16, 4], ["relu", "relu"], layer_norm=True, ends_in_output=False)
    assert _traced_linears_and_sums(trunk) == (2, False)


def test_the_plain_forward_compiled_and_the_switched_off_variant_keep_the_product() -> None:
    """The network's own forward, compiled, is the plain one (no module switch turns it
    into the sum); so is the variant of options that ask for nothing."""
    net = MLP([5, 16, 1], ["relu", "linear"])
    assert traced_variant(net, ForwardOptions()) is net
    assert _traced_linears_and_sums(net, ForwardOptions()) == (2, False)


def test_the_exported_model_keeps_the_linear_layer() -> None:
    """`export_program` (non-strict, no Dynamo) writes the plain forward: `aten.linear`
    for the thin output layer too, no product-and-sum."""
    net = build_q_network(in_dim=2, n_actions=3, layers=[-1, 8, -1], activations=["relu", "linear"])
    kind, space = get_kind("dqn"), DiscreteSpace(state_ids=["0", "1"], actions=["a", "b", "c"])
    pre = Preprocessor(
        ["0", "1"], fit_normalization(torch.rand(200, 2).double().numpy(), ["0", "1"])
    )
    program = export_program(kind.serving_module({"state": pre}, net.eval()), kind, space)
    targets = [n.target for n in program.graph.nodes]
    assert targets.count(torch.ops.aten.linear.default) == 2, targets
    assert torch.ops.aten.sum.dim_IntList not in targets, targets


def _traced_pads(net: MLP, x: torch.Tensor, options: ForwardOptions) -> int:
    return sum("pad" in op for op in _traced_ops(traced_variant(net, options), x))


@pytest.mark.parametrize("width", [5, 14])
def test_a_first_layer_of_unaligned_rows_is_padded_in_the_variant(width: int) -> None:
    """With `row_align` (4 features: TF32 products), a first layer whose rows are not a
    multiple of it multiplies zero-padded rows by a zero-padded weight, with the values
    and gradients of the plain layer; the weight's gradient keeps its shape."""
    torch.manual_seed(0)
    net = MLP([width, 16, 8, 2], ["relu", "relu", "linear"])
    x = torch.randn(9, width)
    tf32 = ForwardOptions(row_align=4, sum_outputs=4)
    assert _traced_pads(net, x, tf32) == 2
    _, got_grads = _compiled_equals_eager(net, x, tf32)
    assert got_grads[0].shape == (16, width)


def test_aligned_rows_and_options_without_alignment_are_not_padded() -> None:
    """Nothing is padded for rows already aligned or for `row_align=0` (IEEE fp32, bf16)."""
    x5, x8, x4 = torch.randn(3, 5), torch.randn(3, 8), torch.randn(3, 4)
    assert _traced_pads(MLP([5, 16, 2], ["relu", "linear"]), x5, SUM) == 0
    assert _traced_pads(MLP([8, 16, 2], ["relu", "linear"]), x8, ForwardOptions(row_align=4)) == 0
    assert _traced_pads(MLP([4, 16, 2], ["relu", "linear"]), x4, ForwardOptions(row_align=4)) == 0


def test_the_variant_shares_the_networks_parameters_and_leaves_it_plain() -> None:
    """A container (dueling) gets a variant of its trunk over the same parameters; the
    network itself keeps its own children."""
    net = build_q_network(
        in_dim=5, n_actions=3, layers=[-1, 16, -1], activations=["relu", "linear"], dueling=True
    )
    variant = traced_variant(net, ForwardOptions(row_align=4))
    assert variant is not net and isinstance(net.trunk, MLP)  # type: ignore[attr-defined]
    assert variant.trunk is not net.trunk  # type: ignore[attr-defined]
    assert {id(p) for p in variant.parameters()} == {id(p) for p in net.parameters()}
    x = torch.randn(4, 5)
    torch.testing.assert_close(variant(x), net(x))
