"""What a run carries from one epoch to the next, as one typed record.

`TrainState` is the whole of it: the epoch to train next, the optimizer steps so far, the
epochs' records, model selection's best and — for a run resumed from a mid-epoch
checkpoint — where that epoch goes on. The loop holds the only copy; epoch-end, the
checkpoints and `--resume` take a state and hand back a new one (frozen: nobody changes it
behind the loop's back). The networks and optimizer are *not* here: they are what setup
built (`run.Run`), updated in place by the optimizer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from torch import Tensor

# One epoch's metrics.jsonl record: JSON values (numbers, flags, the CPE estimates' dicts).
EpochRecord = dict[str, Any]
# A mid-epoch checkpoint's position: steps done, world size, every rank's RNG and loss sum
# (preemption.py writes and reads it).
Position = dict[str, Any]


@dataclass(frozen=True)
class Best:
    """Model selection's choice so far: the epoch, its score (lower is better) and the
    model's state on the CPU (None before the first epoch)."""

    epoch: int = -1
    score: float = math.inf
    state: dict[str, Tensor] | None = None

    def to_checkpoint(self) -> dict[str, Any]:
        # The checkpoint format predates this class: a plain dict.
        return {"epoch": self.epoch, "score": self.score, "state": self.state}

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any]) -> Best:
        return cls(int(saved["epoch"]), float(saved["score"]), saved["state"])


@dataclass(frozen=True)
class TrainState:
    epoch: int = 0  # the epoch to train next
    global_step: int = 0  # optimizer steps taken by the run so far
    history: tuple[EpochRecord, ...] = ()
    best: Best = field(default_factory=Best)
    position: Position | None = None  # resumed mid-epoch: where `epoch` goes on

    def after_epoch(self, steps: int, record: EpochRecord, best: Best) -> TrainState:
        """The state once epoch `self.epoch` has finished with `steps` steps in all."""
        return replace(
            self,
            epoch=self.epoch + 1,
            global_step=steps,
            history=(*self.history, record),
            best=best,
            position=None,
        )

    @property
    def diverged_at(self) -> int | None:
        """The first epoch whose record flags `q_diverging` (divergence.py), or None."""
        return next((r["epoch"] for r in self.history if r.get("q_diverging")), None)
