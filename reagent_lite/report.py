"""Training and CPE curves of a run as a PNG: `python -m reagent_lite.report --run DIR`.

Needs the `plot` extra (matplotlib).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reagent_lite.io_utils import atomic_write
from reagent_lite.training.metrics import read_metrics

_ESTIMATORS = (
    "direct_method",
    "ips",
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


def draw_report(run_dir: Path, output: Path | None = None) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise SystemExit("report needs matplotlib: pip install 'reagent-lite[plot]'") from err
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise SystemExit(f"--run: no metrics.jsonl in '{run_dir}'")
    records = epoch_records(read_metrics(metrics))
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
        values = [r.get("cpe", {}).get(name, {}).get("normalized") for r in records]
        if any(v is not None for v in values):
            ax_cpe.plot(epochs, values, marker=".", label=name)
    ax_cpe.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="logged policy")
    ax_cpe.set_xlabel("epoch")
    ax_cpe.set_ylabel("value / logged value")
    ax_cpe.set_title(f"CPE of the {_policy_name(records)}", fontsize=9)
    ax_cpe.legend(fontsize=7)
    fig.tight_layout()
    path = output or run_dir / "report.png"
    # Atomic like every other output; the format follows the name, not the temp file's.
    fmt = path.suffix[1:] or "png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format=fmt))
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m reagent_lite.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--run", required=True, type=Path, help="model_output_path of a run")
    parser.add_argument(
        "--output", type=Path, default=None, help="PNG path (default: <run>/report.png)"
    )
    args = parser.parse_args(argv)
    path = draw_report(args.run, args.output)
    print(f"report: {path}", file=sys.stdout)


if __name__ == "__main__":
    main()
