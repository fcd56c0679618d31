"""report.png's CPE panel: the improvement over the logged policy has the right sign
whatever the sign of the logged value; a run without epoch records is an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reagent_lite.errors import DataError
from reagent_lite.report import draw_report, improvement


def estimate(raw: float, logged: float, se: float = 0.1) -> dict[str, float]:
    return {"raw": raw, "normalized": raw / logged, "normalized_std_error": se}


@pytest.mark.parametrize(
    ("raw", "logged", "expected"),
    [
        (15.0, 10.0, 0.5),  # positive values: more is better
        (5.0, 10.0, -0.5),
        (-5.0, -10.0, 0.5),  # negative values (costs): less negative is better
        (-15.0, -10.0, -0.5),
        (5.0, -10.0, 1.5),  # from a loss to a gain
        (-5.0, 10.0, -1.5),
    ],
)
def test_improvement_is_above_zero_exactly_when_the_policy_is_better(
    raw: float, logged: float, expected: float
) -> None:
    value, se = improvement(estimate(raw, logged))  # type: ignore[misc]
    assert value == pytest.approx(expected)
    assert value == pytest.approx((raw - logged) / abs(logged))
    assert se == pytest.approx(0.1)


def test_improvement_is_none_when_it_cannot_be_told() -> None:
    assert improvement(None) is None
    assert improvement({"raw": 0.0, "normalized": 0.0}) is None  # logged value unknown
    assert improvement({"raw": 1.0, "normalized": None}) is None  # logged value was 0


def test_report_draws_negative_values_and_refuses_a_run_without_epochs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    cpe = {name: estimate(-4.0 - e, -10.0) for e, name in enumerate(["ips", "snips"])}
    records = [
        {"epoch": 0, "steps": 5, "loss": 0.5},
        {"epoch": 0, "steps": 10, "loss": 0.4, "transitions_per_s": 1e3, "cpe": cpe},
        {"epoch": 1, "steps": 20, "loss": 0.3, "transitions_per_s": 1e3, "cpe": cpe},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    path = draw_report(tmp_path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n")
    with pytest.raises(DataError, match="no epoch record"):
        draw_report(tmp_path, tmp_path / "again.png")
    assert not (tmp_path / "again.png").exists()


def _cpe(rewards: tuple[float, float], episode_ess: float, magic_outside: bool) -> dict:
    seq = {"raw": 6.0, "normalized": 1.2, "normalized_std_error": 0.05}
    return {
        "direct_method": estimate(1.0, 1.0, 0.001),
        "doubly_robust": estimate(1.1, 1.0, 0.02),
        "sequential_doubly_robust": seq,
        "magic": seq,
        "reachable_range": {
            "reward_min": rewards[0],
            "reward_max": rewards[1],
            "return_min": 0.0,
            "return_max": 20.0,
            "outside": ["magic"] if magic_outside else [],
        },
        "diagnostics": {
            "effective_sample_size_rows": 500.0,
            "rows": 1000.0,
            "effective_sample_size_episodes": episode_ess,
            "episodes": 509.0,
        },
    }


def _run(tmp_path: Path, cpe: dict, online: bool) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    run.mkdir()
    records = [
        {"epoch": e, "steps": 10 * e, "loss": 1.0 + e, "eval_td_loss": 0.5, "cpe": cpe,
         "transitions_per_s": 1e3}
        for e in range(3)
    ]  # fmt: skip
    meta: dict = {"selected_epoch": 1, "model_selection": "best_cpe"}
    if online:
        records.append({"epoch": 2, "steps": 30, "online": {"env": "CartPole-v1",
                        "episodes": 100, "mean_return": 500.0, "std_return": 0.0}})  # fmt: skip
        meta["online_evaluation"] = records[-1]["online"]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "model_meta.json").write_text(json.dumps(meta))
    eval_path = tmp_path / "eval.parquet"
    # Two logged episodes of 20 and 24 steps of reward 1: the logger's mean return is 22.
    pq.write_table(pa.table({"mdp_id": ["a"] * 20 + ["b"] * 24, "reward": [1.0] * 44}), eval_path)
    config = {"training": {"cql_alpha": 0.5}, "eval_data_path": str(eval_path)}
    (run / "config.json").write_text(json.dumps(config))
    return run


def test_report_answers_with_the_online_return_and_sets_apart_unreliable_cpe(
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    from reagent_lite.report_data import build_report_data
    from reagent_lite.training.metrics import read_metrics

    run = _run(tmp_path, _cpe((1.0, 1.0), episode_ess=1.0, magic_outside=True), online=True)
    records = read_metrics(run / "metrics.jsonl")
    data = build_report_data(run, [r for r in records if "transitions_per_s" in r], records)
    assert data.selected_epoch == 2 and data.model_selection == "best_cpe"
    assert data.online is not None
    assert (data.online.mean_return, data.online.logger_mean_return) == (500.0, 22.0)
    assert list(data.losses) == [
        "train loss = TD + 0.5 × CQL penalty",
        "eval TD loss (no CQL penalty)",
    ]
    assert data.verdict("direct_method") == "constant reward"  # CartPole: reward always 1
    assert data.verdict("sequential_doubly_robust") == "ESS 1.0 of 509 episodes"
    assert data.verdict("magic") == "beyond any policy's value"
    assert data.trusted_at_selected() == {}
    path = draw_report(run)
    assert path == run / "report.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_an_env_shows_the_trusted_cpe(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from reagent_lite.report_data import build_report_data
    from reagent_lite.training.metrics import read_metrics

    run = _run(tmp_path, _cpe((0.0, 1.0), episode_ess=300.0, magic_outside=False), online=False)
    records = read_metrics(run / "metrics.jsonl")
    data = build_report_data(run, [r for r in records if "transitions_per_s" in r], records)
    assert data.online is None
    trusted = data.trusted_at_selected()
    assert sorted(trusted) == [
        "direct_method",
        "doubly_robust",
        "magic",
        "sequential_doubly_robust",
    ]
    assert trusted["doubly_robust"].epoch == 2
    assert trusted["doubly_robust"].improvement == pytest.approx(0.1)
    assert draw_report(run, tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
