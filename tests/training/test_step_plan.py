"""The step plan names every choice a run's step took (the `training step:` line, the first
epoch record of metrics.jsonl), and a choice asked `on` but not taken says why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from reagent_lite.config.models import StepPlanParameters, StepVariants
from reagent_lite.models.mlp import MLP
from reagent_lite.models.parametric import ParametricQNetwork
from reagent_lite.trainers.optim import OptimizerKernel
from reagent_lite.training.compiled import forward_options
from reagent_lite.training.host_memory import HostMemory
from reagent_lite.training.metrics import read_metrics
from reagent_lite.training.step_plan import StepPlan, StepShape, asked, step_shape
from tests.training.runs import run_workflow, tiny_dqn_config

KEYS = [
    "precision",
    "compile",
    "graph",
    "output_sum",
    "pad_first_layer",
    "candidate_kernel",
    "compile_cache",
    "keep_freed_memory",
    "tf32",
]
CPU = torch.device("cpu")


def test_a_cpu_run_names_every_choice_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="reagent_lite"):
        wf = run_workflow(tiny_dqn_config(tmp_path, epochs=2))
    epochs = [r for r in read_metrics(tmp_path / "out" / "metrics.jsonl") if "loss" in r]
    assert [("step_plan" in r) for r in epochs] == [True, False]  # once, on the first
    plan = epochs[0]["step_plan"]
    assert sorted(plan) == sorted(KEYS)  # metrics.jsonl sorts keys; the log line does not
    assert plan["keep_freed_memory"] == wf.host_memory.plan()
    assert {k: v for k, v in plan.items() if k != "keep_freed_memory"} == {
        "precision": "fp32",
        "compile": "off (training.compile is false)",
        "graph": "off (no CUDA)",
        "output_sum": "off (training.compile is false)",
        "pad_first_layer": "off (training.compile is false)",
        "candidate_kernel": "off (training.compile is false)",
        "compile_cache": "off (training.compile is false)",
        "tf32": "off (no CUDA: CPU float32 products are IEEE)",
    }
    lines = [m for m in caplog.messages if m.startswith("training step: ")]
    assert len(lines) == 1
    assert lines[0].endswith(
        "; plan: precision fp32, compile off (training.compile is false), graph off (no CUDA), "
        "output_sum off (training.compile is false), pad_first_layer off (training.compile "
        "is false), candidate_kernel off (training.compile is false), compile_cache off "
        "(training.compile is false), "
        f"keep_freed_memory {plan['keep_freed_memory']}, tf32 off (no CUDA: CPU "
        "float32 products are IEEE)"
    ), lines[0]
    assert not [m for m in caplog.messages if "is on but" in m]  # auto: silent


def test_asking_on_for_what_a_cpu_run_cannot_take_warns_and_trains_plainly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    training = {
        "step_variants": {"candidate_kernel": "on", "pad_first_layer": "on"},
    }
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        wf = run_workflow(tiny_dqn_config(tmp_path, epochs=1, training=training))
    assert [m for m in caplog.messages if "is on but" in m] == [
        "training.step_variants.pad_first_layer is on but not taken: training.compile is "
        "false; the plain path runs",
        "training.step_variants.candidate_kernel is on but not taken: training.compile is "
        "false; the plain path runs",
    ]
    assert len(wf.history) == 1 and "p2p_allreduce" not in wf.history[0]["step_plan"]


def _plan(
    device: str = "cpu", precision: str = "fp32", **variants: str
) -> tuple[StepPlan, ParametricQNetwork]:
    dev = torch.device(device)
    chosen = StepVariants(**variants)  # type: ignore[arg-type]
    plan = StepPlan(
        device=dev,
        precision=precision,  # type: ignore[arg-type]
        compile=True,
        cuda_graphs=True,
        variants=chosen,
        plan=StepPlanParameters(),
        options=forward_options(chosen, dev, precision),  # type: ignore[arg-type]
        host_memory=HostMemory(False, "left alone"),
    )
    # 5 state + 2 action features: rows of 7 floats, 16-byte aligned in tf32 by padding.
    return plan, ParametricQNetwork(5, 2, (-1, 16, -1), ("relu", "linear"))


def _choices(plan: StepPlan, net: torch.nn.Module) -> dict[str, str]:
    return plan.choices(net, compile_failed="", graph=False, why_eager="")


def test_a_compiled_cpu_step_names_why_each_form_is_off_or_on() -> None:
    plan, net = _plan()
    got = _choices(plan, net)
    assert (got["compile"], got["output_sum"]) == ("on", "on")
    assert got["pad_first_layer"] == "off (no CUDA)"
    assert got["candidate_kernel"] == "off (no CUDA)"
    assert plan.unmet(got) == []  # auto: silent, the record says why

    plan, net = _plan(precision="tf32", pad_first_layer="on", candidate_kernel="on")
    got = _choices(plan, net)
    assert got["pad_first_layer"] == "off (tf32 products on cpu are IEEE float32)"
    assert got["candidate_kernel"] == "off (no CUDA)"  # a Triton kernel: CUDA only
    assert plan.unmet(got) == [
        "training.step_variants.pad_first_layer is on but not taken: tf32 products on cpu "
        "are IEEE float32; the plain path runs",
        "training.step_variants.candidate_kernel is on but not taken: no CUDA; the plain path runs",
    ]

    plan, net = _plan(pad_first_layer="on", output_sum="off")
    got = _choices(plan, net)
    assert got["pad_first_layer"] == "off (fp32 products on cpu are IEEE float32)"
    assert got["output_sum"] == "off (training.step_variants.output_sum is off)"
    failed = plan.choices(net, compile_failed="compile failed: X", graph=False, why_eager="")
    assert failed["compile"] == failed["output_sum"] == "off (compile failed: X)"

    # A form that changes nothing in the network is off, and says so.
    plan, _ = _plan("cuda", precision="tf32")
    wide = MLP([8, 16, 6], ["relu", "linear"])
    got = _choices(plan, wide)
    assert got["pad_first_layer"] == "off (the first layer's rows are aligned already)"
    assert got["output_sum"] == "off (no output layer of at most 4 outputs)"


def test_a_compiled_cuda_tf32_plan_pads_the_first_layer() -> None:
    """The plan is decided without running anything, so a CUDA plan can be read here."""
    plan, net = _plan("cuda", precision="tf32")
    assert plan.options.row_align == 4  # 16 bytes of float32
    assert _choices(plan, net)["pad_first_layer"] == "on"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_bf16_compiled_plan_does_not_pad_and_says_why(device: str, mode: str) -> None:
    """bf16 padding measured +2.6% (dqn) and ±0% (parametric) in one A/B, under the 5% a
    speed-up must earn: nothing is padded, and the choice says so (`on` also warns)."""
    plan, net = _plan(device, precision="bf16", pad_first_layer=mode)
    assert plan.options.row_align == 0
    got = _choices(plan, net)
    why = "bf16 products are not padded: measured under 5% faster"
    assert got["pad_first_layer"] == f"off ({why})"
    warned = [m for m in plan.unmet(got) if "pad_first_layer" in m]
    want = f"training.step_variants.pad_first_layer is on but not taken: {why}; the plain path runs"
    assert warned == ([want] if mode == "on" else [])


def test_off_keeps_every_form_out_of_the_trace() -> None:
    off = StepVariants(pad_first_layer="off", output_sum="off", candidate_kernel="off")
    for device in ("cpu", "cuda"):
        for precision in ("tf32", "bf16"):
            options = forward_options(off, torch.device(device), precision)
            assert not options.changes_anything()


def test_the_removed_gradient_sum_switch_is_no_longer_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`REAGENT_LITE_P2P_ALLREDUCE=0` forced NCCL's all-reduce, which every run now uses:
    the variable changes nothing and is not warned about."""
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        got = asked(StepPlanParameters(), {"REAGENT_LITE_P2P_ALLREDUCE": "0"})
    assert got == StepPlanParameters()
    assert caplog.messages == []


