"""Close the loop: serve with exploration → decision log → timeline → train → CPE → hot reload.

For CartPole-v1 and the synthetic parametric environment (`closed_loop_envs.py`), the
environment is a client of a real `reagent-lite serve` on 127.0.0.1 (`closed_loop_http.py`):

* **Round 0** is served by a random policy: the server started with `--exploration
  epsilon:1.0` on an initial model (the shipped config trained for one epoch on a few
  random episodes, only so that the server has a model of the right signature). ε = 1
  makes every probability exactly 1/|possible actions| whatever the model says: a uniform
  random logger with exact propensities, through the same server path as later rounds.
* **Rounds 1..N**: the decision logs of every round so far (`timeline --input LOGS`, all
  of them: the table grows each round, and each row keeps the propensity of the policy that
  logged it) → the shipped config trained on that table through the real CLI, CPE on →
  the new policy's CPE estimate ± SE is read from the run's `metrics.jsonl` (the exported
  epoch's record) *before* it is deployed → hot reload into the one exploring server
  (`--exploration epsilon:E`, started once after round 0) → the round's episodes.
* Per round it prints the online value of the served greedy policy (measured in process on
  the deployed `model.pt2`, whose SHA-256 must be the server's `model_id`: see
  `closed_loop_envs.py`), the value under exploration and the exploration's cost (greedy −
  exploring), the CPE estimate made before deploying, whether it is within 3 SE of the
  value then measured (SE = the CPE's bootstrap SE and the measurement's, combined), and
  decisions answered vs logged (they must be equal: the round's episodes are waited for in
  the log's closed parts; the random server is stopped by SIGTERM, which flushes).

Goals (the exit status, except with `--quick`): the greedy value improves round over round
until it saturates (CartPole: ≥ 450 within 4 rounds; parametric: ≥ 95% of the optimal
policy's exact value), then stays saturated, and every CPE is within 3 SE. With
`--quick` (a few episodes, one round, one epoch: a smoke test) only the bookkeeping counts:
exit 1 when decisions logged ≠ answered or a server stopped badly.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/closed_loop.py [--env cartpole parametric]
        [--rounds N] [--episodes E] [--round0-episodes E0] [--epsilon 0.1] [--quick]

Everything a run writes is under `--out/<env>/` (replaced at each run): `logs/` (the
decision logs), `rounds/<k>/` (table, config, model, train.log), the servers' output.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `benchmarks` is a package of the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.closed_loop_envs import ENVS, LoopEnv, Measured  # noqa: E402
from benchmarks.closed_loop_http import (  # noqa: E402
    MODEL_FILES,
    ServerProcess,
    sha256_of,
    subprocess_env,
    wait_logged,
)

CLI_TIMEOUT_S = 1800
Z_BAR = 3.0
# Per environment: rounds, episodes of round 0 and of each later round, greedy evaluation
# episodes, random episodes of the initial (signature-only) model, and the fewest optimizer
# updates a round trains for: about what the shipped config makes on its own sample data
# (CartPole: 5000 random episodes ≈ 99k training rows / 1024 × 20 epochs ≈ 1900;
# parametric: 13000 × 0.7 rows / 256 × 10 epochs ≈ 360). The early rounds' tables are
# smaller than those samples, and the shipped epochs alone would train them for a fraction
# of those updates (CartPole's first model then serves one action: return ≈ 9); so a round
# trains max(shipped epochs, enough epochs for that many updates). Then the --quick sizes.
SIZES: dict[str, dict[str, int]] = {
    "cartpole": dict(rounds=4, round0=1000, episodes=100, eval=50, initial=50, updates=2000),
    "parametric": dict(rounds=3, round0=3000, episodes=3000, eval=0, initial=300, updates=360),
}
QUICK: dict[str, dict[str, int]] = {
    "cartpole": dict(rounds=1, round0=12, episodes=3, eval=2, initial=30, updates=0),
    "parametric": dict(rounds=1, round0=60, episodes=30, eval=0, initial=200, updates=0),
}


@dataclass(frozen=True)
class Estimate:
    """One CPE estimate of the exported epoch: raw value ± bootstrap SE."""

    estimator: str
    value: float
    se: float


@dataclass
class RoundRow:
    round: int
    exploration: str
    model_id: str
    episodes: int
    answered: int  # /v1/act answers the clients got
    logged: int = 0  # rows of the round in the decision log's closed parts
    no_feedback: int = 0  # of those, rows logged without their reward (feedback_missing)
    exploring: tuple[float, float] = (math.nan, math.nan)  # value under exploration ± SE
    greedy: Measured | None = None  # the served model's greedy policy
    cpe: Estimate | None = None  # made before this round's model was deployed
    table_rows: int = 0  # rows of the table trained on after this round
    epochs: int = 0  # epochs the served model trained for

    @property
    def cost(self) -> float:
        return self.greedy.online - self.exploring[0] if self.greedy else float("nan")

    @property
    def z(self) -> float:
        return z_score(self.cpe, self.greedy) if self.cpe and self.greedy else float("nan")


# ------------------------------------------------------------------------ bookkeeping
def read_cpe(model_dir: Path, estimator: str) -> Estimate:
    """`estimator`'s raw estimate ± SE in the exported epoch's record of `metrics.jsonl`."""
    meta = json.loads((model_dir / "model_meta.json").read_text())
    selected = meta.get("selected_epoch")
    records = [
        json.loads(line)
        for line in (model_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    with_cpe = [r for r in records if isinstance(r.get("cpe"), dict)]
    chosen = [r for r in with_cpe if r.get("epoch") == selected] or with_cpe[-1:]
    if not chosen or estimator not in chosen[-1]["cpe"]:
        raise ValueError(f"{model_dir / 'metrics.jsonl'}: no {estimator} estimate in any epoch")
    est = chosen[-1]["cpe"][estimator]
    value, se = est.get("raw"), est.get("raw_std_error")
    return Estimate(
        estimator,
        float("nan") if value is None else float(value),
        float("nan") if se is None else float(se),
    )


def z_score(cpe: Estimate, measured: Measured) -> float:
    """|CPE − measured| in standard errors of their difference (both SEs combined)."""
    se = math.sqrt(cpe.se**2 + measured.target_se**2)
    diff = abs(cpe.value - measured.target)
    if not math.isfinite(diff):
        return float("nan")
    return diff / se if se > 0 else (0.0 if diff == 0 else math.inf)


def improving(values: list[float], saturated: float | None, tolerance: float = 0.0) -> bool:
    """The greedy values rise round over round until they reach `saturated` (then stay at
    or above it); without a bar, each round at least matches the one before."""
    for before, after in itertools.pairwise(values):
        if saturated is not None and before >= saturated:
            if after < saturated:
                return False
        elif after < before - tolerance:
            return False
    return saturated is None or (bool(values) and values[-1] >= saturated)


def _fmt(value: float, se: float | None = None, digits: int = 2) -> str:
    if not math.isfinite(value):
        return "—"
    if se is None or not math.isfinite(se):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} ± {se:.{digits}f}"


def round_line(env: str, row: RoundRow, unit: str) -> str:
    parts = [
        f"[{env}] round {row.round} ({row.exploration}, model {row.model_id[:12]})",
        f"{row.episodes} episodes, {row.answered} decisions answered, {row.logged} logged",
        f"value under exploration {_fmt(*row.exploring)} {unit}",
    ]
    if row.greedy:
        g = row.greedy
        parts.append(f"greedy {_fmt(g.online, g.online_se)} {unit}")
        parts.append(f"(CPE's scale: {_fmt(g.target, g.target_se, 3)})")
        parts.append(f"exploration cost {_fmt(row.cost)}")
    if row.cpe:
        verdict = "within" if row.z <= Z_BAR else "NOT within"
        parts.append(
            f"CPE before deploy {row.cpe.estimator} {_fmt(row.cpe.value, row.cpe.se, 3)}: "
            f"z = {_fmt(row.z)}, {verdict} {Z_BAR:g} SE"
        )
    if row.epochs:
        parts.append(f"model trained {row.epochs} epochs")
    if row.table_rows:
        parts.append(f"next table {row.table_rows} rows")
    return "; ".join(parts)


def table(env: str, rows: list[RoundRow], unit: str) -> str:
    lines = [
        f"| {env} round | served | greedy value ({unit}) | value under exploration "
        "| exploration cost | CPE before deploy (± SE) | measured on CPE's scale | z "
        "| within 3 SE | decisions answered / logged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g = r.greedy
        within = "—" if not (r.cpe and g) else ("yes" if r.z <= Z_BAR else "no")
        lines.append(
            f"| {r.round} | {r.exploration} | {_fmt(g.online, g.online_se) if g else '—'} "
            f"| {_fmt(*r.exploring)} | {_fmt(r.cost)} "
            f"| {_fmt(r.cpe.value, r.cpe.se, 3) if r.cpe else '—'} "
            f"| {_fmt(g.target, g.target_se, 3) if g else '—'} | {_fmt(r.z)} | {within} "
            f"| {r.answered} / {r.logged} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the loop
def run_cli(args: list[str], log_path: Path) -> None:
    """`reagent-lite <args>` (the console module: this checkout's), output to `log_path`."""
    cmd = [sys.executable, "-m", "reagent_lite.console", *args]
    with open(log_path, "w") as log:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT,
            timeout=CLI_TIMEOUT_S,
        )  # fmt: skip
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"reagent-lite {args[0]} exited {proc.returncode}:\n{tail}")


