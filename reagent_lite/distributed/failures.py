"""How a failed collective shows itself, in one place for every module that runs one."""

from __future__ import annotations

import torch.distributed as dist


def is_collective_error(err: BaseException) -> bool:
    """True for the error a failed collective raises (a peer died, a timeout): the
    launcher's to report, not a problem of the code that called the collective."""
    return isinstance(err, dist.DistError)
