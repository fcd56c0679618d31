"""What `report.png` draws, read from a run's directory: pure data, no matplotlib.

Kept apart from the drawing so that a test can check what the picture says (which series,
which are trusted and why, the selected epoch, the online returns) without reading pixels.

* Loss: the training loss is the TD loss plus `cql_alpha` × the CQL penalty; the eval TD
  loss has no penalty. With CQL on, the training loss may rise while the fit improves
  (the penalty grows as Q separates the logged actions from the others): the labels say so.
* CPE: each estimate as the relative improvement over the logged policy, with a verdict
  per epoch: unreliable when it is outside the values any policy can reach, when its
  effective sample size is tiny (the thresholds of the run's warnings), or, for the
  one-step estimators, when every reward is the same (they then value one constant reward
  and say nothing about the policy).
* Did the policy improve: the online mean return of the exported model against the
  logging policy's mean episode return in the eval table, when the run had an environment;
  otherwise the trusted CPE estimates at the selected epoch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reagent_lite.evaluation.diagnostics import (
    MIN_EFFECTIVE_FRACTION,
    MIN_EFFECTIVE_SAMPLES,
    ONE_STEP,
)

ESTIMATORS = (
    "direct_method",
    "ips",
    "snips",
    "doubly_robust",
    "sequential_doubly_robust",
    "weighted_doubly_robust",
    "magic",
)


@dataclass(frozen=True)
class CpePoint:
    epoch: int  # 1-based, as drawn
    improvement: float  # (value - logged) / |logged|
    std_error: float
    unreliable: str | None  # why not to trust it, or None


@dataclass(frozen=True)
class Online:
    env: str
    episodes: int
    mean_return: float
    std_return: float
    logger_mean_return: float | None  # mean episode return in the eval table


@dataclass
class ReportData:
    epochs: list[int]
    losses: dict[str, list[float | None]]  # label -> one value per epoch
    cpe: dict[str, list[CpePoint]] = field(default_factory=dict)
    policy: str = "no policy (no CPE in this run)"
    selected_epoch: int | None = None  # 1-based
    model_selection: str | None = None
    online: Online | None = None

    def verdict(self, name: str) -> str | None:
        """Why `name` is not to be trusted at the selected (else last) epoch, or None."""
        points = self.cpe.get(name) or []
        at = [p for p in points if p.epoch == self.selected_epoch] or points[-1:]
        return at[0].unreliable if at else "no estimate"

    def trusted_at_selected(self) -> dict[str, CpePoint]:
        out = {}
        for name, points in self.cpe.items():
            at = [p for p in points if p.epoch == self.selected_epoch] or points[-1:]
            if at and at[0].unreliable is None:
                out[name] = at[0]
        return out


def improvement(estimate: dict[str, Any] | None) -> tuple[float, float] | None:
    """(relative improvement over the logged policy, its standard error) of one CPE
    estimate, or None when it cannot be told (no estimate, a zero logged value).

    `normalized` is value / logged; when the logged value is negative a better policy has
    a *smaller* ratio, so the sign of the logged value (= sign(raw) · sign(normalized))
    turns the ratio into an improvement that is above 0 exactly when the policy is better."""
    if not estimate:
        return None
    raw, ratio = estimate.get("raw"), estimate.get("normalized")
    # raw = 0 gives ratio 0 whatever the logged value: its sign cannot be told then.
    if not finite(raw) or not finite(ratio) or ratio == 0:
        return None
    assert raw is not None and ratio is not None
    logged_sign = math.copysign(1.0, raw) * math.copysign(1.0, ratio)
    err = estimate.get("normalized_std_error")
    return logged_sign * (ratio - 1.0), float(err) if err is not None and finite(err) else 0.0


def unreliable(cpe: dict[str, Any], name: str) -> str | None:
    """Why the estimate `name` of one epoch's CPE is not to be trusted, or None."""
    check = cpe.get("reachable_range") or {}
    if name in check.get("outside", []):
        return "beyond any policy's value"
    one_step = name in ONE_STEP
    if one_step and check and check.get("reward_min") == check.get("reward_max"):
        return "constant reward"
    diag = cpe.get("diagnostics") or {}
    unit = "rows" if one_step else "episodes"
    ess, n = diag.get(f"effective_sample_size_{unit}"), diag.get(unit)
    if not isinstance(ess, int | float) or not isinstance(n, int | float) or not n:
        return None
    if ess < MIN_EFFECTIVE_SAMPLES or ess < MIN_EFFECTIVE_FRACTION * n:
        return f"ESS {ess:.1f} of {n:.0f} {unit}"
    return None


