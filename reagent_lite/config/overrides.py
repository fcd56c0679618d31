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

from reagent_lite.config.json_text import DuplicateKeys, parse_json, show
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
    try:
        return key, parse_value(raw)
    except DuplicateKeys as exc:
        dup = exc.duplicates[0]
        raise ConfigError(
            f"override {key}: {key}.{dup.path}: key given twice in the value, and JSON "
            f"would silently keep the last (got {show(dup.first)}, then {show(dup.second)})"
        ) from None


def parse_value(raw: str) -> Any:
    """JSON when it parses as JSON (NaN/Infinity excluded), else the string itself;
    `DuplicateKeys` when it is a JSON object that repeats a key."""
    try:
        return parse_json(raw)
    except ValueError:
        return raw


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
    pairs = as_pairs(overrides)
    _check_given_once(pairs)
    for key, value in pairs:
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


def _check_given_once(pairs: list[tuple[str, Any]]) -> None:
    """`ConfigError` when one setting is given twice with different values: the later
    would silently win (`epochs=5 epochs=7`), or replace the earlier whole
    (`training.learning_rate=0.1 training={...}`). The same value twice is harmless."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        for earlier, before in seen.items():
            same_key = earlier == key
            if (same_key or earlier.startswith(key + ".")) and not _same(before, value):
                first = f"{earlier}={show(before)}"
                raise ConfigError(
                    f"override {key}: given twice with different values (got {first}, then "
                    f"{key}={show(value)}); the last would silently win: give it once"
                )
        seen[key] = value


def _same(a: Any, b: Any) -> bool:
    # As JSON: 1 and true, or 1 and 1.0, are different values for a config.
    return json.dumps(a, sort_keys=True, default=repr) == json.dumps(
        b, sort_keys=True, default=repr
    )


def _copy(value: Any) -> Any:
    # Nested dicts are copied so the caller's dict is never changed; leaves are shared.
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def describe(overrides: Overrides | None) -> list[str]:
    """`key=value` lines (values as JSON) for logs and the dry run."""
    return [f"{k}={json.dumps(v)}" for k, v in as_pairs(overrides)]
