"""Sparse and dense one-hot action maps train the same parametric CartPole policy.

The same logged CartPole episodes are written twice for the parametric workflow: with
dense one-hot action maps (`{"100": 1.0, "101": 0.0}`, as the sample-data command logs
them) and with sparse ones (`{"100": 1.0}` / `{"101": 1.0}`, legal by the data format).
Each single-valued sparse action feature must be identified BINARY, so its presence
reaches the network; before, both were CONTINUOUS_ACTION with min = max, every candidate
normalized to zeros, and the exported model played one action only (a mean return of
~10 was reported). The dense 0/1 features are BINARY too, so both encodings are the same
network input (`test_sparse_dense_identical.py` shows bit-identical models).
The shipped config, shrunk as in `test_cartpole_learning.py` (1,000 random episodes, ~430
updates), must learn from both encodings. Measured (20 online episodes) while the dense
features were still CONTINUOUS_ACTION: seed 0 dense 73.7, sparse 164.1; seed 1 both above
75. Both encodings now train the same model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.data.timeline import build_training_table
from reagent_lite.samples.gym_logging import log_gym_episodes
from tests.conftest import REPO_ROOT, run_module

SHIPPED = REPO_ROOT / "sample_configs" / "parametric_action" / "cartpole_parametric_dqn.json"
THRESHOLD = 50.0  # random play ≈ 22, a model that cannot tell the candidates apart ≈ 10
MAP_COLUMNS = ("action", "next_action")
LIST_COLUMNS = ("possible_actions", "possible_next_actions")


def _sparse_map(m: list[tuple[str, float]] | None) -> list[tuple[str, float]] | None:
    return None if m is None else [(k, v) for k, v in m if v != 0.0]


def sparsify(table: pa.Table) -> pa.Table:
    """The table with every zero entry dropped from its action maps."""
    for name in (*MAP_COLUMNS, *LIST_COLUMNS):
        col = table.column(name)
        rows = col.to_pylist()
        if name in MAP_COLUMNS:
            new = [_sparse_map(m) for m in rows]
        else:
            new = [None if ms is None else [_sparse_map(m) for m in ms] for ms in rows]
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, pa.array(new, type=col.type))
    return table


def _train(tmp: Path, table: pa.Table, name: str) -> tuple[dict[str, Any], str]:
    data = tmp / name
    data.mkdir()
    pq.write_table(table, data / "train.parquet")
    cfg = json.loads(SHIPPED.read_text())
    cfg.pop("$schema", None)
    cfg.update(
        training_data_path=str(data / "train.parquet"),
        model_output_path=str(data / "out"),
        use_gpu=False,
        epochs=10,
        seed=0,
        checkpoint_every_epochs=10,
    )
    cfg.pop("eval_data_path", None)
    cfg["training"].update(minibatch_size=512, learning_rate=0.001)
    cfg["evaluation"].update(calc_cpe_in_training=False, online_episodes=20)
    path = data / "config.json"
    path.write_text(json.dumps(cfg, indent=1))
    result = run_module("workflows.parametric_dqn_workflow", "--config", str(path), timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((data / "out" / "model_meta.json").read_text()), result.stderr


@pytest.mark.slow
def test_sparse_and_dense_one_hot_action_maps_both_learn(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")
    logs = log_gym_episodes("CartPole-v1", 1000, seed=1, actions_as_features=True)
    dense, _ = build_training_table(logs.steps, eval_fraction=0.0)
    sparse = sparsify(dense)
    assert sparse.column("action")[0].as_py() in ([("100", 1.0)], [("101", 1.0)])

    returns = {}
    for name, table in (("dense", dense), ("sparse", sparse)):
        meta, log = _train(tmp_path, table, name)
        types = {p["feature_type"] for p in meta["normalization"]["action"].values()}
        assert types == {"BINARY"}, name
        assert "normalizes to the constant" not in log, name
        returns[name] = meta["online_evaluation"]["mean_return"]
    assert min(returns.values()) >= THRESHOLD, returns
