"""Per-feature normalization parameters and their JSON files.

The field names are ReAgent's (`reagent.core.parameters.NormalizationParameters`), so a
normalization file written by ReAgent/Horizon loads here unchanged. Two layouts are read:

* ours (and ReAgent's dict form): ``{"12": {"feature_type": "CONTINUOUS", "mean": ...}, ...}``
* Horizon's serialized form, where each value is itself a JSON *string* of that dict:
  ``{"12": "{\\"feature_type\\": \\"CONTINUOUS\\", ...}"}``.

`save_normalization` writes the first layout, feature ids sorted numerically, atomically.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from enum import Enum
from itertools import pairwise
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reagent_lite.errors import DataError
from reagent_lite.io_utils import atomic_write_text

# The smallest base of the Box-Cox power: fitting (on the shifted sample, whose minimum is 0)
# and serving (the exported module) floor at the same value, so the sample's smallest value
# normalizes to what the fitted mean and stddev were computed from.
BOXCOX_MIN_BASE = 1e-4


class FeatureType(str, Enum):
    """How a feature is transformed before it reaches the network (ReAgent's names)."""

    BINARY = "BINARY"
    PROBABILITY = "PROBABILITY"
    CONTINUOUS = "CONTINUOUS"
    BOXCOX = "BOXCOX"
    QUANTILE = "QUANTILE"
    ENUM = "ENUM"
    CONTINUOUS_ACTION = "CONTINUOUS_ACTION"
    DO_NOT_PREPROCESS = "DO_NOT_PREPROCESS"


class NormalizationParameters(BaseModel):
    """How to normalize one feature; which fields matter depends on `feature_type`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    feature_type: FeatureType = Field(description="Transform applied to the feature.")
    boxcox_lambda: float | None = Field(
        default=None, description="Box-Cox exponent (BOXCOX only; 0 means log)."
    )
    boxcox_shift: float | None = Field(
        default=None, description="Added to the raw value before the Box-Cox transform."
    )
    mean: float = Field(
        default=0.0, description="Subtracted after any Box-Cox step (CONTINUOUS, BOXCOX)."
    )
    stddev: float = Field(
        default=1.0, gt=0.0, description="Divides after subtracting `mean`; must be > 0."
    )
    possible_values: list[float] | None = Field(
        default=None, description="ENUM only: the values that get a one-hot column, in order."
    )
    quantiles: list[float] | None = Field(
        default=None,
        description="QUANTILE only: sorted boundaries; a value maps to its position in [0, 1].",
    )
    min_value: float | None = Field(
        default=None, description="Smallest value seen in the sample (CONTINUOUS_ACTION: range)."
    )
    max_value: float | None = Field(
        default=None, description="Largest value seen in the sample (CONTINUOUS_ACTION: range)."
    )

    @model_validator(mode="after")
    def _check_consistent(self) -> NormalizationParameters:
        for name in ("boxcox_lambda", "boxcox_shift", "mean", "stddev", "min_value", "max_value"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name} must be finite (got {v})")
        t = self.feature_type
        if t is FeatureType.BOXCOX and (self.boxcox_lambda is None or self.boxcox_shift is None):
            raise ValueError("BOXCOX needs boxcox_lambda and boxcox_shift")
        if t is FeatureType.ENUM:
            pv = self.possible_values
            if not pv:
                raise ValueError("ENUM needs a non-empty possible_values list")
            if any(not math.isfinite(v) for v in pv) or len(set(pv)) != len(pv):
                raise ValueError(f"possible_values must be finite and distinct (got {pv})")
        if t is FeatureType.QUANTILE:
            q = self.quantiles
            if q is None or len(q) < 2:
                raise ValueError(f"QUANTILE needs at least 2 quantile boundaries (got {q})")
            if any(not math.isfinite(v) for v in q) or any(a > b for a, b in pairwise(q)):
                raise ValueError(f"quantiles must be finite and sorted ascending (got {q})")
        if t is FeatureType.CONTINUOUS_ACTION:
            lo, hi = self.min_value, self.max_value
            if lo is None or hi is None or lo > hi:
                raise ValueError(f"CONTINUOUS_ACTION needs min_value <= max_value (got {lo}, {hi})")
        return self


def _sort_key(feature_id: str) -> tuple[int, int | str]:
    # Numeric ids in numeric order, anything else after them in string order.
    return (0, int(feature_id)) if feature_id.isdigit() else (1, feature_id)


def sorted_feature_ids(ids: Mapping[str, Any] | list[str]) -> list[str]:
    """Feature ids in numeric order (as the data module orders them)."""
    return sorted(ids, key=_sort_key)


def save_normalization(
    path: str | os.PathLike[str], params: Mapping[str, NormalizationParameters]
) -> None:
    """Write `params` as JSON keyed by feature id; temp file + rename, so never half-written."""
    doc = {fid: params[fid].model_dump(mode="json") for fid in sorted_feature_ids(list(params))}
    atomic_write_text(Path(path), json.dumps(doc, indent=2) + "\n")


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = "" if loc == "" else f" (got {e.get('input')!r})"
        parts.append(f"{loc + ': ' if loc else ''}{msg}{got}")
    return "; ".join(parts)


def parse_normalization(
    doc: Any, source: str = "<normalization>"
) -> dict[str, NormalizationParameters]:
    """Turn a decoded JSON document into parameters; `source` names it in error messages."""
    if not isinstance(doc, dict):
        raise DataError(
            f"{source}: expected a JSON object keyed by feature id (got {type(doc).__name__})"
        )
    out: dict[str, NormalizationParameters] = {}
    for fid, raw in doc.items():
        value = raw
        if isinstance(value, str):  # Horizon: each value is a JSON-encoded string
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{source}: feature {fid!r}: value is a string but not JSON ({e.msg})"
                ) from None
        if not isinstance(value, dict):
            raise DataError(
                f"{source}: feature {fid!r}: expected an object of normalization fields "
                f"(got {type(value).__name__})"
            )
        try:
            out[str(fid)] = NormalizationParameters.model_validate(value)
        except ValidationError as e:
            raise DataError(f"{source}: feature {fid!r}: {_describe(e)}") from None
    return out


def load_normalization(path: str | os.PathLike[str]) -> dict[str, NormalizationParameters]:
    """Read a normalization file (ours or ReAgent/Horizon's); `DataError` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: normalization file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read normalization file ({e})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}: not valid JSON at line {e.lineno} column {e.colno} ({e.msg})"
        ) from None
    return parse_normalization(doc, str(path))
