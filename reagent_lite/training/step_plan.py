"""The step plan: every speed choice of a run's training step, decided once and named.

`build_step_runner` (`steps.py`) decides the step from the config, the device and the
precision; `StepPlan` keeps what it was asked and decided from, and `choices` names, for
each choice, what the step actually does: "on", or "off (why)" — precision, compile, the
CUDA graph, the three traced forms of `training.step_variants`, the compile cache and host
memory reuse of `training.step_plan`, and the state of TF32 products. The
`training step:` log line ends with them, and the first epoch record a run writes to
metrics.jsonl holds them as `step_plan`, so that a run says what it ran.

`auto` falls back silently (the record says why); a choice asked `on` and not taken is a
warning naming why (`unmet`): the run still trains, on the plain path, since a speed-up
never changes what is learnt, and a config stays portable between a GPU and a laptop.

The environment switch of earlier releases (`REAGENT_LITE_KEEP_FREED_MEMORY=0`) is read
here and nowhere else (`asked`): it turns an `auto` choice off, with a deprecation warning.
(`REAGENT_LITE_P2P_ALLREDUCE` is no longer read: the sum it switched off was removed, so
its one effect, NCCL's all-reduce, is what every run does.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from reagent_lite.config.models import Precision, StepPlanParameters, StepVariants
from reagent_lite.models.traced import ForwardOptions
from reagent_lite.trainers.optim import OptimizerKernel
from reagent_lite.training.compiled import BF16_NOT_PADDED, SUM_OUTPUTS
from reagent_lite.training.host_memory import HostMemory

log = logging.getLogger("reagent_lite")

# The deprecated switches, by the `training.step_plan` key each one maps onto.
DEPRECATED_ENV = {"keep_freed_memory": "REAGENT_LITE_KEEP_FREED_MEMORY"}
_OFF_WORDS = ("0", "false", "no", "off")
VARIANTS = "training.step_variants"
PLAN = "training.step_plan"


def asked(
    params: StepPlanParameters, env: Mapping[str, str] | None = None, *, warn: bool = True
) -> StepPlanParameters:
    """`training.step_plan` with the deprecated environment switches mapped onto it: "0"
    (or false / no / off) turns an `auto` choice off; a choice the config sets to `on` or
    `off` is the config's. `warn`: say so (rank 0; every rank maps the same way)."""
    env = os.environ if env is None else env
    changes: dict[str, str] = {}
    for key, name in DEPRECATED_ENV.items():
        value = env.get(name)
        if value is None:
            continue
        now = getattr(params, key)
        off = value.strip().lower() in _OFF_WORDS
        if off and now == "auto":
            changes[key] = "off"
        if warn:
            if key in changes:
                effect = f"read as {PLAN}.{key}: off"
            elif off:
                effect = f"ignored: the config sets {PLAN}.{key} to {now}"
            else:
                effect = "ignored: only 0, false, no or off ever had an effect"
            log.warning(
                "%s=%s is deprecated and will be removed: set %s.%s in the config instead "
                "(auto, on or off); %s",
                name,
                value,
                PLAN,
                key,
                effect,
            )
    return params.model_copy(update=changes) if changes else params


@dataclass(frozen=True)
class StepShape:
    """What the step is built for, decided once (`step_shape`) from the config, the device
    and the ranks, before the trainers' optimizers are built: `graph`, the step is built
    to be captured (else `why_eager`, when a graph was asked on CUDA; a capture that fails
    later leaves the step eager, built as it is); `compiled_update`, the optimizer steps
    compiled (`training.compile`, under a graph only: `compiled.py` says why);
    `average_in_graph`, the step averages the gradients over the ranks itself (a graph
    cannot hold DDP's hooks), else DDP's hooks do; `kernel`, how Adam is built."""

    graph: bool
    why_eager: str
    compiled_update: bool
    average_in_graph: bool
    kernel: OptimizerKernel


def graph_blocker(*, data_parallel: bool, world_size: int, backend: str, optimizer: str) -> str:
    """Why a step cannot be captured ("" when it can): `data_parallel`, the network is
    wrapped by DataParallel; `backend`, the process group's; `optimizer`,
    `training.optimizer`."""
    if data_parallel:
        return "the network is wrapped by DataParallel (its steps run eagerly)"
    if world_size > 1 and backend != "nccl":
        return f"DDP over {backend}: only NCCL all-reduces can be captured"
    if optimizer not in ("adam", "adamw"):
        return f"training.optimizer {optimizer} is not adam/adamw"
    return ""


def step_shape(
    device: torch.device,
    *,
    cuda_graphs: bool,
    compile: bool,
    world_size: int,
    backend: str,
    optimizer: str,
    data_parallel: bool,
) -> StepShape:
    """The shape of a run's step (`StepShape`): a pure function of the config
    (`cuda_graphs`, `training.compile`, `training.optimizer`), the device and the ranks."""
    wants_graph = cuda_graphs and device.type == "cuda"
    why_eager = (
        graph_blocker(
            data_parallel=data_parallel, world_size=world_size, backend=backend, optimizer=optimizer
        )
        if wants_graph
        else ""
    )
    graph = wants_graph and not why_eager
    compiled_update = graph and compile
    if graph:
        # Capturable, the lr a tensor the graph reads; Inductor fuses the multi-tensor
        # form, torch's fused kernel is opaque to it.
        kernel = OptimizerKernel(
            fused=not compiled_update, foreach=compiled_update, capturable=True, tensor_lr=True
        )
    else:
        kernel = OptimizerKernel.eager(device)
    return StepShape(graph, why_eager, compiled_update, graph and world_size > 1, kernel)


