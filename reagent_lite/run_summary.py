"""The end-of-run summary: one screen on what the run learned and how much to trust it.

Built only from what a finished run left in its output directory (`metrics.jsonl`,
`model_meta.json`, `config.json` and the eval table the config names), so it describes
exactly the files a user will read, and a test can build it from a crafted directory.
Node 0 logs it at the end of every successful run and writes it to `summary.txt`.

The verdict is one word for "is the policy better than the logger?":
* with an online check (an environment): its mean return against the logging policy's mean
  episode return in the eval table, "within noise" when they differ by at most 2 standard
  errors of the online mean; "undecided" from fewer than 2 episodes (no error to judge by);
* otherwise the trusted CPE estimates at the selected epoch (report_data.unreliable sets
  the others apart): "better" when one is above the logger by more than 2 SE and none
  below, "worse" the other way round, "within noise" when all are within 2 SE, and
  "undecided" when none is trusted or they disagree;
* "failed", whatever the above says, when most online episodes timed out
  (`evaluation.online.failed`): the policy does not reach the goal.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reagent_lite.evaluation.online import failed
from reagent_lite.io_utils import atomic_write_text
from reagent_lite.report_data import CpePoint, ReportData, build_report_data, finite, read_json

log = logging.getLogger("reagent_lite")

SUMMARY_FILE = "summary.txt"
MAX_WIDTH = 100
# The order in which trusted estimates are listed: the ones a reader should look at first.
_ORDER = (
    "doubly_robust",
    "sequential_doubly_robust",
    "magic",
    "weighted_doubly_robust",
    "ips",
    "snips",
    "direct_method",
)
_SELECTION = {
    "last": "the newest epoch",
    "td_error": "the lowest eval TD loss",
    "cpe": "the highest doubly robust estimate",
}
_REMEDIES = "e.g. training.cql_alpha=1.0"


@dataclass(frozen=True)
class Returns:
    """The logging policy's episode returns in the eval table: mean, its standard error."""

    mean: float
    se: float
    episodes: int


@dataclass(frozen=True)
class Verdict:
    word: str  # better / within noise / worse / undecided / failed
    why: str


def summary_lines(run_dir: Path, *, wall_s: float | None = None) -> list[str]:
    """The summary of the finished run in `run_dir`, at most ~20 lines of at most
    `MAX_WIDTH` characters. `wall_s`: the whole run's wall-clock time, when known."""
    records = _read_records(run_dir / "metrics.jsonl")
    epochs = [r for r in records if "loss" in r and "transitions_per_s" in r]
    meta = read_json(run_dir / "model_meta.json")
    config = read_json(run_dir / "config.json")
    data = build_report_data(run_dir, epochs, records)
    lines = [f"model:     {run_dir / 'model.pt2'}"]
    lines.append(_selected(data, len(epochs)))
    lines.append(_training(epochs, config, wall_s))
    lines.append(f"policy vs logger ({_policy(data)}):")
    logger = _logged_returns(config.get("eval_data_path")) if data.online else None
    online = _online_line(data, logger)
    if online:
        lines.append(online)
    trusted = data.trusted_at_selected()
    lines += _cpe_lines(data, trusted)
    verdict = _verdict(data, trusted, logger)
    # A policy that times out on most online episodes has failed, even where its mean is
    # within noise of (or above) a logger that hardly ever reached the goal either.
    timed_out = failed(meta.get("online_evaluation"))
    if timed_out:
        verdict = Verdict("failed", timed_out)
    lines.append(f"verdict:   {verdict.word.upper()} ({verdict.why})")
    at = _record_at(epochs, data.selected_epoch)
    lines += _trust_lines(at, epochs)
    lines.append(f"next:      {_next_step(verdict, epochs, run_dir, meta)}")
    return [_fit(line) for line in lines]


def report_run(run_dir: Path, *, wall_s: float | None = None) -> list[str]:
    """Writes `summary.txt` and logs the summary as one record (one log prefix, then the
    lines as they are). A summary that cannot be built is a warning: the run succeeded."""
    try:
        lines = summary_lines(run_dir, wall_s=wall_s)
        atomic_write_text(run_dir / SUMMARY_FILE, "\n".join(lines) + "\n")
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("run summary not written: %s", err)
        return []
    log.info("run summary (also in %s):\n%s", run_dir / SUMMARY_FILE, "\n".join(lines))
    return lines


# ----------------------------------------------------------------------------- sections
def _selected(data: ReportData, n_epochs: int) -> str:
    rule = data.model_selection or "last"
    why = _SELECTION.get(rule, rule)
    if data.selected_epoch is None:
        return f"selected:  no epoch recorded (model_selection {rule!r})"
    return f"selected:  epoch {data.selected_epoch} of {n_epochs} (model_selection {rule!r}: {why})"


