"""The config models: defaults, strictness and cross-field checks, with the paths they report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from reagent_lite.config import (
    DQNWorkflowConfig,
    ParametricDQNWorkflowConfig,
    config_from_dict,
)
from reagent_lite.errors import ConfigError
from tests.config.conftest import minimal_dqn, minimal_parametric


def dqn(**changes: Any) -> dict[str, Any]:
    data = minimal_dqn()
    data.update(changes)
    return data


def problem(data: dict[str, Any], cls: type = DQNWorkflowConfig) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, cls, source="c.json")
    return str(info.value)


def test_defaults_are_the_documented_ones() -> None:
    cfg = DQNWorkflowConfig.model_validate(minimal_dqn())
    assert cfg.workflow == "dqn"
    assert cfg.num_nodes == 1 and cfg.init_method is None
    assert cfg.use_gpu and cfg.use_all_avail_gpus
    assert cfg.epochs == 10 and cfg.seed == 0
    assert cfg.rendezvous_timeout_s == 600 and cfg.collective_timeout_s == 1800
    assert cfg.rl.gamma == 0.99 and cfg.rl.maxq_learning is True
    assert cfg.rl.q_network_loss == "mse"
    assert cfg.rainbow.double_q_learning and not cfg.rainbow.dueling_architecture
    assert cfg.training.layers == [-1, 256, 256, -1]
    assert cfg.training.activations == ["relu", "relu", "linear"]
    assert cfg.training.minibatch_size == 1024 and cfg.training.optimizer == "adam"
    assert cfg.evaluation.calc_cpe_in_training and cfg.evaluation.model_selection == "last"
    assert cfg.sample_data is None and cfg.norm_params is None
    p = ParametricDQNWorkflowConfig.model_validate(minimal_parametric())
    assert p.workflow == "parametric_dqn" and p.max_candidates is None


def test_every_field_is_described() -> None:
    from pydantic import BaseModel

    seen: set[type] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    walk(arg)

    walk(DQNWorkflowConfig)
    walk(ParametricDQNWorkflowConfig)
    assert len(seen) >= 7


def test_models_are_frozen() -> None:
    cfg = DQNWorkflowConfig.model_validate(minimal_dqn())
    with pytest.raises(ValidationError):
        cfg.epochs = 3


def test_horizon_spellings_load() -> None:
    cfg = DQNWorkflowConfig.model_validate(
        dqn(rl={"maxq_learning": 0, "softmax_policy": 1}, training={"optimizer": "ADAM"})
    )
    assert cfg.rl.maxq_learning is False and cfg.rl.softmax_policy is True
    assert cfg.training.optimizer == "adam"


def test_strict_types() -> None:
    assert 'epochs: input should be a valid integer (got "10")' in problem(dqn(epochs="10"))
    assert "rl.maxq_learning" in problem(dqn(rl={"maxq_learning": 2}))
    assert "training.minibatch_size" in problem(dqn(training={"minibatch_size": 32.5}))


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        ([-1, 64, -1], ["relu", "linear"]),
        ([-1, -1], ["linear"]),
        ([-1, 32, 32, 32, -1], ["relu", "relu", "relu", "linear"]),
    ],
)
def test_unset_activations_follow_layers(layers: list[int], expected: list[str]) -> None:
    cfg = DQNWorkflowConfig.model_validate(dqn(training={"layers": layers}))
    assert cfg.training.activations == expected


def test_activations_are_known_and_normalised() -> None:
    cfg = DQNWorkflowConfig.model_validate(
        dqn(training={"layers": [-1, 8, -1], "activations": ["ReLU", "Identity"]})
    )
    assert cfg.training.activations == ["relu", "identity"]
    msg = problem(dqn(training={"layers": [-1, 8, -1], "activations": ["relu", "swish"]}))
    assert "c.json: training.activations[1]: unknown activation" in msg
    assert '(got "swish")' in msg


def test_layer_shape_checks() -> None:
    msg = problem(dqn(training={"layers": [-1, 64, -1, -1], "activations": ["relu"] * 3}))
    assert "training.layers[2]: -1 is only allowed as the first or last entry" in msg
    msg = problem(dqn(training={"layers": [-1, 0, -1], "activations": ["relu", "linear"]}))
    assert "training.layers[1]" in msg
    msg = problem(dqn(training={"layers": [-1, 64, -1], "activations": ["relu"]}))
    assert "training.activations: needs len(layers) - 1 = 2 entries" in msg
    assert "training.layers[0]" in problem(dqn(training={"layers": [-2, 64, -1]}))
    # An explicit output size must match the number of actions.
    ok = {"layers": [4, 16, 2], "activations": ["relu", "linear"]}
    assert DQNWorkflowConfig.model_validate(dqn(training=ok)).training.layers == [4, 16, 2]
    bad = {"layers": [-1, 16, 3], "activations": ["relu", "linear"]}
    assert "training.layers[2]: output size must be -1 or the number of actions" in problem(
        dqn(training=bad)
    )
    assert "training.layers[2]" in problem(
        {**minimal_parametric(), "training": bad}, ParametricDQNWorkflowConfig
    )


def test_actions_non_empty_and_unique() -> None:
    assert "actions: list should have at least 1 item" in problem(dqn(actions=[]))
    assert "actions[2]: duplicate action name" in problem(dqn(actions=["a", "b", "a"]))
    assert "actions[0]: action names must be non-empty" in problem(dqn(actions=[""]))
    assert "actions: required key is missing" in problem(
        {"training_data_path": "x", "model_output_path": "y"}
    )


def test_reward_boost_names_actions() -> None:
    msg = problem(dqn(rl={"reward_boost": {"up": 1.0}}))
    assert "rl.reward_boost.up: not one of the actions" in msg


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"rl": {"gamma": 1.5}}, "rl.gamma"),
        ({"rl": {"target_update_rate": 0}}, "rl.target_update_rate"),
        ({"rl": {"epsilon": -0.1}}, "rl.epsilon"),
        ({"rl": {"temperature": 0}}, "rl.temperature"),
        ({"training": {"dropout_ratio": 1.0}}, "training.dropout_ratio"),
        ({"training": {"learning_rate": 0}}, "training.learning_rate"),
        ({"training": {"minibatch_size": 0}}, "training.minibatch_size"),
        ({"training": {"lr_decay": 1.5}}, "training.lr_decay"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"epochs": 0}, "epochs"),
        ({"rendezvous_timeout_s": -1}, "rendezvous_timeout_s"),
        ({"sample_data": {"eval_fraction": 1.0}}, "sample_data.eval_fraction"),
        ({"sample_data": {"episodes": 0}}, "sample_data.episodes"),
        # An empty path would silently mean the working directory.
        ({"model_output_path": ""}, "model_output_path"),
        ({"training_data_path": ""}, "training_data_path"),
        ({"eval_data_path": ""}, "eval_data_path"),
        ({"state_norm_data_path": ""}, "state_norm_data_path"),
        ({"training": {"warm_start_model_path": ""}}, "training.warm_start_model_path"),
    ],
)
def test_ranges(change: dict[str, Any], path: str) -> None:
    assert f"c.json: {path}: " in problem(dqn(**change))


def test_init_method_rules() -> None:
    msg = problem(dqn(num_nodes=2))
    assert "init_method: required when num_nodes > 1" in msg
    assert "init_method: must be a file:// URL" in problem(dqn(init_method="tcp://h:1234"))
    assert "must be an absolute file URL" in problem(dqn(init_method="file://rel/x"))
    cfg = DQNWorkflowConfig.model_validate(dqn(num_nodes=2, init_method="file:///nfs/j/rdzv"))
    assert cfg.init_method == "file:///nfs/j/rdzv"
    assert "data_parallel" in problem(
        dqn(num_nodes=2, init_method="file:///nfs/j/rdzv", data_parallel="dp")
    )


def test_cross_block_checks() -> None:
    assert "evaluation.online_episodes: needs a sample_data block" in problem(
        dqn(evaluation={"online_episodes": 3})
    )
    assert "sample_data.kind" in problem(dqn(sample_data={"kind": "synthetic_parametric"}))
    assert "rainbow.dueling_architecture" in problem(
        {**minimal_parametric(), "rainbow": {"dueling_architecture": True}},
        ParametricDQNWorkflowConfig,
    )


def test_norm_params_num_samples_sets_sample_size() -> None:
    cfg = DQNWorkflowConfig.model_validate(dqn(norm_params={"num_samples": 1000}))
    assert cfg.normalization_sample_size == 1000
    cfg = DQNWorkflowConfig.model_validate(
        dqn(norm_params={"num_samples": 1000}, normalization_sample_size=50)
    )
    assert cfg.normalization_sample_size == 50


def test_unknown_keys_suggest_the_known_one() -> None:
    msg = problem(dqn(training={"learnig_rate": 0.1}))
    assert "training.learnig_rate: unknown key; did you mean 'learning_rate'?" in msg


def test_resolved_makes_paths_absolute(tmp_path: Path) -> None:
    cfg = ParametricDQNWorkflowConfig.model_validate(
        {
            **minimal_parametric(),
            "action_norm_data_path": "norm/a.json",
            "training": {"warm_start_model_path": "ckpt/m.pt"},
        }
    )
    r = cfg.resolved(tmp_path)
    assert r.training_data_path == str(tmp_path.resolve() / "data/train.parquet")
    assert r.model_output_path == str(tmp_path.resolve() / "out")
    assert r.action_norm_data_path == str(tmp_path.resolve() / "norm/a.json")
    assert r.training.warm_start_model_path == str(tmp_path.resolve() / "ckpt/m.pt")
    assert r.eval_data_path is None
    assert isinstance(r, ParametricDQNWorkflowConfig)


def test_round_trip_through_json() -> None:
    cfg = DQNWorkflowConfig.model_validate(dqn(rl={"maxq_learning": 0}))
    again = DQNWorkflowConfig.model_validate(cfg.model_dump(mode="json"))
    assert again == cfg
