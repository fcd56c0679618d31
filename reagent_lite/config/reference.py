"""The config reference (`docs/CONFIG.md`), generated from the Pydantic models.

`python -m reagent_lite.config.schema` writes it beside the JSON Schemas and `--check`
fails when it drifts, so the README's reference can never disagree with the code.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from reagent_lite.config.loader import model_of_annotation
from reagent_lite.config.models import DQNWorkflowConfig, ParametricDQNWorkflowConfig
from reagent_lite.resources import config_reference_path

REFERENCE_PATH = config_reference_path()


def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return " \\| ".join(json.dumps(v) for v in get_args(annotation))
    if get_origin(annotation) is Union:  # e.g. bool | Literal["auto"]: "Union" says nothing
        return " \\| ".join(_type_name(arg) for arg in get_args(annotation))
    text = getattr(annotation, "__name__", None) or str(annotation)
    for noise in ("typing.", "reagent_lite.config.models.", "Annotated[", "NoneType"):
        text = text.replace(noise, "null" if noise == "NoneType" else "")
    return text.replace("|", "\\|")


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "(block)"
    return f"`{json.dumps(value)}`"


def _rows(
    model: type[BaseModel], prefix: str, blocks: list[tuple[str, type[BaseModel]]]
) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        nested = model_of_annotation(field.annotation)
        if nested is not None:
            blocks.append((f"{prefix}{name}", nested))
        description = (field.description or "").replace("\n", " ").replace("|", "\\|")
        rows.append(
            f"| `{prefix}{name}` | {_type_name(field.annotation)} | {_default(field)} | {description} |"
        )
    return rows


def _section(title: str, model: type[BaseModel]) -> list[str]:
    lines = [f"## {title}", "", "| key | type | default | description |", "|---|---|---|---|"]
    blocks: list[tuple[str, type[BaseModel]]] = []
    lines += _rows(model, "", blocks)
    seen = set()
    while blocks:
        prefix, nested = blocks.pop(0)
        if prefix in seen:
            continue
        seen.add(prefix)
        lines += [
            "",
            f"### `{prefix}`",
            "",
            "| key | type | default | description |",
            "|---|---|---|---|",
        ]
        lines += _rows(nested, f"{prefix}.", blocks)
    return [*lines, ""]


# What a newcomer needs first: the few keys that are enough, before the full tables.
MINIMAL = [
    "## A minimal config",
    "",
    "Three keys are enough for dqn; every other key has the default listed below.",
    "",
    "```json",
    "{",
    '  "training_data_path": "train.parquet",',
    '  "model_output_path": "model",',
    '  "actions": ["left", "right"]',
    "}",
    "```",
    "",
    "With `reagent_lite.train(config, training_data=frame)` (a DataFrame or an Arrow table)",
    "`training_data_path` may be left out. On a small table lower `training.minibatch_size`",
    "(the run warns when an epoch has fewer than 10 optimizer steps); see",
    "[TUTORIAL.md](TUTORIAL.md). parametric_dqn needs no `actions`: its actions are feature",
    "maps in the data.",
    "",
]


def render_reference() -> str:
    lines = [
        "# Config reference",
        "",
        "Generated from `reagent_lite/config/models.py` by `python -m reagent_lite.config.schema`;",
        "do not edit by hand. The same descriptions are in `schemas/*.schema.json`.",
        "",
        *MINIMAL,
    ]
    lines += _section("dqn workflow (`python -m workflows.dqn_workflow`)", DQNWorkflowConfig)
    lines += _section(
        "parametric_dqn workflow (`python -m workflows.parametric_dqn_workflow`)",
        ParametricDQNWorkflowConfig,
    )
    return "\n".join(lines)
