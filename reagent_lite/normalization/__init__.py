"""Feature normalization: identify types, fit parameters, JSON I/O, the torch `Preprocessor`."""

from reagent_lite.normalization.identify import fit_feature, fit_normalization, identify_type
from reagent_lite.normalization.module import MAX_FEATURE_VALUE, Preprocessor
from reagent_lite.normalization.params import (
    FeatureType,
    NormalizationParameters,
    load_normalization,
    parse_normalization,
    save_normalization,
    sorted_feature_ids,
)

__all__ = [
    "MAX_FEATURE_VALUE",
    "FeatureType",
    "NormalizationParameters",
    "Preprocessor",
    "fit_feature",
    "fit_normalization",
    "identify_type",
    "load_normalization",
    "parse_normalization",
    "save_normalization",
    "sorted_feature_ids",
]
