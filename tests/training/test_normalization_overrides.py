"""normalization_overrides in the config force a feature's normalization type where it is
fitted (training and the dry run alike); a misspelt type or id is a config error."""

from __future__ import annotations

from pathlib import Path

import pytest

from reagent_lite.config.loader import config_from_dict
from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.errors import ConfigError
from reagent_lite.normalization.params import FeatureType
from tests.data.test_ingest import rows, write
from tests.training.test_load_training_data import _load


def test_forced_type_replaces_the_identified_one(tmp_path: Path) -> None:
    data = rows(60)
    for i, r in enumerate(data):  # an hour-of-day-like code: identified as ENUM
        r["state_features"]["9"] = float(i % 4 + 1)
    path = write(tmp_path / "t.parquet", data, 20)
    plain = _load(path, tmp_path)
    assert plain.norm["state"]["9"].feature_type is FeatureType.ENUM
    forced = _load(path, tmp_path, normalization_overrides={"state": {"9": "CONTINUOUS"}})
    assert forced.norm["state"]["9"].feature_type is FeatureType.CONTINUOUS
    # The others are identified as before.
    for fid, params in plain.norm["state"].items():
        if fid != "9":
            assert forced.norm["state"][fid] == params


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"state": {"9": "CONTINUOS"}}, "normalization_overrides.state.9: input should be"),
        ({"state": {"hour": "ENUM"}}, "normalization_overrides.state.hour: feature ids are"),
        ({"states": {}}, "normalization_overrides.states: unknown key; did you mean 'state'?"),
    ],
)
def test_bad_overrides_are_config_errors(overrides: dict[str, object], expected: str) -> None:
    data = {
        "training_data_path": "t.parquet",
        "model_output_path": "out",
        "actions": ["a", "b"],
        "normalization_overrides": overrides,
    }
    with pytest.raises(ConfigError, match=expected):
        config_from_dict(data, DQNWorkflowConfig)
