"""Config stand-ins for the model and trainer tests (any object with the fields works)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def config_like(
    *,
    layers: list[int] | None = None,
    activations: list[str] | None = None,
    dueling: bool = False,
    **training: Any,
) -> SimpleNamespace:
    return SimpleNamespace(
        training=SimpleNamespace(
            layers=layers or [-1, 16, -1],
            activations=activations or ["relu", "linear"],
            dropout_ratio=training.pop("dropout_ratio", 0.0),
            layer_norm=training.pop("layer_norm", False),
            **training,
        ),
        rainbow=SimpleNamespace(dueling_architecture=dueling, double_q_learning=True),
    )
