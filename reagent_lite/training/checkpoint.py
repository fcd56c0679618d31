"""Per-epoch checkpoints: everything needed to continue a run exactly where it stopped."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from reagent_lite.io_utils import atomic_write

_NAME = re.compile(r"^epoch_(\d+)\.pt$")


def checkpoint_dir(output_dir: Path) -> Path:
    return output_dir / "checkpoints"


def save_checkpoint(output_dir: Path, epoch: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Writes `checkpoints/epoch_<n>.pt` atomically and prunes all but the newest `keep`."""
    directory = checkpoint_dir(output_dir)
    path = directory / f"epoch_{epoch:05d}.pt"
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    for old in list_checkpoints(output_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(output_dir: Path) -> list[Path]:
    directory = checkpoint_dir(output_dir)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    # Our own files hold optimizer state and RNG states (numpy arrays, tuples), so the
    # restricted weights-only unpickler is too strict for them.
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return state
