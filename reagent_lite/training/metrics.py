"""metrics.jsonl (one JSON record per line) and, when the config asks, TensorBoard."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reagent_lite.errors import ConfigError
from reagent_lite.io_utils import atomic_write_text, check_owner

if TYPE_CHECKING:
    from reagent_lite.training.tracking import MlflowTracker

log = logging.getLogger(__name__)


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf; write them as null so every line stays valid JSON.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


class MetricsWriter:
    """Appends records to `metrics.jsonl`; mirrors scalars to TensorBoard when asked."""

    def __init__(
        self,
        output_dir: Path,
        *,
        tensorboard: bool = False,
        append: bool = False,
        tracker: MlflowTracker | None = None,
    ):
        self.output_dir = output_dir
        self.tracker = tracker
        self.path = output_dir / "metrics.jsonl"
        output_dir.mkdir(parents=True, exist_ok=True)
        if not append:
            check_owner(self.path)
            self.path.write_text("")
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(output_dir / "tensorboard"))
            except ImportError as err:
                raise ConfigError(
                    "tensorboard: true needs the tensorboard package (pip install "
                    f"'reagent-lite[tensorboard]'): {err}"
                ) from None

    def write(self, record: dict[str, Any]) -> None:
        check_owner(self.path)  # a run taken over while paused appends nothing
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(_clean(record), sort_keys=True) + "\n")
        except OSError as err:  # named, for the loop's one-line error
            raise OSError(err.errno, err.strerror or str(err), str(self.path)) from err
        if self._tb is not None:
            step = int(record.get("steps", 0))
            for key, value in _flatten(record):
                if isinstance(value, int | float) and key not in ("steps", "epoch"):
                    self._tb.add_scalar(key, value, step)
        if self.tracker is not None:
            self.tracker.log_record(record)

    def outputs_written(self) -> None:
        """The run's outputs are complete: trackers publish them."""
        if self.tracker is not None:
            self.tracker.log_outputs(self.output_dir)

    def drop_after(self, epoch: int, steps: int | None = None) -> None:
        """Forgets records of epochs after `epoch` and, given `steps`, of steps after it
        (written before a crash, not in the checkpoint a resumed run continues from): they
        are about to be written again."""
        if not self.path.is_file():
            return
        keep = [
            r
            for r in read_metrics(self.path)
            if int(r.get("epoch", -1)) <= epoch
            and (steps is None or int(r.get("steps", 0)) <= steps)
        ]
        atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self.tracker is not None:
            self.tracker.close()


def _flatten(record: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.extend(_flatten(value, f"{name}/"))
        else:
            out.append((name, value))
    return out


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
