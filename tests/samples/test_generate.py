"""generate_sample_data and `python -m workflows.make_sample_data`, end to end."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from reagent_lite.errors import ConfigError
from reagent_lite.samples.generate import generate_sample_data
from reagent_lite.samples.parametric_env import ParametricBanditEnv
from tests.conftest import run_module

pytest.importorskip("gymnasium")


def test_gym_sample_data_from_config_like_object(tmp_path) -> None:
    block = SimpleNamespace(
        kind="gym", env="CartPole-v1", episodes=60, policy="random", epsilon=0.1, seed=0,
        eval_fraction=0.2,
    )  # fmt: skip
    train_path = tmp_path / "data" / "train.parquet"
    result = generate_sample_data(block, training_data_path=train_path)
    assert result.training_data_path == train_path
    assert result.eval_data_path == tmp_path / "data" / "eval.parquet"
    assert result.steps_path.exists() and result.values_path is None
    train = pq.read_table(train_path)
    evaluation = pq.read_table(result.eval_data_path)
    assert train.num_rows + evaluation.num_rows == result.steps
    assert evaluation.num_rows > 0
    # Keywords win over the block; a mapping works as well as an object.
    again = generate_sample_data(
        # eval_fraction 0.3: 10 episodes are few for the hashed split (0.1 draws none of them).
        {"kind": "gym", "episodes": 60, "seed": 0, "eval_fraction": 0.3},
        episodes=10,
        output_dir=tmp_path / "b",
    )
    assert again.summary["episodes"] == 10


def test_bad_sample_data_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="kind"):
        generate_sample_data(kind="atari", output_dir=tmp_path)
    with pytest.raises(ConfigError, match="heuristic"):
        generate_sample_data(env="MountainCar-v0", policy="epsilon_greedy", output_dir=tmp_path)
    with pytest.raises(ConfigError, match="output_dir"):
        generate_sample_data(kind="gym")
    with pytest.raises(ConfigError, match="sample_data: env 'NoSuchEnv-v0' cannot be made"):
        generate_sample_data(env="NoSuchEnv-v0", output_dir=tmp_path)
    # Too few episodes for the eval split: an error, not an empty eval file.
    with pytest.raises(ConfigError, match=r"sample_data\.eval_fraction: 0\.1 of 2 episodes"):
        generate_sample_data(episodes=2, eval_fraction=0.1, seed=3, output_dir=tmp_path / "few")
    assert not (tmp_path / "few" / "eval.parquet").exists()


def test_cli_gym_parametric(tmp_path) -> None:
    out = tmp_path / "cartpole"
    result = run_module(
        "workflows.make_sample_data",
        *("--kind", "gym", "--env", "CartPole-v1", "--episodes", "50"),
        *("--policy", "epsilon_greedy", "--epsilon", "0.3", "--parametric"),
        *("--seed", "1", "--eval-fraction", "0.2", "--output-dir", str(out)),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 50 and summary["mean_return"] > 50
    train = pq.read_table(out / "train.parquet")
    assert train.schema.field("next_action").type == train.schema.field("action").type
    assert {p.name for p in out.iterdir()} == {"steps.parquet", "train.parquet", "eval.parquet"}


def test_cli_synthetic_parametric(tmp_path) -> None:
    out = tmp_path / "synthetic"
    result = run_module(
        "workflows.make_sample_data",
        *("--kind", "synthetic_parametric", "--states", "3000", "--seed", "2"),
        *("--output-dir", str(out)),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    values = json.loads((out / "values.json").read_text())
    assert values["optimal_value"] > values["logging_value"] > values["random_value"]
    env = ParametricBanditEnv.from_json(out / "values.json")
    assert env.optimal_value() == pytest.approx(values["optimal_value"])
    train = pq.read_table(out / "train.parquet")
    evaluation = pq.read_table(out / "eval.parquet")
    assert train.num_rows + evaluation.num_rows == 3000


def test_cli_bad_flag_exits_2(tmp_path) -> None:
    result = run_module(
        "workflows.make_sample_data", "--kind", "nope", "--output-dir", str(tmp_path), timeout=60
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
