"""The optional dependencies a config needs, checked before anything starts.

A run that needs gymnasium (to generate sample data or to play the online check),
tensorboard, mlflow or matplotlib finds out here, from the run, `--dry_run`, `train()` and
`make-sample-data` alike, with the config key that needs it and the extra that installs it
(exit 2) instead of a `ModuleNotFoundError` after the data loaded. Torch-free.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from reagent_lite.config.models import BaseWorkflowConfig
from reagent_lite.errors import ConfigError

log = logging.getLogger("reagent_lite")

# module → the pyproject extra that installs it
EXTRAS = {
    "gymnasium": "gym",
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
    "matplotlib": "plot",
    "fastapi": "serve",
    "uvicorn": "serve",
}


def importable(module: str) -> bool:
    """Whether `module` imports (an import, not `find_spec`: a package that is present
    but broken, or blocked with `sys.modules[name] = None`, counts as missing)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def require(module: str, key: str, why: str, instead: str) -> None:
    """`ConfigError` (exit 2) naming `key`, what needs `module`, and the extra to install."""
    if not importable(module):
        extra = EXTRAS[module]
        raise ConfigError(
            f"{key}: {why} needs the {module} package, which is not installed: "
            f"pip install 'reagent-lite[{extra}]' ({instead})"
        )


def check_extras(cfg: BaseWorkflowConfig) -> None:
    """Every optional package `cfg` needs is importable, and an MLflow `file://` store can
    be written; `ConfigError` naming the config key otherwise. matplotlib only draws
    report.png, so without it the run goes on and says so once."""
    sample = cfg.sample_data
    if sample is not None and sample.kind == "gym":
        if not Path(cfg.training_data_path).exists():
            require(
                "gymnasium",
                "sample_data",
                f"generating sample data from gym env {sample.env}",
                "or point training_data_path at existing data",
            )
        if cfg.evaluation.online_episodes > 0:
            require(
                "gymnasium",
                "evaluation.online_episodes",
                f"the online check in gym env {sample.env}",
                "or set evaluation.online_episodes=0",
            )
    if cfg.tensorboard:
        require("tensorboard", "tensorboard", "tensorboard: true", "or set tensorboard: false")
    if cfg.mlflow is not None:
        require("mlflow", "mlflow", "the mlflow block", "or remove the mlflow block")
        _check_file_store(cfg.mlflow.tracking_uri)
    if not importable("matplotlib"):
        log.warning(
            "report.png will not be drawn: matplotlib is not installed "
            "(pip install 'reagent-lite[plot]')"
        )


def _check_file_store(uri: str | None) -> None:
    """A `file://` tracking store must be a directory this process can create or write."""
    if uri is None or not uri.startswith("file:"):
        return
    path = Path(unquote(urlparse(uri).path))
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        raise ConfigError(
            f"mlflow.tracking_uri: {uri!r} cannot be created or written (expected a writable "
            f"directory; {probe} is {'not a directory' if probe.exists() else 'missing'} or "
            "read-only)"
        )
