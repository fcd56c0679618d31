"""The closed-loop benchmark's environments: HTTP clients of the server, and greedy evaluation.

Each environment plays episodes as a client of `reagent-lite serve`: every step is one
`POST /v1/act` (the state's feature ids as strings, the possible actions) and, once the
environment has answered the returned action, one `POST /v1/feedback` with the reward.
Episode e of round r is `mdp_id` "r<r>-e<e>", its steps `sequence_number` 0, 1, ...
Episodes run on `concurrency` threads, each with its own keep-alive connection, so
concurrent requests reach the server as they would from many users (and it may batch them).

The served greedy policy is measured in process, on the very `model.pt2` the server was
given (the driver checks its SHA-256 against the server's `model_id`): HTTP adds nothing to
what the greedy policy is worth, and the exploring traffic already goes through the server.

* CartPole-v1 (`sample_configs/discrete_action/cartpole_dqn.json`): the online value is
  the mean undiscounted return; the value CPE estimates (`sequential_doubly_robust`) is the
  discounted return from an episode's start with the run's γ, so that one is compared.
* The synthetic parametric environment (`reagent_lite/samples/parametric_env.py`,
  `sample_configs/parametric_action/synthetic_parametric_dqn.json`; one-step episodes,
  4–16 candidates): it knows its reward model, so the greedy policy's value is exact (the
  expected reward per step on 20,000 held-out states); CPE's `doubly_robust` estimates it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.closed_loop_http import Client

EVAL_SEED = 10_000  # greedy evaluation episodes: the same seeds every round (paired)
PLAY_SEED = 1_000  # exploring episodes of round r: seeds PLAY_SEED + r * 100_000 + e
HELD_OUT_STATES = 20_000


@dataclass(frozen=True)
class Played:
    """What the clients saw in one round of served episodes."""

    returns: np.ndarray  # per episode: undiscounted return (parametric: expected reward μ)
    decisions: int  # /v1/act answered
    model_ids: frozenset[str]  # the models that made them

    def mean_se(self) -> tuple[float, float]:
        return mean_se(self.returns)


@dataclass(frozen=True)
class Measured:
    """The greedy policy's value: `online` (what users see: return, or reward per step) and
    `target` ± `target_se`, the same value on the scale CPE estimates (discounted)."""

    online: float
    online_se: float
    target: float
    target_se: float


def mean_se(values: np.ndarray) -> tuple[float, float]:
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    se = float(np.std(values, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return float(np.mean(values)), se


def _run_threads(
    port: int, items: int, concurrency: int, work: Callable[[Client, int], tuple[float, set[str]]]
) -> tuple[np.ndarray, frozenset[str]]:
    """`work(client, i)` for i in range(items) on `concurrency` threads (item i on thread
    i % concurrency, each with its own connection); per-item values and model ids seen."""
    values = np.zeros(items)
    seen: set[str] = set()

    def lane(lane_id: int) -> None:
        client = Client(port)
        try:
            for i in range(lane_id, items, concurrency):
                values[i], ids = work(client, i)
                seen.update(ids)
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lane, range(concurrency)))  # re-raises the first client error
    return values, frozenset(seen)


class CartPoleLoop:
    name = "cartpole"
    workflow = "dqn"
    config = Path("sample_configs/discrete_action/cartpole_dqn.json")
    estimator = "sequential_doubly_robust"
    online_unit = "return"
    env_id = "CartPole-v1"
    actions = ("0", "1")

    def setup(self, initial_data_dir: Path) -> None:
        """Nothing to read back: the environment is gymnasium's."""

    def saturated(self) -> float:
        """The issue's bar on the greedy return (500 is the most an episode gives)."""
        return 450.0

    def play(self, port: int, round_idx: int, episodes: int, concurrency: int) -> Played:
        import gymnasium as gym

        answered = [0] * episodes

        def episode(client: Client, e: int) -> tuple[float, set[str]]:
            env = gym.make(self.env_id)
            obs, _ = env.reset(seed=PLAY_SEED + round_idx * 100_000 + e)
            total, seq, done, ids = 0.0, 0, False, set()
            while not done:
                state = {str(i): float(v) for i, v in enumerate(obs)}
                answer = client.act(state, self.actions, f"r{round_idx}-e{e}", seq)
                ids.add(str(answer["model_id"]))
                obs, reward, term, trunc, _ = env.step(int(str(answer["action"])))
                client.feedback(str(answer["decision_id"]), float(reward))
                answered[e] += 1
                total += float(reward)
                seq += 1
                done = bool(term or trunc)
            env.close()
            return total, ids

        returns, ids = _run_threads(port, episodes, concurrency, episode)
        return Played(returns, sum(answered), ids)

    def greedy_value(self, model_dir: Path, gamma: float, episodes: int) -> Measured:
        """The greedy policy of `model_dir/model.pt2`, `episodes` episodes in process."""
        import gymnasium as gym
        import torch

        from reagent_lite.kinds import get_kind
        from reagent_lite.safe_load import load_program

        meta = json.loads((model_dir / "model_meta.json").read_text())
        kind = get_kind(meta["workflow"])
        space = kind.space_type.from_json(meta)
        program = load_program(model_dir / "model.pt2", "closed_loop").module()
        env = gym.make(self.env_id)
        act = kind.greedy_actor(program, space, len(self.actions))
        cols = np.asarray([int(f) for f in space.state_ids])
        returns, discounted = np.zeros(episodes), np.zeros(episodes)
        for ep in range(episodes):
            obs, _ = env.reset(seed=EVAL_SEED + ep)
            t, done = 0, False
            while not done:
                state = torch.from_numpy(np.asarray(obs, dtype=np.float32)[cols]).unsqueeze(0)
                with torch.no_grad():
                    obs, reward, term, trunc, _ = env.step(act(state, torch.ones_like(state))[0])
                returns[ep] += float(reward)
                discounted[ep] += float(reward) * gamma**t
                t += 1
                done = bool(term or trunc)
        env.close()
        return Measured(*mean_se(returns), *mean_se(discounted))


