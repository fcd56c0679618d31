"""`training.precision` and `training.compile`: validated, and each trains what the plain
fp32 step trains (the compiled loss up to float rounding, bf16 within its precision)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._functorch.config as aot_config

from reagent_lite.config import DQNWorkflowConfig, config_from_dict
from reagent_lite.errors import ConfigError
from reagent_lite.training.loop import Workflow
from tests.training.runs import tiny_cpe_workflow as _workflow


def _trained(wf: Workflow) -> list[torch.Tensor]:
    wf.train()
    nets = [wf.trainer.online, wf.trainer.target] + ([wf.cpe.plain] if wf.cpe else [])
    return [p.detach().cpu() for net in nets for p in net.parameters()]


def test_precision_is_validated() -> None:
    cfg = {"training_data_path": "x", "model_output_path": "y", "actions": ["a", "b"]}
    with pytest.raises(ConfigError) as err:
        config_from_dict({**cfg, "training": {"precision": "fp8"}}, DQNWorkflowConfig)
    assert "training.precision" in str(err.value) and "fp8" in str(err.value)
    ok = config_from_dict({**cfg, "training": {"precision": "bf16"}}, DQNWorkflowConfig)
    assert ok.training.precision == "bf16" and ok.training.compile is False


def test_bf16_trains_near_fp32_with_float32_state(tmp_path: Path) -> None:
    fp32 = _workflow(tmp_path, "dqn", "fp32")
    bf16 = _workflow(tmp_path, "dqn", "bf16", precision="bf16")
    assert "bf16 autocast" in bf16.step_runner().describe()
    a, b = _trained(fp32), _trained(bf16)
    diffs = [float((x - y).abs().max()) for x, y in zip(a, b, strict=True)]
    # Autocast really ran (not bit-identical), yet the weights stay close to fp32's.
    assert max(diffs) > 0.0
    assert max(diffs) < 0.05, diffs
    # Master weights, gradients' optimizer state and the loss stay float32.
    assert all(p.dtype == torch.float32 for p in bf16.trainer.online.parameters())
    for state in bf16.trainer.optimizer.state.values():
        assert state["exp_avg"].dtype == torch.float32
    assert all(isinstance(r["loss"], float) for r in bf16.history)


def test_tf32_on_cpu_is_fp32(tmp_path: Path) -> None:
    a = _trained(_workflow(tmp_path, "dqn", "fp32"))
    b = _trained(_workflow(tmp_path, "dqn", "tf32", precision="tf32"))
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.slow
def test_compiled_loss_trains_what_the_eager_loss_trains(tmp_path: Path) -> None:
    """CPU Inductor: the compiled loss (forward + AOTAutograd backward) equals the eager one
    up to float rounding, CPE side models included, for the parametric kind (candidates)."""
    eager = _workflow(tmp_path, "parametric_dqn", "eager")
    # The compile cache (on by auto on a CPU) asked off: the plan turns torch's switch off
    # before the first compile, and names it.
    compiled = _workflow(
        tmp_path, "parametric_dqn", "compiled", compile=True, step_plan={"compile_cache": "off"}
    )
    aot_config.enable_autograd_cache = True
    try:
        a, b = _trained(eager), _trained(compiled)
        assert aot_config.enable_autograd_cache is False
    finally:
        aot_config.enable_autograd_cache = True
    choices = compiled.step_runner().plan()
    assert choices["compile_cache"] == "off (training.step_plan.compile_cache is off)"
    assert "loss compiled by Inductor" in compiled.step_runner().describe()
    loss = compiled.step_runner().update.loss
    assert loss is not None and not loss.failed and loss.compile_s > 0
    cpe_loss = compiled.step_runner().update.cpe_loss
    assert cpe_loss is not None and not cpe_loss.failed and cpe_loss.compile_s > 0
    assert "CPE models' loss compiled" in compiled.step_runner().describe()
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)


def test_compile_failure_falls_back_to_eager(tmp_path: Path) -> None:
    """No working C++ compiler for the CPU backend: the run warns and trains eagerly."""
    import torch._inductor.config as inductor

    eager = _trained(_workflow(tmp_path, "dqn", "eager"))
    # The config's own `patch`: pytest's monkeypatch cannot restore a torch config entry
    # (it leaves the entry missing, and every later compilation in the process failing).
    with inductor.patch({"cpp.cxx": (None, "/nonexistent/c++")}):
        torch._dynamo.reset()
        wf = _workflow(tmp_path, "dqn", "broken", compile=True)
        got = _trained(wf)
    torch._dynamo.reset()
    assert "compile failed" in wf.step_runner().describe()
    for x, y in zip(eager, got, strict=True):
        assert torch.equal(x, y)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_cuda_graph_with_compiled_loss_and_precisions(tmp_path: Path, kind: str) -> None:
    """On CUDA: the compiled loss inside the captured graph equals the eager fp32 step up
    to float rounding; tf32 and bf16 graphs train close to it."""
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    base = _trained(_workflow(tmp_path, kind, "eager", "cuda:0"))
    for name, training, tol in (
        ("compiled", {"compile": True}, 1e-4),
        ("tf32", {"compile": True, "precision": "tf32"}, 2e-2),
        ("bf16", {"compile": True, "precision": "bf16"}, 5e-2),
    ):
        wf = _workflow(tmp_path, kind, name, "cuda:0", **training)
        got = _trained(wf)
        text = wf.step_runner().describe()
        assert wf.step_runner().mode == "graph" and "loss compiled by Inductor" in text, text
        assert "optimizer step compiled" in text, text  # Adam and the soft update, too
        assert "CPE models' optimizer step compiled" in text, text
        worst = max(float((x - y).abs().max()) for x, y in zip(base, got, strict=True))
        assert worst < tol, (name, worst)


def test_the_step_line_names_the_forms_that_training_step_variants_leave_on(
    tmp_path: Path,
) -> None:
    """From the config to the `training step:` line: by default a compiled CPU step traces
    the output layers (dqn's 2 actions, the CPE models') as a product and a sum and pads
    nothing; `step_variants` can turn the sum off, and padding asked `on` for bf16 products
    is not taken (measured under 5% faster) and says so."""
    auto = _workflow(tmp_path, "dqn", "auto", compile=True)
    assert "loss compiled by Inductor (output layer as a product and a sum)" in (
        auto.step_runner().describe()
    )
    variants = {"output_sum": "off", "pad_first_layer": "on"}
    bf16 = _workflow(
        tmp_path, "dqn", "switched", compile=True, precision="bf16", step_variants=variants
    )
    text = bf16.step_runner().describe()
    assert "loss compiled by Inductor (plain forward)" in text, text
    assert "CPE models' loss compiled (plain forward)" in text, text
    assert bf16.step_runner().plan()["pad_first_layer"] == (
        "off (bf16 products are not padded: measured under 5% faster)"
    )
