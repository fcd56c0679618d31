"""Command-line overrides of config keys: `training.learning_rate=1e-4 epochs=5`.

Each override is `key.path=value`. The value is parsed as JSON when it is valid JSON
(`5`, `1e-4`, `true`, `null`, `[-1, 64, -1]`, `{"gamma": 0.9}`), else kept as a string
(`model_output_path=/tmp/out`), so paths and action names need no quoting. Overrides are
applied to the parsed file *before* validation: the merged config is checked exactly like a
file, with the same messages (and did-you-mean) for a bad key or value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from reagent_lite.errors import ConfigError

Overrides = Mapping[str, Any] | Iterable[str]


def parse_override(text: str) -> tuple[str, Any]:
    """`"a.b=1"` → `("a.b", 1)`; `ConfigError` naming the argument if it is not `key=value`."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"override {text!r}: expected key.path=value (e.g. training.learning_rate=1e-4)"
        )
    return key, parse_value(raw)


def parse_value(raw: str) -> Any:
    """JSON when it parses as JSON (NaN/Infinity excluded), else the string itself."""
    try:
        return json.loads(raw, parse_constant=_not_json)
    except ValueError:
        return raw


def _not_json(name: str) -> Any:
    raise ValueError(name)


def as_pairs(overrides: Overrides | None) -> list[tuple[str, Any]]:
    """A mapping (`{"training.learning_rate": 1e-4}`, values used as given) or `key=value`
    strings (values parsed) as (dotted key, value) pairs, in order."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        # A lone string would otherwise be iterated character by character.
        return [parse_override(overrides)]
    if isinstance(overrides, Mapping):
        return [(str(k), v) for k, v in overrides.items()]
    return [parse_override(item) for item in overrides]


def apply_overrides(data: dict[str, Any], overrides: Overrides | None) -> dict[str, Any]:
    """A copy of the raw config `data` with every override set (nested objects created as
    needed); `ConfigError` when a key path runs through a value that is not an object."""
    out = _copy(data)
    for key, value in as_pairs(overrides):
        parts = key.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"override {key}: {where} is {json.dumps(child)}, not an object, so it "
                    f"has no key {parts[i + 1]!r}"
                )
            node = child
        node[parts[-1]] = value
    return out


def _copy(value: Any) -> Any:
    # Nested dicts are copied so the caller's dict is never changed; leaves are shared.
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def describe(overrides: Overrides | None) -> list[str]:
    """`key=value` lines (values as JSON) for logs and the dry run."""
    return [f"{k}={json.dumps(v)}" for k, v in as_pairs(overrides)]
