"""`benchmarks.busy_sample`'s arithmetic: busy / quiet is paired per round, then the median
(the runs themselves are full fresh-clone installs, left to the benchmark)."""

from __future__ import annotations

import pytest

from benchmarks.busy_sample import ratios, table, user_env


def _fig(setup: float, job: float) -> dict[str, float]:
    return {"setup_s": setup, "job_s": job, "total_s": setup + job}


def test_ratios_pair_each_round_before_the_median() -> None:
    runs = {
        "quiet": [_fig(10, 50), _fig(20, 100), _fig(10, 60)],
        "neighbours": [_fig(10, 100), _fig(20, 150), _fig(30, 300)],
    }
    r = ratios(runs)
    assert r["job_s"] == pytest.approx(2.0)  # 2.0, 1.5, 5.0
    assert r["setup_s"] == pytest.approx(1.0)  # 1, 1, 3
    assert r["total_s"] == pytest.approx(110 / 60)  # 110/60, 170/120, 330/70
    lines = table(runs).splitlines()
    assert lines[-2].split()[:3] == ["busy/quiet", "job_s", "2.00"]
    assert lines[-2].endswith("(goal <= 2)") and not lines[-3].endswith(")")


def test_a_users_environment_has_no_openmp_settings_or_checkout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("HOME_LIKE", "kept")
    env = user_env()
    assert "OMP_NUM_THREADS" not in env and "PYTHONPATH" not in env
    assert env["HOME_LIKE"] == "kept"
