"""CartPole quality bar: the shipped sample config, trained at several seeds, rolled out online.

Trains `sample_configs/discrete_action/cartpole_dqn.json` (or, with `--workflow
parametric_dqn`, `sample_configs/parametric_action/cartpole_parametric_dqn.json`) once per
seed through the real workflow command (a fresh process each, as a user runs it), rolls
each exported `model.pt2` out for `--episodes` greedy episodes of CartPole-v1 and prints
each mean return, the wall time of each run and the median over seeds (the bar: ≥ 400).

Every seed trains on the same logged data (the config's `sample_data` block makes it on
the first run); only the top-level `seed` (initialisation, sampling, dropout) changes.
The config's own online check is switched off here because this script does the rollout
itself, with the same episode seeds for every model.

When d3rlpy is installed (`pip install -e ".[bench]"`), its DoubleDQN and DiscreteCQL
(α = the config's `training.cql_alpha`, or 1) are trained on the same training table with
the same network, batch size, learning rate, γ, Huber loss, standardised observations
and number of updates, and rolled out the same way. The config's soft target update
rate τ becomes d3rlpy's hard `target_update_interval` = round(1/τ) steps.

    .venv/bin/python benchmarks/cartpole_quality.py [--workflow dqn|parametric_dqn]
        [--seeds 0 1 2] [--episodes 100] [--no-d3rlpy]

Subprocesses get `OMP_NUM_THREADS=1` unless it is set: these networks are small, and on a
busy 2-core machine extra intra-op threads only add contention.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "dqn": ROOT / "sample_configs/discrete_action/cartpole_dqn.json",
    "parametric_dqn": ROOT / "sample_configs/parametric_action/cartpole_parametric_dqn.json",
}
ROLLOUT_SEED = 10_000


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _seed_config(base: dict[str, Any], seed: int, out_root: Path) -> dict[str, Any]:
    cfg = json.loads(json.dumps(base))
    cfg.pop("$schema", None)
    cfg["seed"] = seed
    cfg["model_output_path"] = str(out_root / f"seed{seed}")
    # Reruns of the benchmark train into the same directory: replacing its model is meant.
    cfg["overwrite"] = True
    for key in ("training_data_path", "eval_data_path"):
        if cfg.get(key):
            cfg[key] = str((ROOT / cfg[key]).resolve())
    cfg.setdefault("evaluation", {})["online_episodes"] = 0
    return cfg


def train_seed(workflow: str, cfg: dict[str, Any], cfg_path: Path) -> float:
    """Runs the workflow command on `cfg`; returns its wall time in seconds."""
    cfg_path.write_text(json.dumps(cfg, indent=2))
    cmd = [sys.executable, "-m", f"workflows.{workflow}_workflow", "--config", str(cfg_path)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    return elapsed


def rollout_model(workflow: str, out_dir: Path, episodes: int) -> float:
    from reagent_lite.evaluation.online import rollout_exported_model
    from reagent_lite.kinds import get_kind

    meta = json.loads((out_dir / "model_meta.json").read_text())
    result = rollout_exported_model(
        out_dir / "model.pt2",
        env_id="CartPole-v1",
        episodes=episodes,
        seed=ROLLOUT_SEED,
        kind=get_kind(workflow),
        space=get_kind(meta["workflow"]).space_type.from_json(meta),
    )
    return float(result["mean_return"])


# ------------------------------------------------------------------------------ d3rlpy
def load_episodes(
    path: Path, workflow: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The training table as d3rlpy arrays: observations, action indices, rewards, terminals."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from reagent_lite.data.scatter import feature_matrix

    table = pq.read_table(path)
    table = table.sort_by([("mdp_id", "ascending"), ("sequence_number", "ascending")])
    obs = np.nan_to_num(feature_matrix(table.column("state_features"), ["0", "1", "2", "3"]))
    if workflow == "dqn":
        actions = np.asarray(table.column("action").to_pylist(), dtype=np.int64)
    else:
        onehot = np.nan_to_num(feature_matrix(table.column("action"), ["100", "101"]))
        actions = onehot.argmax(axis=1).astype(np.int64)
    rewards = table.column("reward").to_numpy().astype(np.float32)
    terminals = pc.list_value_length(table.column("possible_next_actions")).to_numpy() == 0
    return obs.astype(np.float32), actions, rewards, terminals.astype(np.float32)


def d3rlpy_figures(
    workflow: str, cfg: dict[str, Any], seeds: list[int], episodes: int
) -> dict[str, list[float]]:
    import d3rlpy
    import gymnasium as gym

    from benchmarks.d3rlpy_match import fit_and_score, matched_settings, quiet

    quiet()
    arrays = load_episodes(Path(cfg["training_data_path"]), workflow)
    common, steps = matched_settings(cfg, len(arrays[0]))
    alpha = float(cfg["training"].get("cql_alpha") or 1.0)
    algos = {
        "d3rlpy DoubleDQN": lambda: d3rlpy.algos.DoubleDQNConfig(**common),
        f"d3rlpy DiscreteCQL(alpha={alpha:g})": lambda: d3rlpy.algos.DiscreteCQLConfig(
            alpha=alpha, **common
        ),
    }

    def score(algo: Any) -> float:
        env = gym.make("CartPole-v1")
        returns = []
        for ep in range(episodes):
            o, _ = env.reset(seed=ROLLOUT_SEED + ep)
            total, done = 0.0, False
            while not done:
                a = int(algo.predict(np.asarray(o, dtype=np.float32)[None])[0])
                o, r, term, trunc, _ = env.step(a)
                total += float(r)
                done = bool(term or trunc)
            returns.append(total)
        env.close()
        return float(np.mean(returns))

    return fit_and_score(arrays, 2, algos, steps, seeds, score)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflow", choices=sorted(CONFIGS), default="dqn")
    parser.add_argument("--config", type=Path, help="default: the shipped CartPole config")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs/bench/cartpole_quality")
    parser.add_argument("--no-d3rlpy", action="store_true", help="skip the d3rlpy baselines")
    parser.add_argument(
        "--only-d3rlpy", action="store_true", help="skip reagent-lite (data must exist)"
    )
    args = parser.parse_args(argv)

    # The d3rlpy baselines train in this process: same thread count as the workflow runs.
    import torch

    torch.set_num_threads(int(_env()["OMP_NUM_THREADS"]))
    config = args.config or CONFIGS[args.workflow]
    base = json.loads(config.read_text())
    out_root = (args.out / args.workflow).resolve()
    out_root.mkdir(parents=True, exist_ok=True)
    print(f"config: {config.relative_to(ROOT) if config.is_relative_to(ROOT) else config}")
    results: list[float] = []
    for seed in [] if args.only_d3rlpy else args.seeds:
        cfg = _seed_config(base, seed, out_root)
        elapsed = train_seed(args.workflow, cfg, out_root / f"config_seed{seed}.json")
        mean = rollout_model(args.workflow, Path(cfg["model_output_path"]), args.episodes)
        results.append(mean)
        print(
            f"  reagent-lite {args.workflow} seed {seed}: mean return {mean:.1f} over "
            f"{args.episodes} episodes (workflow run {elapsed:.0f} s)",
            flush=True,
        )
    median = statistics.median(results) if results else float("nan")
    if results:
        print(f"reagent-lite {args.workflow}: median {median:.1f} (bar: >= 400)", flush=True)

    if not args.no_d3rlpy:
        try:
            import d3rlpy  # noqa: F401
        except ImportError:
            print("d3rlpy not installed: no baselines (pip install -e '.[bench]')")
        else:
            cfg = _seed_config(base, args.seeds[0], out_root)
            for name, means in d3rlpy_figures(
                args.workflow, cfg, args.seeds, args.episodes
            ).items():
                print(f"{name}: median {statistics.median(means):.1f}", flush=True)
    return 0 if args.only_d3rlpy or median >= 400 else 1


if __name__ == "__main__":
    sys.exit(main())
