"""Training and CPE curves of a run as a PNG: `python -m reagent_lite.report --run DIR`.

Needs the `plot` extra (matplotlib). Three panels, left to right: did the policy improve
(the online mean return against the logging policy's when the run had an environment,
else the trusted CPE estimates at the selected epoch); the CPE estimates per epoch as the
relative improvement over the logged policy, `(value - logged) / |logged|` (0 = as good as
the logger, above 0 = better, whatever the sign of the logged value), with bootstrap
standard errors, the unreliable ones grey and dashed with the reason in the legend; the
losses, named. The selected epoch is marked. What is drawn comes from `report_data`.
Exit codes as the workflows: 2 bad flags / no run there / no matplotlib, 3 a
metrics.jsonl without any epoch record.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from reagent_lite.cli import report_parser, run_cli
from reagent_lite.errors import ConfigError, DataError
from reagent_lite.io_utils import atomic_write
from reagent_lite.report_data import ReportData, build_report_data, improvement
from reagent_lite.training.metrics import read_metrics

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["draw_report", "epoch_records", "improvement", "main"]


def epoch_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "transitions_per_s" in r]


def _read(run_dir: Path) -> ReportData:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"--run: no metrics.jsonl in '{run_dir}' (expected a run's output)")
    try:
        records = read_metrics(metrics)
    except ValueError as err:
        raise DataError(f"{metrics}: not JSON Lines ({err})") from None
    epochs = epoch_records(records)
    if not epochs:
        raise DataError(
            f"{metrics}: no epoch record (expected at least one line with 'epoch', 'loss' "
            "and 'transitions_per_s'): nothing to draw"
        )
    return build_report_data(run_dir, epochs, records)


def draw_report(run_dir: Path, output: Path | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ConfigError("report needs matplotlib: pip install 'reagent-lite[plot]'") from err
    data = _read(run_dir)
    fig, (ax_goal, ax_cpe, ax_loss) = plt.subplots(
        1, 3, figsize=(16, 5.2), gridspec_kw={"width_ratios": [0.8, 1.2, 1.0]}
    )
    _draw_goal(ax_goal, data)
    _draw_cpe(ax_cpe, data)
    _draw_loss(ax_loss, data)
    fig.tight_layout()
    path = output or run_dir / "report.png"
    # Atomic like every other output; the format follows the name, not the temp file's.
    fmt = path.suffix[1:] or "png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format=fmt, bbox_inches="tight"))
    plt.close(fig)
    return path


def _legend_below(ax: Axes, ncol: int = 1) -> None:
    # Below the axes, never over the data.
    ax.xaxis.labelpad = 0
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize=8, ncol=ncol)


def _mark_selected(ax: Axes, data: ReportData) -> None:
    if data.selected_epoch is not None:
        how = f" ({data.model_selection})" if data.model_selection else ""
        ax.axvline(
            data.selected_epoch, color="black", linestyle=":", linewidth=1.2,
            label=f"selected epoch {data.selected_epoch}{how}",
        )  # fmt: skip


def _draw_goal(ax: Axes, data: ReportData) -> None:
    """Did the policy improve: online returns when there was an env, else trusted CPE."""
    online = data.online
    if online is not None:
        names, values, errs = [], [], []
        if online.logger_mean_return is not None:
            names.append("logging policy\n(eval table)")
            values.append(online.logger_mean_return)
            errs.append(0.0)
        names.append(f"learned policy\n(epoch {data.selected_epoch or '?'})")
        values.append(online.mean_return)
        errs.append(online.std_return)
        colors = ["#999999", "#2a7ab0"][-len(names) :]
        ax.bar(names, values, yerr=errs, capsize=4, color=colors)
        top = max(abs(v) for v in values) or 1.0
        for i, v in enumerate(values):
            # Inside a tall bar (clear of its error bar), above a short one to stay legible.
            inside = abs(v) > 0.2 * top
            ax.annotate(
                f"{v:.1f}", (i, v / 2 if inside else v + errs[i] + 0.02 * top),
                ha="center", va="center" if inside else "bottom",
                color="white" if inside else "black", weight="bold",
            )  # fmt: skip
        ax.set_ylabel(f"mean episode return in {online.env} (± std)")
        ax.set_title(f"Did the policy improve? Online, {online.episodes} episodes", fontsize=10)
        return
    trusted = data.trusted_at_selected()
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel("(value - logged) / |logged|  (± std. error)")
    ax.set_title("Did the policy improve? Trusted CPE estimates", fontsize=10)
    if not trusted:
        ax.text(
            0.5, 0.5, "no trustworthy CPE estimate\n(see the middle panel)",
            ha="center", va="center", transform=ax.transAxes,
        )  # fmt: skip
        ax.set_xticks([])
        return
    names = list(trusted)
    ax.bar(
        names,
        [trusted[n].improvement for n in names],
        yerr=[trusted[n].std_error for n in names],
        capsize=4,
        color="#2a7ab0",
    )
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)


def _draw_cpe(ax: Axes, data: ReportData) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=1, label="logged policy")
    grey_markers = iter("osD^vPX")
    for name, points in data.cpe.items():
        reason = data.verdict(name)
        xs = [p.epoch for p in points]
        ys = [p.improvement for p in points]
        if reason is None:
            ax.errorbar(
                xs, ys, yerr=[p.std_error for p in points], marker="o", capsize=3,
                linewidth=1.6, label=name,
            )  # fmt: skip
        else:  # drawn, but visibly set apart: no error bars, which would mean nothing
            ax.plot(
                xs, ys, color="#b0b0b0", linestyle="--", marker=next(grey_markers, "o"),
                markerfacecolor="none",
                linewidth=1, label=f"{name}: unreliable ({reason})",
            )  # fmt: skip
    _mark_selected(ax, data)
    ax.set_xlabel("epoch")
    ax.set_ylabel("(value - logged) / |logged|  (± std. error)")
    ax.set_title(f"CPE of the {data.policy}", fontsize=10)
    _legend_below(ax)


def _draw_loss(ax: Axes, data: ReportData) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for (label, values), marker in zip(data.losses.items(), "os", strict=False):
        # NaN leaves a gap where an epoch has no value (e.g. no eval TD loss).
        ys = [float("nan") if v is None else v for v in values]
        ax.plot(data.epochs, ys, marker=marker, label=label)
    _mark_selected(ax, data)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    cql = any("CQL" in label for label in data.losses)
    ax.set_title(
        "Training" + ("\n(the CQL penalty may grow as Q separates actions)" if cql else ""),
        fontsize=10,
    )
    _legend_below(ax)


def main(argv: list[str] | None = None, prog: str = "python -m reagent_lite.report") -> None:
    args = report_parser(prog).parse_args(argv)
    run_cli(lambda: print(f"report: {draw_report(args.run, args.output)}"))


if __name__ == "__main__":
    main()
