"""Robustness: a shipped config (Acrobot, or LunarLander with `--env LunarLander-v3`) on logs
of several behaviour mixes, seed by seed, beside d3rlpy on the same data, with what each
run's own report said about itself.

For each logging mix (all random; 60 % random episodes + 40 % ε-greedy heuristic; ε-greedy
heuristic only) the script logs about `--transitions` steps of Acrobot-v1 once (data seed
`--data-seed`), then trains on them, per seed:

* ours as shipped: `sample_configs/discrete_action/acrobot_dqn.json` through the real
  workflow command (a fresh process, as a user runs it), and the same config with discrete
  BCQ in place of CQL (`acrobot_quality.variants`);
* d3rlpy 2.8's DoubleDQN, DiscreteCQL and DiscreteBCQ with the same network, batch,
  learning rate, γ, standardised observations and number of updates (`d3rlpy_match`),
  when d3rlpy is installed and `--no-d3rlpy` is not given.

Every policy plays `--episodes` greedy episodes (the same episode seeds for all). A seed
FAILS when its policy times out (return −500: never swung up within 500 steps) on more
than half of them; a run that refuses to export (exit 5, diverged) fails too. Per mix the
table gives each contender's median and worst seed, the failed seeds and, for ours, the
seeds the run's own report FLAGGED (`run_verdict`): the divergence check, or the online
check that the shipped config runs before the model is served
(`evaluation.online_episodes`) timing out on most of its episodes. The in-training CPE is
switched off (it does not change what is trained).

    python benchmarks/robustness.py [--env Acrobot-v1] [--seeds 0 1 2 3 4] [--transitions 300000]
        [--mixes random mix60 heuristic] [--episodes 20] [--no-d3rlpy] [--quick]

With `--env LunarLander-v3` the config is `lunarlander_dqn.json` and the mixes are
`mix60` (60 % random episodes + 40 % gymnasium's heuristic lander with ε = 0.1) and
`heuristic` (that ε-greedy heuristic only); all-random LunarLander logs never show a
landing. A LunarLander episode FAILS when its return is below 0 (a crash, a flight off
screen, or a hover that burns more fuel than the landing pays; random play ≈ −180, the
heuristic ≈ +200); a seed FAILS when its median episode return is below 0 (most of its
episodes failed), and the run's report FLAGS it when its online check's median return
is below 0. A run that refuses to export counts as `-inf`.

`--quick` is a smoke test: tiny logs, one seed, one epoch, no d3rlpy.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.acrobot_quality import (
    d3rlpy_algos,
    greedy_of,
    load_table,
    play,
    variants,
)
from benchmarks.cartpole_quality import _env, _seed_config
from reagent_lite.evaluation.online import failed as online_failed

ROOT = Path(__file__).resolve().parents[1]
TIME_LIMIT = 500
ROLLOUT_SEED = 10_000
REFUSED_EXIT = 5  # reagent_lite.errors.TrainingError: the run ended diverged, no model


@dataclass(frozen=True)
class EnvSpec:
    """One environment's benchmark: its shipped config, logging mixes (name → sample_data
    keywords), steps per episode of a random / an ε-greedy heuristic episode (they turn
    --transitions into an episode count), and what a failed episode is."""

    env: str
    config: Path
    mixes: dict[str, dict[str, Any]]
    steps_random: int
    steps_heuristic: int
    n_features: int
    n_actions: int
    # A failed return. A seed fails when its median episode return is one (for Acrobot's
    # floor of −500 that is "more than half timed out"); the run's report flags it when its
    # online check's median return is one.
    failed: Callable[[float], bool]
    refused: float  # the mean recorded for a run that refused to export


ENVS: dict[str, EnvSpec] = {
    "Acrobot-v1": EnvSpec(
        env="Acrobot-v1",
        config=ROOT / "sample_configs/discrete_action/acrobot_dqn.json",
        mixes={
            "random": {"policy": "random", "random_episode_fraction": 1.0},
            "mix60": {"policy": "epsilon_greedy", "epsilon": 0.3, "random_episode_fraction": 0.6},
            "heuristic": {
                "policy": "epsilon_greedy",
                "epsilon": 0.3,
                "random_episode_fraction": 0.0,
            },
        },
        steps_random=495,
        steps_heuristic=140,
        n_features=6,
        n_actions=3,
        # Timed out: never swung up within 500 steps.
        failed=lambda r: r <= -TIME_LIMIT,
        refused=float(-TIME_LIMIT),
    ),
    "LunarLander-v3": EnvSpec(
        env="LunarLander-v3",
        config=ROOT / "sample_configs/discrete_action/lunarlander_dqn.json",
        mixes={
            "mix60": {"policy": "epsilon_greedy", "epsilon": 0.1, "random_episode_fraction": 0.6},
            "heuristic": {
                "policy": "epsilon_greedy",
                "epsilon": 0.1,
                "random_episode_fraction": 0.0,
            },
        },
        steps_random=90,
        steps_heuristic=290,
        n_features=8,
        n_actions=4,
        # Crashed, flew off screen, or hovered at a loss.
        failed=lambda r: r < 0.0,
        refused=-math.inf,
    ),
}


@dataclass
class Figures:
    """One contender on one mix: each seed's mean return, failure and (ours) flag."""

    spec: EnvSpec
    means: list[float] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    flagged: list[int] | None = None

    def add(self, seed: int, returns: list[float] | None, flag: str | None = None) -> None:
        """`returns` None: no model (the run refused to export)."""
        if returns is None:
            self.means.append(self.spec.refused)
            self.failed.append(seed)
        else:
            self.means.append(float(np.mean(returns)))
            if self.spec.failed(float(np.median(returns))):
                self.failed.append(seed)
        if flag is not None:
            self.flagged = (self.flagged or []) + [seed]

    def row(self, name: str) -> str:
        flagged = "-" if self.flagged is None else _seeds(self.flagged)
        return (
            f"  {name:34s} {statistics.median(self.means):8.1f} {min(self.means):8.1f}   "
            f"{_seeds(self.failed):14s} {flagged}"
        )


