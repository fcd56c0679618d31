"""`evaluate_cpe`: networks + eval tensors → estimator inputs, checked end to end.

Tiny hand-made networks on a hand-made table (numbers worked out in the comments), then
oracle networks on the synthetic parametric environment, whose exact values are known.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch import Tensor, nn

from reagent_lite.config import ParametricDQNWorkflowConfig
from reagent_lite.data.ingest import ingest_table
from reagent_lite.data.parametric_shard import ParametricShard
from reagent_lite.data.rows import Rows
from reagent_lite.data.timeline import build_training_table
from reagent_lite.evaluation.cpe_models import CpeNets, EvaluatedPolicy
from reagent_lite.evaluation.evaluator import evaluate_cpe
from reagent_lite.kinds import KINDS
from reagent_lite.samples.parametric_env import Contexts, ParametricBanditEnv

DQN, PARAMETRIC = KINDS["dqn"], KINDS["parametric_dqn"]


class Table(nn.Module):
    """A 'network' that returns a fixed [N, K] table, row i for state value i (dqn)."""

    values: Tensor

    def __init__(self, values: list[list[float]]):
        super().__init__()
        self.register_buffer("values", torch.tensor(values, dtype=torch.float32))

    def forward(self, state: Tensor) -> Tensor:
        return self.values[state[:, 0].long()]


class FirstFeature(nn.Module):
    """Parametric 'network': the score of a candidate is its first feature."""

    def forward(self, state: Tensor, actions: Tensor) -> Tensor:
        return actions[..., 0]


def discrete_table() -> Rows:
    """Three one-step episodes, two actions; row i has state [i]."""
    n = 3
    return Rows(
        {
            "state": torch.arange(n, dtype=torch.float32)[:, None],
            "next_state": torch.zeros(n, 1),
            "action": torch.tensor([0, 1, 1]),
            "next_action": torch.full((n,), -1),
            "reward": torch.tensor([1.0, 2.0, 1.5]),
            "possible_actions_mask": torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]),
            "possible_next_actions_mask": torch.zeros(n, 2),
            "terminal": torch.ones(n),
            "time_diff": torch.ones(n),
            "propensity": torch.tensor([0.25, 0.5, 0.4]),
            "mdp_id": torch.arange(n),
            "sequence_number": torch.zeros(n, dtype=torch.long),
        }
    )


def test_greedy_is_the_served_policy_ties_to_the_first() -> None:
    q = torch.tensor([[1.0, 3.0, 3.0], [2.0, 5.0, 1.0], [4.0, 4.0, 4.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    got = EvaluatedPolicy("greedy").probs(q, mask)
    # Row 0: a tie between 1 and 2 goes to 1 (argmax's first maximum, as model.pt2's users
    # pick); row 1: the masked 5.0 is no candidate; row 2: first allowed of a 3-way tie;
    # row 3: no candidate, no action.
    want = [[0, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 0]]
    assert got.tolist() == want
    served = torch.where(mask > 0, q, float("-inf"))[:3].argmax(dim=1)
    assert got[:3].argmax(dim=1).tolist() == served.tolist()


def test_discrete_greedy_hand_computed() -> None:
    # Q rows (possible actions): [2, 1] → 0 ; [3, 3] tie → 0 ; [0, 9 masked] → 0.
    q = [[2.0, 1.0], [3.0, 3.0], [0.0, 9.0]]
    r_hat = [[0.9, 0.1], [1.0, 3.0], [0.5, 7.0]]
    q_hat = [[1.0, 0.0], [2.0, 4.0], [1.0, 9.0]]
    out = evaluate_cpe(
        DQN,
        Table(q),
        CpeNets(Table(r_hat), Table(q_hat)),
        discrete_table(),
        policy=EvaluatedPolicy("greedy"),
        gamma=0.9,
        n_bootstrap=0,
        seed=0,
    )
    # Logged a = 0, 1, 1; mu = .25, .5, .4. Greedy takes 0 everywhere, so the weights are
    # 1/.25 = 4 (row 0 took it), 0, 0: a deterministic policy's weight is 1/mu or 0.
    # DM rows: .9, 1.0, .5 ; DR rows: .9 + 4(1 - .9) = 1.3, 1.0, .5
    # Sequential DR (q̂ not r̂): v̂ = 1, 2, 1 ; 1 + 4(1 - 1) = 1, 2, 1
    expected = {
        "direct_method": (0.9 + 1.0 + 0.5) / 3,
        "ips": 4.0 / 3,
        "snips": 1.0,
        "doubly_robust": (1.3 + 1.0 + 0.5) / 3,
        "sequential_doubly_robust": (1.0 + 2.0 + 1.0) / 3,
    }
    for name, value in expected.items():
        assert out[name]["raw"] == pytest.approx(value), name
    assert out["policy"] == {"name": "greedy", "temperature": None, "served_by_model": True}
    diag = out["diagnostics"]
    assert diag["effective_sample_size_rows"] == pytest.approx(1.0)  # one row carries IPS
    assert diag["effective_sample_size_episodes"] == pytest.approx(1.0)
    assert diag["mean_top_probability"] == 1.0
    assert diag["tied_top_q_fraction"] == pytest.approx(0.5)  # row 1 of the two with 2 actions


def test_discrete_hand_computed() -> None:
    # Q = T · log(wanted probabilities), so that softmax(Q / T) over the possible actions
    # is `wanted`.
    t = 0.5
    wanted = np.array([[0.8, 0.2], [0.5, 0.5], [1.0, 0.0]])
    q = (t * np.log(np.where(wanted > 0, wanted, 1.0))).tolist()  # row 2's slot 1 is masked
    r_hat = [[0.9, 0.1], [1.0, 3.0], [0.5, 7.0]]  # 7.0 sits on a masked slot: never used
    q_hat = [[1.0, 0.0], [2.0, 4.0], [1.0, 9.0]]
    out = evaluate_cpe(
        DQN,
        Table(q),
        CpeNets(Table(r_hat), Table(q_hat)),
        discrete_table(),
        policy=EvaluatedPolicy("softmax", t),
        gamma=0.9,
        n_bootstrap=0,
        seed=0,
    )
    # pi = wanted (row 2 is restricted to action 0). Logged a = 0, 1, 1; mu = .25, .5, .4.
    # w = pi[a] / mu = .8/.25 = 3.2 ; .5/.5 = 1 ; 0/.4 = 0 (action 1 is not possible in row 2)
    # DM rows: .8·.9 + .2·.1 = .74 ; .5·1 + .5·3 = 2 ; 1·.5 = .5
    # DR rows: .74 + 3.2(1 - .9) = 1.06 ; 2 + 1(2 - 3) = 1 ; .5 + 0 = .5
    logged = (1.0 + 2.0 + 1.5) / 3
    expected = {
        "direct_method": (0.74 + 2.0 + 0.5) / 3,
        "ips": (3.2 * 1.0 + 1.0 * 2.0 + 0.0) / 3,
        "snips": (3.2 * 1.0 + 1.0 * 2.0) / (3.2 + 1.0),
        "doubly_robust": (1.06 + 1.0 + 0.5) / 3,
        # One-step episodes: sequential DR = v̂ + w (r - q̂(a)) per row, with q̂ not r̂:
        # v̂ = .8·1 + .2·0 = .8 ; .5·2 + .5·4 = 3 ; 1·1 = 1
        # .8 + 3.2(1 - 1) = .8 ; 3 + 1(2 - 4) = 1 ; 1 + 0 = 1
        "sequential_doubly_robust": (0.8 + 1.0 + 1.0) / 3,
    }
    for name, value in expected.items():
        assert out[name]["raw"] == pytest.approx(value), name
        assert out[name]["normalized"] == pytest.approx(value / logged), name
    assert out["rows"] == {"scored": 3.0, "dropped": 0.0, "logged_action_not_candidate": 0.0}


def parametric_table() -> pa.Table:
    """Two rows; row 1's logged action is not among its candidates."""

    def fmap(values: list[float]) -> list[tuple[str, float]]:
        return [(str(100 + j), v) for j, v in enumerate(values)]

    map_type = pa.map_(pa.string(), pa.float64())
    return pa.table(
        {
            "mdp_id": ["a", "b"],
            "sequence_number": pa.array([0, 0], pa.int64()),
            "state_features": pa.array([[("0", 1.0)], [("0", 2.0)]], map_type),
            "action": pa.array([fmap([0.0, 1.0]), fmap([5.0, 0.0])], map_type),
            "reward": [1.0, 3.0],
            "next_state_features": pa.array([[], []], map_type),
            "next_action": pa.array([[], []], map_type),
            "possible_actions": pa.array(
                [[fmap([0.0, 1.0]), fmap([math.log(3.0), 0.0])], [fmap([0.0, 0.0])]],
                pa.list_(map_type),
            ),
            "possible_next_actions": pa.array([[], []], pa.list_(map_type)),
            "action_probability": [0.5, 0.5],
        }
    )