def _training(epochs: list[dict[str, Any]], config: dict[str, Any], wall_s: float | None) -> str:
    training = config.get("training") or {}
    per_step = int(training.get("minibatch_size") or 0) * int(
        training.get("minibatches_per_step") or 1
    )
    seconds = transitions = waited = 0.0
    for r in epochs:
        # As the epoch's record counts them: the timed steps of every rank, over the
        # slowest rank's time.
        n = int(r.get("steps_timed", 0)) * per_step * int(r.get("world_size", 1))
        rate = float(r.get("transitions_per_s") or 0.0)
        if n and rate > 0:
            transitions += n
            seconds += n / rate
            waited += float(r.get("data_wait_s") or 0.0)
    steps = int(epochs[-1]["steps"]) if epochs else 0
    text = f"training:  {len(epochs)} epoch(s), {steps:,} optimizer steps"
    if seconds > 0:
        text += f" in {_duration(seconds)}, {transitions / seconds:,.0f} transitions/s"
        if waited > 0.05 * seconds:  # the data set the pace: say so where the user reads
            text += f" ({min(100.0, 100 * waited / seconds):.0f}% of it waiting for data)"
    if wall_s is not None:
        text += f"; whole run {_duration(wall_s)}"
    return text


def _policy(data: ReportData) -> str:
    return data.policy.replace(" policy model.pt2 serves", " policy served")


def _online_line(data: ReportData, logger: Returns | None) -> str | None:
    o = data.online
    if o is None:
        return None
    se = o.std_return / math.sqrt(o.episodes) if o.episodes > 1 else math.nan
    err = f" ± {se:.1f}" if math.isfinite(se) else ""
    theirs = f" vs the logger's {logger.mean:.1f} ± {logger.se:.1f}" if logger else ""
    return f"  online {o.env}: mean return {o.mean_return:.1f}{err} ({o.episodes} episodes){theirs}"


def _cpe_lines(data: ReportData, trusted: dict[str, CpePoint]) -> list[str]:
    if not data.cpe:
        return ["  CPE: none (no eval table, or evaluation.calc_cpe_in_training off)"]
    lines = []
    for name in _ORDER:
        if name in trusted:
            p = trusted[name]
            lines.append(
                f"  {name:<25} {p.improvement:+8.1%} ± {p.std_error:.1%} vs the logger (trusted)"
            )
    untrusted = [n for n in _ORDER if n in data.cpe and n not in trusted]
    reasons: dict[str, list[str]] = {}
    for name in untrusted:
        reasons.setdefault(data.verdict(name) or "?", []).append(name)
    for reason, names in reasons.items():
        lines.append(f"  not trusted ({reason}): {', '.join(names)}")
    return lines


def _verdict(data: ReportData, trusted: dict[str, CpePoint], logger: Returns | None) -> Verdict:
    o = data.online
    if o is not None and logger is not None:
        if o.episodes < 2 or logger.episodes < 2:
            return Verdict("undecided", "fewer than 2 episodes on a side: no error bar")
        diff = o.mean_return - logger.mean
        noise = 2 * math.hypot(o.std_return / math.sqrt(o.episodes), logger.se)
        word = "within noise" if abs(diff) <= noise else "better" if diff > 0 else "worse"
        return Verdict(word, f"online return {diff:+.1f} against the logger's, 2 SE = {noise:.1f}")
    if not data.cpe:
        return Verdict("undecided", "nothing measured: no CPE, no online check")
    if not trusted:
        return Verdict("undecided", "no trusted CPE estimate")
    up = [n for n, p in trusted.items() if p.improvement - 2 * p.std_error > 0]
    down = [n for n, p in trusted.items() if p.improvement + 2 * p.std_error < 0]
    if up and down:
        return Verdict("undecided", f"trusted estimates disagree: {up[0]} up, {down[0]} down")
    if up:
        return Verdict("better", f"{', '.join(up)} above the logger by > 2 SE")
    if down:
        return Verdict("worse", f"{', '.join(down)} below the logger by > 2 SE")
    return Verdict("within noise", "every trusted estimate within 2 SE of the logger")


def _trust_lines(at: dict[str, Any] | None, epochs: list[dict[str, Any]]) -> list[str]:
    lines = []
    cpe = (at or {}).get("cpe") or {}
    diag = cpe.get("diagnostics") or {}
    if diag:
        lines.append(
            f"trust:     effective sample size {diag['effective_sample_size_rows']:.0f} of "
            f"{diag['rows']:.0f} rows, {diag['effective_sample_size_episodes']:.1f} of "
            f"{diag['episodes']:.0f} episodes"
        )
    agree, unlogged = diag.get("logged_action_agreement"), diag.get("unlogged_pick_fraction")
    if finite(agree) and finite(unlogged):
        lines.append(
            f"coverage:  takes the logged action in {agree:.0%} of eval rows; "
            f"{unlogged:.0%} of its picks never logged"
        )
    raised = _diagnostics(cpe)
    lines.append(f"warnings:  {'; '.join(raised) if raised else 'none from the CPE'}")
    lines.append(f"Q values:  {_divergence(epochs)}")
    return lines


