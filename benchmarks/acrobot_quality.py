"""Acrobot-v1: the shipped sample config beside d3rlpy's DoubleDQN, DiscreteCQL and
DiscreteBCQ, on the same logged data and the same number of updates, rolled out online.

Trains `sample_configs/discrete_action/acrobot_dqn.json` (logs of a mix of behaviours:
half the episodes uniformly random, half ε-greedy over an energy-pumping heuristic) once
per seed through the real workflow command, and the same config with discrete BCQ in
place of CQL (`rainbow.bcq_drop_threshold`, d3rlpy's `action_flexibility` default 0.3);
then d3rlpy 2.8.1's DoubleDQN, DiscreteCQL (α = the config's `training.cql_alpha`) and
DiscreteBCQ (action_flexibility 0.3) on the same training table with the same network,
batch size, learning rate, γ, standardised observations and number of updates (the
workflow's steps per epoch × epochs). Every model plays `--episodes` greedy episodes with
the same episode seeds; the script prints each mean return and the median over seeds side
by side (returns are −steps to swing up; −500 is a time-out; higher is better).

The config's soft target update rate τ becomes d3rlpy's hard `target_update_interval` =
round(1/τ) steps. The workflow's in-training CPE and online check are switched off here
(they do not change what is trained; the rollout is done by this script).

    .venv/bin/python benchmarks/acrobot_quality.py [--seeds 0 1 2] [--episodes 30]
        [--no-d3rlpy] [--only-d3rlpy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cartpole_quality import _env, _seed_config, train_seed

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "sample_configs/discrete_action/acrobot_dqn.json"
ENV = "Acrobot-v1"
ROLLOUT_SEED = 10_000
BCQ_THRESHOLD = 0.3  # d3rlpy DiscreteBCQ's action_flexibility default


def variants(base: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Our contenders: the shipped config, and the same with BCQ instead of CQL."""
    bcq = json.loads(json.dumps(base))
    bcq.setdefault("rainbow", {})["bcq_drop_threshold"] = BCQ_THRESHOLD
    bcq["training"]["cql_alpha"] = 0.0
    # Without CQL there is no penalty to weight (a weighting needs cql_alpha > 0).
    bcq["training"].pop("cql_weighting", None)
    alpha = base["training"].get("cql_alpha", 0.0)
    weighting = base["training"].get("cql_weighting", "constant")
    how = "" if weighting == "constant" else f", {weighting}"
    return {
        f"reagent-lite dqn (CQL alpha={alpha:g}{how})": base,
        f"reagent-lite dqn (BCQ {BCQ_THRESHOLD:g})": bcq,
    }


def d3rlpy_algos(cfg: dict[str, Any], common: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """d3rlpy's DoubleDQN, DiscreteCQL (alpha = the config's `training.cql_alpha`) and
    DiscreteBCQ (action_flexibility BCQ_THRESHOLD), each made from the matched settings."""
    import d3rlpy

    alpha = float(cfg["training"].get("cql_alpha") or 1.0)
    algos: dict[str, Callable[[], Any]] = {
        "d3rlpy DoubleDQN": lambda: d3rlpy.algos.DoubleDQNConfig(**common),
        f"d3rlpy DiscreteCQL(alpha={alpha:g})": lambda: d3rlpy.algos.DiscreteCQLConfig(
            alpha=alpha, **common
        ),
        f"d3rlpy DiscreteBCQ({BCQ_THRESHOLD:g})": lambda: d3rlpy.algos.DiscreteBCQConfig(
            action_flexibility=BCQ_THRESHOLD, **common
        ),
    }
    return algos


def rollout_model(out_dir: Path, episodes: int) -> float:
    from reagent_lite.evaluation.online import rollout_exported_model
    from reagent_lite.kinds import get_kind

    meta = json.loads((out_dir / "model_meta.json").read_text())
    result = rollout_exported_model(
        out_dir / "model.pt2",
        env_id=ENV,
        episodes=episodes,
        seed=ROLLOUT_SEED,
        kind=get_kind("dqn"),
        space=get_kind(meta["workflow"]).space_type.from_json(meta),
    )
    return float(result["mean_return"])


def play(act: Callable[[np.ndarray], int], episodes: int, env_id: str = ENV) -> list[float]:
    """Returns of `episodes` greedy episodes, episode e reset with ROLLOUT_SEED + e."""
    import gymnasium as gym

    env = gym.make(env_id)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=ROLLOUT_SEED + ep)
        total, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(act(np.asarray(obs, dtype=np.float32)))
            total += float(r)
            done = bool(term or trunc)
        returns.append(total)
    env.close()
    return returns


