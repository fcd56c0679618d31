"""JSON I/O of normalization parameters: round trip, ReAgent layouts, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reagent_lite.errors import DataError
from reagent_lite.normalization import (
    FeatureType,
    NormalizationParameters,
    load_normalization,
    save_normalization,
)

PARAMS = {
    "10": NormalizationParameters(feature_type=FeatureType.CONTINUOUS, mean=1.5, stddev=2.0),
    "2": NormalizationParameters(feature_type=FeatureType.ENUM, possible_values=[0, 3, 7]),
    "3": NormalizationParameters(
        feature_type=FeatureType.BOXCOX, boxcox_lambda=0.5, boxcox_shift=1.0, mean=0.2, stddev=3.0
    ),
    "4": NormalizationParameters(feature_type=FeatureType.QUANTILE, quantiles=[0.0, 1.0, 5.0]),
    "5": NormalizationParameters(
        feature_type=FeatureType.CONTINUOUS_ACTION, min_value=-2.0, max_value=2.0
    ),
    "6": NormalizationParameters(feature_type=FeatureType.BINARY),
}


def test_round_trip_identical(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "norm.json"
    save_normalization(path, PARAMS)
    loaded = load_normalization(path)
    assert loaded == PARAMS
    # Keys sorted numerically, no temp files left behind.
    assert list(json.loads(path.read_text())) == ["2", "3", "4", "5", "6", "10"]
    assert [p.name for p in path.parent.iterdir()] == ["norm.json"]


def test_params_are_frozen() -> None:
    with pytest.raises(Exception, match="frozen"):
        PARAMS["10"].mean = 3.0


def test_loads_horizon_string_layout(tmp_path: Path) -> None:
    # Horizon's serialize(): each value is a JSON string of the 9 fields.
    fields = {
        "feature_type": "QUANTILE",
        "boxcox_lambda": None,
        "boxcox_shift": None,
        "mean": 0,
        "stddev": 1,
        "possible_values": None,
        "quantiles": [-0.93, -0.11, 0.06, 2.39],
        "min_value": -0.93,
        "max_value": 2.39,
    }
    cont = dict(
        fields, feature_type=FeatureType.CONTINUOUS, quantiles=None, mean=0.009, stddev=0.064
    )
    doc = {"0": json.dumps(fields), "2": json.dumps(cont)}
    path = tmp_path / "cartpole_norm.json"
    path.write_text(json.dumps(doc))
    loaded = load_normalization(path)
    assert loaded["0"].feature_type is FeatureType.QUANTILE
    assert loaded["0"].quantiles == [-0.93, -0.11, 0.06, 2.39]
    assert loaded["2"].feature_type is FeatureType.CONTINUOUS
    assert loaded["2"].stddev == pytest.approx(0.064)


def test_loads_reagent_dict_layout(tmp_path: Path) -> None:
    doc = {
        "4": {
            "feature_type": "BINARY",
            "boxcox_lambda": None,
            "boxcox_shift": 0,
            "mean": 0,
            "stddev": 1,
            "possible_values": None,
            "quantiles": None,
            "min_value": 0.0,
            "max_value": 1.0,
        },
        "5": {"feature_type": "ENUM", "possible_values": [1, 2, 3]},
    }
    path = tmp_path / "action_norm.json"
    path.write_text(json.dumps(doc))
    loaded = load_normalization(path)
    assert loaded["4"].feature_type is FeatureType.BINARY
    assert loaded["5"].possible_values == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", r"not valid JSON at line 1"),
        ("[1, 2]", r"expected a JSON object keyed by feature id"),
        ('{"7": 3}', r"feature '7': expected an object"),
        ('{"7": "nope"}', r"feature '7': value is a string but not JSON"),
        ('{"7": {"feature_type": "ENUM"}}', r"feature '7': ENUM needs a non-empty"),
        ('{"7": {"feature_type": "WHATEVER"}}', r"feature '7': feature_type"),
        ('{"7": {"feature_type": "CONTINUOUS", "stdev": 1}}', r"feature '7': stdev: Extra"),
        ('{"7": {"feature_type": "CONTINUOUS", "stddev": 0}}', r"feature '7': stddev"),
        ('{"7": {"feature_type": "QUANTILE", "quantiles": [3, 1]}}', r"sorted ascending"),
        ('{"7": {"feature_type": "BOXCOX", "boxcox_lambda": 0.5}}', r"needs boxcox_lambda"),
    ],
)
def test_bad_files_name_file_and_problem(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataError, match=expected) as info:
        load_normalization(path)
    assert str(path) in str(info.value)
    assert info.value.exit_code == 3


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="normalization file not found"):
        load_normalization(tmp_path / "absent.json")
