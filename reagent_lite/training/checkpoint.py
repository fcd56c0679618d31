"""Per-epoch checkpoints: everything needed to continue a run exactly where it stopped;
reading them back (`--resume`) and warm-starting from a previous run's model state.

A checkpoint holds the Q-network, the trainer (target network, optimizer, scheduler), the
CPE side models, model selection's best so far, the metrics history and the feature space.
The sampler's index stream is a pure function of (seed, rank, epoch), so resuming at the
next epoch boundary needs nothing more than the epoch number.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reagent_lite.config.loader import REMOVED_KEYS
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError
from reagent_lite.evaluation.cpe_models import CpeModelTrainer
from reagent_lite.io_utils import atomic_write_bytes, serialized
from reagent_lite.safe_load import load_state
from reagent_lite.trainers.common import QLearningTrainer
from reagent_lite.training.graphs import plain_lr
from reagent_lite.training.inputs import Fingerprint, changes
from reagent_lite.training.ownership import config_diff, current_run_id

log = logging.getLogger("reagent_lite")

# epoch_<e>.pt: after epoch e; epoch_<e>_step_<s>.pt: after s steps of epoch e.
_NAME = re.compile(r"^epoch_(\d+)(?:_step_(\d+))?\.pt$")
_END = 1 << 62  # sorts an epoch's end after its mid-epoch checkpoints

# Config keys a resumed run may change: they do not change what is computed.
RESUMABLE_CHANGES = (
    "epochs",
    "rendezvous_timeout_s",
    "collective_timeout_s",
    "log_every_steps",
    "tensorboard",
    "mlflow",
    "checkpoint_every_epochs",
    "checkpoint_every_steps",
    "checkpoint_every_minutes",
    "stop_check_every_steps",
    "model_output_path",
    "init_method",
    # Where and whether row groups are prepared: the windows are the same bits either way.
    "stream_prepare",
    "stream_prepared_dir",
    # The compiled loss is the same maths (float rounding aside), not another model.
    "training.compile",
    # Whether a diverged run's model is written: resuming a finished run to export it.
    "training.export_diverged_model",
    # Whether a fresh run may replace a finished model: a resume replaces nothing.
    "overwrite",
)


def checkpoint_dir(output_dir: Path, run_id: str) -> Path:
    return output_dir / "checkpoints" / run_id


def save_checkpoint(
    output_dir: Path,
    run_id: str,
    epoch: int,
    state: dict[str, Any],
    keep: int = 3,
    step: int | None = None,
) -> Path:
    """Writes `checkpoints/<run_id>/epoch_<n>[_step_<s>].pt` durably and atomically, then
    prunes all but this run's newest `keep`."""
    name = f"epoch_{epoch:05d}.pt" if step is None else f"epoch_{epoch:05d}_step_{step:09d}.pt"
    path = checkpoint_dir(output_dir, run_id) / name
    atomic_write_bytes(path, serialized(lambda buf: torch.save(state, buf)))
    # Older ones go only now: the new one is on disk (atomic_write fsyncs it).
    for old in list_checkpoints(output_dir, run_id)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def _order(path: Path) -> tuple[int, int]:
    m = _NAME.match(path.name)
    assert m is not None
    return int(m.group(1)), int(m.group(2)) if m.group(2) else _END


def list_checkpoints(output_dir: Path, run_id: str | None = None) -> list[Path]:
    """The checkpoints of run `run_id` (default: the run recorded in run.json), oldest
    first."""
    run_id = run_id or current_run_id(output_dir)
    if run_id is None:
        return []
    directory = checkpoint_dir(output_dir, run_id)
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if _NAME.match(p.name)), key=_order)


