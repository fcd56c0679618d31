"""`training.precision`: the arithmetic a training step runs in, as one context manager.

* fp32: nothing changes.
* tf32: float32 matrix products on TensorFloat-32 tensor cores (10-bit mantissa inputs,
  float32 accumulation). A CUDA setting only: a CPU step stays fp32.
* bf16: the forward passes under bfloat16 autocast. Weights, gradients and optimizer
  state stay float32 (autocast casts a copy per use), and the losses are float32 because
  autocast runs mse / smooth-L1 / logsumexp in float32. The cast cache is off: a cached
  copy would outlive a CUDA graph's capture. (A compiled last layer of up to 4 outputs, a
  product and a sum with the float32 weight, gives float32 where the linear layer gives
  bf16.)

With tf32 a compiled CUDA step pads a first layer's rows to 16 bytes (not with bf16, where
it gained under 5%): the step plan decides it from the precision (`compiled.forward_options`), not from these settings,
which a trace cannot read.

Only the step is affected: evaluation, CPE and the exported model read the float32
weights in float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from reagent_lite.config.models import Precision

PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16")


@contextlib.contextmanager
def step_precision(precision: Precision, device: torch.device) -> Iterator[None]:
    """Runs the enclosed step in `precision` on `device`; restores the settings after."""
    if precision == "fp32":
        yield
    elif precision == "tf32":
        if device.type != "cuda":
            yield
            return
        matmul = torch.backends.cuda.matmul
        before = matmul.fp32_precision
        matmul.fp32_precision = "tf32"
        try:
            yield
        finally:
            matmul.fp32_precision = before
    elif precision == "bf16":
        with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False):
            yield
    else:
        raise ValueError(f"unknown precision {precision!r}; expected one of {list(PRECISIONS)}")
