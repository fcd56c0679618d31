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