def _seeds(seeds: list[int]) -> str:
    return f"{len(seeds)} {seeds}" if seeds else "0"


def episodes_for(spec: EnvSpec, mix: dict[str, Any], transitions: int) -> int:
    f = float(mix["random_episode_fraction"])
    return max(2, round(transitions / (f * spec.steps_random + (1 - f) * spec.steps_heuristic)))


def make_data(spec: EnvSpec, name: str, transitions: int, data_seed: int, out: Path) -> Path:
    """The mix's logs (train/eval tables) in `out`, made once."""
    from reagent_lite.samples.generate import generate_sample_data

    if not (out / "train.parquet").exists():
        mix = spec.mixes[name]
        made = generate_sample_data(
            mix,
            env=spec.env,
            episodes=episodes_for(spec, mix, transitions),
            seed=data_seed,
            output_dir=out,
        )
        print(f"{name}: {made.steps} logged steps, logger {made.summary['mean_return']:.1f}")
    return out


def exported_actor(model_dir: Path) -> Callable[[np.ndarray], int]:
    import torch

    from reagent_lite.kinds import get_kind
    from reagent_lite.safe_load import load_program

    meta = json.loads((model_dir / "model_meta.json").read_text())
    kind = get_kind(meta["workflow"])
    space = kind.space_type.from_json(meta)
    act = kind.greedy_actor(load_program(model_dir / "model.pt2", "robustness").module(), space, 3)
    cols = [int(f) for f in space.state_ids]

    def greedy(obs: np.ndarray) -> int:
        state = torch.from_numpy(obs[cols]).unsqueeze(0)
        with torch.no_grad():
            return act(state, torch.ones_like(state))[0]

    return greedy


def run_verdict(spec: EnvSpec, model_dir: Path, returncode: int) -> str | None:
    """What the run said about itself before serving, when it said something was wrong:
    a refusal to export (diverged), or its online check failing on most episodes."""
    if returncode == REFUSED_EXIT:
        return "refused: diverged"
    meta = json.loads((model_dir / "model_meta.json").read_text())
    final = meta.get("final_metrics", {})
    if final.get("q_diverging"):
        return "diverging"
    online = meta.get("online_evaluation")
    timed_out = online_failed(online)  # what the run summary reports as FAILED
    if timed_out:
        return f"online check failed: {timed_out}"
    if online and spec.failed(online.get("median_return", 0.0)):
        return "online check failed"
    return None


