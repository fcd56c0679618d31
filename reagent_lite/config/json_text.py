"""JSON as a config reads it: the parse rules and how a value is shown in a message."""

from __future__ import annotations

import json
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