CUDA = torch.device("cuda", 0)


def _shape(device: torch.device, **kw: object) -> StepShape:
    args: dict[str, object] = {
        "cuda_graphs": True,
        "compile": False,
        "world_size": 1,
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "optimizer": "adam",
        "data_parallel": False,
    }
    args.update(kw)
    return step_shape(device, **args)  # type: ignore[arg-type]


def test_the_step_shape_builds_adam_as_the_step_needs() -> None:
    """Decided once from the config, the device and the ranks (a pure function, so the
    CUDA choices are tested here without a GPU): eager steps get fused Adam, a graph a
    capturable one with its lr on the device, a compiled update the multi-tensor form."""
    eager = OptimizerKernel(fused=True)
    assert _shape(CPU) == StepShape(False, "", False, False, eager)  # no CUDA: never a graph
    assert _shape(CUDA, cuda_graphs=False).kernel == eager
    graph = _shape(CUDA)
    assert (graph.graph, graph.compiled_update, graph.average_in_graph) == (True, False, False)
    assert graph.kernel == OptimizerKernel(fused=True, capturable=True, tensor_lr=True)
    compiled = _shape(CUDA, compile=True, world_size=4)
    assert (compiled.graph, compiled.compiled_update, compiled.average_in_graph) == (
        True,
        True,
        True,
    )
    assert compiled.kernel == OptimizerKernel(foreach=True, capturable=True, tensor_lr=True)
    assert not _shape(CPU, compile=True).compiled_update  # compiled updates: under a graph


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"data_parallel": True}, "the network is wrapped by DataParallel"),
        ({"world_size": 2, "backend": "gloo"}, "DDP over gloo: only NCCL"),
        ({"optimizer": "sgd"}, "training.optimizer sgd is not adam/adamw"),
    ],
)
def test_a_blocked_graph_leaves_the_eager_optimizer_and_says_why(
    kw: dict[str, object], why: str
) -> None:
    shape = _shape(CUDA, compile=True, **kw)
    assert not shape.graph and not shape.compiled_update and shape.why_eager.startswith(why)
    assert shape.kernel == OptimizerKernel(fused=True)


