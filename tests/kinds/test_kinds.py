"""The kinds: networks and trainers built from typed configs, serving inputs, lookup."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typing_extensions import get_protocol_members

from reagent_lite.config import (
    BaseWorkflowConfig,
    DQNWorkflowConfig,
    ParametricDQNWorkflowConfig,
    config_from_dict,
)
from reagent_lite.distributed.context import DistContext
from reagent_lite.errors import ConfigError
from reagent_lite.kinds import KINDS, DiscreteSpace, ParametricSpace, get_kind
from reagent_lite.models.dueling import DuelingQNetwork
from reagent_lite.normalization.identify import fit_normalization
from reagent_lite.normalization.module import Preprocessor

PATHS = {"training_data_path": "t.parquet", "model_output_path": "out"}


def test_lookup_by_name() -> None:
    assert set(KINDS) == {"dqn", "parametric_dqn"}
    assert all(get_kind(name).name == name for name in KINDS)
    with pytest.raises(ConfigError, match="unknown kind"):
        get_kind("slate")


def test_discrete_network_and_trainer_from_a_horizon_style_config() -> None:
    cfg = config_from_dict(
        {
            **PATHS,
            "actions": ["a", "b", "c"],
            "rl": {"gamma": 0.9, "maxq_learning": 1, "q_network_loss": "huber",
                   "reward_boost": {"a": 1.0}},
            "rainbow": {"double_q_learning": False, "dueling_architecture": True},
            "training": {"layers": [-1, 8, -1], "activations": ["relu", "linear"],
                         "optimizer": "ADAM", "l2_decay": 0.001, "minibatches_per_step": 2},
        },
        DQNWorkflowConfig,
    )  # fmt: skip
    kind = get_kind("dqn")
    space = DiscreteSpace(state_ids=["0", "1", "2", "3"], actions=list(cfg.actions))
    net = kind.build_q_network(cfg, {"state": 4}, space)
    assert isinstance(net, DuelingQNetwork)
    assert net(torch.randn(2, 4)).shape == (2, 3)
    trainer = kind.build_trainer(net, cfg, space, net)
    hp = trainer.hp
    assert hp.maxq_learning is True and hp.optimizer == "adam" and hp.q_network_loss == "huber"
    assert hp.double_q_learning is False and hp.minibatches_per_step == 2 and hp.gamma == 0.9
    assert trainer.optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.001)
    assert trainer.reward_boost is not None and trainer.reward_boost.tolist() == [1.0, 0.0, 0.0]
    assert kind.schema(cfg).kind == "dqn"
    assert kind.layout(cfg).builder(1, "t.parquet").actions == ["a", "b", "c"]
    assert kind.norm_files(cfg) == {"state": None}


def test_parametric_network_and_trainer_from_config() -> None:
    cfg = ParametricDQNWorkflowConfig(
        **PATHS,
        action_norm_data_path="a.json",
        rl={"maxq_learning": 0},
        training={"layers": [-1, 8, -1], "activations": ["relu", "linear"], "optimizer": "sgd"},
    )
    kind = get_kind("parametric_dqn")
    space = ParametricSpace(state_ids=["0"] * 4, action_ids=["10", "11"], max_candidates=5)
    net = kind.build_q_network(cfg, {"state": 4, "action": 2}, space)
    assert net(torch.randn(3, 4), torch.randn(3, 5, 2)).shape == (3, 5)
    trainer = kind.build_trainer(net, cfg, space, net)
    assert trainer.hp.maxq_learning is False and isinstance(trainer.optimizer, torch.optim.SGD)
    assert kind.schema(cfg).kind == "parametric_dqn"
    assert kind.norm_files(cfg) == {"state": None, "action": str(cfg.action_norm_data_path)}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_serving_module_takes_its_example_inputs_with_any_batch(name: str) -> None:
    kind = get_kind(name)
    space = kind.space_type.from_json(
        {"state_feature_ids": ["0", "1"], "actions": ["x", "y"], "action_feature_ids": ["5"],
         "max_candidates": 1}
    )  # fmt: skip
    dims = {"state": 2, "action": 1}
    pre = {
        group: Preprocessor(ids, fit_normalization(torch.randn(50, len(ids)).double().numpy(), ids))
        for group, ids in (("state", space.state_ids), ("action", ["5"]))
    }
    cfg_cls = DQNWorkflowConfig if name == "dqn" else ParametricDQNWorkflowConfig
    extra = {"actions": ["x", "y"]} if name == "dqn" else {}
    cfg = cfg_cls(**PATHS, **extra)
    serving = kind.serving_module(pre, kind.build_q_network(cfg, dims, space)).eval()
    for batch in (1, 4):
        inputs = kind.example_inputs(space, batch)
        out = serving(*inputs)
        assert out.shape[0] == batch and torch.isfinite(out).all()
    assert set(kind.dynamic_shapes()) <= set(serving.forward.__code__.co_varnames)
    assert kind.signature["inputs"] and kind.signature["output"]


def test_parametric_scoring_of_rows_without_any_candidate() -> None:
    """A JSON Lines table whose `possible_actions` is null throughout (no row has a
    candidate) scores to empty rankings, not an Arrow error."""
    import pyarrow as pa

    kind = get_kind("parametric_dqn")
    space = ParametricSpace(state_ids=["0"], action_ids=["10"], max_candidates=2)
    table = pa.table({"state_features": pa.nulls(3), "possible_actions": pa.nulls(3)})
    seen: list[tuple[int, ...]] = []

    def program(*inputs: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(inputs[2].shape))
        return torch.zeros(inputs[-1].shape)

    state = (torch.zeros(3, 1), torch.zeros(3, 1))
    out = kind.score_rows(program, table, state, space, batch_size=2, source="t.jsonl")
    assert out.column("candidate_scores").to_pylist() == [[], [], []]
    assert out.column("best_candidate").to_pylist() == [None, None, None]
    assert seen == [(2, 1, 1), (1, 1, 1)]  # two row batches, one empty candidate slot each


def test_each_kind_has_a_feature_space_of_its_own_fields() -> None:
    d = DiscreteSpace(state_ids=["0"], actions=["a", "b"])
    p = ParametricSpace(state_ids=["0"], action_ids=["9"], max_candidates=4)
    assert d.to_json() == {"state_feature_ids": ["0"], "actions": ["a", "b"]}
    assert p.to_json() == {
        "state_feature_ids": ["0"], "action_feature_ids": ["9"], "max_candidates": 4
    }  # fmt: skip
    # model_meta.json is read back into the kind's own space.
    assert get_kind("dqn").space_type.from_json(d.to_json()) == d
    assert get_kind("parametric_dqn").space_type.from_json(p.to_json()) == p
    assert not hasattr(d, "action_ids") and not hasattr(p, "actions")
    assert p.ids("action") == ["9"] and d.ids("state") == ["0"]
    with pytest.raises(KeyError, match="no feature group 'action'"):
        d.ids("action")
    # What the memory estimate reads: Q-values per network row, network rows per state.
    assert (d.q_outputs(), d.rows_per_state(), p.q_outputs(), p.rows_per_state()) == (2, 1, 1, 4)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_a_kinds_training_tensors_hold_every_field_of_its_batch_type(
    name: str, tmp_path: Path
) -> None:
    from tests.data.test_ingest import ACTIONS, rows, write
    from tests.data.test_ingest_parametric import parametric_rows, write_parametric

    kind, path = get_kind(name), tmp_path / "t.parquet"
    cfg: BaseWorkflowConfig
    if name == "dqn":
        cfg = DQNWorkflowConfig(**PATHS, actions=ACTIONS)
        write(path, rows(40), 16)
    else:
        cfg = ParametricDQNWorkflowConfig(**PATHS)
        write_parametric(path, parametric_rows(40), 16)
    space, shard = kind.load_shard(DistContext.single("cpu"), cfg, str(path), [(0, 1)])
    pre = {
        group: Preprocessor(space.ids(group), fit_normalization(sample, space.ids(group)))
        for group, sample in kind.norm_samples(shard, 100, 0).items()
    }
    tensors = kind.training_tensors(shard, pre)
    assert isinstance(space, kind.space_type)
    assert get_protocol_members(kind.batch_type) <= set(tensors.keys())
