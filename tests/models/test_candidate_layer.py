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
from tests.conftest import REPO_ROOT


def _reference(state_part: Tensor, actions: Tensor, w_action: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.relu(state_part.unsqueeze(1) + F.linear(actions, w_action)).to(dtype)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> list[torch.Size]:
    """The kernel's maths in plain torch, on the CPU, as if Triton were installed; returns
    the shapes of the candidate sets it scored."""
    calls: list[torch.Size] = []

    def first_layer(state_part: Tensor, actions: Tensor, w_action: Tensor, dtype: torch.dtype):  # type: ignore[no-untyped-def]
        calls.append(actions.shape)
        return _reference(state_part, actions, w_action, dtype)

    monkeypatch.setattr(candidate_layer, "triton", object())
    monkeypatch.setattr(candidate_layer, "DEVICE", "cpu")
    monkeypatch.setattr(candidate_layer, "first_layer", first_layer)
    return calls


def _scores(net: ParametricQNetwork, compiled: bool, grad: bool = False) -> Tensor:
    torch.manual_seed(1)
    state, actions = torch.randn(6, 5), torch.randn(6, 7, 3)
    torch._dynamo.reset()
    fn = torch.compile(net, backend="aot_eager", fullgraph=True) if compiled else net
    with torch.set_grad_enabled(grad):
        return fn(state, actions)


def test_a_compiled_grad_free_candidate_set_takes_the_kernel(stand_in: list[torch.Size]) -> None:
    """Compiled and without gradient (double Q's choice), the first layer and its ReLU are
    the kernel's; the scores are the plain network's."""
    torch.manual_seed(0)
    net = ParametricQNetwork(5, 3, [-1, 16, 8, -1], ["relu", "relu", "linear"])
    got = _scores(net, compiled=True)
    assert stand_in == [torch.Size([6, 7, 3])]
    torch.testing.assert_close(got, _scores(net, compiled=False), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "case", ["eager", "with gradient", "tanh", "layer norm", "one action per state"]
)
def test_everything_else_keeps_the_plain_layer(stand_in: list[torch.Size], case: str) -> None:
    """Eager forwards (evaluation, the exported model), candidate sets scored with gradient
    (CQL), another first activation, a layer norm, and one action per state."""
    torch.manual_seed(0)
    first = "tanh" if case == "tanh" else "relu"
    net = ParametricQNetwork(5, 3, [-1, 16, -1], [first, "linear"], layer_norm=case == "layer norm")
    if case == "one action per state":
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(net, backend="aot_eager")(torch.randn(6, 5), torch.randn(6, 3))
    else:
        _scores(net, compiled=case != "eager", grad=case == "with gradient")
    assert stand_in == []


def test_without_triton_or_off_the_kernels_device_the_plain_layer() -> None:
    net = ParametricQNetwork(5, 3, [-1, 16, -1], ["relu", "linear"])
    actions = torch.randn(2, 4, 3)
    with torch.no_grad():
        assert not candidate_layer.usable(net.mlp.tails[0], torch.randn(2, 5), actions)


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