def raw_shard(table: pa.Table, state_ids: list[str], action_ids: list[str]) -> ParametricShard:
    """A parametric table as the ingest engine reads it (raw values, NaN = absent), in the
    space of those ids and K = its longest candidate list."""
    cfg = ParametricDQNWorkflowConfig(training_data_path="t.parquet", model_output_path="out")
    shard = ingest_table(table, PARAMETRIC.layout(cfg))
    shard.conform(state_ids, action_ids, shard.max_candidates)
    return shard


def _raw(shard: ParametricShard, name: str) -> np.ndarray:
    """A raw column, 0 where a feature is absent."""
    return np.nan_to_num({**shard.features, **shard.fields}[name])


def tensors(raw: ParametricShard) -> Rows:
    """Raw (unnormalized, 0 where absent) parametric transitions as the evaluator's
    Rows."""
    fields = [
        "state",
        "next_state",
        "possible_actions",
        "possible_actions_mask",
        "possible_next_actions",
        "possible_next_actions_mask",
        "action_index",
        "reward",
        "terminal",
        "time_diff",
        "propensity",
        "mdp_id",
        "sequence_number",
    ]
    return Rows({name: torch.from_numpy(_raw(raw, name)) for name in fields})


def test_parametric_logged_action_not_among_candidates() -> None:
    raw = raw_shard(parametric_table(), ["0"], ["100", "101"])
    assert raw.fields["action_index"].tolist() == [0, -1]
    out = evaluate_cpe(
        PARAMETRIC,
        FirstFeature(),  # Q = first feature: row 0 → [0, ln 3] → pi = [.25, .75] at T = 1
        CpeNets(FirstFeature(), FirstFeature()),
        tensors(raw),
        policy=EvaluatedPolicy("softmax", 1.0),
        gamma=1.0,
        n_bootstrap=0,
        seed=0,
    )
    # Row 0: w = .25 / .5 = .5; DM = .75 ln 3; DR = DM + .5 (1 - 0).
    # Row 1: its only candidate scores 0 and pi = [1]; the logged action is not a candidate,
    # so the learned policy never takes it: w = 0, DM = DR = 0. Both rows are kept.
    dm0 = 0.75 * math.log(3.0)
    assert out["direct_method"]["raw"] == pytest.approx(dm0 / 2)
    assert out["ips"]["raw"] == pytest.approx(0.5 * 1.0 / 2)
    assert out["snips"]["raw"] == pytest.approx(1.0)
    assert out["doubly_robust"]["raw"] == pytest.approx((dm0 + 0.5) / 2)
    assert out["sequential_doubly_robust"]["raw"] == pytest.approx((dm0 + 0.5) / 2)
    assert out["direct_method"]["normalized"] == pytest.approx(dm0 / 2 / 2.0)
    assert out["rows"] == {"scored": 2.0, "dropped": 0.0, "logged_action_not_candidate": 1.0}