def test_the_compile_cache_is_off_by_default_for_a_compiled_cuda_step() -> None:
    """An AOTAutograd cache entry loaded by a multi-GPU run made its step up to 2.5× slower
    (benchmarks/RESULTS.md): auto keeps a compiled CUDA step off the cache, a CPU one on."""

    def cache(device: str, compile: bool = True, mode: str = "auto") -> str:
        dev = torch.device(device)
        plan = StepPlan(
            device=dev,
            precision="bf16",
            compile=compile,
            cuda_graphs=True,
            variants=StepVariants(),
            plan=StepPlanParameters(compile_cache=mode),  # type: ignore[arg-type]
            options=forward_options(StepVariants(), torch.device("cpu"), "bf16"),
            host_memory=HostMemory(False, "left alone"),
        )
        return _choice_text(plan.compile_cache_blocker())

    assert (
        cache("cuda")
        == "off (auto: a compiled CUDA step, measured slower when loaded from the cache)"
    )
    assert cache("cuda", mode="on") == "on"
    assert cache("cpu") == "on"
    assert cache("cpu", mode="off") == "off (training.step_plan.compile_cache is off)"
    assert cache("cuda", compile=False, mode="on") == "off (training.compile is false)"


def _choice_text(why_not: str) -> str:
    return f"off ({why_not})" if why_not else "on"


def test_the_autograd_cache_switch_reaches_torch() -> None:
    import torch._functorch.config as aot_config

    from reagent_lite.torch_private import set_autograd_cache

    before = aot_config.enable_autograd_cache
    try:
        assert set_autograd_cache(False) is True
        assert aot_config.enable_autograd_cache is False
        assert set_autograd_cache(True) is True
        assert aot_config.enable_autograd_cache is True
    finally:
        aot_config.enable_autograd_cache = before


def test_a_graph_is_not_planned_for_an_optimizer_built_for_eager_steps() -> None:
    """`build_step_runner` without the plan's shape (tests, tools): the trainer's optimizer
    was built with the eager kernel, so a planned graph would fail to capture; the step
    stays eager and says why."""
    from reagent_lite.training.steps import fit_to_optimizer

    cuda = torch.device("cuda")
    planned = step_shape(
        cuda,
        cuda_graphs=True,
        compile=True,
        world_size=2,
        backend="nccl",
        optimizer="adam",
        data_parallel=False,
    )
    assert planned.graph and planned.average_in_graph and planned.compiled_update
    assert fit_to_optimizer(planned, capturable=True, device=cuda) == planned
    eager = fit_to_optimizer(planned, capturable=False, device=cuda)
    assert not (eager.graph or eager.average_in_graph or eager.compiled_update)
    assert "built for eager steps" in eager.why_eager
    assert eager.kernel == OptimizerKernel.eager(cuda)