def _diagnostics(cpe: dict[str, Any]) -> list[str]:
    """The CPE diagnostics the run warned about (once each), in a few words."""
    from reagent_lite.evaluation.diagnostics import diagnostic_notices

    out = []
    diag = cpe.get("diagnostics") or {}
    needed = ("rows", "episodes", "mean_top_probability", "tied_top_q_fraction")
    if all(k in diag for k in needed):
        for key, _ in diagnostic_notices(diag, "policy"):
            if "ess rows" in key:
                out.append("one-step ESS tiny")
            elif "ess episodes" in key:
                out.append("sequential ESS tiny")
            elif "near-uniform" in key:
                out.append("near-uniform policy")
            else:
                out.append(f"{diag['tied_top_q_fraction']:.0%} of rows tie at the top Q")
    outside = (cpe.get("reachable_range") or {}).get("outside") or []
    if outside:
        out.append(f"beyond any policy's value: {', '.join(outside)}")
    return out


def _divergence(epochs: list[dict[str, Any]]) -> str:
    flagged = [r for r in epochs if r.get("q_diverging")]
    last = epochs[-1] if epochs else {}
    peak, bound = last.get("max_abs_q"), last.get("q_bound")
    if not flagged:
        if finite(peak) and finite(bound):
            # The check flags past twice the bound (divergence.py): a little above is not.
            return f"max|Q| {peak:.3g}, under twice the bound {bound:.3g}: not diverging"
        return "not checked"
    first = int(flagged[0]["epoch"]) + 1
    if last.get("q_diverging"):
        return f"DIVERGED from epoch {first} (max|Q| {peak:.3g} > 2 × bound {bound:.3g})"
    return f"diverged in epoch {first}, recovered by the last epoch"


def _next_step(
    verdict: Verdict, epochs: list[dict[str, Any]], run_dir: Path, meta: dict[str, Any]
) -> str:
    if epochs and epochs[-1].get("q_diverging"):
        return f"do not serve it; retrain with {_REMEDIES}"
    if verdict.word == "failed":
        return "do not serve it; the logs may show too few episodes that reach the goal: log more"
    if verdict.word == "better":
        command = f"serve it: reagent-lite serve --model {run_dir} --log-dir DIR"
        # A path too long for the screen is not cut inside a command a user would copy.
        fits = len(command) <= MAX_WIDTH - len("next:      ")
        return command if fits else command.replace(str(run_dir), "<the model's directory>")
    if verdict.word == "worse":
        return f"do not serve it; retrain ({_REMEDIES}) or log more data"
    if verdict.word == "within noise":
        return "no measurable gain: a larger eval table narrows the error bars"
    if verdict.why.startswith("nothing measured"):
        return "measure it: give an eval_data_path (CPE), or an env with online_episodes"
    if meta.get("online_evaluation") is None:
        return "CPE undecided: collect logs with exploration (or check online with an env)"
    return "undecided: run more online episodes (evaluation.online_episodes)"


# ----------------------------------------------------------------------------- helpers
def _logged_returns(path: object) -> Returns | None:
    """The eval table's episode returns (summed rewards per `mdp_id`), None when the table
    is gone or lacks the columns (Parquet only, as `report_data` reads it)."""
    if not isinstance(path, str) or not Path(path).is_file():
        return None
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["mdp_id", "reward"])
    except (OSError, KeyError, ValueError):  # pyarrow's errors derive from these
        return None
    sums = table.group_by("mdp_id").aggregate([("reward", "sum")]).column("reward_sum")
    values = [float(v) for v in sums.to_pylist() if v is not None]
    if not values:
        return None
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return Returns(mean, math.sqrt(var / len(values)), len(values))


def _record_at(epochs: list[dict[str, Any]], selected: int | None) -> dict[str, Any] | None:
    at = [r for r in epochs if selected is not None and int(r["epoch"]) + 1 == selected]
    return at[-1] if at else (epochs[-1] if epochs else None)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _fit(line: str) -> str:
    # A long path must not make the screen wrap: cut in the middle, keep both ends.
    if len(line) <= MAX_WIDTH:
        return line
    keep = (MAX_WIDTH - 3) // 2
    return line[:keep] + "..." + line[-(MAX_WIDTH - 3 - keep) :]


def _read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
