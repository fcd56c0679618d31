"""JSON as a config reads it: the parse rules and how a value is shown in a message.

A config is stricter JSON than `json.loads` takes: NaN/Infinity are refused, and so is an
object that gives a key twice, which `json.loads` would read as the last value silently
(a Horizon example lists `training_data_path` twice, and would train on the second)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


def reject_constant(name: str) -> Any:
    """`parse_constant` for `json.loads`: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not a JSON value")


def show(value: Any, limit: int = 80) -> str:
    """`value` as JSON (repr if it is not JSON), cut to `limit` characters for a message."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Duplicate:
    """A key that one JSON object gives twice: where, and the values in file order."""

    path: str  # the key's config path, e.g. `training.learning_rate`
    key: str
    first: Any
    second: Any


class DuplicateKeys(Exception):
    """The text is valid JSON, but an object repeats a key: `json.loads` would silently
    keep the last value. (Not a ValueError, so "not JSON, keep it a string" never hides it.)"""

    def __init__(self, duplicates: list[Duplicate]) -> None:
        super().__init__(", ".join(d.path for d in duplicates))
        self.duplicates = duplicates


def parse_json(text: str) -> Any:
    """`json.loads(text)` without NaN/Infinity and without repeated keys: `ValueError` for
    text that is not JSON, `DuplicateKeys` (naming every repeated key) for a repeat."""
    found: list[tuple[dict[str, Any], str, Any, Any]] = []

    def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj:
                found.append((obj, key, obj[key], value))
            obj[key] = value
        return obj

    data = json.loads(text, parse_constant=reject_constant, object_pairs_hook=unique_pairs)
    if found:
        # The hook sees an object before its parent exists, so paths are found afterwards.
        paths = _object_paths(data, {id(obj) for obj, *_ in found})
        raise DuplicateKeys(
            [
                Duplicate(_join(paths[id(obj)], key), key, first, second)
                for obj, key, first, second in found
            ]
        )
    return data


def key_lines(text: str, key: str) -> list[int]:
    """1-based lines where `"key":` appears in `text` (a cheap search: a key written with
    escapes, or the same text inside a string value, can make it miss or over-count)."""
    pattern = re.escape(json.dumps(key, ensure_ascii=False)) + r"\s*:"
    return [text.count("\n", 0, m.start()) + 1 for m in re.finditer(pattern, text)]


def _object_paths(root: Any, wanted: set[int]) -> dict[int, str]:
    """Config paths ("" = top level) of the objects whose id is in `wanted`; iterative, as
    the parser has already accepted the nesting."""
    out: dict[int, str] = {}
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack and len(out) < len(wanted):
        node, path = stack.pop()
        if isinstance(node, dict):
            if id(node) in wanted:
                out[id(node)] = path
            stack.extend((v, _join(path, k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
    return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
