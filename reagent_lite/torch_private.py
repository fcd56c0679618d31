"""Every use of a private (underscored) torch API in the package, in one place.

`pyproject.toml` admits the torch versions CI and the GPU machines test; each function
here says what it relies on and, where a public equivalent exists, falls back to it when
torch lacks the private one, so a torch release that renames one of these is found here,
not all over the package. (Developer tools in `benchmarks/` may use more.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor


def foreach_lerp_(targets: Sequence[Tensor], sources: Sequence[Tensor], weight: float) -> None:
    """targets[i] ← targets[i] + weight·(sources[i] − targets[i]), in place: one multi-tensor
    kernel (`torch._foreach_lerp_`) instead of a loop of `lerp_` calls."""
    fn = getattr(torch, "_foreach_lerp_", None)
    if fn is not None:
        fn(list(targets), list(sources), weight)
        return
    for t, s in zip(targets, sources, strict=True):
        t.lerp_(s, weight)


def foreach_copy_(targets: Sequence[Tensor], sources: Sequence[Tensor]) -> None:
    """targets[i].copy_(sources[i]) as one multi-tensor kernel (`torch._foreach_copy_`);
    plain copies inside a CUDA graph too."""
    fn = getattr(torch, "_foreach_copy_", None)
    if fn is not None:
        fn(list(targets), list(sources))
        return
    for t, s in zip(targets, sources, strict=True):
        t.copy_(s)


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
