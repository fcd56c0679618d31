"""Shared fixtures: minimal valid configs as dicts, and a writer for config files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def minimal_dqn() -> dict[str, Any]:
    return {
        "training_data_path": "data/train.parquet",
        "model_output_path": "out",
        "actions": ["left", "right"],
    }


def minimal_parametric() -> dict[str, Any]:
    return {"training_data_path": "data/train.parquet", "model_output_path": "out"}


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[Any, str], Path]:
    def write(data: Any, name: str = "config.json") -> Path:
        path = tmp_path / name
        path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
        return path

    return write