def train(cfg: dict[str, Any], cfg_path: Path) -> int:
    """The workflow command on `cfg`: its exit code (0, or 5 for a refused export)."""
    cfg_path.write_text(json.dumps(cfg, indent=1))
    cmd = [sys.executable, "-m", "workflows.dqn_workflow", "--config", str(cfg_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=3600)
    if proc.returncode not in (0, REFUSED_EXIT):
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return proc.returncode


def ours(
    spec: EnvSpec,
    base: dict[str, Any],
    data: Path,
    seeds: list[int],
    args: argparse.Namespace,
    out: Path,
) -> dict[str, Figures]:
    results: dict[str, Figures] = {}
    for v, (name, variant) in enumerate(variants(base).items()):
        figures = results.setdefault(name, Figures(spec, flagged=[]))
        for seed in seeds:
            cfg = _seed_config(variant, seed, out / f"v{v}")
            cfg["training_data_path"] = str(data / "train.parquet")
            cfg["eval_data_path"] = str(data / "eval.parquet")
            # The run's own online check stays as the config sets it: it is part of the
            # report. The in-training CPE does not change what is trained and costs most of
            # a run's time here (acrobot_quality.py switches it off too).
            cfg["evaluation"]["online_episodes"] = variant["evaluation"].get("online_episodes", 0)
            cfg["evaluation"]["calc_cpe_in_training"] = False
            if args.quick:
                cfg.update(epochs=1)
                cfg["training"]["steps_per_epoch"] = 20
                cfg["evaluation"].update(online_episodes=2, calc_cpe_in_training=False)
            rc = train(cfg, out / f"config_v{v}_seed{seed}.json")
            model = Path(cfg["model_output_path"])
            returns = None if rc else play(exported_actor(model), args.episodes, spec.env)
            figures.add(seed, returns, run_verdict(spec, model, rc))
            mean = "no model" if returns is None else f"{np.mean(returns):.1f}"
            print(f"  {name} seed {seed}: {mean}", flush=True)
    return results


def d3rlpy_contenders(
    spec: EnvSpec, base: dict[str, Any], data: Path, seeds: list[int], episodes: int
) -> dict[str, Figures]:
    from benchmarks.d3rlpy_match import fit_and_score, matched_settings, quiet

    quiet()
    arrays = load_table(data / "train.parquet", spec.n_features)
    common, steps = matched_settings(base, len(arrays[0]))
    algos = d3rlpy_algos(base, common)
    played: list[list[float]] = []

    def score(algo: Any) -> float:
        played.append(play(greedy_of(algo), episodes, spec.env))
        return float(np.mean(played[-1]))

    fit_and_score(arrays, spec.n_actions, algos, steps, seeds, score)
    results: dict[str, Figures] = {}
    for i, name in enumerate(algos):
        figures = results[name] = Figures(spec)
        for j, seed in enumerate(seeds):
            figures.add(seed, played[i * len(seeds) + j])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=list(ENVS), default="Acrobot-v1")
    parser.add_argument("--config", type=Path, help="default: the env's shipped config")
    mixes = sorted({m for spec in ENVS.values() for m in spec.mixes})
    parser.add_argument("--mixes", nargs="+", choices=mixes, help="default: all of the env's")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--transitions", type=int, default=300_000)
    parser.add_argument("--data-seed", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs/bench/robustness")
    parser.add_argument("--no-d3rlpy", action="store_true", help="skip the d3rlpy baselines")
    parser.add_argument("--quick", action="store_true", help="smoke test (tiny, no d3rlpy)")
    args = parser.parse_args(argv)
    spec = ENVS[args.env]
    args.config = args.config or spec.config
    args.mixes = args.mixes or list(spec.mixes)
    unknown = [m for m in args.mixes if m not in spec.mixes]
    if unknown:
        parser.error(f"--mixes: {unknown} are not mixes of {args.env} (its: {list(spec.mixes)})")
    if args.quick:
        args.seeds, args.transitions, args.episodes, args.no_d3rlpy = [0], 3000, 2, True

    import torch

    torch.set_num_threads(int(_env()["OMP_NUM_THREADS"]))
    base = json.loads(args.config.read_text())
    # Acrobot keeps its outputs where they always were; other envs get a folder each.
    out_root = args.out.resolve() / ("" if spec.env == "Acrobot-v1" else spec.env)
    tables: dict[str, dict[str, Figures]] = {}
    for mix in args.mixes:
        data = make_data(spec, mix, args.transitions, args.data_seed, out_root / mix / "data")
        tables[mix] = ours(spec, base, data, args.seeds, args, out_root / mix)
        if not args.no_d3rlpy:
            tables[mix].update(d3rlpy_contenders(spec, base, data, args.seeds, args.episodes))
    print(
        f"\n{spec.env}: mean return over {args.episodes} episodes per seed, seeds {args.seeds}, "
        f"~{args.transitions} logged steps per mix (config {args.config.name})"
    )
    for mix, table in tables.items():
        print(f"\n{mix} ({spec.mixes[mix]})")
        print(f"  {'contender':34s} {'median':>8s} {'worst':>8s}   {'failed':14s} flagged")
        for name, figures in table.items():
            print(figures.row(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
