"""Will the network and one training step fit? Checked before anything is allocated.

Each setting is bounded in the config models, but their product is not: a wide network
times a large minibatch can ask for terabytes, and growing into that on a shared node
invites the OOM killer to take someone else's job. The estimate is deliberately rough
(a lower bound of what a step holds), enough to refuse what cannot fit with a message
that names the settings, never to refuse what can.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import torch

from reagent_lite.config import WorkflowConfig
from reagent_lite.errors import ConfigError
from reagent_lite.kinds import FeatureSpace

_FLOAT = 4  # bytes


def step_bytes(cfg: WorkflowConfig, in_width: int, space: FeatureSpace) -> int:
    """Parameters with their gradients, Adam moments and target copy, plus the
    activations of one micro-batch through the online and target networks."""
    t = cfg.training
    widths = [in_width, *(w for w in t.layers[1:-1] if w > 0), space.q_outputs()]
    params = sum(a * b + b for a, b in pairwise(widths))
    rows = t.minibatch_size * space.rows_per_state()
    activations = rows * sum(widths) * 3  # online forward + backward, target forward
    return (params * 5 + activations) * _FLOAT


def available_bytes(device: torch.device) -> int | None:
    """Free memory of `device` (host: MemAvailable); None when unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(
    cfg: WorkflowConfig, in_width: int, space: FeatureSpace, device: torch.device
) -> None:
    """`ConfigError` when the estimate exceeds the memory the device has free."""
    need, have = step_bytes(cfg, in_width, space), available_bytes(device)
    if have is not None and need > have:
        t = cfg.training
        raise ConfigError(
            f"training.minibatch_size ({t.minibatch_size}) and training.layers "
            f"({list(t.layers)}) need at least {need / 2**30:.1f} GiB for the network and one "
            f"step on {device}, which has {have / 2**30:.1f} GiB free: use a smaller "
            "minibatch or narrower layers"
        )
