"""benchmarks/closed_loop.py: its bookkeeping on real files, and `--quick` end to end against
a real `reagent-lite serve` subprocess (skipped only where the serving package is absent)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.closed_loop import (
    Estimate,
    RoundRow,
    bookkeeping_problems,
    epochs_for,
    goals_met,
    improving,
    read_cpe,
    z_score,
)
from benchmarks.closed_loop_envs import Measured, ParametricLoop
from benchmarks.closed_loop_http import logged_decisions, read_decision_log
from tests.conftest import REPO_ROOT


def _estimates(raw: float, se: float) -> dict[str, dict[str, float]]:
    est = {"raw": raw, "raw_std_error": se, "normalized": raw / 10, "normalized_std_error": 0.1}
    return {"sequential_doubly_robust": est, "doubly_robust": est}


def test_read_cpe_takes_the_exported_epoch_not_the_last(tmp_path: Path) -> None:
    # A run that exported its first epoch (model_selection picked it): the estimate made
    # for the deployed model is that epoch's, though a later epoch was logged after it.
    (tmp_path / "model_meta.json").write_text(json.dumps({"selected_epoch": 0}))
    records = [
        {"step": 5, "loss": 1.0},
        {"epoch": 0, "loss": 0.9, "cpe": _estimates(12.5, 0.75)},
        {"step": 10, "loss": 0.8},
        {"epoch": 1, "loss": 0.7, "cpe": _estimates(3.0, 2.0)},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")

    assert read_cpe(tmp_path, "sequential_doubly_robust") == Estimate(
        "sequential_doubly_robust", 12.5, 0.75
    )
    with pytest.raises(ValueError, match=r"metrics\.jsonl: no magic estimate"):
        read_cpe(tmp_path, "magic")


def test_z_score_combines_the_cpe_and_the_measurement_errors() -> None:
    # |10 - 17.5| = 7.5 over sqrt(2² + 1.5²) = 2.5: exactly 3 SE (the CPE's alone: 3.75).
    z = z_score(Estimate("doubly_robust", 10.0, 2.0), Measured(400.0, 5.0, 17.5, 1.5))
    assert z == pytest.approx(3.0)
    # An exact measurement (the parametric env's) leaves the CPE's own error.
    assert z_score(Estimate("dr", 0.5, 0.01), Measured(0.53, 0.0, 0.53, 0.0)) == pytest.approx(3.0)
    assert math.isnan(z_score(Estimate("dr", math.nan, 1.0), Measured(1, 0, 1.0, 0)))


@pytest.mark.parametrize(
    ("values", "bar", "expected"),
    [
        ([120.0, 310.0, 470.0, 460.0], 450.0, True),  # saturated, stays above the bar
        ([120.0, 310.0, 470.0, 430.0], 450.0, False),  # fell back below it
        ([120.0, 470.0, 430.0, 460.0], 450.0, False),  # ... even if it came back
        ([120.0, 90.0, 470.0], 450.0, False),  # a round worse than the one before
        ([120.0, 310.0, 400.0], 450.0, False),  # never reached the bar
        ([0.40, 0.45, 0.47], None, True),  # no bar: each round at least as good
        ([0.40, 0.47, 0.45], None, False),
    ],
)
def test_improving_until_saturated(values: list[float], bar: float | None, expected: bool) -> None:
    assert improving(values, bar) is expected


def test_small_tables_train_for_at_least_the_updates_asked() -> None:
    base = {"epochs": 20, "training": {"minibatch_size": 1024}}
    assert epochs_for(base, 99_000, 1900) == 20  # the shipped sample: its own epochs
    assert epochs_for(base, 21_500, 2000) == 96  # 21 minibatches an epoch
    assert epochs_for(base, 500, 0) == 20


def test_parametric_values_saturate_near_the_optimal_policys(tmp_path: Path) -> None:
    from reagent_lite.samples.parametric_env import HELD_OUT_SEED_OFFSET, ParametricBanditEnv

    env = ParametricBanditEnv(seed=3)
    (tmp_path / "values.json").write_text(json.dumps({"env": env.to_dict()}))
    loop = ParametricLoop()
    loop.setup(tmp_path)
    best = env.optimal_value(env.sample_contexts(20_000, seed=HELD_OUT_SEED_OFFSET))
    assert loop.saturated() == pytest.approx(0.95 * best)

    def rows(*fractions: float) -> list[RoundRow]:
        out = []
        for k, f in enumerate(fractions, start=1):
            row = RoundRow(k, "epsilon:0.1", f"m{k}", 10, answered=10, logged=10)
            row.greedy = Measured(f * best, 0.0, f * best, 0.0)
            row.cpe = Estimate("doubly_robust", f * best, 0.01)
            out.append(row)
        return out

    # Exact values a hair apart once saturated are not a step back.
    assert goals_met("parametric", rows(0.97, 0.989, 0.988), loop.saturated())[0]
    assert not goals_met("parametric", rows(0.97, 0.94), loop.saturated())[0]
    assert not goals_met("parametric", rows(0.80, 0.90), loop.saturated())[0]


def test_bookkeeping_names_rounds_with_lost_or_unjoined_decisions() -> None:
    rows = [
        RoundRow(0, "epsilon:1.0", "m0", 10, answered=200, logged=200),
        RoundRow(1, "epsilon:0.1", "m1", 3, answered=300, logged=299),
        RoundRow(2, "epsilon:0.1", "m2", 3, answered=300, logged=300, no_feedback=2),
        RoundRow(3, "epsilon:0.1", "m3", 3, answered=0, logged=0),
    ]
    problems = bookkeeping_problems("cartpole", rows)
    assert [p.split(":")[0] for p in problems] == [
        "[cartpole] round 1",
        "[cartpole] round 2",
        "[cartpole] round 3",
    ]
    assert "300 decisions answered, 299 logged, 0 without their feedback" in problems[0]
    assert bookkeeping_problems("cartpole", rows[:1]) == []


def _part(path: Path, mdp_ids: list[str], missing: list[bool]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"mdp_id": mdp_ids, "feedback_missing": missing})
    pq.write_table(table, path)


def test_logged_decisions_counts_one_rounds_rows_in_closed_parts(tmp_path: Path) -> None:
    _part(tmp_path / "part-1.parquet", ["r1-e0", "r1-e0", "r0-e3"], [False, False, False])
    _part(tmp_path / "part-2.parquet", ["r1-e1", "r10-e0"], [True, False])
    # What the timeline skips, the count skips: the journal and a part still being written.
    _part(tmp_path / "_journal" / "part-3.parquet", ["r1-e2"], [False])
    _part(tmp_path / ".part-4.parquet.tmp.parquet", ["r1-e3"], [False])

    assert logged_decisions(tmp_path, "r1-") == (3, 1)
    assert logged_decisions(tmp_path, "r0-") == (1, 0)
    assert logged_decisions(tmp_path / "nothing-yet", "r1-") == (0, 0)


# Two environments, each: an initial model, two servers, a timeline and a training run;
# minutes on a busy 2-core machine.
QUICK_TIMEOUT_S = 1500
SERVING = (REPO_ROOT / "reagent_lite/serving/server.py").is_file()


@pytest.mark.bench_smoke
@pytest.mark.skipif(not SERVING, reason="reagent_lite.serving (reagent-lite serve) is absent")
@pytest.mark.timeout(QUICK_TIMEOUT_S + 60)
def test_quick_closed_loop_against_a_real_server(tmp_path: Path) -> None:
    from benchmarks.closed_loop_http import subprocess_env

    out = tmp_path / "out"
    # A session of its own: on a timeout the benchmark and the servers it started all go.
    proc = subprocess.Popen(
        [sys.executable, "benchmarks/closed_loop.py", "--quick", "--out", str(out),
         "--env", "cartpole", "parametric"],
        cwd=REPO_ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=QUICK_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    for env in ("cartpole", "parametric"):
        rounds = results[env]["rounds"]
        assert [r["round"] for r in rounds] == [0, 1]
        for r in rounds:
            assert f"[{env}] round {r['round']} (" in stdout
            assert r["answered"] > 0 and r["logged"] == r["answered"] and r["no_feedback"] == 0
        # The table round 1 trained on came from round 0's log, through the timeline.
        assert rounds[0]["table_rows"] > 0
        assert pq.ParquetFile(out / env / "rounds/1/train.parquet").metadata.num_rows > 0
        # Round 1 was served by the model trained on it, hot-reloaded: its CPE was read
        # before, its greedy value measured after.
        assert rounds[1]["model_id"] != rounds[0]["model_id"]
        assert rounds[1]["cpe"] is not None and rounds[1]["greedy"] is not None
        # Decisions answered == decisions in the logs, counted here, not by the script.
        logged = sum(
            read_decision_log(out / env / "logs" / s).num_rows for s in ("random", "explore")
        )
        assert logged == sum(r["answered"] for r in rounds)
