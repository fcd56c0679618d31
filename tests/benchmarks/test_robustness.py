"""`benchmarks.robustness --quick` runs end to end: for every logging mix, a table with each
of our contenders' median, worst seed, failed seeds and the seeds the run's own report
flagged (tiny logs and one epoch: this checks the command and the table, not the quality).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.acrobot_quality import CONFIG, variants
from benchmarks.robustness import ENVS
from reagent_lite.config import DQNWorkflowConfig
from tests.conftest import run_module

pytest.importorskip("gymnasium")  # the logs come from Acrobot-v1

ROW = re.compile(
    r"^  (reagent-lite dqn \((?:CQL|BCQ) [^)]*\))\s+(-?\d+\.\d)\s+(-?\d+\.\d)\s+"
    r"(0|\d+ \[[\d, ]*\])\s+(0|\d+ \[[\d, ]*\])$"
)


@pytest.mark.bench_smoke
@pytest.mark.timeout(1200)  # six workflow runs, each a fresh process, on a busy CPU
def test_quick_run_prints_one_table_per_mix_and_flags_its_failed_seeds(tmp_path: Path) -> None:
    proc = run_module(
        "benchmarks.robustness", "--quick", "--out", str(tmp_path / "out"), timeout=1100
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout.split("Acrobot-v1: mean return", 1)[1]
    sections = re.split(r"\n\n(random|mix60|heuristic) \(", text)[1:]
    assert [sections[i] for i in range(0, len(sections), 2)] == ["random", "mix60", "heuristic"]
    for body in sections[1::2]:
        lines = body.splitlines()
        assert lines[1].split() == ["contender", "median", "worst", "failed", "flagged"]
        rows = [ROW.match(line) for line in lines[2:] if line.strip()]
        assert len(rows) == 2 and all(rows), lines
        for row in rows:
            assert row is not None
            median, worst = float(row[2]), float(row[3])
            assert -500.0 <= worst <= median <= 0.0
            # Every failed seed is flagged by the run's own report (its online check plays
            # the same episode seeds as the benchmark at seed 0), and nothing else.
            assert row[4] == row[5], row[0]
    assert "d3rlpy" not in proc.stdout


@pytest.mark.bench_smoke
@pytest.mark.timeout(400)  # two workflow runs (about 40 s on a busy 2-core box)
def test_quick_lunarlander_run_prints_its_table_and_flags_its_failed_seeds(tmp_path: Path) -> None:
    """`--env LunarLander-v3`: the LunarLander config and mixes; a seed fails when its median
    return is below 0, and the run's online check (the same episode seeds) flags it then."""
    pytest.importorskip("Box2D")
    proc = run_module(
        *("benchmarks.robustness", "--env", "LunarLander-v3", "--quick", "--mixes", "heuristic"),
        *("--out", str(tmp_path / "out")),
        timeout=380,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout.split("LunarLander-v3: mean return", 1)[1]
    assert "(config lunarlander_dqn.json)" in text
    body = text.split("\n\nheuristic ({'policy': 'epsilon_greedy', 'epsilon': 0.1,", 1)[1]
    rows = [ROW.match(line) for line in body.splitlines()[2:] if line.strip()]
    assert len(rows) == 2 and all(rows), body
    for row in rows:
        assert row is not None
        median = float(row[2])
        assert (row[4] != "0") == (median < 0.0), row[0]  # one seed: failed iff below 0
        assert row[4] == row[5], row[0]
    assert (tmp_path / "out" / "LunarLander-v3" / "heuristic" / "data" / "train.parquet").exists()


def test_a_mix_the_env_has_not_is_refused_before_anything_runs(tmp_path: Path) -> None:
    proc = run_module(
        *("benchmarks.robustness", "--env", "LunarLander-v3", "--mixes", "random"),
        *("--out", str(tmp_path / "out")),
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--mixes: ['random'] are not mixes of LunarLander-v3 (its: ['mix60', 'heuristic'])" in (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_the_flagged_column_counts_what_the_run_summary_reports_failed(tmp_path: Path) -> None:
    """A run whose online check timed out on most episodes is flagged even when its median
    return is above the table's failure line (Acrobot: −300 > −500): the run summary
    reports it FAILED, so the table must agree."""
    import json

    from benchmarks.robustness import ENVS, run_verdict

    meta = tmp_path / "model_meta.json"
    online = {"env": "Acrobot-v1", "episodes": 30, "median_return": -300.0}
    meta.write_text(json.dumps({"online_evaluation": {**online, "timed_out": 20}}))
    assert run_verdict(ENVS["Acrobot-v1"], tmp_path, 0) == (
        "online check failed: 20 of 30 online episodes timed out short of the goal"
    )
    meta.write_text(json.dumps({"online_evaluation": {**online, "timed_out": 2}}))
    assert run_verdict(ENVS["Acrobot-v1"], tmp_path, 0) is None


@pytest.mark.parametrize("env", ["Acrobot-v1", "LunarLander-v3"])
def test_every_contender_of_a_shipped_config_is_a_valid_config(env: str) -> None:
    """The shipped configs switch CQL by the logger's certainty; the BCQ contender drops
    CQL, so it must drop the weighting too (a weighting needs cql_alpha > 0)."""
    base = json.loads(ENVS[env].config.read_text())
    assert base["training"]["cql_weighting"] == "certainty_switch"
    contenders = variants(base)
    for cfg in contenders.values():
        DQNWorkflowConfig.model_validate({k: v for k, v in cfg.items() if k != "$schema"})
    assert "reagent-lite dqn (CQL alpha=1, certainty_switch)" in contenders
    assert ENVS["Acrobot-v1"].config == CONFIG
