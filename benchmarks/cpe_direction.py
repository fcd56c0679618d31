"""Does the CPE point the same way as the online check, on every shipped sample config?

For each config under `sample_configs/` (discrete_action, parametric_action, ci) this
script generates the config's sample data, trains it with the shipped settings through
`reagent_lite.train` (every node of a multi-node config as its own process, as the
workflow runs them), reads the exported epoch's CPE of the served (greedy) policy, then
plays the served `model.pt2` and the logging policy that generated the data in the
config's environment with the same episode seeds, and prints one table:

* CPE verdict: the doubly robust estimate normalized by the logged policy's value, ± 2
  bootstrap standard errors: "better" when it is above 1 by more than that (below 1 where
  the logged value is negative, as on Acrobot), "worse" the other way, else "within
  noise". For episodes of one step that is the one-step `doubly_robust`; for episodic
  envs it is `sequential_doubly_robust` (the discounted return from an episode's start:
  the one-step estimates value one immediate reward, ≈ 1.0 by construction on CartPole
  and Acrobot). An estimate outside the values any policy can reach with the eval rewards
  by more than 2 SE (the run warns: `cpe.reachable_range`) is "invalid": it is wrong by
  at least its excess, so no direction is read from it.
* online verdict: the mean discounted return (γ of the config: what the CPE estimates)
  of the served model vs the logger over the same episode seeds, ± 2 standard errors of
  the paired difference. The undiscounted mean returns are printed beside it. The
  synthetic parametric env knows its reward model, so there the "online" values are exact
  (per-step expected reward on 20,000 held-out states, no sampling noise).
* agree: "yes" when both verdicts are the same, "no" when they point in opposite
  directions (exit status 1), "CPE undecided" when the CPE is within noise but online is
  not (and the reverse "online undecided"), "CPE flagged invalid" for an out-of-range
  estimate.

Only paths change in the configs (data, model and rendezvous under `--out`); in-training
CPE runs as shipped, the workflow's own online check is switched off (this script does
it). Workflow output goes to `<out>/<config>/train.log`.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpe_direction.py [--episodes 50]
        [--only cartpole_dqn ...]

The eight configs take about 5 minutes on two shared CPU cores, so there is no shortened
mode: the figures come from the shipped settings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GROUPS = ("discrete_action", "parametric_action", "ci")
ROLLOUT_SEED = 10_000
TRAIN_TIMEOUT_S = 1800
# The node processes call the library as a user's program would.
NODE_CODE = "import sys, reagent_lite; reagent_lite.train(sys.argv[1], node_index=int(sys.argv[2]))"


@dataclass
class Row:
    config: str
    estimator: str = ""
    cpe: str = ""
    cpe_verdict: str = ""
    online: str = ""
    online_verdict: str = ""
    agree: str = ""
    note: str = ""
    seconds: float = 0.0


def cpe_verdict(logged: float, norm: float, se: float, outside: bool) -> str:
    """The CPE's verdict on served vs logger; `normalized` = value / logged, so with a
    negative logged value (Acrobot) a ratio above 1 is worse."""
    if outside:
        return "invalid (outside the reachable range)"
    return verdict((norm - 1.0) * math.copysign(1.0, logged), se)


def verdict(diff: float, se: float) -> str:
    """better / worse / within noise for a difference with its standard error (2 SE)."""
    if not math.isfinite(diff):
        return "n/a"
    se = se if math.isfinite(se) else 0.0
    if diff - 2 * se > 0:
        return "better"
    if diff + 2 * se < 0:
        return "worse"
    return "within noise"


def agreement(cpe: str, online: str) -> str:
    if cpe == online:
        return "yes"
    if cpe == "within noise":
        return "CPE undecided"
    if cpe.startswith("invalid"):
        return "CPE flagged invalid"
    if online == "within noise":
        return "online undecided"
    return "no"


# ------------------------------------------------------------------------- training
def prepared_config(path: Path, out: Path) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(path.read_text())
    cfg.pop("$schema", None)
    cfg["training_data_path"] = str(out / "data" / "train.parquet")
    cfg["eval_data_path"] = str(out / "data" / "eval.parquet")
    cfg["model_output_path"] = str(out / "model")
    # Reruns of the benchmark train into the same directory: replacing its model is meant.
    cfg["overwrite"] = True
    if int(cfg.get("num_nodes", 1)) > 1:
        cfg["init_method"] = (out / "rendezvous").absolute().as_uri()
    cfg.setdefault("evaluation", {})["online_episodes"] = 0
    return cfg


def train_nodes(cfg: dict[str, Any], out: Path) -> None:
    """Every node of the config as its own process (node 0 makes the data and the model)."""
    cfg_path = out / "config.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    with open(out / "train.log", "w") as log:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", NODE_CODE, str(cfg_path), str(node)],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for node in range(int(cfg.get("num_nodes", 1)))
        ]
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        try:
            codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    if any(codes):
        tail = (out / "train.log").read_text()[-3000:]
        raise RuntimeError(f"training exited {codes}; see {out / 'train.log'}:\n{tail}")


# ------------------------------------------------------------------------------- CPE
def cpe_of(model_dir: Path, one_step: bool) -> tuple[str, float, float, float, float, bool]:
    """(estimator, raw, logged value, normalized, normalized SE, outside the reachable
    range) of the exported epoch."""
    from reagent_lite.api import RunResult

    cpe = RunResult.read(model_dir).final_metrics["cpe"]
    assert cpe["policy"]["name"] == "greedy", cpe["policy"]
    name = "doubly_robust" if one_step else "sequential_doubly_robust"
    est = cpe[name]
    nan = float("nan")
    raw, norm = est.get("raw"), est.get("normalized")
    se = est.get("normalized_std_error")
    raw_f = nan if raw is None else float(raw)
    norm_f = nan if norm is None else float(norm)
    logged = raw_f / norm_f if norm_f else nan
    outside = name in (cpe.get("reachable_range") or {}).get("outside", [])
    return name, raw_f, logged, norm_f, nan if se is None else float(se), outside


# ---------------------------------------------------------------------------- online
def discounted(rewards: np.ndarray, gamma: float) -> float:
    return float(np.sum(rewards * gamma ** np.arange(len(rewards))))


def play_model(model_dir: Path, env_id: str, episodes: int, gamma: float) -> np.ndarray:
    """[episodes, 2] (return, discounted return) of the served model, greedy."""
    import gymnasium as gym
    import torch

    from reagent_lite.kinds import get_kind
    from reagent_lite.safe_load import load_program

    meta = json.loads((model_dir / "model_meta.json").read_text())
    kind = get_kind(meta["workflow"])
    space = kind.space_type.from_json(meta)
    program = load_program(model_dir / "model.pt2", "cpe_direction").module()
    env = gym.make(env_id)
    act = kind.greedy_actor(program, space, int(env.action_space.n))
    cols = np.asarray([int(f) for f in space.state_ids])
    out = np.zeros((episodes, 2))
    for ep in range(episodes):
        obs, _ = env.reset(seed=ROLLOUT_SEED + ep)
        rewards, done = [], False
        while not done:
            state = torch.from_numpy(np.asarray(obs, dtype=np.float32)[cols]).unsqueeze(0)
            with torch.no_grad():
                obs, r, term, trunc, _ = env.step(act(state, torch.ones_like(state))[0])
            rewards.append(float(r))
            done = bool(term or trunc)
        out[ep] = sum(rewards), discounted(np.asarray(rewards), gamma)
    env.close()
    return out


def play_logger(sample: dict[str, Any], episodes: int, gamma: float) -> np.ndarray:
    """[episodes, 2] of the logging policy of `sample_data`, same episode seeds: the
    generator itself plays it (episode e is reset with seed ROLLOUT_SEED + e)."""
    from reagent_lite.samples.gym_logging import log_gym_episodes

    logged = log_gym_episodes(
        sample.get("env", "CartPole-v1"),
        episodes,
        policy=sample.get("policy", "random"),
        epsilon=float(sample.get("epsilon", 0.1)),
        seed=ROLLOUT_SEED,
        random_episode_fraction=float(sample.get("random_episode_fraction", 0.0)),
    )
    steps = logged.steps
    ep = np.asarray(steps.column("mdp_id").to_pylist(), dtype=np.int64)
    seq = steps.column("sequence_number").to_numpy()
    rew = steps.column("reward").to_numpy()
    disc = np.bincount(ep, weights=rew * gamma**seq, minlength=episodes)
    return np.stack([logged.returns, disc], axis=1)


def gym_online(cfg: dict[str, Any], episodes: int) -> tuple[str, str]:
    # γ as the run resolved it (its config.json holds every default).
    resolved = json.loads((Path(cfg["model_output_path"]) / "config.json").read_text())
    gamma = float(resolved["rl"]["gamma"])
    sample = cfg["sample_data"]
    env_id = sample.get("env", "CartPole-v1")
    served = play_model(Path(cfg["model_output_path"]), env_id, episodes, gamma)
    logger = play_logger(sample, episodes, gamma)
    diff = served[:, 1] - logger[:, 1]
    se = float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    text = (
        f"return {served[:, 0].mean():.1f} vs {logger[:, 0].mean():.1f}; "
        f"discounted {served[:, 1].mean():.2f} vs {logger[:, 1].mean():.2f} "
        f"(diff {diff.mean():+.2f} ± {se:.2f})"
    )
    return text, verdict(float(diff.mean()), se)


def bandit_online(cfg: dict[str, Any]) -> tuple[str, str]:
    """Exact per-step values of the served greedy policy and the logger (held-out states)."""
    import torch

    from reagent_lite.safe_load import load_program
    from reagent_lite.samples.parametric_env import Contexts, ParametricBanditEnv

    model_dir = Path(cfg["model_output_path"])
    env = ParametricBanditEnv.from_json(Path(cfg["training_data_path"]).parent / "values.json")
    meta = json.loads((model_dir / "model_meta.json").read_text())
    program = load_program(model_dir / "model.pt2", "cpe_direction").module()

    def greedy(ctx: Contexts) -> np.ndarray:
        inputs = ctx.model_inputs(meta["state_feature_ids"], meta["action_feature_ids"])
        with torch.no_grad():
            q = program(*[torch.from_numpy(x) for x in inputs]).double().numpy()
        return np.where(ctx.mask, q, -np.inf).argmax(axis=1)

    held_out = env.sample_contexts(20_000, seed=1_000_003)
    served = env.true_policy_value(greedy, held_out)
    logger = env.logging_value(held_out)
    text = f"exact per-step value {served:.4f} vs {logger:.4f} (ratio {served / logger:.3f})"
    return text, verdict(served - logger, 0.0)


# ------------------------------------------------------------------------------ main
def run_config(path: Path, out_root: Path, episodes: int) -> Row:
    name = f"{path.parent.name}/{path.stem}"
    row = Row(config=name)
    raw = json.loads(path.read_text())
    if raw.get("sample_data") is None:
        row.note = (
            "no sample_data block: its data (Horizon's logged CartPole timeline) is not "
            "shipped and its logging policy is unknown, so there is no environment to "
            "replay the logger in: no online check possible"
        )
        return row
    start = time.perf_counter()
    out = out_root / path.parent.name / path.stem
    out.mkdir(parents=True, exist_ok=True)
    cfg = prepared_config(path, out)
    train_nodes(cfg, out)
    sample = cfg["sample_data"]
    bandit = sample.get("kind", "gym") == "synthetic_parametric"
    one_step = bandit and int(sample.get("episode_length", 1)) == 1
    est, raw_v, logged, norm, se, outside = cpe_of(Path(cfg["model_output_path"]), one_step)
    row.estimator = est
    row.cpe = f"{raw_v:.3f} vs logged {logged:.3f}: {norm:.3f} ± {se:.3f}"
    row.cpe_verdict = cpe_verdict(logged, norm, se, outside)
    row.online, row.online_verdict = bandit_online(cfg) if bandit else gym_online(cfg, episodes)
    row.agree = agreement(row.cpe_verdict, row.online_verdict)
    if int(cfg.get("num_nodes", 1)) > 1:
        row.note = f"{cfg['num_nodes']} nodes, one process each"
    row.seconds = time.perf_counter() - start
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=50, help="online episodes per policy")
    parser.add_argument("--only", nargs="+", help="config stems to run (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs/bench/cpe_direction")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    paths = sorted(p for g in GROUPS for p in (ROOT / "sample_configs" / g).glob("*.json"))
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
    rows = []
    for path in paths:
        row = run_config(path, args.out.resolve(), args.episodes)
        rows.append(row)
        print(f"{row.config}: {row.cpe_verdict or '-'} / {row.online_verdict or '-'} "
              f"({row.seconds:.0f} s) {row.cpe} | {row.online} {row.note}", flush=True)  # fmt: skip
    out_json = args.out.resolve() / "results.json"
    out_json.write_text(json.dumps([vars(r) for r in rows], indent=1))
    print(
        "\n| config | CPE estimate (served vs logged: normalized ± SE) | CPE verdict "
        "| online (served vs logger) | online verdict | agree |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        if not r.estimator:
            print(f"| {r.config} | — | — | — | — | {r.note} |")
            continue
        note = f" ({r.note})" if r.note else ""
        print(
            f"| {r.config}{note} | {r.estimator} {r.cpe} | {r.cpe_verdict} | {r.online} "
            f"| {r.online_verdict} | {r.agree} |"
        )
    # The bar: no config where the two point in opposite directions.
    return 1 if any(r.agree == "no" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
