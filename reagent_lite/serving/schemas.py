"""The request and response bodies of the serving API, in the training table's own names
(`state_features`, `possible_actions`, `mdp_id`, `sequence_number`). The HTTP server and
the in-process `Policy` validate through these same models."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

_FEATURE_ID = re.compile(r"[0-9]+")


def _feature_ids(features: dict[str, float]) -> dict[str, float]:
    """Feature ids are strings of non-negative integers, as in the training table; `"007"`
    is feature `"7"`, so that it meets the model's id."""
    out: dict[str, float] = {}
    for key, value in features.items():
        if not _FEATURE_ID.fullmatch(key):
            raise ValueError(
                f"feature id {key!r} is not a string of a non-negative integer (expected ids"
                ' such as "0", "12")'
            )
        out[str(int(key))] = value
    if len(out) != len(features):
        raise ValueError("two keys name the same feature id (such as '7' and '007')")
    return out


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
FeatureMap = Annotated[dict[str, FiniteFloat], AfterValidator(_feature_ids)]


class ActRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    state_features: FeatureMap = Field(description="Feature id → raw (unnormalized) value.")
    possible_actions: list[str] | list[FeatureMap] | None = Field(
        default=None,
        min_length=1,
        description="dqn: action names to choose among (default: all the model's actions); "
        "parametric_dqn: the candidates, one feature map each (required).",
    )
    mdp_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="The episode; absent: a new episode with a generated id.",
    )
    sequence_number: int | None = Field(
        default=None,
        ge=0,
        description="The step within the episode; absent: one after the episode's last.",
    )


class ActResponse(BaseModel):
    decision_id: str = Field(description="Names the decision in /v1/feedback.")
    action: str | int = Field(description="dqn: the action name; parametric: candidate index.")
    propensity: float = Field(description="The probability with which `action` was chosen.")
    probabilities: list[float] = Field(description="One per possible action, in its order.")
    model_id: str = Field(description="SHA-256 of the model.pt2 that made the decision.")
    mdp_id: str
    sequence_number: int


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    decision_id: str = Field(min_length=1, description="The id /v1/act answered.")
    reward: FiniteFloat
    metrics: dict[str, FiniteFloat] | None = Field(
        default=None, description="Optional metric name → value, logged beside the reward."
    )


def describe_errors(err: ValidationError | Sequence[Mapping[str, Any]], prefix: str = "") -> str:
    """Pydantic's errors as one line: `field.path: what was expected (got value)`; a
    union's alternatives are reported under the field, not under the type names."""
    errors: Sequence[Mapping[str, Any]] = err.errors() if isinstance(err, ValidationError) else err
    parts: list[str] = []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if not _is_type_name(str(p))]
        where = ".".join([prefix, *loc] if prefix else loc) or "body"
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict | list) or got is None else f" (got {got!r:.80})"
        line = f"{where}: {msg}{shown}"
        if line not in parts:
            parts.append(line)
    return "; ".join(parts[:6]) + (f"; ... ({len(parts) - 6} more)" if len(parts) > 6 else "")


def _is_type_name(part: str) -> bool:
    """Pydantic puts the union member it tried in the location (`list[str]`, `function-
    after[...]`): an implementation detail, not a field the user wrote."""
    return "[" in part or part in ("str", "int", "float", "dict", "list")