def epochs_for(base: dict[str, Any], train_rows: int, updates: int) -> int:
    """The shipped epochs, or more where a small table would get fewer than `updates`
    optimizer steps from them (one process: a step per minibatch)."""
    per_epoch = max(1, math.ceil(train_rows / int(base["training"]["minibatch_size"])))
    return max(int(base["epochs"]), math.ceil(updates / per_epoch))


def train_config(
    base: dict[str, Any], out: Path, train: Path, evaluation: Path, epochs: int, quick: bool
) -> Path:
    """The shipped config pointed at `train`/`evaluation`, its model under `out/model`."""
    cfg = json.loads(json.dumps(base))
    cfg.pop("$schema", None)
    cfg.pop("sample_data", None)
    cfg.update(
        training_data_path=str(train),
        eval_data_path=str(evaluation),
        model_output_path=str(out / "model"),
        overwrite=True,
    )
    evaluation_cfg = cfg.setdefault("evaluation", {})
    evaluation_cfg["online_episodes"] = 0  # measured here, on the deployed model
    evaluation_cfg["calc_cpe_in_training"] = True
    cfg["epochs"] = epochs
    if quick:
        evaluation_cfg["bootstrap_samples"] = 10
    path = out / "config.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def initial_model(base: dict[str, Any], out: Path, episodes: int) -> Path:
    """The shipped config, one epoch on `episodes` random episodes of its own sample data:
    a model of the right signature for the random round (whose ε = 1 ignores its Q)."""
    cfg = json.loads(json.dumps(base))
    cfg.pop("$schema", None)
    cfg["sample_data"]["episodes"] = episodes
    cfg["sample_data"]["eval_fraction"] = 0.5
    cfg.update(
        training_data_path=str(out / "data" / "train.parquet"),
        eval_data_path=str(out / "data" / "eval.parquet"),
        model_output_path=str(out / "model"),
        overwrite=True,
        epochs=1,
    )
    cfg.setdefault("evaluation", {}).update(online_episodes=0, calc_cpe_in_training=False)
    path = out / "config.json"
    path.write_text(json.dumps(cfg, indent=1))
    run_cli(["train", "--config", str(path)], out / "train.log")
    return out / "model"


