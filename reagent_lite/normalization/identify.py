"""Identify each feature's type from a sample and fit its normalization parameters.

Follows ReAgent's `identify_types.identify_type` and `normalization.identify_parameter`,
with the statistics (D'Agostino-Pearson K², Box-Cox maximum likelihood, quantiles) done in
numpy because scipy is not a dependency.

Every function here is a pure function of its arguments: no random numbers, no global
state, and each feature's sample is sorted first, so the result does not even depend on
row order. In a distributed run every rank that fits on the same gathered sample gets
identical parameters (bit-for-bit on identical numpy builds; to be safe across
heterogeneous hosts, fit on rank 0 and broadcast the result).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from reagent_lite.normalization.params import (
    BOXCOX_MIN_BASE,
    FeatureType,
    NormalizationParameters,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_UNIQUE_ENUM = 10
DEFAULT_MAX_QUANTILES = 20
DEFAULT_QUANTILE_K2_THRESHOLD = 1000.0
# Below this many non-missing values the normality tests mean little: no Box-Cox/quantiles.
MINIMUM_SAMPLES_TO_IDENTIFY = 20
BOX_COX_MARGIN = 1e-4
BOX_COX_MAX_STDDEV = 1e8
# A standard deviation below this is a constant feature: divide by 1 instead of ~0.
MIN_STDDEV = 1e-6
# Box-Cox lambda search range; the grid is refined by golden-section search.
_LAMBDA_LO, _LAMBDA_HI, _LAMBDA_STEPS = -4.0, 4.0, 33

_NEEDS_DATA = (FeatureType.BOXCOX, FeatureType.QUANTILE, FeatureType.ENUM)


def identify_type(
    sample: np.ndarray, max_unique_enum_values: int = DEFAULT_MAX_UNIQUE_ENUM
) -> FeatureType:
    """ReAgent's rule: BINARY ⊂ PROBABILITY ⊂ ENUM ⊂ CONTINUOUS, first match wins.

    `sample` is 1-D, finite and non-empty. Box-Cox and quantile refinement of
    CONTINUOUS happen in `fit_feature`. A feature seen with one value only (a sparse
    one-hot, `{"10": 1.0}` when present and absent otherwise) is BINARY, as in Horizon:
    any other type would normalize that value to the 0 an absent feature gets (a
    CONTINUOUS mean, a PROBABILITY of 0.5), so presence, all it carries, would be lost.
    """
    uniq = np.unique(sample)
    if len(uniq) == 1 or np.all((uniq == 0.0) | (uniq == 1.0)):
        return FeatureType.BINARY
    lo, hi = float(uniq[0]), float(uniq[-1])
    if lo >= 0.0 and hi <= 1.0:
        return FeatureType.PROBABILITY
    if lo >= 0.0 and len(uniq) <= max_unique_enum_values and np.all(uniq == np.round(uniq)):
        return FeatureType.ENUM
    return FeatureType.CONTINUOUS


def normal_k2(x: np.ndarray) -> float:
    """D'Agostino-Pearson K² (skewness z² + kurtosis z²); 0 for fewer than 8 or constant values.

    Same statistic as `scipy.stats.normaltest`; larger = further from normal.
    """
    n = float(len(x))
    if n < 8:
        return 0.0
    d = x - x.mean()
    d2 = d * d
    m2 = float(np.mean(d2))
    if m2 <= 0.0 or not math.isfinite(m2):
        return 0.0
    # Products, not `d**3` / `d**4`: numpy's general pow is ~10x slower.
    skew = float(np.mean(d2 * d)) / m2**1.5
    kurt = float(np.mean(d2 * d2)) / m2**2
    if not (math.isfinite(skew) and math.isfinite(kurt)):
        return math.inf

    # Skewness test (D'Agostino 1970).
    y = skew * math.sqrt((n + 1) * (n + 3) / (6.0 * (n - 2)))
    beta2 = (
        3.0 * (n * n + 27 * n - 70) * (n + 1) * (n + 3) / ((n - 2) * (n + 5) * (n + 7) * (n + 9))
    )
    w2 = -1.0 + math.sqrt(2.0 * (beta2 - 1.0))
    delta = 1.0 / math.sqrt(0.5 * math.log(w2))
    alpha = math.sqrt(2.0 / (w2 - 1.0))
    y = y if y != 0.0 else 1.0
    z_skew = delta * math.asinh(y / alpha)

    # Kurtosis test (Anscombe & Glynn 1983).
    e = 3.0 * (n - 1) / (n + 1)
    var_b2 = 24.0 * n * (n - 2) * (n - 3) / ((n + 1) ** 2 * (n + 3) * (n + 5))
    xk = (kurt - e) / math.sqrt(var_b2)
    sqrt_beta1 = (
        6.0
        * (n * n - 5 * n + 2)
        / ((n + 7) * (n + 9))
        * math.sqrt(6.0 * (n + 3) * (n + 5) / (n * (n - 2) * (n - 3)))
    )
    a = 6.0 + 8.0 / sqrt_beta1 * (2.0 / sqrt_beta1 + math.sqrt(1.0 + 4.0 / sqrt_beta1**2))
    term1 = 1.0 - 2.0 / (9.0 * a)
    denom = 1.0 + xk * math.sqrt(2.0 / (a - 4.0))
    if denom == 0.0:
        return math.inf
    term2 = math.copysign(abs((1.0 - 2.0 / a) / abs(denom)) ** (1.0 / 3.0), denom)
    z_kurt = (term1 - term2) / math.sqrt(2.0 / (9.0 * a))
    return z_skew * z_skew + z_kurt * z_kurt


def boxcox_transform(z: np.ndarray, lam: float) -> np.ndarray:
    """(z^λ − 1)/λ, or log z at λ = 0; `z` must be positive."""
    logz = np.log(z)
    if abs(lam) < 1e-12:
        return logz
    return np.expm1(lam * logz) / lam


def _boxcox_llf(logz: np.ndarray, sum_log: float, lam: float) -> float:
    # Profile log-likelihood of λ (variance maximised out), as scipy.stats.boxcox_llf.
    # Takes log z (computed once per search): `boxcox_transform` without its np.log.
    with np.errstate(over="ignore", invalid="ignore"):
        y = logz if abs(lam) < 1e-12 else np.expm1(lam * logz) / lam
        var = float(np.var(y))
    if not math.isfinite(var) or var <= 0.0:
        return -math.inf
    return (lam - 1.0) * sum_log - 0.5 * len(logz) * math.log(var)


def boxcox_lambda(z: np.ndarray) -> float:
    """Maximum-likelihood Box-Cox λ for positive `z`: grid search, then golden section."""
    z = np.log(z)  # the search only ever needs log z
    sum_log = float(np.sum(z))
    grid = np.linspace(_LAMBDA_LO, _LAMBDA_HI, _LAMBDA_STEPS)
    llf = [_boxcox_llf(z, sum_log, float(g)) for g in grid]
    i = int(np.argmax(llf))
    a = float(grid[max(i - 1, 0)])
    b = float(grid[min(i + 1, len(grid) - 1)])
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - inv_phi * (b - a), a + inv_phi * (b - a)
    fc, fd = _boxcox_llf(z, sum_log, c), _boxcox_llf(z, sum_log, d)
    while b - a > 1e-5:
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - inv_phi * (b - a)
            fc = _boxcox_llf(z, sum_log, c)
        else:
            a, c, fc = c, d, fd
            d = a + inv_phi * (b - a)
            fd = _boxcox_llf(z, sum_log, d)
    return (a + b) / 2.0


def _mean_std(x: np.ndarray) -> tuple[float, float]:
    mean = float(np.mean(x))
    std = float(np.std(x, ddof=1)) if len(x) > 1 else 1.0
    if not math.isfinite(std) or std < MIN_STDDEV:
        std = 1.0
    return mean, std


def _quantiles(sorted_x: np.ndarray, max_quantiles: int) -> list[float]:
    # alphap=0, betap=1 in scipy's mquantiles = the interpolated inverted CDF (Hyndman-Fan 4).
    probs = np.arange(max_quantiles + 1, dtype=np.float64) / max_quantiles
    q = np.quantile(sorted_x, probs, method="interpolated_inverted_cdf")
    return [float(v) for v in np.unique(q)]


def _empty_params(requested: FeatureType | None) -> NormalizationParameters:
    # A feature never present in the sample still needs valid parameters.
    if requested is FeatureType.CONTINUOUS_ACTION:
        return NormalizationParameters(feature_type=requested, min_value=-1.0, max_value=1.0)
    if requested in (FeatureType.BINARY, FeatureType.PROBABILITY, FeatureType.DO_NOT_PREPROCESS):
        return NormalizationParameters(feature_type=requested)
    return NormalizationParameters(feature_type=FeatureType.CONTINUOUS)


def fit_feature(
    sample: np.ndarray,
    feature_type: FeatureType | None = None,
    *,
    max_unique_enum_values: int = DEFAULT_MAX_UNIQUE_ENUM,
    max_quantiles: int = DEFAULT_MAX_QUANTILES,
    quantile_k2_threshold: float = DEFAULT_QUANTILE_K2_THRESHOLD,
    skip_boxcox: bool = False,
    skip_quantiles: bool = False,
    feature_id: str = "?",
) -> NormalizationParameters:
    """Fit one feature from its non-missing values; `feature_type` forces the type."""
    x = np.sort(np.asarray(sample, dtype=np.float64).ravel())
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return _empty_params(feature_type)
    if feature_type in _NEEDS_DATA and len(x) < 2:
        logger.warning("feature %s: too few values for forced %s", feature_id, feature_type)
        feature_type = FeatureType.CONTINUOUS
    lo, hi = float(x[0]), float(x[-1])
    t = feature_type or identify_type(x, max_unique_enum_values)

    if t in (FeatureType.BINARY, FeatureType.PROBABILITY):
        return NormalizationParameters(feature_type=t, min_value=lo, max_value=hi)
    if t is FeatureType.ENUM:
        values = [float(v) for v in np.unique(x)]
        return NormalizationParameters(
            feature_type=t, possible_values=values, min_value=lo, max_value=hi
        )
    if t in (FeatureType.CONTINUOUS_ACTION, FeatureType.DO_NOT_PREPROCESS):
        mean, std = _mean_std(x)
        return NormalizationParameters(
            feature_type=t, mean=mean, stddev=std, min_value=lo, max_value=hi
        )

    # CONTINUOUS (identified or forced), or forced BOXCOX / QUANTILE.
    force_boxcox = feature_type is FeatureType.BOXCOX
    force_quantile = feature_type is FeatureType.QUANTILE
    force_continuous = feature_type is FeatureType.CONTINUOUS
    mean, std = _mean_std(x)
    continuous = NormalizationParameters(
        feature_type=FeatureType.CONTINUOUS, mean=mean, stddev=std, min_value=lo, max_value=hi
    )
    nearly_constant = hi - lo < BOX_COX_MARGIN
    if force_continuous or (
        not (force_boxcox or force_quantile)
        and (nearly_constant or len(x) < MINIMUM_SAMPLES_TO_IDENTIFY)
    ):
        return continuous

    k2_raw = normal_k2(x)
    if (not skip_boxcox or force_boxcox) and not force_quantile and not nearly_constant:
        shift = -lo
        z = np.maximum(x + shift, BOXCOX_MIN_BASE)  # the module's floor: fit = serve
        lam = boxcox_lambda(z)
        y = boxcox_transform(z, lam)
        k2_bc = normal_k2(y)
        worth_it = (lam < 0.9 or lam > 1.1) and k2_raw > 10.0 * k2_bc
        worth_it = worth_it and k2_bc <= quantile_k2_threshold
        bc_mean, bc_std = float(np.mean(y)), float(np.std(y, ddof=1))
        sane = math.isfinite(bc_std) and MIN_STDDEV < bc_std < BOX_COX_MAX_STDDEV
        logger.debug(
            "feature %s: K2 raw %.4g, Box-Cox(λ=%.4g) %.4g", feature_id, k2_raw, lam, k2_bc
        )
        if sane and (worth_it or force_boxcox):
            return NormalizationParameters(
                feature_type=FeatureType.BOXCOX,
                boxcox_lambda=lam,
                boxcox_shift=shift,
                mean=bc_mean,
                stddev=bc_std,
                min_value=lo,
                max_value=hi,
            )
    if force_quantile or (
        not force_boxcox and not skip_quantiles and k2_raw > quantile_k2_threshold
    ):
        q = _quantiles(x, max_quantiles)
        if len(q) >= 2:
            return NormalizationParameters(
                feature_type=FeatureType.QUANTILE, quantiles=q, min_value=lo, max_value=hi
            )
    if force_boxcox or force_quantile:
        logger.warning(
            "feature %s: cannot fit forced %s on this sample; using CONTINUOUS",
            feature_id,
            feature_type,
        )
    return continuous


def _action_default(column: np.ndarray) -> FeatureType:
    """CONTINUOUS_ACTION (ReAgent's default for action features), except for a feature
    whose present values are 0 and 1 only, or a single value. Those are BINARY (present
    and non-zero → 1; absent or 0 → 0), as Horizon identified them, for two reasons:

    * a single value under CONTINUOUS_ACTION has min = max and maps to 0, the value of an
      absent feature, so the candidates of a sparse one-hot action map (`{"10": 1.0}` /
      `{"11": 1.0}`) would all look the same to the network;
    * the dense one-hot map of the same actions (`{"10": 1.0, "11": 0.0}`) then becomes
      exactly the same network input as the sparse one (an absent BINARY feature and a
      present 0 both give 0, as in Horizon), so the two encodings train the same model;
      CONTINUOUS_ACTION would map a present 0 to -1 and make them differ.
    """
    present = column[np.isfinite(column)]
    if len(present) and (
        np.all(present == present[0]) or np.all((present == 0.0) | (present == 1.0))
    ):
        return FeatureType.BINARY
    return FeatureType.CONTINUOUS_ACTION


def fit_normalization(
    values: Any,
    feature_ids: Sequence[str],
    *,
    feature_overrides: Mapping[str, FeatureType | str] | None = None,
    action: bool = False,
    max_quantiles: int = DEFAULT_MAX_QUANTILES,
    max_unique_enum_values: int = DEFAULT_MAX_UNIQUE_ENUM,
    quantile_k2_threshold: float = DEFAULT_QUANTILE_K2_THRESHOLD,
    skip_boxcox: bool = False,
    skip_quantiles: bool = False,
) -> dict[str, NormalizationParameters]:
    """Fit parameters for every column of `values` ([N, F], NaN = missing; numpy or torch).

    `feature_overrides` forces a type per feature id; `action=True` makes CONTINUOUS_ACTION
    the default for features not overridden (ReAgent's `default_feature_override` for
    action features), BINARY for those seen with 0/1 values or a single value
    (`_action_default`). `max_quantiles` is ReAgent's `quantile_size`: the number of quantile
    intervals (at most `max_quantiles + 1` boundaries). Pure and deterministic.
    """
    if hasattr(values, "detach"):  # torch.Tensor without importing torch here
        values = values.detach().cpu().numpy()
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != len(feature_ids):
        raise ValueError(
            f"values must be [N, {len(feature_ids)}] to match feature_ids (got {arr.shape})"
        )
    if len(set(feature_ids)) != len(feature_ids):
        raise ValueError("feature_ids must be distinct")
    if max_quantiles < 1:
        raise ValueError(f"max_quantiles must be >= 1 (got {max_quantiles})")
    overrides = {
        str(k): FeatureType(str(getattr(v, "value", v)).upper())
        for k, v in (feature_overrides or {}).items()
    }
    unknown = sorted(set(overrides) - set(feature_ids))
    if unknown:
        logger.warning("feature_overrides name features not in the sample: %s", unknown)

    def fit(j: int) -> NormalizationParameters:
        fid = feature_ids[j]
        return fit_feature(
            arr[:, j],
            overrides.get(fid, _action_default(arr[:, j]) if action else None),
            max_unique_enum_values=max_unique_enum_values,
            max_quantiles=max_quantiles,
            quantile_k2_threshold=quantile_k2_threshold,
            skip_boxcox=skip_boxcox,
            skip_quantiles=skip_quantiles,
            feature_id=fid,
        )

    # Features are independent and their numpy passes release the GIL: fit them on the
    # machine's cores (each result depends on its own column only, so it is the same).
    workers = min(os.cpu_count() or 1, len(feature_ids), 8)
    if workers > 1 and len(arr) >= 10_000:
        with ThreadPoolExecutor(workers) as pool:
            fitted = list(pool.map(fit, range(len(feature_ids))))
    else:
        fitted = [fit(j) for j in range(len(feature_ids))]
    return dict(zip(feature_ids, fitted, strict=True))
