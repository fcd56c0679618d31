"""The report PNG and the online rollout of an exported model, on one real small run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reagent_lite.evaluation.online import rollout_exported_model
from reagent_lite.kinds import get_kind
from reagent_lite.report import draw_report
from tests.conftest import run_module
from tests.workflows.test_end_to_end import make_config


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("run")
    config = make_config(tmp_path, "dqn", evaluation={"online_episodes": 3})
    result = run_module("workflows.dqn_workflow", "--config", str(config), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / "out"


def test_workflow_records_online_check(trained_run: Path) -> None:
    meta = json.loads((trained_run / "model_meta.json").read_text())
    online = meta["online_evaluation"]
    assert online["env"] == "CartPole-v1" and online["episodes"] == 3
    # CartPole pays 1 per step, and no episode is shorter than a few steps or longer than 500.
    assert 5 <= online["mean_return"] <= 500


def test_rollout_is_deterministic_and_bounded(trained_run: Path) -> None:
    meta = json.loads((trained_run / "model_meta.json").read_text())
    kwargs = dict(
        env_id="CartPole-v1",
        episodes=2,
        seed=7,
        kind=get_kind(meta["workflow"]),
        space=get_kind(meta["workflow"]).space_type.from_json(meta),
    )
    first = rollout_exported_model(trained_run / "model.pt2", **kwargs)  # type: ignore[arg-type]
    again = rollout_exported_model(trained_run / "model.pt2", **kwargs)  # type: ignore[arg-type]
    assert first == again
    capped = rollout_exported_model(trained_run / "model.pt2", max_steps=3, **kwargs)  # type: ignore[arg-type]
    assert capped["mean_return"] <= 3
    # Cut off by the limit with +3: CartPole's time-out is its best case, not a failure.
    assert capped["timed_out"] == 0


def test_episodes_stepped_together_return_what_each_returns_alone(
    trained_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gymnasium as gym
    import numpy as np
    import torch

    from reagent_lite.evaluation import online
    from reagent_lite.safe_load import load_program

    meta = json.loads((trained_run / "model_meta.json").read_text())
    kind = get_kind(meta["workflow"])
    space = kind.space_type.from_json(meta)
    act = kind.greedy_actor(load_program(trained_run / "model.pt2", "test").module(), space, 2)
    cols = [int(f) for f in space.state_ids]
    alone = []  # one episode at a time, one state per call: the reference
    for ep in range(5):
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=3 + ep)
        total, done = 0.0, False
        while not done:
            state = torch.from_numpy(np.asarray(obs, dtype=np.float32)[cols]).unsqueeze(0)
            with torch.no_grad():
                (action,) = act(state, torch.ones_like(state))
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        alone.append(total)
    assert len(set(alone)) > 1  # episodes of different lengths: some leave the group early
    monkeypatch.setattr(online, "LOCKSTEP_ENVS", 2)  # groups of 2, 2, 1
    together = rollout_exported_model(
        trained_run / "model.pt2", env_id="CartPole-v1", episodes=5, seed=3, kind=kind,
        space=space,
    )  # fmt: skip
    assert together["mean_return"] == pytest.approx(float(np.mean(alone)))
    assert together["median_return"] == pytest.approx(float(np.median(alone)))
    assert together["std_return"] == pytest.approx(float(np.std(alone)))


def test_report_draws_png(trained_run: Path, tmp_path: Path) -> None:
    path = draw_report(trained_run, tmp_path / "report.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # two panels with curves, not an empty canvas
    result = run_module(
        "reagent_lite.report", "--run", str(trained_run), "--output", str(tmp_path / "b.png")
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "b.png").is_file()


def test_report_without_metrics_is_a_clear_error(tmp_path: Path) -> None:
    result = run_module("reagent_lite.report", "--run", str(tmp_path))
    assert result.returncode != 0
    assert "metrics.jsonl" in result.stderr
    assert "Traceback" not in result.stderr