def serve_round(
    env: LoopEnv, server: ServerProcess, k: int, episodes: int, concurrency: int
) -> RoundRow:
    """Round k's episodes through `server`; every decision must come from the model it
    serves now (a reload that had not taken would show as a second model id)."""
    model_id = server.model_id()
    played = env.play(server.port, k, episodes, concurrency)
    if played.model_ids != {model_id}:
        raise RuntimeError(
            f"round {k}: decisions made by models {sorted(played.model_ids)}, expected only "
            f"{model_id} (the deployed one)"
        )
    return RoundRow(k, server.exploration, model_id, episodes, played.decisions,
                    exploring=played.mean_se())  # fmt: skip


def count_logged(row: RoundRow, log_dir: Path, timeout_s: float = 60.0) -> None:
    row.logged, row.no_feedback = wait_logged(log_dir, f"r{row.round}-", row.answered, timeout_s)


def bookkeeping_problems(name: str, rows: list[RoundRow]) -> list[str]:
    """Rounds whose decisions were not all logged with their feedback."""
    return [
        f"[{name}] round {r.round}: {r.answered} decisions answered, {r.logged} logged, "
        f"{r.no_feedback} without their feedback (expected all logged, every one with it)"
        for r in rows
        if r.logged != r.answered or r.no_feedback or not r.answered
    ]


