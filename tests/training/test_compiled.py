"""`training/compiled.py`'s `CompiledApply` on the CPU (on CUDA it runs inside the captured
graph: `test_precision.py`'s gpu tests): the compiled optimizer step and soft target
update train what the eager ones train, and a compile failure falls back to them, with
the optimizer as the step plan built it (multi-tensor Adam: nothing switches it)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from reagent_lite.config import DQNWorkflowConfig, config_from_dict
from reagent_lite.config.models import Precision, StepVariants
from reagent_lite.errors import ConfigError
from reagent_lite.models import ParametricQNetwork, build_q_network, candidate_layer
from reagent_lite.models.bcq import BCQQNetwork
from reagent_lite.models.traced import ForwardOptions, TracedMLP
from reagent_lite.trainers import DQNHyperParams, ParametricDQNTrainer
from reagent_lite.trainers.common import DQNLoss
from reagent_lite.trainers.dqn import DQNTrainer
from reagent_lite.trainers.optim import OptimizerKernel
from reagent_lite.training.compiled import (
    CompiledApply,
    CompiledLoss,
    forward_options,
    traced_view,
)
from reagent_lite.training.sources import LazyBatch
from tests.config.conftest import minimal_dqn
from tests.trainers.helpers import random_discrete_batch, random_parametric_batch, train_step

# What the step plan builds Adam as for a compiled update (on CUDA capturable too).
MULTI_TENSOR = OptimizerKernel(foreach=True)


def _pair() -> tuple[DQNTrainer, DQNTrainer]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3))
    hp = DQNHyperParams(learning_rate=1e-2, target_update_rate=0.1, l2_decay=1e-3)
    eager = DQNTrainer(copy.deepcopy(net), hp, n_actions=3)
    other = DQNTrainer(copy.deepcopy(net), hp, n_actions=3)
    for trainer in (eager, other):
        trainer.build_optimizer(MULTI_TENSOR)
    return eager, other


def _kernel(trainer: DQNTrainer) -> tuple[bool, bool]:
    group = trainer.optimizer.param_groups[0]
    return bool(group["fused"]), bool(group["foreach"])


def _train(trainer: DQNTrainer, apply: CompiledApply | None, steps: int = 6) -> None:
    torch.manual_seed(1)
    for _ in range(steps):
        train_step(trainer, [random_discrete_batch(32, 4, 3)], apply=apply)


def _weights(trainer: DQNTrainer) -> list[torch.Tensor]:
    return [p.detach() for net in trainer.modules() for p in net.parameters()]


def test_compiled_update_trains_what_the_eager_update_trains() -> None:
    eager, compiled = _pair()
    apply = CompiledApply(compiled.optimizer, compiled.apply_update, "optimizer step")
    _train(eager, None)
    _train(compiled, apply)
    assert not apply.failed and apply.compile_s > 0
    assert apply.describe() == "optimizer step compiled"
    for a, b in zip(_weights(eager), _weights(compiled), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)  # online and target nets


def test_a_compile_failure_falls_back_to_the_eager_update_with_the_optimizer_as_built() -> None:
    import torch._inductor.config as inductor

    eager, other = _pair()
    with inductor.patch({"cpp.cxx": (None, "/nonexistent/c++")}):  # no working compiler
        torch._dynamo.reset()
        apply = CompiledApply(other.optimizer, other.apply_update, "optimizer step")
        _train(other, apply)
    torch._dynamo.reset()
    assert apply.describe().startswith("optimizer step eager, optimizer as built (compile failed: ")
    assert _kernel(other) == (False, True)  # not switched: multi-tensor Adam runs eagerly
    _train(eager, None)
    for a, b in zip(_weights(eager), _weights(other), strict=True):
        assert torch.equal(a, b)


def test_give_up_means_the_eager_update_from_then_on() -> None:
    eager, other = _pair()
    apply = CompiledApply(other.optimizer, other.apply_update, "optimizer step")
    apply.give_up("the step is not captured")
    assert _kernel(other) == (False, True)
    assert apply.describe() == "optimizer step eager, optimizer as built (the step is not captured)"
    _train(other, apply)
    _train(eager, None)
    assert apply.compile_s == 0.0  # never compiled
    for a, b in zip(_weights(eager), _weights(other), strict=True):
        assert torch.equal(a, b)


def _agree_worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    from reagent_lite.data.sampler import EpochSampler
    from reagent_lite.distributed.context import DistContext
    from reagent_lite.training.graphs import GraphStep
    from reagent_lite.training.sources import ResidentRows
    from reagent_lite.training.update import Averaging, StepKernels, build_update

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        ctx = DistContext(
            rank=rank, world_size=2, local_rank=rank, node_index=0, procs_per_node=2,
            device=torch.device("cpu"), backend="gloo",
        )  # fmt: skip
        trainer = _pair()[0]
        apply = CompiledApply(trainer.optimizer, trainer.apply_update, "optimizer step")
        if rank == 1:  # this rank's compilation "failed"
            apply.give_up("compile failed: simulated")
        update = build_update(
            trainer,
            None,
            torch.zeros(()),
            precision="fp32",
            kernels=StepKernels(apply=apply),
            averaging=Averaging(ctx),
        )
        source = ResidentRows(
            {"state": torch.zeros(8, 4)}, None, EpochSampler(8, 4, 2, seed=0), 1, 2, 4
        )
        GraphStep(update, source, ctx)._agree_on_compiled_updates()
        torch.save((apply.failed, _kernel(trainer)), f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_ranks_agree_to_run_the_eager_update_when_one_rank_failed_to_compile(
    tmp_path: Path,
) -> None:
    """Over several ranks the optimizer arithmetic must be the same on all: one rank's
    compile failure turns every rank's update eager before capture (the optimizer as
    built: multi-tensor Adam on every rank)."""
    import torch.multiprocessing as mp

    init = (tmp_path / "store").as_uri()
    mp.start_processes(_agree_worker, args=(init, str(tmp_path)), nprocs=2, start_method="spawn")
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert got == [
        ("compile failed on another rank", (False, True)),
        ("compile failed: simulated", (False, True)),
    ]


def _traced_code(call: Callable[[], Any]) -> str:
    """The code of the graphs Dynamo traces while `call` runs (torch's `graph_code` log)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    torch._logging.set_logs(graph_code=True)
    try:
        call()
    finally:
        torch._logging.set_logs()
        logger.removeHandler(handler)
    return "\n".join(lines)


@pytest.mark.parametrize("kind", ["dqn", "parametric_dqn"])
def test_a_compiled_loss_traces_the_last_layer_as_a_sum(kind: str) -> None:
    """`CompiledLoss`: the Q-network's thin last layer (dqn's 3 actions, the parametric
    network's one output) is traced as a product and a sum; the loss is the eager one."""
    torch.manual_seed(0)
    trainer: DQNTrainer | ParametricDQNTrainer
    if kind == "dqn":
        trainer = DQNTrainer(
            build_q_network(
                in_dim=4, n_actions=3, layers=[-1, 16, -1], activations=["relu", "linear"]
            ),
            DQNHyperParams(double_q_learning=True),
            n_actions=3,
        )
        fields = vars(random_discrete_batch(32, 4, 3))
    else:
        net = ParametricQNetwork(4, 3, [-1, 16, -1], ["relu", "linear"])
        trainer = ParametricDQNTrainer(net, DQNHyperParams(double_q_learning=True))
        fields = vars(random_parametric_batch(32, 4, 3, 5))
    loss = CompiledLoss(trainer, forward_options(StepVariants(), torch.device("cpu"), "fp32"))
    torch._dynamo.reset()
    got: list[DQNLoss] = []
    code = _traced_code(
        lambda: got.append(loss(LazyBatch(fields, torch.arange(32)), trainer.online))
    )
    assert not loss.failed and "in _from" in code, code[-2000:]
    assert "layer.weight).sum(-1)" in code, code[-2000:]
    want = trainer.compute_loss(LazyBatch(fields, torch.arange(32)))
    torch.testing.assert_close(got[0].total, want.total, rtol=1e-5, atol=1e-6)


def test_the_step_log_names_the_forms_traced() -> None:
    """The compiled loss's part of the `training step:` line names the forms its networks
    trace, and none where `training.step_variants` turns them off."""
    net = ParametricQNetwork(4, 3, [-1, 16, -1], ["relu", "linear"])
    trainer = ParametricDQNTrainer(net, DQNHyperParams())
    cpu = torch.device("cpu")
    loss = CompiledLoss(trainer, forward_options(StepVariants(), cpu, "fp32"))
    assert loss.describe() == "loss compiled by Inductor (output layer as a product and a sum)"
    off = forward_options(StepVariants(output_sum="off"), cpu, "fp32")
    assert off == ForwardOptions()
    assert CompiledLoss(trainer, off).describe() == "loss compiled by Inductor (plain forward)"
    padded = forward_options(StepVariants(candidate_kernel="off"), torch.device("cuda"), "tf32")
    assert CompiledLoss(trainer, padded).describe() == (
        "loss compiled by Inductor (first layer padded to 16 bytes, "
        "output layer as a product and a sum)"
    )


@pytest.mark.parametrize(
    ("variants", "device", "precision", "row_align"),
    [
        ({}, "cuda", "tf32", 4),  # 16 bytes of float32 on TF32 cores
        ({"pad_first_layer": "on"}, "cuda", "tf32", 4),
        ({}, "cuda", "fp32", 0),  # IEEE products keep their maths
        ({}, "cuda", "bf16", 0),  # measured under 5% faster padded
        ({"pad_first_layer": "on"}, "cuda", "bf16", 0),
        ({"pad_first_layer": "on"}, "cpu", "bf16", 0),
        ({"pad_first_layer": "on"}, "cpu", "tf32", 0),  # a CPU step in tf32 is IEEE fp32
        ({"pad_first_layer": "off"}, "cuda", "tf32", 0),
    ],
)
def test_the_plan_pads_for_tensor_core_products_as_configured(
    variants: dict[str, str], device: str, precision: Precision, row_align: int
) -> None:
    options = forward_options(StepVariants(**variants), torch.device(device), precision)  # type: ignore[arg-type]
    assert options.row_align == row_align


def test_the_plan_sums_thin_outputs_and_takes_the_kernel_where_triton_runs() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert forward_options(StepVariants(), cpu, "fp32").sum_outputs == 4
    assert forward_options(StepVariants(output_sum="off"), cpu, "fp32").sum_outputs == 0
    assert not forward_options(StepVariants(), cpu, "fp32").candidate_kernel
    triton = candidate_layer.triton is not None
    assert forward_options(StepVariants(), cuda, "fp32").candidate_kernel == triton
    assert not forward_options(StepVariants(candidate_kernel="off"), cuda, "fp32").candidate_kernel


def test_a_bad_step_variant_is_a_config_error_naming_the_key() -> None:
    data = minimal_dqn()
    data["training"] = {"step_variants": {"output_sum": "on"}}
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, DQNWorkflowConfig, source="c.json")
    assert str(info.value) == (
        "c.json: training.step_variants.output_sum: input should be 'auto' or 'off' (got \"on\")"
    )
    assert info.value.exit_code == 2


def test_the_traced_view_swaps_the_trainers_networks_for_variants_and_keeps_its_own() -> None:
    """What the compiled loss traces `compute_loss` on: a copy of the trainer whose online,
    target and BCQ networks are variants over the same parameters (BCQ's is the online
    one's); the trainer itself keeps its plain networks."""

    def mlp() -> nn.Module:
        return build_q_network(
            in_dim=5, n_actions=3, layers=[-1, 8, -1], activations=["relu", "linear"]
        )

    trainer = DQNTrainer(BCQQNetwork(mlp(), mlp(), 0.3), DQNHyperParams(), n_actions=3)
    online, target = trainer.online, trainer.target
    view = traced_view(trainer, ForwardOptions(sum_outputs=4), {})
    assert trainer.online is online and trainer.target is target and trainer.bcq is online
    assert view.online is not online and view.target is not target
    assert view.bcq is view.online and view.q_net is view.online
    assert isinstance(view.online.q, TracedMLP)  # type: ignore[union-attr]
    assert {id(p) for p in view.online.parameters()} == {id(p) for p in online.parameters()}
    batch = random_discrete_batch(16, 5, 3)
    torch.testing.assert_close(view.compute_loss(batch).total, trainer.compute_loss(batch).total)
