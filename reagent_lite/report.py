"""Training and CPE curves of a run as a PNG: `python -m reagent_lite.report --run DIR`.

Needs the `plot` extra (matplotlib). The CPE panel draws each estimate as the relative
improvement over the logged policy, `(value - logged) / |logged|` (0 = as good as the
logger, above 0 = better, whatever the sign of the logged value), with its bootstrap
standard error as an error bar. Exit codes as the workflows: 2 bad flags / no run there /
no matplotlib, 3 a metrics.jsonl without any epoch record.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from reagent_lite.cli import report_parser, run_cli
from reagent_lite.errors import ConfigError, DataError
from reagent_lite.io_utils import atomic_write
from reagent_lite.training.metrics import read_metrics

_ESTIMATORS = (
    "direct_method",
    "ips",
    "snips",
    "doubly_robust",
    "sequential_doubly_robust",
    "weighted_doubly_robust",
    "magic",
)


def epoch_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "transitions_per_s" in r]


def _policy_name(records: list[dict[str, Any]]) -> str:
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
    if not _finite(raw) or not _finite(ratio) or ratio == 0:
        return None
    assert raw is not None and ratio is not None
    logged_sign = math.copysign(1.0, raw) * math.copysign(1.0, ratio)
    err = estimate.get("normalized_std_error")
    return logged_sign * (ratio - 1.0), float(err) if err is not None and _finite(err) else 0.0


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def draw_report(run_dir: Path, output: Path | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ConfigError("report needs matplotlib: pip install 'reagent-lite[plot]'") from err
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"--run: no metrics.jsonl in '{run_dir}' (expected a run's output)")
    try:
        records = epoch_records(read_metrics(metrics))
    except ValueError as err:
        raise DataError(f"{metrics}: not JSON Lines ({err})") from None
    if not records:
        raise DataError(
            f"{metrics}: no epoch record (expected at least one line with 'epoch', 'loss' "
            "and 'transitions_per_s'): nothing to draw"
        )
    epochs = [r["epoch"] + 1 for r in records]
    fig, (ax_loss, ax_cpe) = plt.subplots(1, 2, figsize=(11, 4))
    for ax in (ax_loss, ax_cpe):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_loss.plot(epochs, [r["loss"] for r in records], marker="o", label="train loss")
    if any("eval_td_loss" in r for r in records):
        ax_loss.plot(
            epochs, [r.get("eval_td_loss") for r in records], marker="s", label="eval TD loss"
        )
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("loss")
    ax_loss.set_yscale("log")
    ax_loss.legend()
    ax_loss.set_title("training")
    for name in _ESTIMATORS:
        points = [
            (epoch, imp)
            for epoch, r in zip(epochs, records, strict=True)
            if (imp := improvement((r.get("cpe") or {}).get(name))) is not None
        ]
        if points:
            ax_cpe.errorbar(
                [e for e, _ in points],
                [v for _, (v, _) in points],
                yerr=[se for _, (_, se) in points],
                marker=".",
                capsize=3,
                label=name,
            )
    ax_cpe.axhline(0.0, color="grey", linestyle="--", linewidth=1, label="logged policy")
    ax_cpe.set_xlabel("epoch")
    ax_cpe.set_ylabel("(value - logged) / |logged|  (± std. error)")
    ax_cpe.set_title(f"CPE of the {_policy_name(records)}", fontsize=9)
    ax_cpe.legend(fontsize=7)
    fig.tight_layout()
    path = output or run_dir / "report.png"
    # Atomic like every other output; the format follows the name, not the temp file's.
    fmt = path.suffix[1:] or "png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format=fmt))
    plt.close(fig)
    return path


def main(argv: list[str] | None = None, prog: str = "python -m reagent_lite.report") -> None:
    args = report_parser(prog).parse_args(argv)
    run_cli(lambda: print(f"report: {draw_report(args.run, args.output)}"))


if __name__ == "__main__":
    main()