# ------------------------------------------------------------------ synthetic environment
class EnvScorer(nn.Module):
    """An oracle 'network' on raw features: the env's expected reward μ(s, a), or
    `temperature · log` of the logging policy's probabilities (so that the evaluator's
    softmax at that temperature is the logging policy itself)."""

    def __init__(self, env: ParametricBanditEnv, what: str, temperature: float = 1.0):
        super().__init__()
        self.env, self.what, self.temperature = env, what, temperature

    def forward(self, state: Tensor, actions: Tensor) -> Tensor:
        ctx = Contexts(
            state.double().numpy(),
            actions.double().numpy(),
            np.ones(actions.shape[:2], dtype=bool),
            self.env.state_feature_ids,
            self.env.action_feature_ids,
        )
        if self.what == "reward":
            out = self.env.expected_reward(ctx)
        else:  # log-probabilities over all slots: a per-row shift of the masked ones
            out = self.temperature * np.log(self.env.logging_probs(ctx))
        return torch.from_numpy(out).float()


@pytest.fixture(scope="module")
def bandit() -> tuple[ParametricBanditEnv, Rows, Contexts]:
    env = ParametricBanditEnv(seed=3)
    table, _ = build_training_table(env.log_episodes(4000, seed=5).steps, eval_fraction=0.0)
    raw = raw_shard(table, env.state_feature_ids, env.action_feature_ids)
    contexts = Contexts(
        _raw(raw, "state").astype(np.float64),
        _raw(raw, "possible_actions").astype(np.float64),
        _raw(raw, "possible_actions_mask") > 0,
        env.state_feature_ids,
        env.action_feature_ids,
    )
    return env, tensors(raw), contexts


