"""Type identification and fitting on synthetic samples (as ReAgent's test_normalization)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reagent_lite.normalization import FeatureType, fit_normalization, identify_type
from reagent_lite.normalization.identify import (
    boxcox_lambda,
    boxcox_transform,
    fit_feature,
    normal_k2,
)

N = 10_000


def _samples(seed: int = 0) -> dict[str, tuple[np.ndarray, FeatureType]]:
    rng = np.random.default_rng(seed)
    return {
        "1": (rng.binomial(1, 0.3, N).astype(float), FeatureType.BINARY),
        "2": (rng.uniform(0.0, 1.0, N), FeatureType.PROBABILITY),
        "3": (rng.integers(0, 6, N).astype(float) * 3.0, FeatureType.ENUM),
        "4": (rng.normal(3.0, 2.0, N), FeatureType.CONTINUOUS),
        "5": (np.exp(rng.normal(0.0, 1.0, N)), FeatureType.BOXCOX),
        # Two far-apart modes: no power transform makes that normal.
        "6": (
            np.concatenate([rng.normal(0.0, 1.0, N // 2), rng.normal(1000.0, 1.0, N // 2)]),
            FeatureType.QUANTILE,
        ),
    }


def _matrix(samples: dict[str, tuple[np.ndarray, FeatureType]]) -> np.ndarray:
    return np.stack([v for v, _ in samples.values()], axis=1)


def test_identifies_each_type() -> None:
    samples = _samples()
    params = fit_normalization(_matrix(samples), list(samples))
    for fid, (values, expected) in samples.items():
        p = params[fid]
        assert p.feature_type is expected, fid
        assert p.min_value == pytest.approx(values.min())
        assert p.max_value == pytest.approx(values.max())
    assert params["3"].possible_values == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    assert params["4"].mean == pytest.approx(3.0, abs=0.1)
    assert params["4"].stddev == pytest.approx(2.0, abs=0.1)
    bc = params["5"]
    assert bc.boxcox_lambda is not None and abs(bc.boxcox_lambda) < 0.2  # ~log for lognormal
    assert bc.boxcox_shift == pytest.approx(-samples["5"][0].min())
    q = params["6"].quantiles
    assert q is not None and 2 <= len(q) <= 21 and q == sorted(q)
    assert q[0] == samples["6"][0].min() and q[-1] == samples["6"][0].max()


def test_identify_type_rules() -> None:
    assert identify_type(np.array([0.0, 1.0, 1.0])) is FeatureType.BINARY
    assert identify_type(np.array([0.0, 0.5, 1.0])) is FeatureType.PROBABILITY
    assert identify_type(np.array([0.0, 2.0, 5.0])) is FeatureType.ENUM
    assert identify_type(np.array([-1.0, 2.0, 5.0])) is FeatureType.CONTINUOUS  # negative
    assert identify_type(np.array([0.0, 2.5, 5.0])) is FeatureType.CONTINUOUS  # not integral
    many = np.arange(11, dtype=float)
    assert identify_type(many) is FeatureType.CONTINUOUS
    assert identify_type(many, max_unique_enum_values=11) is FeatureType.ENUM


def test_k2_and_boxcox_lambda() -> None:
    rng = np.random.default_rng(1)
    # K² is chi-squared with 2 degrees of freedom under normality: mean 2.
    k2 = [normal_k2(rng.normal(size=500)) for _ in range(300)]
    assert np.mean(k2) == pytest.approx(2.0, abs=0.4)
    assert normal_k2(np.exp(rng.normal(size=2000))) > 500
    # Data that is exactly normal after Box-Cox with λ = 0.5 recovers λ.
    y = rng.normal(10.0, 1.0, 20_000)
    z = (0.5 * y + 1.0) ** 2
    assert boxcox_lambda(z) == pytest.approx(0.5, abs=0.05)
    np.testing.assert_allclose(boxcox_transform(z, 0.5), y, rtol=1e-9)
    np.testing.assert_allclose(boxcox_transform(np.array([np.e]), 0.0), [1.0])


def test_overrides_and_action() -> None:
    samples = _samples()
    ids = list(samples)
    forced = fit_normalization(
        _matrix(samples),
        ids,
        feature_overrides={"4": FeatureType.BOXCOX, "5": "continuous", "2": FeatureType.QUANTILE},
    )
    assert forced["4"].feature_type is FeatureType.BOXCOX
    assert forced["5"].feature_type is FeatureType.CONTINUOUS
    assert forced["2"].feature_type is FeatureType.QUANTILE
    assert forced["1"].feature_type is FeatureType.BINARY

    action = fit_normalization(
        _matrix(samples), ids, action=True, feature_overrides={"1": FeatureType.BINARY}
    )
    assert action["1"].feature_type is FeatureType.BINARY
    for fid in ids[1:]:
        p = action[fid]
        assert p.feature_type is FeatureType.CONTINUOUS_ACTION
        assert (p.min_value, p.max_value) == (samples[fid][0].min(), samples[fid][0].max())


def test_missing_values_ignored_and_absent_feature() -> None:
    rng = np.random.default_rng(2)
    full = rng.normal(5.0, 2.0, N)
    holes = full.copy()
    holes[::2] = np.nan
    x = np.stack([holes, np.full(N, np.nan), np.full(N, np.nan)], axis=1)
    params = fit_normalization(x, ["1", "2", "3"], feature_overrides={"3": "CONTINUOUS_ACTION"})
    assert params["1"] == fit_feature(full[1::2])
    assert params["1"].feature_type is FeatureType.CONTINUOUS
    absent = params["2"]
    assert (absent.feature_type, absent.mean, absent.stddev) == (FeatureType.CONTINUOUS, 0, 1)
    absent_action = params["3"]
    assert absent_action.feature_type is FeatureType.CONTINUOUS_ACTION
    assert (absent_action.min_value, absent_action.max_value) == (-1.0, 1.0)


def test_small_and_constant_samples() -> None:
    few = fit_feature(np.exp(np.arange(5.0)))  # too few for Box-Cox/quantile tests
    assert few.feature_type is FeatureType.CONTINUOUS
    # One value seen: BINARY (CONTINUOUS would normalize it to 0, the input of an absent
    # feature; see tests/normalization/test_checks.py).
    const = fit_feature(np.full(100, 2.5))
    assert (const.feature_type, const.min_value, const.max_value) == (FeatureType.BINARY, 2.5, 2.5)
    # A forced transform that cannot be fitted falls back to CONTINUOUS.
    assert fit_feature(np.full(100, 2.5), FeatureType.BOXCOX).feature_type is (
        FeatureType.CONTINUOUS
    )
    assert fit_feature(np.array([1.0]), FeatureType.ENUM).feature_type is FeatureType.CONTINUOUS


def test_quantile_count_respects_max_quantiles() -> None:
    x = np.arange(1001, dtype=float) ** 3
    p = fit_feature(x, FeatureType.QUANTILE, max_quantiles=4)
    assert p.quantiles is not None and len(p.quantiles) == 5
    assert p.quantiles[0] == 0.0 and p.quantiles[-1] == 1000.0**3


def test_deterministic_and_row_order_invariant() -> None:
    samples = _samples(seed=3)
    x = _matrix(samples)
    ids = list(samples)
    a = fit_normalization(x, ids)
    b = fit_normalization(x.copy(), ids)
    perm = np.random.default_rng(4).permutation(len(x))
    c = fit_normalization(x[perm], ids)
    d = fit_normalization(torch.from_numpy(x), ids)
    assert a == b == c == d


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="match feature_ids"):
        fit_normalization(np.zeros((3, 2)), ["1"])


def test_boxcox_fit_and_module_share_one_floor() -> None:
    """The sample's smallest value (shifted to 0, floored) normalizes in the exported
    module exactly as fitting transformed it, so the fitted mean and stddev describe what
    the network sees: mean 0 and stddev 1 over the sample."""
    from reagent_lite.normalization import Preprocessor
    from reagent_lite.normalization.params import BOXCOX_MIN_BASE

    x = np.exp(np.random.default_rng(4).normal(0.0, 1.0, 400))
    x[:40] = x.min()  # many rows at the minimum: a floor mismatch shows in the mean
    p = fit_feature(x, FeatureType.BOXCOX)
    assert p.feature_type is FeatureType.BOXCOX and p.boxcox_lambda is not None
    fitted_min = boxcox_transform(np.array([BOXCOX_MIN_BASE]), p.boxcox_lambda) - p.mean
    pre = Preprocessor(["0"], {"0": p})
    values = torch.tensor(x, dtype=torch.float32)[:, None]
    y = pre(values, torch.ones_like(values)).double().numpy()[:, 0]
    assert y[0] == pytest.approx(fitted_min[0] / p.stddev, rel=1e-4)
    assert abs(y.mean()) < 1e-3 and y.std(ddof=1) == pytest.approx(1.0, abs=1e-3)
