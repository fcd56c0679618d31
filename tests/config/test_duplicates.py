"""A setting given twice is refused, never read as the last value: a key repeated in a
config file (at any depth, Horizon-era files included), Horizon's name beside ours, an
override or a value flag repeated with another value. Exit 2, naming both values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reagent_lite.config import load_config
from reagent_lite.config.json_text import DuplicateKeys, parse_json
from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.config.overrides import apply_overrides, parse_override
from reagent_lite.errors import ConfigError
from tests.config.conftest import REPO, minimal_dqn
from tests.config.test_cli import run_workflow

HORIZON = REPO / "sample_configs" / "discrete_action" / "horizon_dqn_example.json"


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(path, DQNWorkflowConfig)
    return str(err.value)


def test_a_top_level_key_given_twice_names_the_file_both_values_and_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.json"
    path.write_text(
        '{\n "training_data_path": "train.parquet",\n "model_output_path": "out",\n'
        ' "actions": ["a", "b"],\n "training_data_path": "eval.parquet"\n}\n'
    )
    message = refused(path)
    assert message.startswith(f"{path}: training_data_path: key given twice"), message
    assert '"train.parquet" at line 2, then "eval.parquet" at line 5' in message


def test_a_nested_key_given_twice_is_named_by_its_config_path(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    text = json.dumps({**minimal_dqn(), "training": {"learning_rate": 0.1, "DUP": 0}}, indent=1)
    path.write_text(text.replace('"DUP": 0', '"learning_rate": 0.01'))
    message = refused(path)
    assert f"{path}: training.learning_rate: key given twice" in message
    assert "(got 0.1 at line 9, then 0.01 at line 10)" in message
    # The same key name in another object too: its lines are not told apart, so none shown.
    path.write_text(text.replace('"DUP": 0', '"learning_rate": 0.01, "rl": {"learning_rate": 1}'))
    assert (
        "training.learning_rate: key given twice, and JSON would silently keep the last "
        "(got 0.1, then 0.01)" in refused(path)
    )


def test_keys_repeated_inside_lists_and_deep_objects_are_found() -> None:
    text = '{"a": [{"b": 1}, {"b": 2, "c": {"d": 1, "d": 1}}], "e": 1, "e": 2}'
    with pytest.raises(DuplicateKeys) as err:
        parse_json(text)
    found = {(d.path, d.first, d.second) for d in err.value.duplicates}
    assert found == {("a[1].c.d", 1, 1), ("e", 1, 2)}  # the same value twice is refused too
    assert parse_json('{"a": [{"b": 1}, {"b": 2}]}') == {"a": [{"b": 1}, {"b": 2}]}


def test_a_horizon_example_with_training_data_path_twice_exits_2(tmp_path: Path) -> None:
    # Horizon's example as a user copies it, with the eval path pasted over a second
    # training_data_path: the run would train on the eval file.
    text = HORIZON.read_text(encoding="utf-8")
    second = '  "training_data_path": "training_data/cartpole_discrete_timeline_eval.json",\n'
    path = tmp_path / "horizon.json"
    path.write_text(text.replace("{\n", "{\n" + second, 1), encoding="utf-8")
    proc = run_workflow(["--config", str(path), "--dry_run"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "training_data_path: key given twice" in proc.stderr
    assert '"training_data/cartpole_discrete_timeline_eval.json" at line 2' in proc.stderr
    assert '"training_data/cartpole_discrete_timeline.json" at line 3' in proc.stderr
    assert "Traceback" not in proc.stderr


def test_horizon_name_and_ours_with_different_values_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    training = {"use_layer_norm": True, "layer_norm": False}
    path.write_text(json.dumps({**minimal_dqn(), "training": training}))
    message = refused(path)
    assert "training.layer_norm: given twice, as training.use_layer_norm" in message
    assert "meaning true" in message and "(got false)" in message
    path.write_text(json.dumps({**minimal_dqn(), "training": {**training, "layer_norm": True}}))
    assert load_config(path, DQNWorkflowConfig).training.layer_norm is True


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["epochs=5", "epochs=7"], "override epochs: given twice with different values (got epochs=5, then epochs=7)"),
        (["training.learning_rate=0.1", 'training={"layers": [-1, -1]}'], "(got training.learning_rate=0.1, then training="),
        ({"training.learning_rate": 0.1, "training": {}}, "override training: given twice"),
    ],
)  # fmt: skip
def test_an_override_given_twice_with_different_values_is_refused(
    overrides: list[str] | dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        apply_overrides(minimal_dqn(), overrides)
    assert expected in str(err.value)


def test_an_override_repeated_with_the_same_value_or_merged_deeper_is_fine() -> None:
    merged = apply_overrides(
        minimal_dqn(), ["epochs=5", "epochs=5", 'training={"layers": [-1, -1]}', "training.dropout_ratio=0.1"]
    )  # fmt: skip
    assert merged["epochs"] == 5
    assert merged["training"] == {"layers": [-1, -1], "dropout_ratio": 0.1}


def test_an_override_value_repeating_a_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"override rl: rl\.gamma: key given twice .*0\.9.*0\.5"):
        parse_override('rl={"gamma": 0.9, "gamma": 0.5}')


def test_cli_overrides_and_value_flags_given_twice_exit_2(tmp_path: Path) -> None:
    config = REPO / "sample_configs/ci/dqn_1node.json"
    proc = run_workflow(["--config", str(config), "--dry_run", "epochs=2", "epochs=3"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "got epochs=2, then epochs=3" in proc.stderr and "Traceback" not in proc.stderr
    other = tmp_path / "other.json"
    proc = run_workflow(["--config", str(config), "--dry_run", "-c", str(other)], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"-c: given twice with different values (got {config}, then {other})" in proc.stderr
    proc = run_workflow(["--config", str(config), "--config", str(config), "--dry_run"], tmp_path)
    assert proc.returncode == 0, proc.stderr
