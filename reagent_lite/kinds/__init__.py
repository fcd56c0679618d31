"""Workflow kinds: what differs between dqn and parametric_dqn (see `kinds/base.py`)."""

from __future__ import annotations

from typing import Any

from reagent_lite.errors import ConfigError
from reagent_lite.kinds.base import EVAL_ONLY_FIELDS, FeatureSpace, Kind
from reagent_lite.kinds.discrete import DiscreteKind, DiscreteServingModule
from reagent_lite.kinds.parametric import ParametricKind, ParametricServingModule

KINDS: dict[str, Kind[Any]] = {"dqn": DiscreteKind(), "parametric_dqn": ParametricKind()}


def get_kind(name: str) -> Kind[Any]:
    """The kind called `name` ("dqn" or "parametric_dqn")."""
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(
            f"workflow: unknown kind (got {name!r}); expected one of {list(KINDS)}"
        ) from None


__all__ = [
    "EVAL_ONLY_FIELDS",
    "KINDS",
    "DiscreteKind",
    "DiscreteServingModule",
    "FeatureSpace",
    "Kind",
    "ParametricKind",
    "ParametricServingModule",
    "get_kind",
]
