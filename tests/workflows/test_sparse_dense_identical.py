"""Sparse and dense one-hot action maps are the same information, and train the same model.

The same logged CartPole episodes are written with dense one-hot action maps
(`{"100": 1.0, "101": 0.0}`, as the sample-data command logs them) and with sparse ones
(`{"100": 1.0}` / `{"101": 1.0}`). Both identify the action features BINARY, under which a
present 0 and an absent feature give the same 0 (as in Horizon), so the network sees
bit-identical inputs, and the same seed must train bit-identical weights: the exported
models' scores and the CPE figures are compared exactly, not approximately.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

import reagent_lite
from reagent_lite.data.timeline import build_training_table
from reagent_lite.samples.gym_logging import action_feature_map, log_gym_episodes
from tests.conftest import REPO_ROOT
from tests.workflows.test_sparse_action_maps import sparsify

SHIPPED = REPO_ROOT / "sample_configs" / "parametric_action" / "cartpole_parametric_dqn.json"


def _train(tmp: Path, name: str, train: Any, evaluation: Any) -> reagent_lite.RunResult:
    data = tmp / name
    data.mkdir()
    pq.write_table(train, data / "train.parquet")
    pq.write_table(evaluation, data / "eval.parquet")
    cfg = json.loads(SHIPPED.read_text())
    cfg.pop("$schema", None)
    cfg.pop("sample_data")
    cfg.update(
        training_data_path=str(data / "train.parquet"),
        eval_data_path=str(data / "eval.parquet"),
        model_output_path=str(data / "out"),
        use_gpu=False,
        epochs=2,
    )
    cfg["training"].update(minibatch_size=128, steps_per_epoch=15)
    cfg["evaluation"].update(bootstrap_samples=5, online_episodes=0)
    return reagent_lite.train(cfg)


def test_sparse_and_dense_action_maps_train_bit_identical_models(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")
    logs = log_gym_episodes("CartPole-v1", 60, seed=3, actions_as_features=True)
    dense_train, dense_eval = build_training_table(logs.steps, eval_fraction=0.3, seed=0)
    assert dense_eval.num_rows > 0
    sparse_train, sparse_eval = sparsify(dense_train), sparsify(dense_eval)
    assert sparse_train.column("action")[0].as_py() in ([("100", 1.0)], [("101", 1.0)])

    runs = {
        name: _train(tmp_path, name, *tables)
        for name, tables in (
            ("dense", (dense_train, dense_eval)),
            ("sparse", (sparse_train, sparse_eval)),
        )
    }
    models = {name: reagent_lite.load_model(run.model_dir) for name, run in runs.items()}
    for model in models.values():
        types = {p["feature_type"] for p in model.meta["normalization"]["action"].values()}
        assert types == {"BINARY"}

    # Score the eval states with each encoding's candidates: every model, every encoding,
    # the same Q values bit for bit.
    states = torch.randn(64, 4)
    dense_cand = torch.tensor(
        [[float(v) for v in action_feature_map(k, 2).values()] for k in range(2)]
    ).expand(64, 2, 2)
    dense_presence = torch.ones_like(dense_cand)
    sparse_presence = (dense_cand != 0).float()  # the zero entries are absent
    mask = torch.ones(64, 2)
    scores = [
        model(states, torch.ones_like(states), dense_cand * presence, presence, mask)
        for model in models.values()
        for presence in (dense_presence, sparse_presence)
    ]
    for other in scores[1:]:
        assert torch.equal(scores[0], other)
    assert not torch.equal(scores[0][:, 0], scores[0][:, 1])  # the candidates differ

    cpe = {name: run.final_metrics["cpe"] for name, run in runs.items()}
    assert cpe["dense"]["sequential_doubly_robust"] == cpe["sparse"]["sequential_doubly_robust"]
    assert runs["dense"].final_metrics["loss"] == runs["sparse"].final_metrics["loss"]