def _evaluate(env: ParametricBanditEnv, data: Rows, q_net: nn.Module, t: float | None) -> dict:
    """CPE of the softmax at `t`, or of the greedy policy (t None), with an exact r̂."""
    policy = EvaluatedPolicy("greedy") if t is None else EvaluatedPolicy("softmax", t)
    oracle = EnvScorer(env, "reward")
    nets = CpeNets(oracle, EnvScorer(env, "reward"))
    return evaluate_cpe(
        PARAMETRIC, q_net, nets, data, policy=policy, gamma=0.9, n_bootstrap=200, seed=1
    )


def test_logging_policy_evaluates_to_one(bandit) -> None:
    env, data, contexts = bandit
    t = 0.3
    out = _evaluate(env, data, EnvScorer(env, "logging", t), t)
    # Target = logging policy: every importance weight is 1, so IPS and SNIPS are exactly
    # the logged value; DM (with the true μ) is the logging policy's exact value.
    assert out["ips"]["normalized"] == pytest.approx(1.0, abs=1e-5)
    assert out["snips"]["normalized"] == pytest.approx(1.0, abs=1e-5)
    truth = env.logging_value(contexts)
    assert out["direct_method"]["raw"] == pytest.approx(truth, abs=1e-5)
    for name in ("doubly_robust", "sequential_doubly_robust", "weighted_doubly_robust"):
        assert out[name]["normalized"] == pytest.approx(1.0, abs=0.02), name


