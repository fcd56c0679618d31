"""A synthetic environment with parametric actions whose optimal policy is known exactly.

Each state s (features "0".."Ds-1", standard normal) comes with a varying number of
candidates (`min_candidates`..`max_candidates`); each candidate is a feature vector a under
ids "100".."100+Da-1" (the first Da-1 standard normal, the last binary). A hidden model fixes
the expected reward

    μ(s, a) = σ(sᵀ W a + bᵀ a)

and the logged reward is μ plus Gaussian noise. The best candidate of a state is therefore
argmax_a μ(s, a), and the value of any policy on a set of states is Σ π(a|s) μ(s, a)
averaged over the states — exact, with no Monte Carlo over rewards.

The logging policy is a softmax over a weak scorer (half the true logit, half a fixed random
bilinear score) and records its propensities. Episodes are one step by default (a
contextual bandit); with `episode_length > 1` the state follows an AR(1) process that the
actions do not influence, so the greedy policy stays optimal for every γ and the per-step
values below stay exact (the stationary state distribution is the start distribution).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from reagent_lite.samples.gym_logging import ACTION_FEATURE_BASE, dense_to_map, lists_from_offsets

# Seed offset of the held-out states used when no contexts are given: never the logged ones.
HELD_OUT_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class Contexts:
    """A batch of states with their candidate sets (padded to the largest set)."""

    states: np.ndarray  # [n, Ds] float64
    candidates: np.ndarray  # [n, K, Da] float64, zeros where padded
    mask: np.ndarray  # [n, K] bool, True for real candidates
    state_feature_ids: list[str]
    action_feature_ids: list[str]

    def __len__(self) -> int:
        return int(self.states.shape[0])

    def model_inputs(
        self,
        state_feature_ids: list[str] | None = None,
        action_feature_ids: list[str] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """float32 `(state_values, state_presence, action_values, action_presence,
        candidate_mask)` as the exported parametric model takes them, with the
        features in the given order (default: this env's order; unknown ids are absent)."""
        s_idx = _reorder(self.state_feature_ids, state_feature_ids)
        a_idx = _reorder(self.action_feature_ids, action_feature_ids)
        s_pad = np.concatenate([self.states, np.zeros((len(self), 1))], axis=1)
        a_pad = np.concatenate([self.candidates, np.zeros((*self.mask.shape, 1))], axis=2)
        s_present = (s_idx < self.states.shape[1]).astype(np.float32)
        a_present = (a_idx < self.candidates.shape[2]).astype(np.float32)
        mask = self.mask.astype(np.float32)
        return (
            s_pad[:, s_idx].astype(np.float32),
            np.broadcast_to(s_present, (len(self), len(s_idx))).copy(),
            a_pad[:, :, a_idx].astype(np.float32),
            (mask[:, :, None] * a_present[None, None, :]).astype(np.float32),
            mask,
        )


def _reorder(own: list[str], wanted: list[str] | None) -> np.ndarray:
    """Column index of each wanted id in `own`, len(own) (a zero pad column) when absent."""
    if wanted is None:
        return np.arange(len(own))
    position = {fid: i for i, fid in enumerate(own)}
    return np.array([position.get(fid, len(own)) for fid in wanted], dtype=np.int64)


# A policy maps contexts to either chosen candidate indices [n] (int) or probabilities [n, K].
PolicyFn = Callable[[Contexts], np.ndarray]


@dataclass(frozen=True)
class LoggedBandit:
    """Step logs of the logging policy plus the contexts and choices behind them."""

    steps: pa.Table
    contexts: Contexts  # one row per step, in table order
    chosen: np.ndarray  # [n] index of the logged candidate


@dataclass(frozen=True)
class ParametricBanditEnv:
    """The environment; every field is a plain number so `to_dict()` rebuilds it exactly."""

    state_dim: int = 8
    action_dim: int = 6
    min_candidates: int = 4
    max_candidates: int = 16
    reward_noise: float = 0.1
    logit_scale: float = 2.5
    logging_temperature: float = 1.0
    episode_length: int = 1
    state_persistence: float = 0.8
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_candidates <= self.max_candidates:
            raise ValueError("need 1 <= min_candidates <= max_candidates")
        if self.episode_length < 1 or self.action_dim < 2 or self.state_dim < 1:
            raise ValueError("need episode_length >= 1, action_dim >= 2, state_dim >= 1")

    @cached_property
    def _hidden(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(W, b, W_noise): the hidden reward model and the logging policy's weak scorer,
        fixed by the env seed."""
        rng = np.random.default_rng([self.seed, 7919])
        norm = self.logit_scale / np.sqrt(self.state_dim * self.action_dim)
        w = rng.normal(0.0, norm, (self.state_dim, self.action_dim))
        b = rng.normal(0.0, 0.5, self.action_dim)
        return w, b, rng.normal(0.0, norm, w.shape)

    # --- description -------------------------------------------------------------------
    @property
    def state_feature_ids(self) -> list[str]:
        return [str(i) for i in range(self.state_dim)]

    @property
    def action_feature_ids(self) -> list[str]:
        return [str(ACTION_FEATURE_BASE + j) for j in range(self.action_dim)]

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_json(cls, path: str | Path) -> ParametricBanditEnv:
        """Rebuild the env from the `env` block of a values JSON written by `generate`."""
        return cls(**json.loads(Path(path).read_text())["env"])

    # --- states and candidates ---------------------------------------------------------
    def sample_contexts(self, n: int, seed: int) -> Contexts:
        """`n` states from the stationary distribution, each with fresh candidates."""
        rng = np.random.default_rng([self.seed, seed, 1])
        states = rng.standard_normal((n, self.state_dim))
        return self._with_candidates(states, rng)

    def _with_candidates(self, states: np.ndarray, rng: np.random.Generator) -> Contexts:
        n, k_max = len(states), self.max_candidates
        counts = rng.integers(self.min_candidates, self.max_candidates + 1, size=n)
        mask = np.arange(k_max)[None, :] < counts[:, None]
        cands = rng.standard_normal((n, k_max, self.action_dim))
        cands[:, :, -1] = rng.random((n, k_max)) < 0.5  # one binary feature
        cands[~mask] = 0.0
        return Contexts(states, cands, mask, self.state_feature_ids, self.action_feature_ids)

    # --- the hidden model and the logging policy -----------------------------------------
    def _logits(self, ctx: Contexts, w: np.ndarray) -> np.ndarray:
        bias: np.ndarray = ctx.candidates @ self._hidden[1]
        return np.einsum("nd,de,nke->nk", ctx.states, w, ctx.candidates) + bias

    def expected_reward(self, ctx: Contexts) -> np.ndarray:
        """μ(s, a) for every candidate, [n, K]; 0 on padding."""
        mu = 1.0 / (1.0 + np.exp(-self._logits(ctx, self._hidden[0])))
        return np.where(ctx.mask, mu, 0.0)

    def logging_probs(self, ctx: Contexts) -> np.ndarray:
        """The logging policy's candidate probabilities, [n, K] (0 on padding)."""
        score = 0.5 * self._logits(ctx, self._hidden[0]) + 0.5 * self._logits(ctx, self._hidden[2])
        return _masked_softmax(score / self.logging_temperature, ctx.mask)

    # --- exact values ---------------------------------------------------------------
    def _contexts_or_fresh(self, contexts: Contexts | None, n_states: int, seed: int | None):
        if contexts is not None:
            return contexts
        return self.sample_contexts(n_states, HELD_OUT_SEED_OFFSET if seed is None else seed)

    def true_policy_value(
        self,
        policy_fn: PolicyFn,
        contexts: Contexts | None = None,
        *,
        n_states: int = 20_000,
        seed: int | None = None,
    ) -> float:
        """Exact expected reward per step of `policy_fn` on `contexts` (default: a fresh,
        held-out set of `n_states` states, the same for every call with the same seed)."""
        ctx = self._contexts_or_fresh(contexts, n_states, seed)
        probs = policy_probabilities(policy_fn(ctx), ctx.mask)
        return float((probs * self.expected_reward(ctx)).sum(axis=1).mean())

    def optimal_value(
        self, contexts: Contexts | None = None, *, n_states: int = 20_000, seed: int | None = None
    ) -> float:
        """Value of the best policy (argmax of μ over each state's candidates)."""
        return self.true_policy_value(self.optimal_policy, contexts, n_states=n_states, seed=seed)

    def logging_value(
        self, contexts: Contexts | None = None, *, n_states: int = 20_000, seed: int | None = None
    ) -> float:
        return self.true_policy_value(self.logging_probs, contexts, n_states=n_states, seed=seed)

    def random_value(
        self, contexts: Contexts | None = None, *, n_states: int = 20_000, seed: int | None = None
    ) -> float:
        return self.true_policy_value(
            lambda c: c.mask.astype(np.float64), contexts, n_states=n_states, seed=seed
        )

    def optimal_policy(self, ctx: Contexts) -> np.ndarray:
        return np.where(ctx.mask, self.expected_reward(ctx), -np.inf).argmax(axis=1)

    # --- logging -------------------------------------------------------------------
    def log_episodes(self, episodes: int, seed: int = 0) -> LoggedBandit:
        """Roll the logging policy for `episodes` episodes of `episode_length` steps."""
        rng = np.random.default_rng([self.seed, seed, 2])
        t_len, n = self.episode_length, episodes * self.episode_length
        states = np.empty((episodes, t_len, self.state_dim))
        states[:, 0] = rng.standard_normal((episodes, self.state_dim))
        rho = self.state_persistence
        for t in range(1, t_len):  # action-independent AR(1), stationary N(0, I)
            noise = rng.standard_normal((episodes, self.state_dim))
            states[:, t] = rho * states[:, t - 1] + np.sqrt(1.0 - rho**2) * noise
        ctx = self._with_candidates(states.reshape(n, self.state_dim), rng)

        probs = self.logging_probs(ctx)
        cum = np.cumsum(probs, axis=1)
        chosen = (cum < rng.random(n)[:, None] * cum[:, -1:]).sum(axis=1)
        chosen = np.minimum(chosen, ctx.mask.sum(axis=1) - 1)
        rows = np.arange(n)
        mu = self.expected_reward(ctx)[rows, chosen]
        reward = mu + self.reward_noise * rng.standard_normal(n)

        counts = ctx.mask.sum(axis=1)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        candidate_maps = dense_to_map(ctx.candidates[ctx.mask], self.action_feature_ids)
        table = pa.table(
            {
                "mdp_id": pa.array(np.repeat(np.arange(episodes), t_len).astype(str)),
                "sequence_number": pa.array(np.tile(np.arange(t_len), episodes), pa.int64()),
                "state_features": dense_to_map(ctx.states, self.state_feature_ids),
                "action": dense_to_map(ctx.candidates[rows, chosen], self.action_feature_ids),
                "reward": pa.array(reward, pa.float64()),
                "possible_actions": lists_from_offsets(offsets, candidate_maps),
                "action_probability": pa.array(probs[rows, chosen], pa.float64()),
                "metrics": dense_to_map(mu[:, None], ["expected_reward"]),
            }
        )
        return LoggedBandit(table, ctx, chosen)


def _masked_softmax(score: np.ndarray, mask: np.ndarray) -> np.ndarray:
    score = np.where(mask, score, -np.inf)
    z = np.exp(score - score.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def policy_probabilities(choice: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A policy's output (indices [n] or probabilities [n, K]) as probabilities [n, K]."""
    choice = np.asarray(choice)
    n, k = mask.shape
    if choice.ndim == 1:
        idx = choice.astype(np.int64)
        if idx.shape != (n,) or (idx < 0).any() or (idx >= k).any():
            raise ValueError(f"policy returned indices outside [0, {k}) or of wrong shape")
        if not mask[np.arange(n), idx].all():
            raise ValueError("policy chose a padded (non-existent) candidate")
        probs = np.zeros((n, k))
        probs[np.arange(n), idx] = 1.0
        return probs
    if choice.shape != (n, k):
        raise ValueError(f"policy probabilities must have shape {(n, k)} (got {choice.shape})")
    probs = np.where(mask, np.clip(choice.astype(np.float64), 0.0, None), 0.0)
    total = probs.sum(axis=1, keepdims=True)
    if (total <= 0).any():
        raise ValueError("policy gave zero probability to every candidate of some state")
    return probs / total


def greedy_policy(q_fn: Callable[..., np.ndarray]) -> PolicyFn:
    """Turn a scorer with the exported model's signature into an argmax policy."""

    def policy(ctx: Contexts) -> np.ndarray:
        q = np.asarray(q_fn(*ctx.model_inputs()), dtype=np.float64)
        return np.where(ctx.mask, q, -np.inf).argmax(axis=1)

    return policy