def rollout_policy(act: Callable[[np.ndarray], int], episodes: int) -> float:
    return float(np.mean(play(act, episodes)))


def greedy_of(algo: Any) -> Callable[[np.ndarray], int]:
    """A trained d3rlpy algorithm's greedy action for one observation."""
    return lambda obs: int(algo.predict(obs[None])[0])


def load_table(
    path: Path, n_features: int = 6
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The training table as d3rlpy arrays: observations, actions, rewards, terminals."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from reagent_lite.data.scatter import feature_matrix

    table = pq.read_table(path)
    table = table.sort_by([("mdp_id", "ascending"), ("sequence_number", "ascending")])
    obs = np.nan_to_num(
        feature_matrix(table.column("state_features"), [str(i) for i in range(n_features)])
    )
    actions = np.asarray(table.column("action").to_pylist(), dtype=np.int64)
    rewards = table.column("reward").to_numpy().astype(np.float32)
    terminals = pc.list_value_length(table.column("possible_next_actions")).to_numpy() == 0
    return obs.astype(np.float32), actions, rewards, terminals.astype(np.float32)


def d3rlpy_figures(cfg: dict[str, Any], seeds: list[int], episodes: int) -> dict[str, list[float]]:
    from benchmarks.d3rlpy_match import fit_and_score, matched_settings, quiet

    quiet()
    arrays = load_table(Path(cfg["training_data_path"]))
    common, steps = matched_settings(cfg, len(arrays[0]))
    algos = d3rlpy_algos(cfg, common)
    return fit_and_score(
        arrays, 3, algos, steps, seeds, lambda algo: rollout_policy(greedy_of(algo), episodes)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs/bench/acrobot_quality")
    parser.add_argument("--no-d3rlpy", action="store_true", help="skip the d3rlpy baselines")
    parser.add_argument("--only-d3rlpy", action="store_true", help="skip ours (data must exist)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(int(_env()["OMP_NUM_THREADS"]))
    base = json.loads(args.config.read_text())
    out_root = args.out.resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    print(f"config: {args.config}", flush=True)
    results: dict[str, list[float]] = {}
    for v, (name, variant) in enumerate(variants(base).items()):
        for seed in [] if args.only_d3rlpy else args.seeds:
            cfg = _seed_config(variant, seed, out_root / f"v{v}")
            cfg.setdefault("evaluation", {})["calc_cpe_in_training"] = False
            elapsed = train_seed("dqn", cfg, out_root / f"config_v{v}_seed{seed}.json")
            mean = rollout_model(Path(cfg["model_output_path"]), args.episodes)
            results.setdefault(name, []).append(mean)
            print(f"  {name} seed {seed}: mean return {mean:.1f} ({elapsed:.0f} s)", flush=True)
    if not args.no_d3rlpy:
        cfg = _seed_config(base, args.seeds[0], out_root)
        results.update(d3rlpy_figures(cfg, args.seeds, args.episodes))
    print(f"\nAcrobot-v1, mean return over {args.episodes} episodes; median over seeds "
          f"{args.seeds}:")  # fmt: skip
    for name, means in results.items():
        seeds = " ".join(f"{m:7.1f}" for m in means)
        print(f"  {name:34s} median {statistics.median(means):7.1f}   seeds {seeds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