def run_env(env: LoopEnv, sizes: dict[str, int], args: argparse.Namespace) -> list[RoundRow]:
    name = env.name
    out = (args.out / name).resolve()
    shutil.rmtree(out, ignore_errors=True)  # the decision logs of an earlier run would mix in
    for sub in ("initial", "served", "logs/random", "logs/explore", "rounds"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    base = json.loads((ROOT / env.config).read_text())
    eval_fraction = 0.5 if args.quick else float(base["sample_data"].get("eval_fraction", 0.1))

    first = initial_model(base, out / "initial", sizes["initial"])
    env.setup(out / "initial" / "data")
    gamma = float(json.loads((first / "config.json").read_text())["rl"]["gamma"])
    for file in MODEL_FILES:
        if (first / file).exists():
            shutil.copyfile(first / file, out / "served" / file)

    # Round 0: a server of its own (ε = 1: uniform), stopped by SIGTERM, which flushes.
    server = ServerProcess(
        out / "served", out / "logs/random", "epsilon:1.0", out / "server_random.log"
    )
    try:
        rows = [serve_round(env, server, 0, sizes["round0"], args.concurrency)]
    finally:
        code = server.stop()
    if code != 0:
        raise RuntimeError(f"the random round's server exited {code} on SIGTERM")
    count_logged(rows[0], out / "logs/random", timeout_s=0.0)
    print(round_line(name, rows[0], env.online_unit), flush=True)

    server = ServerProcess(
        out / "served", out / "logs/explore", f"epsilon:{args.epsilon}",
        out / "server_explore.log", seed=1,
    )  # fmt: skip
    try:
        for k in range(1, sizes["rounds"] + 1):
            work = out / "rounds" / str(k)
            work.mkdir(parents=True)
            train, evaluation = work / "train.parquet", work / "eval.parquet"
            run_cli(
                ["timeline", "--input", str(out / "logs"), "--output", str(train),
                 "--eval-output", str(evaluation), "--eval-fraction", str(eval_fraction)],
                work / "timeline.log",
            )  # fmt: skip
            rows[-1].table_rows = _rows(train) + _rows(evaluation)
            epochs = 1 if args.quick else epochs_for(base, _rows(train), sizes["updates"])
            config = train_config(base, work, train, evaluation, epochs, args.quick)
            run_cli(["train", "--config", str(config)], work / "train.log")
            cpe = read_cpe(work / "model", env.estimator)  # read before it is deployed
            if server.deploy(work / "model") != sha256_of(work / "model" / "model.pt2"):
                raise RuntimeError("the server serves another model than the one evaluated")
            row = serve_round(env, server, k, sizes["episodes"], args.concurrency)
            count_logged(row, out / "logs/explore")
            row.greedy = env.greedy_value(work / "model", gamma, sizes["eval"])
            row.cpe, row.epochs = cpe, epochs
            rows.append(row)
            print(round_line(name, row, env.online_unit), flush=True)
    finally:
        code = server.stop()
    if code != 0:
        raise RuntimeError(f"the exploring server exited {code} on SIGTERM")
    return rows


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def goals_met(name: str, rows: list[RoundRow], saturated: float | None) -> tuple[bool, str]:
    values = [r.greedy.online for r in rows if r.greedy]
    rising = improving(values, saturated)
    cpe_ok = all(r.z <= Z_BAR for r in rows if r.cpe and r.greedy)
    bar = f" (saturated at {saturated:.4g})" if saturated is not None else ""
    text = (
        f"[{name}] greedy value by round: {', '.join(_fmt(v) for v in values)}{bar}: "
        f"{'improves' if rising else 'does NOT improve'} until saturated; CPE "
        f"{'within' if cpe_ok else 'NOT within'} {Z_BAR:g} SE at every round"
    )
    return rising and cpe_ok, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", nargs="+", choices=sorted(ENVS), default=sorted(ENVS))
    parser.add_argument("--rounds", type=int, help="rounds after the random one")
    parser.add_argument("--episodes", type=int, help="episodes (decisions) per round")
    parser.add_argument("--round0-episodes", type=int, help="episodes of the random round")
    parser.add_argument("--eval-episodes", type=int, help="greedy evaluation episodes")
    parser.add_argument(
        "--min-updates", type=int, help="fewest optimizer updates per round (more epochs)"
    )
    parser.add_argument("--epsilon", type=float, default=0.1, help="exploration of rounds ≥ 1")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads")
    parser.add_argument("--quick", action="store_true", help="a smoke test: tiny and fast")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs/bench/closed_loop")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the `finally` blocks stop the servers this run started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))

    ok, summaries, tables, results = True, [], [], {}
    for name in args.env:
        sizes = dict((QUICK if args.quick else SIZES)[name])
        for key, flag in (("rounds", "rounds"), ("episodes", "episodes"),
                          ("round0", "round0_episodes"), ("eval", "eval_episodes"),
                          ("updates", "min_updates")):  # fmt: skip
            if getattr(args, flag) is not None:
                sizes[key] = getattr(args, flag)
        env = ENVS[name]()
        rows = run_env(env, sizes, args)
        met, text = goals_met(name, rows, env.saturated())
        problems = bookkeeping_problems(name, rows)
        ok = ok and not problems and (met or args.quick)
        summaries += [text, *problems]
        tables.append(table(name, rows, env.online_unit))
        results[name] = {"sizes": sizes, "goals_met": met, "rounds": [asdict(r) for r in rows]}
    print("\n" + "\n\n".join(tables) + "\n\n" + "\n".join(summaries))
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