class ParametricLoop:
    name = "parametric"
    workflow = "parametric_dqn"
    config = Path("sample_configs/parametric_action/synthetic_parametric_dqn.json")
    estimator = "doubly_robust"
    online_unit = "reward/step"

    def __init__(self) -> None:
        from reagent_lite.samples.parametric_env import ParametricBanditEnv

        self.env: ParametricBanditEnv | None = None

    def setup(self, initial_data_dir: Path) -> None:
        """The environment the initial sample was drawn from (same hidden reward model)."""
        from reagent_lite.samples.parametric_env import ParametricBanditEnv

        self.env = ParametricBanditEnv.from_json(initial_data_dir / "values.json")

    def saturated(self) -> float:
        """95% of the optimal policy's value on the held-out states (exact; the bar of
        `parametric_quality.py`): a policy there has learnt what there is to learn."""
        from reagent_lite.samples.parametric_env import HELD_OUT_SEED_OFFSET

        assert self.env is not None, "setup() first"
        held_out = self.env.sample_contexts(HELD_OUT_STATES, seed=HELD_OUT_SEED_OFFSET)
        return 0.95 * self.env.optimal_value(held_out)

    def play(self, port: int, round_idx: int, episodes: int, concurrency: int) -> Played:
        env = self.env
        assert env is not None, "setup() first"
        ctx = env.sample_contexts(episodes, seed=PLAY_SEED + round_idx)
        mu = env.expected_reward(ctx)
        noise = env.reward_noise * np.random.default_rng([PLAY_SEED, round_idx]).standard_normal(
            episodes
        )

        def decision(client: Client, i: int) -> tuple[float, set[str]]:
            state = {
                fid: float(v) for fid, v in zip(ctx.state_feature_ids, ctx.states[i], strict=True)
            }
            candidates = [
                {
                    fid: float(v)
                    for fid, v in zip(ctx.action_feature_ids, ctx.candidates[i, k], strict=True)
                }
                for k in np.flatnonzero(ctx.mask[i])
            ]
            answer = client.act(state, candidates, f"r{round_idx}-e{i}", 0)
            chosen = int(str(answer["action"]))
            client.feedback(str(answer["decision_id"]), float(mu[i, chosen] + noise[i]))
            return float(mu[i, chosen]), {str(answer["model_id"])}

        values, ids = _run_threads(port, episodes, concurrency, decision)
        return Played(values, episodes, ids)

    def greedy_value(self, model_dir: Path, gamma: float, episodes: int) -> Measured:
        """Exact: the greedy policy's expected reward per step on held-out states."""
        import torch

        from reagent_lite.safe_load import load_program
        from reagent_lite.samples.parametric_env import HELD_OUT_SEED_OFFSET, Contexts

        env = self.env
        assert env is not None, "setup() first"
        meta = json.loads((model_dir / "model_meta.json").read_text())
        program = load_program(model_dir / "model.pt2", "closed_loop").module()

        def greedy(ctx: Contexts) -> np.ndarray:
            inputs = ctx.model_inputs(meta["state_feature_ids"], meta["action_feature_ids"])
            with torch.no_grad():
                q = program(*[torch.from_numpy(x) for x in inputs]).double().numpy()
            return np.where(ctx.mask, q, -np.inf).argmax(axis=1)

        held_out = env.sample_contexts(HELD_OUT_STATES, seed=HELD_OUT_SEED_OFFSET)
        value = env.true_policy_value(greedy, held_out)
        return Measured(value, 0.0, value, 0.0)


LoopEnv = CartPoleLoop | ParametricLoop
ENVS: dict[str, Callable[[], LoopEnv]] = {
    "cartpole": CartPoleLoop,
    "parametric": ParametricLoop,
}
