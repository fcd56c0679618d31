"""Workflow kinds: what differs between dqn and parametric_dqn (see `kinds/base.py`), and
the registry every entry point resolves a config's kind through (`kinds/registry.py`).

Importing this package registers the shipped kinds without importing torch: their `Kind`
classes load when a run needs them, as do the names below (PEP 562 `__getattr__`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reagent_lite.config.models import DQNWorkflowConfig, ParametricDQNWorkflowConfig
from reagent_lite.kinds.registry import (
    KindSpec,
    register_kind,
    registered,
    resolve_kind,
    spec_of_config,
    unregister_kind,
)

if TYPE_CHECKING:
    from reagent_lite.kinds.base import (
        EVAL_ONLY_FIELDS,
        DiscreteSpace,
        FeatureSpace,
        Kind,
        ParametricSpace,
    )
    from reagent_lite.kinds.discrete import DiscreteKind, DiscreteServingModule
    from reagent_lite.kinds.parametric import ParametricKind, ParametricServingModule

    KINDS: dict[str, Kind[Any]]

# The shipped kinds: one registration each. The first is the default of a config that
# names no workflow and has no kind's marker keys.
DQN = register_kind(
    KindSpec(
        name="dqn",
        config=DQNWorkflowConfig,
        kind="reagent_lite.kinds.discrete:DiscreteKind",
        command="python -m workflows.dqn_workflow",
        summary="train a discrete-action DQN as the config says",
        markers=frozenset({"actions"}),
    )
)
PARAMETRIC_DQN = register_kind(
    KindSpec(
        name="parametric_dqn",
        config=ParametricDQNWorkflowConfig,
        kind="reagent_lite.kinds.parametric:ParametricKind",
        command="python -m workflows.parametric_dqn_workflow",
        summary="train a parametric-action DQN as the config says",
        markers=frozenset({"action_norm_data_path", "max_candidates"}),
    )
)


def get_kind(name: str) -> Kind[Any]:
    """The `Kind` of the registered kind `name` (`ConfigError` for an unknown one)."""
    return resolve_kind(name).load()


def served_kinds() -> list[str]:
    """The registered kinds whose models can be served (`Kind.log_action` set), in
    registration order (imports each kind's module)."""
    from reagent_lite.kinds.registry import specs

    return [spec.name for spec in specs() if spec.load().log_action is not None]


_LAZY = {
    "EVAL_ONLY_FIELDS": "reagent_lite.kinds.base",
    "FeatureSpace": "reagent_lite.kinds.base",
    "DiscreteSpace": "reagent_lite.kinds.base",
    "ParametricSpace": "reagent_lite.kinds.base",
    "Kind": "reagent_lite.kinds.base",
    "DiscreteKind": "reagent_lite.kinds.discrete",
    "DiscreteServingModule": "reagent_lite.kinds.discrete",
    "ParametricKind": "reagent_lite.kinds.parametric",
    "ParametricServingModule": "reagent_lite.kinds.parametric",
}


def __getattr__(name: str) -> Any:
    # The torch-side names import torch only when someone asks for them.
    if name == "KINDS":  # name → Kind of every registered kind (a snapshot)
        from reagent_lite.kinds.registry import specs

        return {spec.name: spec.load() for spec in specs()}
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'reagent_lite.kinds' has no attribute {name!r}")


__all__ = [
    "DQN",
    "EVAL_ONLY_FIELDS",
    "KINDS",
    "PARAMETRIC_DQN",
    "DiscreteKind",
    "DiscreteServingModule",
    "DiscreteSpace",
    "FeatureSpace",
    "Kind",
    "KindSpec",
    "ParametricKind",
    "ParametricServingModule",
    "ParametricSpace",
    "get_kind",
    "register_kind",
    "registered",
    "resolve_kind",
    "served_kinds",
    "spec_of_config",
    "unregister_kind",
]
