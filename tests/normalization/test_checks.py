"""Sparse one-hot features keep their presence, and features the network cannot use are
named: single-valued features are BINARY; constant network inputs warn."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from reagent_lite.normalization import FeatureType, Preprocessor, fit_normalization
from reagent_lite.normalization.checks import constant_features, warn_constant_features

NAN = float("nan")


def _inputs(pre: Preprocessor, sample: np.ndarray) -> np.ndarray:
    values = torch.tensor(sample, dtype=torch.float32)
    present = (~torch.isnan(values)).float()
    return pre(values, present).numpy()


@pytest.mark.parametrize("action", [True, False])
@pytest.mark.parametrize("value", [1.0, 5.0, 0.5, -2.3])
def test_a_feature_seen_with_one_value_is_binary_and_present_differs_from_absent(
    action: bool, value: float
) -> None:
    # Candidate features of a sparse one-hot action map: {"10": v} or {"11": v}.
    sample = np.array([[value, NAN], [NAN, value]] * 30)
    params = fit_normalization(sample, ["10", "11"], action=action)
    assert {p.feature_type for p in params.values()} == {FeatureType.BINARY}
    out = _inputs(Preprocessor(["10", "11"], params), sample[:2])
    assert out.tolist() == [[1.0, 0.0], [0.0, 1.0]]  # the two candidates differ


def test_dense_one_hot_action_features_are_binary_and_normalize_as_the_sparse_ones() -> None:
    # The dense one-hot encoding of the same two actions: 0/1 values, BINARY as in Horizon,
    # so a present 0 gives the 0 an absent feature gives and both encodings are one input.
    dense = np.array([[1.0, 0.0], [0.0, 1.0]] * 30)
    params = fit_normalization(dense, ["10", "11"], action=True)
    assert {p.feature_type for p in params.values()} == {FeatureType.BINARY}
    sparse = np.array([[1.0, NAN], [NAN, 1.0]] * 30)
    sparse_params = fit_normalization(sparse, ["10", "11"], action=True)
    dense_in = _inputs(Preprocessor(["10", "11"], params), dense[:2])
    sparse_in = _inputs(Preprocessor(["10", "11"], sparse_params), sparse[:2])
    assert dense_in.tolist() == sparse_in.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_action_features_with_other_values_stay_continuous_action() -> None:
    several = np.array([[2.0, 0.0], [0.0, 1.5], [1.0, 0.5]] * 30)
    params = fit_normalization(several, ["10", "11"], action=True)
    assert {p.feature_type for p in params.values()} == {FeatureType.CONTINUOUS_ACTION}
    forced = fit_normalization(
        np.array([[1.0, NAN]] * 30),
        ["10", "11"],
        action=True,
        feature_overrides={"10": "CONTINUOUS_ACTION"},
    )
    assert forced["10"].feature_type is FeatureType.CONTINUOUS_ACTION  # an override wins


def test_constant_inputs_are_found_and_warned(caplog: pytest.LogCaptureFixture) -> None:
    ids = ["1", "2", "3", "4"]
    sample = np.array(
        [
            # 1: sparse one-hot (fine); 2: always 0.0 when present (looks absent);
            # 3: dense and always 3.0 (constant); 4: forced CONTINUOUS_ACTION, min = max.
            [1.0, 0.0, 3.0, 2.0],
            [NAN, NAN, 3.0, NAN],
        ]
        * 20
    )
    params = fit_normalization(sample, ids, feature_overrides={"4": "CONTINUOUS_ACTION"})
    pre = Preprocessor(ids, params)
    found = {c.feature_id: c for c in constant_features(pre, sample)}
    assert sorted(found) == ["2", "3", "4"]
    assert found["2"].looks_absent and found["4"].looks_absent
    assert not found["3"].looks_absent and found["3"].value == 1.0
    with caplog.at_level(logging.WARNING, logger="reagent_lite"):
        warn_constant_features("action", pre, sample)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert any(
        "action feature 4 (CONTINUOUS_ACTION)" in m and "looks the same" in m for m in messages
    )