@pytest.mark.parametrize("temperature", [0.05, 0.2])
def test_oracle_policy_estimates_track_its_true_value(bandit, temperature) -> None:
    env, data, contexts = bandit
    q_net = EnvScorer(env, "reward")  # the best possible Q: softmax of μ / T

    def policy(ctx: Contexts) -> np.ndarray:
        mu = np.where(ctx.mask, env.expected_reward(ctx) / temperature, -np.inf)
        z = np.exp(mu - mu.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    truth = env.true_policy_value(policy, contexts)
    out = _evaluate(env, data, q_net, temperature)
    assert out["direct_method"]["raw"] == pytest.approx(truth, abs=1e-5)  # exact r̂ = μ
    for name in ("ips", "snips", "doubly_robust", "sequential_doubly_robust"):
        est = out[name]
        assert abs(est["raw"] - truth) <= 3 * est["raw_std_error"] + 1e-4, (name, est, truth)
        assert est["normalized"] == pytest.approx(est["raw"] / out_logged(data), rel=1e-6)
    assert out["direct_method"]["raw"] > env.logging_value(contexts) + 0.05


def out_logged(data: Rows) -> float:
    return float(data.reward.double().mean())


class NoisyOracle(nn.Module):
    """μ(s, a) plus a fixed distortion: a good but imperfect Q-network, whose greedy policy
    beats the logger without being optimal and whose softmax at T = 1 is far from greedy."""

    def __init__(self, env: ParametricBanditEnv):
        super().__init__()
        self.oracle = EnvScorer(env, "reward")

    def forward(self, state: Tensor, actions: Tensor) -> Tensor:
        mu = self.oracle(state, actions)
        return mu + 0.3 * torch.sin(7.0 * actions.sum(-1)) + 0.05 * state[:, :1]


def test_served_greedy_policy_estimates_hold_its_true_value_and_softmax_misses(bandit) -> None:
    """The bar of the issue: on a contextual bandit with a known reward model, IPS and DR of
    the policy model.pt2 serves lie within 3 SE of its true value; the softmax at the
    default temperature, which CPE evaluated before, misses it by far more."""
    env, data, contexts = bandit
    q_net = NoisyOracle(env)

    def greedy(ctx: Contexts) -> np.ndarray:
        with torch.no_grad():
            q = q_net(
                torch.from_numpy(ctx.states).float(), torch.from_numpy(ctx.candidates).float()
            )
        return np.where(ctx.mask, q.double().numpy(), -np.inf).argmax(axis=1)

    truth = env.true_policy_value(greedy, contexts)
    logging_value = env.logging_value(contexts)
    assert env.optimal_value(contexts) > truth + 0.02 and truth > logging_value + 0.05
    out = _evaluate(env, data, q_net, None)
    for name in ("ips", "snips", "doubly_robust", "sequential_doubly_robust"):
        est = out[name]
        assert abs(est["raw"] - truth) <= 3 * est["raw_std_error"], (name, est, truth)
    assert out["direct_method"]["raw"] == pytest.approx(truth, abs=1e-5)  # exact r̂ = μ
    assert out["diagnostics"]["effective_sample_size_rows"] > 100

    old = _evaluate(env, data, q_net, 1.0)  # the softmax CPE valued before
    for name in ("ips", "doubly_robust"):
        est = old[name]
        assert abs(est["raw"] - truth) > 3 * est["raw_std_error"], (name, est, truth)
    assert old["policy"]["name"] == "softmax" and not old["policy"]["served_by_model"]


def test_near_uniform_softmax_and_tiny_ess_warn(bandit, caplog) -> None:
    env, data, _ = bandit
    with caplog.at_level("WARNING", logger="reagent_lite"):
        _evaluate(env, data, NoisyOracle(env), 1000.0)
    assert any("near-uniform" in r.getMessage() for r in caplog.records)
    caplog.clear()
    few = Rows({k: v[:40] for k, v in data.items()})
    with caplog.at_level("WARNING", logger="reagent_lite"):
        _evaluate(env, few, NoisyOracle(env), None)
    assert any("effective sample size" in r.getMessage() for r in caplog.records)


def test_effective_sample_size_is_scale_free_and_survives_long_episodes() -> None:
    from reagent_lite.evaluation.diagnostics import effective_sample_size, policy_diagnostics

    assert effective_sample_size(np.array([1.0, 1.0, 0.0, 2.0])) == pytest.approx(16.0 / 6.0)
    assert effective_sample_size(np.array([3e200, 3e200])) == pytest.approx(2.0)
    assert effective_sample_size(np.zeros(3)) == 0.0
    # Two 600-step episodes on which greedy always agrees with a uniform logger over two
    # actions: each episode's weight is 2^600 (beyond float64's exp), equal, so ESS = 2.
    n = 1200
    q = np.tile([[1.0, 0.0]], (n, 1))
    diag = policy_diagnostics(
        q=q,
        probs=np.tile([[1.0, 0.0]], (n, 1)),
        mask=np.ones((n, 2), dtype=bool),
        ratio=np.full(n, 2.0),
        keep=np.ones(n, dtype=bool),
        mdp_ids=np.repeat([0, 1], n // 2),
    )
    assert diag["effective_sample_size_episodes"] == pytest.approx(2.0)
    assert diag["effective_sample_size_rows"] == pytest.approx(n)


@pytest.mark.parametrize(
    ("top", "candidates", "warns"),
    [(0.016, 80, True), (0.3, 80, False), (0.52, 2, True), (0.75, 2, False), (1.0, 2, False)],
)
def test_near_uniform_is_judged_between_uniform_and_deterministic(
    top: float, candidates: int, warns: bool
) -> None:
    from reagent_lite.evaluation.diagnostics import diagnostic_warnings

    diag = {
        "effective_sample_size_rows": 1000.0,
        "rows": 1000.0,
        "effective_sample_size_episodes": 1000.0,
        "episodes": 1000.0,
        "mean_top_probability": top,
        "uniform_top_probability": 1.0 / candidates,
        "tied_top_q_fraction": 0.0,
    }
    got = diagnostic_warnings(diag, "softmax policy")
    assert any("near-uniform" in m for m in got) == warns


def test_estimates_outside_the_reachable_range_are_named_and_warned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from reagent_lite.evaluation.diagnostics import reachable_range, warn_and_summarize

    def est(raw: float, se: float = 0.01) -> dict[str, float]:
        return {"raw": raw, "raw_std_error": se, "normalized": raw / 12.0}

    # CartPole: rewards of 1, γ = 0.95: a discounted return is at most 20 for any policy.
    cpe: dict[str, Any] = {
        "direct_method": est(1.0),
        "ips": est(1.4),  # above the largest reward by 40 SE: out
        "snips": est(1.0),
        "doubly_robust": est(0.995),  # below, by less than 2 SE: the eval table's noise
        "sequential_doubly_robust": est(68.7, 4.6),  # a diverged value model: out
        "weighted_doubly_robust": est(20.0),  # the bound itself: in
        "magic": est(19.0),
    }
    check = reachable_range(cpe, np.ones(50), gamma=0.95)
    assert (check["return_min"], check["return_max"]) == (0.0, pytest.approx(20.0))
    assert check["outside"] == ["ips", "sequential_doubly_robust"]
    # Negative rewards (Acrobot, γ = 0.99): [-100, 0]; γ = 1 leaves returns unbounded.
    acro = reachable_range({"magic": est(-102.0)}, np.array([-1.0, 0.0]), gamma=0.99)
    assert acro["return_min"] == pytest.approx(-100.0) and acro["outside"] == ["magic"]
    assert reachable_range({"magic": est(-1e9)}, -np.ones(3), gamma=1.0)["outside"] == []

    cpe["reachable_range"] = check
    cpe["diagnostics"] = {
        "effective_sample_size_rows": 1000.0,
        "rows": 1000.0,
        "effective_sample_size_episodes": 1000.0,
        "episodes": 1000.0,
        "mean_top_probability": 1.0,
        "uniform_top_probability": 0.5,
        "tied_top_q_fraction": 0.0,
    }
    with caplog.at_level("WARNING", logger="reagent_lite"):
        warn_and_summarize(cpe, "greedy policy")
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "sequential_doubly_robust = 68.7 is off by at least 48.7: any policy's discounted "
        "return here is in [0, 20]" in m
        for m in messages
    )
    assert sum("is off by at least" in m for m in messages) == 2


@pytest.mark.parametrize(
    ("raw", "se", "low", "high", "outside"),
    [
        (0.999, 1e-5, 1.0, 1.0, False),  # the sample run's DR: rounding, not a wrong value
        (1.0 - 2e-6, 0.0, 1.0, 1.0, False),  # DM = 1 printed as "1 is outside [1, 1]"
        (0.989, 1e-5, 1.0, 1.0, True),  # off by more than 1 % of the scale and 2 SE
        (0.95, 0.03, 1.0, 1.0, False),  # within 2 SE
        (20.15, 0.01, 0.0, 20.0, False),  # 0.75 % above a return bound of 20
        (20.5, 0.01, 0.0, 20.0, True),
    ],
)
def test_reachable_range_ignores_negligible_excess(
    raw: float, se: float, low: float, high: float, outside: bool
) -> None:
    from reagent_lite.evaluation.diagnostics import reachable_range

    name = "doubly_robust" if high == low else "magic"
    gamma = 1.0 - 1.0 / high if high > 1 else 0.5
    rewards = np.array([low, high]) if high == low else np.array([high / 20.0])
    check = reachable_range({name: {"raw": raw, "raw_std_error": se}}, rewards, gamma)
    assert (check["outside"] == [name]) == outside


def test_each_distinct_warning_is_said_once_per_run(caplog: pytest.LogCaptureFixture) -> None:
    from reagent_lite.evaluation.diagnostics import CpeNotices, warn_and_summarize

    def cpe(episode_ess: float, magic: float) -> dict[str, Any]:
        return {
            "magic": {"raw": magic, "raw_std_error": 0.01, "normalized": magic / 12.0},
            "reachable_range": {
                "return_min": 0.0,
                "return_max": 20.0,
                "reward_min": 1.0,
                "reward_max": 1.0,
                "outside": ["magic"],
            },
            "diagnostics": {
                "effective_sample_size_rows": 1000.0,
                "rows": 1000.0,
                "effective_sample_size_episodes": episode_ess,
                "episodes": 509.0,
                "mean_top_probability": 1.0,
                "uniform_top_probability": 0.5,
                "tied_top_q_fraction": 0.0,
            },
        }

    run = CpeNotices()
    with caplog.at_level("DEBUG", logger="reagent_lite"):
        for epoch in range(3):  # other numbers each epoch, the same two problems
            warn_and_summarize(cpe(2.9 - epoch, 28.0 + epoch), "greedy policy", run)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings
    assert "effective sample size 2.9 of 509 episodes" in warnings[0]
    assert "magic = 28 is off by at least 8" in warnings[1]
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert [m.endswith("(2 warning(s) as before)") for m in infos] == [False, True, True]
    debugs = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    assert len(debugs) == 4 and "(said 3 times this run)" in debugs[-1]
    assert all(len(m) < 200 for m in warnings + infos)
    # The state is the run's, not the module's: another run hears both again.
    caplog.clear()
    with caplog.at_level("WARNING", logger="reagent_lite"):
        warn_and_summarize(cpe(2.9, 28.0), "greedy policy", CpeNotices())
    assert len(caplog.records) == 2


def test_evaluator_warns_once_per_cpe_nets(bandit, caplog) -> None:
    env, data, _ = bandit
    few = Rows({k: v[:40] for k, v in data.items()})
    policy = EvaluatedPolicy("greedy")
    nets = CpeNets(EnvScorer(env, "reward"), EnvScorer(env, "reward"))
    counts = []
    for epoch in range(2):
        caplog.clear()
        with caplog.at_level("WARNING", logger="reagent_lite"):
            evaluate_cpe(
                PARAMETRIC, NoisyOracle(env), nets, few, policy=policy, gamma=0.9,
                n_bootstrap=20, seed=epoch,
            )  # fmt: skip
        counts.append(sum("effective sample size" in r.getMessage() for r in caplog.records))
    assert counts[0] >= 1 and counts[1] == 0
