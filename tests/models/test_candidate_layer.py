"""`models.candidate_layer`: where the parametric network scores candidates with its one-kernel
first layer, and that the kernel computes that layer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from reagent_lite.models import ParametricQNetwork, candidate_layer
from reagent_lite.models.traced import ForwardOptions, traced_variant
from tests.conftest import REPO_ROOT


def _reference(state_part: Tensor, actions: Tensor, w_action: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.relu(state_part.unsqueeze(1) + F.linear(actions, w_action)).to(dtype)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[torch.Size]:
    """The kernel's maths in plain torch, on the CPU (Triton's kernels need CUDA; the kernel
    itself is tested below); returns the shapes of the candidate sets it scored."""
    calls: list[torch.Size] = []

    def first_layer(state_part: Tensor, actions: Tensor, w_action: Tensor, dtype: torch.dtype):  # type: ignore[no-untyped-def]
        calls.append(actions.shape)
        return _reference(state_part, actions, w_action, dtype)

    monkeypatch.setattr(candidate_layer, "first_layer", first_layer)
    return calls


KERNEL = ForwardOptions(candidate_kernel=True)


def _scores(
    net: ParametricQNetwork, compiled: bool, grad: bool = False, options: ForwardOptions = KERNEL
) -> Tensor:
    """The scores of a candidate set by `net` (plain, eager) or its variant under
    `options` (compiled)."""
    torch.manual_seed(1)
    state, actions = torch.randn(6, 5), torch.randn(6, 7, 3)
    torch._dynamo.reset()
    variant = traced_variant(net, options)
    fn = torch.compile(variant, backend="aot_eager", fullgraph=True) if compiled else net
    with torch.set_grad_enabled(grad):
        return fn(state, actions)


def test_a_grad_free_candidate_set_takes_the_kernel_in_the_variant(
    stand_in: list[torch.Size],
) -> None:
    """The variant with `candidate_kernel`, compiled and without gradient (double Q's
    choice): the first layer and its ReLU are the kernel's; the scores are the plain
    network's."""
    torch.manual_seed(0)
    net = ParametricQNetwork(5, 3, [-1, 16, 8, -1], ["relu", "relu", "linear"])
    got = _scores(net, compiled=True)
    assert stand_in == [torch.Size([6, 7, 3])]
    torch.testing.assert_close(got, _scores(net, compiled=False), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "case",
    [
        "eager",
        "plain compiled",
        "kernel off",
        "with gradient",
        "tanh",
        "layer norm",
        "one action per state",
    ],
)
def test_everything_else_keeps_the_plain_layer(stand_in: list[torch.Size], case: str) -> None:
    """The plain forward, eager (evaluation, the exported model) or compiled; a variant
    not asked for the kernel (`step_variants.candidate_kernel: off`); candidate sets scored
    with gradient (CQL), another first activation, a layer norm, and one action
    per state."""
    torch.manual_seed(0)
    first = "tanh" if case == "tanh" else "relu"
    net = ParametricQNetwork(5, 3, [-1, 16, -1], [first, "linear"], layer_norm=case == "layer norm")
    if case == "one action per state":
        torch._dynamo.reset()
        with torch.no_grad():
            variant = traced_variant(net, KERNEL)
            torch.compile(variant, backend="aot_eager")(torch.randn(6, 5), torch.randn(6, 3))
    else:
        options = {
            "plain compiled": ForwardOptions(),
            "kernel off": ForwardOptions(row_align=4, sum_outputs=4),
        }.get(case, KERNEL)
        _scores(net, compiled=case != "eager", grad=case == "with gradient", options=options)
    assert stand_in == []


def test_the_kernel_is_available_on_cuda_with_triton_only() -> None:
    assert not candidate_layer.available(torch.device("cpu"))
    has_triton = candidate_layer.triton is not None
    assert candidate_layer.available(torch.device("cuda")) == has_triton


def test_the_kernel_computes_the_layer_under_the_triton_interpreter() -> None:
    """The kernel itself, run by Triton's CPU interpreter (where Triton is installed)."""
    pytest.importorskip("triton")
    code = textwrap.dedent(
        """
        import torch, torch.nn.functional as F
        from reagent_lite.models import candidate_layer
        torch.manual_seed(0)
        # Odd sizes: rows and units that do not fill the last blocks.
        for b, k, d, g, h in [(5, 16, 8, 6, 256), (3, 7, 4, 3, 40)]:
            w, bias = torch.randn(h, d + g), torch.randn(h)
            s, a = torch.randn(b, d), torch.randn(b, k, g)
            part = F.linear(s, w[:, :d], bias)
            want = torch.relu(part.unsqueeze(1) + F.linear(a, w[:, d:]))
            out = torch.full((b, k, h), float("nan"))
            candidate_layer.launch(part, a, w[:, d:], out, block_rows=8, block_units=32)
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        print("ok")
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_computes_the_layer_on_the_gpu(dtype: torch.dtype) -> None:
    if candidate_layer.triton is None:
        pytest.skip("Triton is not installed")
    torch.manual_seed(0)
    for b, k, d, g, h in [(1024, 16, 8, 6, 256), (33, 5, 4, 3, 300)]:
        w, bias = torch.randn(h, d + g, device="cuda"), torch.randn(h, device="cuda")
        s, a = torch.randn(b, d, device="cuda"), torch.randn(b, k, g, device="cuda")
        part = F.linear(s, w[:, :d], bias)
        got = candidate_layer.first_layer(part, a, w[:, d:], dtype)
        want = _reference(part.double(), a.double(), w[:, d:].double(), torch.float64)
        assert got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
