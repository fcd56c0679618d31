"""The one place a workflow kind is registered, and the one place a kind's name is looked up.

A `KindSpec` names everything a kind is: its config model, its `Kind` (data layout,
networks, the trainer whose maths it runs, its batch type and feature space, serving), the
command that runs it and the config keys only its configs have. `register_kind` adds one;
the entry points (`runner.main`, `reagent_lite.train`) resolve a config's kind here once
and hand the resolved object on; nothing else compares kind names.

Torch-free on purpose: the command line checks a config against its kind's model before
torch is imported. The `Kind` itself may therefore be given as "module:Class", imported
the first time a run needs it (`KindSpec.load`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reagent_lite.errors import ConfigError

if TYPE_CHECKING:
    from reagent_lite.config.models import BaseWorkflowConfig
    from reagent_lite.kinds.base import Kind


@dataclass(frozen=True)
class KindSpec:
    """A workflow kind as registered (see the module notes).

    `config`'s `workflow` field must default to `name` (configs say which kind they are for);
    `kind` is the `Kind` subclass or "module:Class" naming it; `command` is how a user runs
    it (error messages point there); `markers` are top-level config keys only this kind's
    configs have, so a config without a `workflow` key is still recognised."""

    name: str
    config: type[BaseWorkflowConfig]
    kind: type[Kind[Any]] | str
    command: str
    summary: str = ""
    markers: frozenset[str] = field(default_factory=frozenset)

    def load(self) -> Kind[Any]:
        """The kind's `Kind` instance (imported on first use; one per process)."""
        cached = _LOADED.get(self.name)
        if cached is not None:
            return cached
        cls = self.kind
        if isinstance(cls, str):
            module, _, attr = cls.partition(":")
            cls = getattr(importlib.import_module(module), attr)
        instance = cls()
        if instance.name != self.name:
            raise ValueError(f"kind {self.name!r}: its Kind class is named {instance.name!r}")
        _LOADED[self.name] = instance
        return instance


_SPECS: dict[str, KindSpec] = {}
_LOADED: dict[str, Kind[Any]] = {}


def register_kind(spec: KindSpec) -> KindSpec:
    """Adds `spec` to the kinds every entry point accepts. A name registered already is a
    programming error (two kinds would answer to one config)."""
    if spec.name in _SPECS:
        raise ValueError(f"kind {spec.name!r} is registered already")
    default = spec.config.model_fields.get("workflow")
    if default is None or default.default != spec.name:
        raise ValueError(
            f"kind {spec.name!r}: {spec.config.__name__} needs a `workflow` field defaulting "
            f"to {spec.name!r} (configs say which kind they are for)"
        )
    _SPECS[spec.name] = spec
    return spec


def unregister_kind(name: str) -> None:
    """Removes a registered kind (a kind registered for a while, e.g. by a test)."""
    _SPECS.pop(name, None)
    _LOADED.pop(name, None)


@contextmanager
def registered(spec: KindSpec) -> Iterator[KindSpec]:
    """`spec` registered inside the block, and only there."""
    register_kind(spec)
    try:
        yield spec
    finally:
        unregister_kind(spec.name)


# "reagent-lite" once the console script started this process: messages then name its
# subcommands (`reagent-lite dqn`) instead of the `python -m` modules.
_LAUNCHER: list[str] = []


def set_launcher(script: str) -> None:
    _LAUNCHER[:] = [script]


def command_for(spec: KindSpec) -> str:
    """How the user runs `spec`'s workflow, in the form they started this process with."""
    return f"{_LAUNCHER[0]} {spec.name}" if _LAUNCHER else spec.command


def kind_names() -> list[str]:
    """The registered kinds' names, in registration order (the shipped ones first)."""
    return list(_SPECS)


def specs() -> list[KindSpec]:
    return list(_SPECS.values())


def resolve_kind(name: str) -> KindSpec:
    """The registered kind `name`; a `ConfigError` naming the registered ones otherwise."""
    try:
        return _SPECS[name]
    except KeyError:
        raise ConfigError(
            f"workflow: unknown kind (got {name!r}); expected one of {kind_names()}"
        ) from None


def spec_of_config(cls: type[BaseWorkflowConfig]) -> KindSpec | None:
    """The kind whose config model is `cls` (None: not a registered kind's)."""
    return next((s for s in _SPECS.values() if s.config is cls), None)


def infer_kind(data: Any) -> str:
    """The kind a raw config is for: its `workflow` key (a name `resolve_kind` may reject),
    else the first kind (in registration order) one of whose marker keys it has, else the
    first registered kind (dqn), whose validation then names what is missing."""
    names = kind_names()
    if isinstance(data, Mapping):
        if isinstance(data.get("workflow"), str):
            return str(data["workflow"])
        for spec in _SPECS.values():
            if spec.markers & data.keys():
                return spec.name
    return names[0]