def latest_checkpoint(output_dir: Path, run_id: str | None = None) -> Path | None:
    found = list_checkpoints(output_dir, run_id)
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    # Weights-only: a file someone else put in checkpoints/ must not run code. Everything
    # we write is tensors, numbers, strings and containers (RNG states as byte tensors).
    state: dict[str, Any] = load_state(path)
    return state


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two resolved configs, except those in
    `RESUMABLE_CHANGES` and keys a later version removed (`REMOVED_KEYS`: a checkpoint
    written before still records them, and they cannot be set now)."""
    return config_diff(saved, current, RESUMABLE_CHANGES + tuple(REMOVED_KEYS))


def run_state(
    *,
    epoch: int,
    global_step: int,
    q_net: nn.Module,
    trainer: QLearningTrainer[Any],
    cpe: CpeModelTrainer | None,
    best: dict[str, Any],
    history: list[dict[str, Any]],
    space: dict[str, Any],
    run_id: str,
    config: dict[str, Any],
    inputs: Fingerprint,
) -> dict[str, Any]:
    """What `save_checkpoint` writes after `epoch` (`space`: `FeatureSpace.to_json()`,
    `config`: the resolved config as JSON, `inputs`: what the run trains on)."""
    # Learning rates as floats even where a CUDA graph reads them from a tensor.
    trainer_state = trainer.state_dict()
    trainer_state["optimizer"] = plain_lr(trainer_state["optimizer"])
    cpe_state = None
    if cpe is not None:
        cpe_state = cpe.state_dict()
        cpe_state["optimizer"] = plain_lr(cpe_state["optimizer"])
    return {
        "epoch": epoch,
        "global_step": global_step,
        "q_net": q_net.state_dict(),
        "trainer": trainer_state,
        "cpe": cpe_state,
        "best": best,
        "history": history,
        "space": space,
        "run_id": run_id,
        "config": config,
        "inputs": inputs,
    }


@dataclass
class Resumed:
    """What a run continues from: the checkpoint of its last finished `epoch`."""

    path: Path
    epoch: int
    global_step: int
    best: dict[str, Any]
    history: list[dict[str, Any]]


def restore(
    ctx: DistContext,
    output_dir: Path,
    *,
    run_id: str,
    config: dict[str, Any],
    inputs: Fingerprint,
    space: dict[str, Any],
    q_net: nn.Module,
    trainer: QLearningTrainer[Any],
    cpe: CpeModelTrainer | None,
) -> tuple[Resumed, dict[str, Any]] | None:
    """Loads run `run_id`'s newest readable checkpoint into the networks, trainer and CPE
    models and returns it (None: there is none). A newest file that cannot be read is
    skipped with a warning for the one before; one made for another network, other
    features, a config that changes the maths (`config_changes`) or input files that
    changed since (`inputs.changes`) is a `ConfigError`."""
    # Rank 0 chooses and every rank loads that file: on NFS another node's cached
    # directory listing may not show the newest checkpoint yet, and replicas resumed
    # from different epochs would silently diverge (DDP only syncs at construction).
    path = ctx.broadcast_object(_newest_readable(output_dir, run_id) if ctx.is_rank_zero else None)
    if path is None:
        return None
    what = f"--resume: checkpoint {path}"
    state = read_state(path, what, "a checkpoint written by a reagent-lite run")
    if not isinstance(state, dict) or "space" not in state or "q_net" not in state:
        raise ConfigError(f"{what} is not a reagent-lite checkpoint")
    if state.get("run_id", run_id) != run_id:
        raise ConfigError(f"{what} belongs to run {state.get('run_id')}, not {run_id}")
    changed = config_changes(state.get("config") or config, config)
    if changed:
        raise ConfigError(
            f"{what}: the config changes what the run computes: {'; '.join(changed)}. "
            f"Only {', '.join(RESUMABLE_CHANGES)} may change on --resume; start a fresh run "
            "(without --resume) to train with the new settings"
        )
    # Checkpoints written before fingerprints were kept have none to compare.
    moved = changes(state["inputs"], inputs) if "inputs" in state else []
    if moved:
        raise ConfigError(
            f"{what}: the input files changed since it was written: {'; '.join(moved)}. "
            "Resuming would train its weights on other data (normalization refitted on "
            "it): put the original files back, or start a fresh run (without --resume)"
        )
    if state["space"] != space:
        raise ConfigError(f"{what} was made for other features/actions than this data")
    fit(q_net, state["q_net"], what)
    trainer.load_state_dict(state["trainer"])
    if cpe is not None and state["cpe"] is not None:
        fit(cpe, state["cpe"], what)
    resumed = Resumed(path, state["epoch"], state["global_step"], state["best"], state["history"])
    return resumed, state


def _newest_readable(output_dir: Path, run_id: str) -> Path | None:
    """The newest checkpoint of the run that loads; unreadable newer ones are skipped
    (a write cut short by a full disk or a crash of the storage) with a warning."""
    found = list_checkpoints(output_dir, run_id)
    for path in reversed(found):
        try:
            load_checkpoint(path)
        except Exception as err:
            log.warning("--resume: skipping %s, it cannot be read (%s)", path, str(err)[:200])
            continue
        return path
    if found:
        # None readable: load the newest again so the error names it.
        return found[-1]
    return None


def warm_start(q_net: nn.Module, setting: str | None) -> None:
    """Loads the Q-network of a previous run (`training.warm_start_model_path`: its output
    directory or its model_state.pt) into `q_net`."""
    if not setting:
        return
    file = Path(setting)
    if file.is_dir():
        file = file / "model_state.pt"
    if not file.is_file():
        raise ConfigError(
            f"training.warm_start_model_path: no model state at '{file}' "
            "(expected a previous run's output directory or its model_state.pt)"
        )
    what = f"training.warm_start_model_path: '{file}'"
    state = read_state(file, what, "a model_state.pt written by a reagent-lite run")
    if not isinstance(state, dict) or "q_net" not in state:
        raise ConfigError(
            f"{what} holds no Q-network state (expected a model_state.pt written by a "
            "reagent-lite run, a dict with a 'q_net' entry)"
        )
    fit(q_net, state["q_net"], what)
    log.info("warm-started the Q-network from %s", file)


def read_state(path: Path, what: str, expected: str) -> Any:
    """One of our own state files; a file that is not one (truncated, empty, another
    format) is a `ConfigError`."""
    try:
        return load_checkpoint(path)
    except Exception as err:  # EOFError, UnpicklingError, RuntimeError (zip), OSError, ...
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(
            f"{what} cannot be read ({type(err).__name__}: {first}); expected {expected}"
        ) from err


def fit(module: Any, state: Any, what: str) -> None:
    """module.load_state_dict(state), a mismatch named: which tensors differ and how."""
    try:
        module.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError) as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        detail = "; ".join(lines[1:4] if len(lines) > 1 else lines)
        raise ConfigError(
            f"{what} does not fit this network (layers, activations or features differ "
            f"from the run that wrote it): {detail}"
        ) from err
