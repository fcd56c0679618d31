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
from torch import Tensor


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


def symmetric_empty(numel: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A flat buffer in symmetric memory (`torch.distributed._symmetric_memory.empty`), to be
    mapped into the peers' address spaces by `symmetric_rendezvous`. Raises `RuntimeError`
    when this torch has no symmetric memory."""
    try:
        import torch.distributed._symmetric_memory as symm
    except ImportError as err:  # pragma: no cover - built without distributed
        raise RuntimeError(f"no symmetric memory in torch {torch.__version__}") from err
    buf: Tensor = symm.empty(numel, dtype=dtype, device=device)
    return buf


def symmetric_rendezvous(buf: Tensor) -> None:
    """Maps every rank's `symmetric_empty` buffer into every other rank's address space: a
    collective over the default group (the same size and dtype on every rank)."""
    import torch.distributed._symmetric_memory as symm

    group = dist.group.WORLD
    assert group is not None
    enable = getattr(symm, "enable_symm_mem_for_group", None)
    if enable is not None:  # required before torch 2.9; deprecated (still harmless) after
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(group.group_name)
    symm.rendezvous(buf, group.group_name)


def one_shot_sum(buf: Tensor, out: Tensor) -> Tensor:
    """out ← the sum over the default group's ranks of their `buf` (a symmetric buffer),
    one kernel that reads every peer's buffer over NVLink (`torch.ops.symm_mem.
    one_shot_all_reduce_out`). Every rank adds the ranks' values in rank order, so every
    rank gets the same bits. Capturable in a CUDA graph."""
    group = dist.group.WORLD
    assert group is not None
    result: Tensor = torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group.group_name, out)
    return result


def has_one_shot_sum() -> bool:
    """Whether this torch build has `one_shot_sum`'s operator."""
    try:
        return hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out")
    except (AttributeError, RuntimeError):  # pragma: no cover - no symm_mem namespace
        return False


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