@dataclass(frozen=True)
class StepPlan:
    """What the step plan was asked (`variants`, `plan`: the config, the deprecated
    switches mapped on) and the facts it decided from; `options`: the forms it traces."""

    device: torch.device
    precision: Precision
    compile: bool
    cuda_graphs: bool
    variants: StepVariants
    plan: StepPlanParameters
    options: ForwardOptions
    host_memory: HostMemory

    def choices(
        self,
        net: nn.Module,
        *,
        compile_failed: str,
        graph: bool,
        why_eager: str,
    ) -> dict[str, str]:
        """Each choice the step took, "on" or "off (why)" (TF32 and precision: the state).
        `net`: the Q-network the forms are traced in; `compile_failed`: why the compiled
        loss fell back, if it did; `graph`: the step was captured, else `why_eager`."""
        no_compile = "training.compile is false" if not self.compile else compile_failed
        out = {
            "precision": self.precision,
            "compile": _choice(no_compile),
            "graph": _choice(self._graph_blocker(graph, why_eager)),
        }
        applies = self.options.applies(net)
        for key in ("output_sum", "pad_first_layer", "candidate_kernel"):
            why = no_compile or self._form_blocker(key) or ("" if applies[key] else _NA[key])
            out[key] = _choice(why)
        out["compile_cache"] = _choice(self.compile_cache_blocker())
        out["keep_freed_memory"] = self.host_memory.plan()
        out["tf32"] = self._tf32()
        return out

    def unmet(self, choices: Mapping[str, str]) -> list[str]:
        """A warning for each choice asked `on` that was not taken (host memory warns when
        it is set up: `host_memory.keep_freed_memory`)."""
        asks = {
            f"{VARIANTS}.pad_first_layer": ("pad_first_layer", self.variants.pad_first_layer),
            f"{VARIANTS}.candidate_kernel": ("candidate_kernel", self.variants.candidate_kernel),
        }
        return [
            f"{name} is on but not taken: {choices[key][len('off (') : -1]}; the plain path runs"
            for name, (key, mode) in asks.items()
            if mode == "on" and choices[key] != "on"
        ]

    def compile_cache_blocker(self) -> str:
        """Why a compiled step does not use AOTAutograd's on-disk cache ("" when it does:
        `training.step_plan.compile_cache`, RESULTS.md says what auto is measured on)."""
        if not self.compile:
            return "training.compile is false"
        mode = self.plan.compile_cache
        if mode == "off":
            return f"{PLAN}.compile_cache is off"
        if mode == "auto" and self.device.type == "cuda":
            return "auto: a compiled CUDA step, measured slower when loaded from the cache"
        return ""

    def _graph_blocker(self, graph: bool, why_eager: str) -> str:
        if self.device.type != "cuda":
            return "no CUDA"
        if not self.cuda_graphs:
            return "cuda_graphs is false"
        return "" if graph else why_eager or "not captured yet"

    def _form_blocker(self, key: str) -> str:
        """Why the config, device or precision keep the form `key` out of the trace."""
        mode: str = getattr(self.variants, key)
        if mode == "off":
            return f"{VARIANTS}.{key} is off"
        cuda = self.device.type == "cuda"
        if key == "pad_first_layer":
            if self.precision == "bf16":
                return BF16_NOT_PADDED
            if mode == "auto" and not cuda:
                return "no CUDA"
            if not self.options.row_align:
                return f"{self.precision} products on {self.device.type} are IEEE float32"
        if key == "candidate_kernel" and not self.options.candidate_kernel:
            return "no CUDA" if not cuda else "Triton is not installed"
        return ""

    def _tf32(self) -> str:
        if self.device.type != "cuda":
            return "off (no CUDA: CPU float32 products are IEEE)"
        if self.precision == "tf32":
            return "on (training.precision tf32)"
        if torch.backends.cuda.matmul.fp32_precision == "tf32":
            return "on (set in torch outside reagent-lite)"
        return "off (IEEE float32 products)"


# Why a form the config and device allow changes nothing in the network.
_NA = {
    "output_sum": f"no output layer of at most {SUM_OUTPUTS} outputs",
    "pad_first_layer": "the first layer's rows are aligned already",
    "candidate_kernel": "no parametric candidate layer the kernel fits",
}


def _choice(why_not: str) -> str:
    return f"off ({why_not})" if why_not else "on"


def plan_text(choices: Mapping[str, str]) -> str:
    """The choices as the end of the `training step:` line."""
    return "plan: " + ", ".join(f"{key} {value}" for key, value in choices.items())
