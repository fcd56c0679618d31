"""load_config: file errors, Horizon migration and the one-line-per-problem messages."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reagent_lite.config import (
    DQNWorkflowConfig,
    ParametricDQNWorkflowConfig,
    load_config,
)
from reagent_lite.errors import ConfigError
from tests.config.conftest import REPO, minimal_dqn, minimal_parametric

Writer = Callable[..., Path]
HORIZON = REPO / "sample_configs" / "discrete_action" / "horizon_dqn_example.json"


def load_error(path: Path, cls: type = DQNWorkflowConfig) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, cls)
    return str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    assert load_error(path) == f"{path}: config file not found"


def test_directory(tmp_path: Path) -> None:
    assert "is a directory" in load_error(tmp_path)


def test_not_json_names_line_and_column(write_config: Writer) -> None:
    path = write_config('{\n  "epochs": 3,\n  "actions": [1,,]\n}')
    msg = load_error(path)
    assert msg.startswith(f"{path}: not valid JSON: ")
    assert "line 3, column" in msg


def test_nan_is_not_json(write_config: Writer) -> None:
    assert "NaN" in load_error(write_config('{"epochs": NaN}'))


def test_top_level_must_be_object(write_config: Writer) -> None:
    assert "must be a JSON object (got [1, 2])" in load_error(write_config([1, 2]))


def test_schema_key_is_ignored(write_config: Writer) -> None:
    cfg = load_config(write_config({"$schema": "x.json", **minimal_dqn()}), DQNWorkflowConfig)
    assert cfg.actions == ["left", "right"]


def test_one_line_per_problem(write_config: Writer) -> None:
    data = {**minimal_dqn(), "epochs": "ten", "rl": {"gamma": 2}, "bogus": 1}
    del data["model_output_path"]
    path = write_config(data)
    lines = load_error(path).splitlines()
    assert len(lines) == 4, lines
    assert all(line.startswith(f"{path}: ") for line in lines)
    text = "\n".join(lines)
    assert 'epochs: input should be a valid integer (got "ten")' in text
    assert "rl.gamma: input should be less than or equal to 1 (got 2)" in text
    assert "bogus: unknown key (got 1)" in text
    assert "model_output_path: required key is missing" in text


def test_horizon_config_loads_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="reagent_lite.config"):
        cfg = load_config(HORIZON, DQNWorkflowConfig)
    assert cfg.training.optimizer == "adam"
    assert cfg.rl.maxq_learning is True and cfg.rl.softmax_policy is False
    assert cfg.training.layers == [-1, 128, 64, -1]
    assert cfg.training.lr_decay == 0.999
    assert cfg.normalization_sample_size == 1000
    assert cfg.evaluation.calc_cpe_in_training is False  # Horizon: in_training_cpe null
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for key in (
        "rl.reward_burnin",
        "training.use_noisy_linear_layers",
        "norm_params.output_dir",
        "norm_params.cols_to_norm",
    ):
        assert any(key in m for m in warned), (key, warned)
    assert all(r.name == "reagent_lite.config" for r in caplog.records)


@pytest.mark.parametrize(
    ("cls", "extra", "key"),
    [
        (DQNWorkflowConfig, {"rl": {"softmax_policy": True}}, "rl.softmax_policy"),
        (DQNWorkflowConfig, {"rl": {"epsilon": 0.2}}, "rl.epsilon"),
        (DQNWorkflowConfig, {"rl": {"temperature": 0.5}}, "rl.temperature"),
        (DQNWorkflowConfig, {"evaluation": {"model_selection": "cpe"}}, "model_selection"),
        (
            DQNWorkflowConfig,
            {
                "eval_data_path": "e.parquet",
                "evaluation": {"model_selection": "cpe", "calc_cpe_in_training": False},
            },
            "model_selection",
        ),
        (
            ParametricDQNWorkflowConfig,
            {
                "sample_data": {"kind": "synthetic_parametric"},
                "evaluation": {"online_episodes": 5},
            },
            "online_episodes",
        ),
    ],
)
def test_settings_without_effect_warn(
    write_config: Writer,
    caplog: pytest.LogCaptureFixture,
    cls: type,
    extra: dict[str, Any],
    key: str,
) -> None:
    base = minimal_dqn() if cls is DQNWorkflowConfig else minimal_parametric()
    with caplog.at_level(logging.WARNING, logger="reagent_lite.config"):
        load_config(write_config({**base, **extra}), cls)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(key in m and "has no effect" in m for m in warned), warned


def test_temperature_of_an_evaluated_softmax_warns_about_nothing(
    write_config: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    data = {**minimal_dqn(), "rl": {"temperature": 0.5}, "evaluation": {"policy": "softmax"}}
    with caplog.at_level(logging.WARNING, logger="reagent_lite.config"):
        cfg = load_config(write_config(data), DQNWorkflowConfig)
    assert cfg.evaluation.policy == "softmax"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_defaults_warn_about_nothing(
    write_config: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    data = {**minimal_dqn(), "eval_data_path": "e.parquet"}
    data["evaluation"] = {"model_selection": "cpe"}
    with caplog.at_level(logging.WARNING, logger="reagent_lite.config"):
        load_config(write_config(data), DQNWorkflowConfig)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_in_training_cpe_object_turns_cpe_on(
    write_config: Writer, caplog: pytest.LogCaptureFixture
) -> None:
    data = {**minimal_dqn(), "in_training_cpe": {"mdp_sampled_rate": 0.1}}
    with caplog.at_level(logging.WARNING, logger="reagent_lite.config"):
        cfg = load_config(write_config(data), DQNWorkflowConfig)
    assert cfg.evaluation.calc_cpe_in_training is True
    assert "in_training_cpe.mdp_sampled_rate ignored" in caplog.text


def test_explicit_evaluation_wins_over_in_training_cpe(write_config: Writer) -> None:
    data = {
        **minimal_dqn(),
        "in_training_cpe": None,
        "evaluation": {"calc_cpe_in_training": True},
    }
    cfg = load_config(write_config(data), DQNWorkflowConfig)
    assert cfg.evaluation.calc_cpe_in_training is True


def test_use_layer_norm_is_renamed(write_config: Writer) -> None:
    data = {**minimal_dqn(), "training": {"use_layer_norm": True}}
    assert load_config(write_config(data), DQNWorkflowConfig).training.layer_norm is True


@pytest.mark.parametrize(
    ("rainbow", "want"),
    [
        ({"bcq": True}, 0.1),  # Horizon's default threshold
        ({"bcq": True, "bcq_drop_threshold": 0.3}, 0.3),
        ({"bcq": False, "bcq_drop_threshold": 0.3}, None),  # Horizon's switch off: off
        ({"bcq_drop_threshold": 0.3}, 0.3),  # ours
        ({}, None),
    ],
)
def test_horizon_bcq_switch_and_threshold(
    write_config: Writer, rainbow: dict[str, Any], want: float | None
) -> None:
    data = {**minimal_dqn(), "rainbow": rainbow}
    cfg = load_config(write_config(data), DQNWorkflowConfig)
    assert cfg.rainbow.bcq_drop_threshold == want
    msg = load_error(write_config({**minimal_dqn(), "rainbow": {"bcq_drop_threshold": 1.5}}))
    assert "rainbow.bcq_drop_threshold" in msg and "1.5" in msg


@pytest.mark.parametrize(
    ("block", "key", "value"),
    [
        ("rainbow", "categorical", True),
        ("rainbow", "quantile", True),
        ("training", "use_noisy_linear_layers", True),
        ("training", "use_batch_norm", True),
        ("rl", "multi_steps", 3),
    ],
)
def test_unsupported_horizon_options_are_errors(
    write_config: Writer, block: str, key: str, value: Any
) -> None:
    path = write_config({**minimal_dqn(), block: {key: value}})
    msg = load_error(path)
    assert f"{path}: {block}.{key}: Horizon option not supported" in msg
    assert f"(got {json.dumps(value)})" in msg


def test_dqn_config_into_parametric_workflow(write_config: Writer) -> None:
    msg = load_error(write_config(minimal_dqn()), ParametricDQNWorkflowConfig)
    assert "this is a dqn config" in msg and "workflows.dqn_workflow" in msg
    msg = load_error(write_config({**minimal_parametric(), "workflow": "dqn"}),
                     ParametricDQNWorkflowConfig)  # fmt: skip
    assert "this is a dqn config" in msg


def test_parametric_config_into_dqn_workflow(write_config: Writer) -> None:
    data = {**minimal_parametric(), "workflow": "parametric_dqn"}
    msg = load_error(write_config(data), DQNWorkflowConfig)
    assert "workflow: this is a parametric_dqn config" in msg
    assert "workflows.parametric_dqn_workflow" in msg


def test_every_sample_config_loads() -> None:
    files = sorted((REPO / "sample_configs").rglob("*.json"))
    assert len(files) >= 7
    for path in files:
        cls = ParametricDQNWorkflowConfig if "parametric" in path.name else DQNWorkflowConfig
        cfg = load_config(path, cls)
        if "$schema" in json.loads(path.read_text()):
            assert isinstance(cfg, cls)
