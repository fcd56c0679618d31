"""Features the network cannot use: those whose input to the network is a constant.

A feature whose every row — present values and absences alike — normalizes to the same
input carries nothing: a feature forced to CONTINUOUS_ACTION with min = max, a BINARY
feature only ever logged as 0.0 (present looks like absent), a dense feature with one
value. A run trained on it learns nothing from the feature, silently, so each is named in
a warning with its type, the value and whether present and absent look alike.

Presence itself does not reach the network as an input of its own: identification makes
every feature seen with a single value BINARY (present and non-zero → 1, absent → 0), so
for a sparse one-hot, whose presence is all it says, presence is its value. The remaining
cases where a present feature looks absent are the constant ones warned about here (and
single present values that normalize to exactly 0, e.g. a BINARY 0.0, which a sparse map
treats as not logged). Feeding presence columns to the network instead would widen every
sparse model's input and change how existing normalization files are served.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from reagent_lite.normalization.module import Preprocessor

log = logging.getLogger("reagent_lite")

# Normalized values closer than this count as one.
_TOLERANCE = 1e-6


@dataclass(frozen=True)
class ConstantFeature:
    feature_id: str
    feature_type: str
    value: float  # the input every row gives (its first column)
    looks_absent: bool  # present looks like absent (the input is all zeros)
    ever_absent: bool  # the sample has rows without it


def constant_features(pre: Preprocessor, sample: np.ndarray) -> list[ConstantFeature]:
    """Features of `pre` whose network input is the same in every row of `sample` ([N, F]
    raw, NaN = absent, in `pre.feature_ids` order); features never present in the sample
    are not judged (nothing is known about them)."""
    values = torch.as_tensor(np.asarray(sample, dtype=np.float32))
    if values.ndim != 2 or values.shape[1] != len(pre.feature_ids) or len(values) == 0:
        return []
    present = ~torch.isnan(values)
    with torch.no_grad():
        out = pre(values, present.to(torch.float32)).double().numpy()
    src = pre.get_buffer("out_src").numpy()  # input feature of each output column
    found: list[ConstantFeature] = []
    for j, fid in enumerate(pre.feature_ids):
        rows = present[:, j].numpy()
        if not rows.any():
            continue
        cols = out[:, src == j]
        if np.all(cols.max(axis=0) - cols.min(axis=0) <= _TOLERANCE):
            first = cols[int(np.argmax(rows))]
            found.append(
                ConstantFeature(
                    feature_id=fid,
                    feature_type=pre.feature_types[j].value,
                    value=float(first[0]),
                    looks_absent=bool(np.all(np.abs(first) <= _TOLERANCE)),
                    ever_absent=bool(not rows.all()),
                )
            )
    return found


def warn_constant_features(group: str, pre: Preprocessor, sample: np.ndarray) -> None:
    """Logs one warning per `group` ("state" / "action") feature that normalizes to a
    constant over `sample` (see the module notes)."""
    for c in constant_features(pre, sample):
        why = (
            "present looks the same as absent to the network: it carries no information"
            if c.looks_absent
            else "the network sees the same input in every row: it carries no information"
        )
        log.warning(
            "%s feature %s (%s) normalizes to the constant %g over the normalization sample: "
            "%s (a feature seen with a single value is BINARY unless a normalization file "
            "or override says otherwise; check its type and values)",
            group,
            c.feature_id,
            c.feature_type,
            c.value,
            why,
        )