def policy_name(records: list[dict[str, Any]]) -> str:
    """Which policy the CPE curves describe (runs from before the key: the softmax)."""
    with_cpe = [r["cpe"] for r in records if "cpe" in r]
    if not with_cpe:
        return "no policy (no CPE in this run)"
    policy = with_cpe[0].get("policy")
    if policy is None or policy.get("name") == "softmax":
        temperature = (policy or {}).get("temperature")
        at = f" / {temperature:g}" if temperature is not None else " / T"
        return f"softmax(Q{at}) policy (not what model.pt2 serves)"
    return "greedy policy model.pt2 serves"


def build_report_data(
    run_dir: Path, epoch_records: list[dict[str, Any]], all_records: list[dict[str, Any]]
) -> ReportData:
    """The report's content from the run's metrics records, `model_meta.json` and
    `config.json` (both optional: a run cut short has neither)."""
    meta = read_json(run_dir / "model_meta.json")
    config = read_json(run_dir / "config.json")
    epochs = [int(r["epoch"]) + 1 for r in epoch_records]
    cql = float((config.get("training") or {}).get("cql_alpha") or 0.0)
    train_label = f"train loss = TD + {cql:g} × CQL penalty" if cql else "train loss (TD)"
    losses: dict[str, list[float | None]] = {train_label: [r.get("loss") for r in epoch_records]}
    if any("eval_td_loss" in r for r in epoch_records):
        label = "eval TD loss (no CQL penalty)" if cql else "eval TD loss"
        losses[label] = [r.get("eval_td_loss") for r in epoch_records]
    data = ReportData(epochs=epochs, losses=losses, policy=policy_name(epoch_records))
    for name in ESTIMATORS:
        for epoch, record in zip(epochs, epoch_records, strict=True):
            cpe = record.get("cpe") or {}
            imp = improvement(cpe.get(name))
            if imp is not None:
                point = CpePoint(epoch, imp[0], imp[1], unreliable(cpe, name))
                data.cpe.setdefault(name, []).append(point)
    selected = meta.get("selected_epoch")
    data.selected_epoch = int(selected) + 1 if isinstance(selected, int) else None
    data.model_selection = meta.get("model_selection")
    online = meta.get("online_evaluation") or next(
        (r["online"] for r in reversed(all_records) if isinstance(r.get("online"), dict)), None
    )
    if online and finite(online.get("mean_return")):
        data.online = Online(
            env=str(online.get("env", "env")),
            episodes=int(online.get("episodes", 0)),
            mean_return=float(online["mean_return"]),
            std_return=float(online.get("std_return") or 0.0),
            logger_mean_return=_logged_return(config.get("eval_data_path")),
        )
    return data


def _logged_return(path: object) -> float | None:
    """The logging policy's mean episode return: the mean over the eval table's episodes
    of their summed rewards (None when the table is gone or lacks the columns)."""
    if not isinstance(path, str) or not Path(path).is_file():
        return None
    try:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["mdp_id", "reward"])
        sums = table.group_by("mdp_id").aggregate([("reward", "sum")])
        value = pc.mean(sums.column("reward_sum")).as_py()
    except (OSError, KeyError, ValueError, ArithmeticError):  # pyarrow errors derive from these
        return None
    return float(value) if finite(value) else None


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
