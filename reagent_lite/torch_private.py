"""Every use of a private (underscored) torch API in the package, in one place.

`pyproject.toml` admits the torch versions CI and the GPU machines test; each function
here says what it relies on and, where a public equivalent exists, falls back to it when
torch lacks the private one, so a torch release that renames one of these is found here,
not all over the package. (Developer tools in `benchmarks/` may use more.)
"""

from __future__ import annotations

import importlib

import torch
import torch.distributed as dist


def silence_capturable_warning(optimizer: torch.optim.Optimizer) -> None:
    """A capturable optimizer stepped outside a CUDA graph warns once; the step runner does
    that on purpose (warm-up steps, the eager fallback), so mark it as warned already.
    Without the flag (another torch) the cost is one warning, nothing else."""
    optimizer._warned_capturable_if_run_uncaptured = True


def abort_process_groups() -> None:
    """Aborts every process group without waiting for peers and unregisters them, so this
    process could initialise a new one (torch's `_abort_process_group`); where torch lacks
    it, aborts the default group."""
    abort_all = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort_all is not None:
        abort_all()
    else:
        dist.group.WORLD.abort()  # type: ignore[union-attr]


def set_autograd_cache(enabled: bool) -> bool:
    """Turns AOTAutograd's on-disk cache of compiled forward/backward graphs on or off for
    this process (`torch._functorch.config.enable_autograd_cache`, read when a function is
    first compiled). False when this torch has no such switch (nothing to turn off)."""
    try:
        config = importlib.import_module("torch._functorch.config")
    except ImportError:
        return False
    if not hasattr(config, "enable_autograd_cache"):
        return False
    setattr(config, "enable_autograd_cache", enabled)  # noqa: B010 (torch's config module)
    return True
