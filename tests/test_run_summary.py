"""The end-of-run summary: printed by a real run and written to summary.txt; its verdict and
next step on crafted run directories (diverged, undecided, better, within noise)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reagent_lite.run_summary import MAX_WIDTH, summary_lines
from tests.conftest import REPO_ROOT, run_module

VERDICTS = ("BETTER", "WITHIN NOISE", "WORSE", "UNDECIDED")


def test_a_real_run_prints_the_summary_and_writes_summary_txt(tmp_path: Path) -> None:
    out = tmp_path / "model"
    proc = run_module(
        "reagent_lite.console",
        "train",
        "--config",
        str(REPO_ROOT / "sample_configs/ci/dqn_1node.json"),
        f"training_data_path={tmp_path / 'data/train.parquet'}",
        f"eval_data_path={tmp_path / 'data/eval.parquet'}",
        f"model_output_path={out}",
        "epochs=1",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (out / "summary.txt").read_text().splitlines()
    # Logged as one record: one log prefix, then the lines exactly as summary.txt has them.
    printed = proc.stderr.split("run summary (also in ")[1].split("\n", 1)[1].splitlines()
    assert printed[: len(lines)] == lines
    assert 8 <= len(lines) <= 20 and all(len(line) <= MAX_WIDTH for line in lines)
    text = "\n".join(lines)
    assert f"model:     {out / 'model.pt2'}" in text
    assert "selected:  epoch 1 of 1 (model_selection 'last'" in text
    assert "online CartPole-v1: mean return" in text  # the config's online check
    assert any(line.startswith("verdict:   " + v) for v in VERDICTS for line in lines)
    assert "coverage:  takes the logged action in " in text
    assert "Q values:  max|Q| " in text
    assert lines[-1].startswith("next:      ")


# ----------------------------------------------------------------------------- crafted runs
def _estimate(normalized: float, se: float, logged: float = 1.0) -> dict[str, float]:
    return {
        "raw": normalized * logged,
        "raw_std_error": se * abs(logged),
        "normalized": normalized,
        "normalized_std_error": se,
    }


def _cpe(dr: float, dr_se: float, *, ess_rows: float, ess_episodes: float) -> dict[str, Any]:
    one_step = {n: _estimate(dr, dr_se) for n in ("direct_method", "ips", "snips")}
    return {
        **one_step,
        "doubly_robust": _estimate(dr, dr_se),
        **{
            n: _estimate(1.0, 0.5, 10.0)
            for n in ("sequential_doubly_robust", "weighted_doubly_robust", "magic")
        },
        "policy": {"name": "greedy", "served_by_model": True, "temperature": None},
        "reachable_range": {
            "outside": [],
            "reward_min": 0.0,
            "reward_max": 1.0,
            "return_min": 0.0,
            "return_max": 100.0,
        },
        "diagnostics": {
            "effective_sample_size_rows": ess_rows,
            "rows": 1000.0,
            "effective_sample_size_episodes": ess_episodes,
            "episodes": 100.0,
            "mean_importance_weight": 1.0,
            "mean_top_probability": 1.0,
            "uniform_top_probability": 0.5,
            "tied_top_q_fraction": 0.0,
            "logged_action_agreement": 0.4,
            "unlogged_pick_fraction": 0.25,
        },
    }


def _run_dir(
    tmp: Path,
    cpe: dict[str, Any],
    *,
    diverged_last: bool = False,
    online: dict[str, Any] | None = None,
) -> Path:
    run = tmp / "run"
    run.mkdir()
    records = []
    for epoch in range(2):
        diverging = diverged_last and epoch == 1
        records.append(
            {
                "epoch": epoch,
                "steps": 10 * (epoch + 1),
                "steps_timed": 10,
                "loss": 0.5,
                "transitions_per_s": 6400.0,
                "world_size": 1,
                "eval_td_loss": 0.4,
                **({"cpe": cpe} if cpe else {}),
                "max_abs_q": 900.0 if diverging else 3.0,
                "q_bound": 100.0,
                **({"q_diverging": True} if diverging else {}),
            }
        )
    if online:
        records.append({"epoch": 1, "steps": 20, "online": online})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config: dict[str, Any] = {"training": {"minibatch_size": 64, "minibatches_per_step": 1}}
    if online:
        # The logger: 50 episodes of returns 20 ± 5 (SE ≈ 0.7).
        ids = np.repeat(np.arange(50), 4)
        rewards = np.repeat(np.random.default_rng(0).normal(20.0, 5.0, 50) / 4, 4)
        pq.write_table(pa.table({"mdp_id": ids, "reward": rewards}), run / "eval.parquet")
        config["eval_data_path"] = str(run / "eval.parquet")
    (run / "config.json").write_text(json.dumps(config))
    meta = {"selected_epoch": 1, "model_selection": "last", "online_evaluation": online}
    (run / "model_meta.json").write_text(json.dumps(meta))
    return run


def _line(lines: list[str], head: str) -> str:
    (line,) = [x for x in lines if x.startswith(head)]
    return line


def test_no_trusted_estimate_is_undecided_and_says_to_explore(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, _cpe(1.3, 0.01, ess_rows=3.0, ess_episodes=0.0))
    lines = summary_lines(run)
    assert _line(lines, "verdict:").startswith("verdict:   UNDECIDED (no trusted CPE estimate)")
    assert "collect logs with exploration" in _line(lines, "next:")
    assert "  not trusted (ESS 3.0 of 1000 rows): doubly_robust, ips, snips, direct_method" in lines
    assert "one-step ESS tiny; sequential ESS tiny" in _line(lines, "warnings:")
    assert _line(lines, "coverage:") == (
        "coverage:  takes the logged action in 40% of eval rows; 25% of its picks never logged"
    )
    assert _line(lines, "training:") == (
        "training:  2 epoch(s), 20 optimizer steps in 0.2 s, 6,400 transitions/s"
    )


def test_a_run_without_eval_data_says_nothing_was_measured(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, {})
    lines = summary_lines(run)
    assert "  CPE: none (no eval table, or evaluation.calc_cpe_in_training off)" in lines
    assert _line(lines, "verdict:") == (
        "verdict:   UNDECIDED (nothing measured: no CPE, no online check)"
    )
    assert "give an eval_data_path" in _line(lines, "next:")
    assert len(lines) <= 20 and all(len(line) <= MAX_WIDTH for line in lines)


def test_a_trusted_gain_beyond_two_errors_is_better_and_says_serve(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, _cpe(1.2, 0.02, ess_rows=500.0, ess_episodes=50.0))
    lines = summary_lines(run)
    assert "  doubly_robust" in "\n".join(
        lines
    ) and "+20.0% ± 2.0% vs the logger (trusted)" in "\n".join(lines)
    assert _line(lines, "verdict:").startswith("verdict:   BETTER (")
    serve = f"serve it: reagent-lite serve --model {run} --log-dir DIR"
    if len(serve) > MAX_WIDTH - 11:  # the line's label: the path gives way, not the command
        serve = "serve it: reagent-lite serve --model <the model's directory> --log-dir DIR"
    assert _line(lines, "next:") == f"next:      {serve}"
    assert _line(lines, "warnings:") == "warnings:  none from the CPE"


def test_a_gain_within_two_errors_is_within_noise(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, _cpe(1.03, 0.02, ess_rows=500.0, ess_episodes=50.0))
    lines = summary_lines(run)
    assert _line(lines, "verdict:").startswith("verdict:   WITHIN NOISE")


def test_a_diverged_last_epoch_is_named_and_not_to_be_served(tmp_path: Path) -> None:
    # training.export_diverged_model=true: the run succeeded, the model is not to be trusted.
    run = _run_dir(tmp_path, _cpe(1.2, 0.02, ess_rows=500.0, ess_episodes=50.0), diverged_last=True)
    lines = summary_lines(run)
    assert _line(lines, "Q values:") == (
        "Q values:  DIVERGED from epoch 2 (max|Q| 900 > 2 × bound 100)"
    )
    assert _line(lines, "next:").startswith("next:      do not serve it; retrain with")


def test_the_online_check_decides_against_the_loggers_returns(tmp_path: Path) -> None:
    online = {"env": "CartPole-v1", "episodes": 100, "mean_return": 21.0, "std_return": 10.0}
    run = _run_dir(tmp_path, _cpe(1.2, 0.02, ess_rows=500.0, ess_episodes=50.0), online=online)
    lines = summary_lines(run)
    assert "online CartPole-v1: mean return 21.0 ± 1.0 (100 episodes) vs the logger's" in (
        "\n".join(lines)
    )
    # 21 against ≈ 20: within 2 SE of both, whatever the CPE says.
    assert _line(lines, "verdict:").startswith("verdict:   WITHIN NOISE (online return")
    online["mean_return"] = 500.0
    (tmp_path / "run2").mkdir()
    run2 = _run_dir(
        tmp_path / "run2", _cpe(0.8, 0.02, ess_rows=500.0, ess_episodes=50.0), online=online
    )
    assert _line(summary_lines(run2), "verdict:").startswith("verdict:   BETTER (online")


def test_coverage_is_agreement_with_the_logger_and_picks_it_never_took() -> None:
    from reagent_lite.evaluation.diagnostics import coverage

    probs = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [0.5, 0.5, 0]])
    # Logged: position 0, 0, 1 and one action not among the candidates (-1); position 2
    # is never logged, and the policy puts the third row's pick there.
    got = coverage(probs, np.array([0, 0, 1, -1]))
    assert got == {"logged_action_agreement": 0.25, "unlogged_pick_fraction": 0.25}


@pytest.mark.parametrize(("wait", "said"), [(0.06, " (60% of it waiting for data)"), (0.004, "")])
def test_training_line_says_when_the_data_set_the_pace(
    tmp_path: Path, wait: float, said: str
) -> None:
    """Epochs of 0.1 s whose step waited `wait` s for streamed rows (`data_wait_s`): named
    when over 5% of the training time."""
    run = _run_dir(tmp_path, {})
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    text = "".join(json.dumps({**r, "data_wait_s": wait}) + "\n" for r in records)
    (run / "metrics.jsonl").write_text(text)
    assert _line(summary_lines(run), "training:") == (
        "training:  2 epoch(s), 20 optimizer steps in 0.2 s, 6,400 transitions/s" + said
    )
