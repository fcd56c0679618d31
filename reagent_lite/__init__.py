"""reagent-lite: declarative offline reinforcement learning from logged data.

    import reagent_lite
    result = reagent_lite.train("cfg.json", overrides={"epochs": 2})

`import reagent_lite` is cheap (no torch); `train`, `load_config`, `load_model`, `Policy`
and `RunResult` load their modules on first use (see `reagent_lite.api`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reagent_lite.errors import (
    ConfigError,
    DataError,
    DistributedError,
    ReagentLiteError,
    TrainingError,
)

if TYPE_CHECKING:
    from reagent_lite.api import Model, Policy, RunResult, load_config, load_model, train
    from reagent_lite.resources import sample_config

from reagent_lite.version import __version__

_LAZY = {
    "train": "reagent_lite.api",
    "load_config": "reagent_lite.api",
    "load_model": "reagent_lite.api",
    "RunResult": "reagent_lite.api",
    "Model": "reagent_lite.api",
    "Policy": "reagent_lite.api",
    "sample_config": "reagent_lite.resources",
}

__all__ = [
    "ConfigError",
    "DataError",
    "DistributedError",
    "Model",
    "Policy",
    "ReagentLiteError",
    "RunResult",
    "TrainingError",
    "__version__",
    "load_config",
    "load_model",
    "sample_config",
    "train",
]


def __getattr__(name: str) -> Any:
    # PEP 562: the API modules (pydantic, and torch when training) load on first use.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'reagent_lite' has no attribute {name!r}")
