"""`reagent_lite.Policy` in process: the exploration's exact probabilities, episode ids,
masked actions and candidate sets, and requests refused with the field named."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import reagent_lite
from reagent_lite.errors import ConfigError
from reagent_lite.serving.exploration import Exploration, sample
from reagent_lite.serving.policy import Policy, RequestError
from tests.serving.conftest import meta


def _state(model: Path, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    return {f: float(rng.normal()) for f in meta(model)["state_feature_ids"]}


def _q(model: Path, state: dict[str, float]) -> np.ndarray:
    """The exported program's Q for `state`, called directly (the reference)."""
    program = torch.export.load(str(model / "model.pt2")).module()
    ids = meta(model)["state_feature_ids"]
    values = torch.tensor([[state[f] for f in ids]], dtype=torch.float32)
    q: np.ndarray = program(values, torch.ones_like(values)).detach().numpy()[0]
    return q


def test_exploration_probabilities_are_exact_and_sum_to_one() -> None:
    q, rank = np.array([1.0, 3.0, 3.0, -2.0]), np.arange(4)
    assert Exploration.parse("greedy").probabilities(q, rank).tolist() == [0, 1, 0, 0]
    # A tie goes to the lowest rank, whatever the position.
    assert Exploration.parse("greedy").probabilities(q, np.array([0, 5, 4, 1]))[2] == 1.0
    eps = Exploration.parse("epsilon:0.2").probabilities(q, rank)
    np.testing.assert_allclose(eps, [0.05, 0.85, 0.05, 0.05])
    soft = Exploration.parse("softmax:0.5").probabilities(q, rank)
    want = np.exp(q / 0.5) / np.exp(q / 0.5).sum()
    np.testing.assert_allclose(soft, want, rtol=1e-12)
    for p in (eps, soft):
        assert math.isclose(p.sum(), 1.0, rel_tol=1e-12)
    # A zero-probability action is never sampled, even at the ends of [0, 1).
    for u in (0.0, 0.5, 1.0 - 1e-16):
        assert sample(np.array([0.0, 1.0, 0.0]), u) == 1


@pytest.mark.parametrize("text", ["epsilon", "epsilon:1.5", "softmax:0", "softmax:x", "greed"])
def test_bad_exploration_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--exploration: .*expected greedy, epsilon:E"):
        Exploration.parse(text)


def test_dqn_greedy_matches_the_program_and_episodes_count_up(dqn_model: Path) -> None:
    with reagent_lite.Policy(dqn_model) as policy:
        state = _state(dqn_model)
        q = _q(dqn_model, state)
        actions = meta(dqn_model)["actions"]
        first = policy.act(state)
        assert first.action == actions[int(np.argmax(q))]
        assert first.propensity == 1.0 and sorted(first.probabilities) == [0.0, 1.0]
        assert first.model_id == meta(dqn_model)["model_sha256"]
        assert first.sequence_number == 0
        # The same episode continues; a request without mdp_id starts a new one.
        second = policy.act(state, mdp_id=first.mdp_id)
        assert (second.mdp_id, second.sequence_number) == (first.mdp_id, 1)
        third = policy.act(state, mdp_id=first.mdp_id, sequence_number=7)
        assert third.sequence_number == 7
        assert policy.act(state, mdp_id=first.mdp_id).sequence_number == 8
        other = policy.act(state)
        assert other.mdp_id != first.mdp_id and other.sequence_number == 0
        assert len({first.decision_id, second.decision_id, other.decision_id}) == 3


def test_dqn_masked_actions_and_softmax_over_the_request_order(dqn_model: Path) -> None:
    actions = meta(dqn_model)["actions"]
    state = _state(dqn_model, 1)
    q = _q(dqn_model, state)
    with Policy(dqn_model, exploration="softmax:0.7", seed=3) as policy:
        only = policy.act(state, possible_actions=[actions[1]])
        assert only.action == actions[1] and only.probabilities == [1.0]
        rev = policy.act(state, possible_actions=actions[::-1])
        z = np.exp(q[::-1] / 0.7)
        np.testing.assert_allclose(rev.probabilities, z / z.sum(), rtol=1e-5)
        assert rev.propensity == rev.probabilities[actions[::-1].index(str(rev.action))]


def test_epsilon_frequencies_follow_the_probabilities(dqn_model: Path) -> None:
    state = _state(dqn_model, 2)
    with Policy(dqn_model, exploration="epsilon:0.5", seed=0) as policy:
        decisions = [policy.act(state) for _ in range(400)]
    best = decisions[0].probabilities.index(max(decisions[0].probabilities))
    assert decisions[0].probabilities[best] == pytest.approx(0.75)
    share = np.mean([d.action == meta(dqn_model)["actions"][best] for d in decisions])
    assert 0.65 < share < 0.85  # 0.75 ± 4.6 standard errors
    # The seed makes the choices reproducible.
    with Policy(dqn_model, exploration="epsilon:0.5", seed=0) as again:
        assert [again.act(state).action for _ in range(400)] == [d.action for d in decisions]


def test_parametric_one_and_many_candidates(parametric_model: Path) -> None:
    ids = meta(parametric_model)["action_feature_ids"]
    state = _state(parametric_model)
    rng = np.random.default_rng(0)
    cands = [{f: float(rng.normal()) for f in ids} for _ in range(5)]
    program = torch.export.load(str(parametric_model / "model.pt2")).module()
    sids = meta(parametric_model)["state_feature_ids"]
    s = torch.tensor([[state[f] for f in sids]], dtype=torch.float32)
    a = torch.tensor([[[c[f] for f in ids] for c in cands]], dtype=torch.float32)
    q = program(s, torch.ones_like(s), a, torch.ones_like(a), torch.ones(1, 5))[0]
    with Policy(parametric_model) as policy:
        many = policy.act(state, possible_actions=cands)
        assert many.action == int(q.argmax()) and len(many.probabilities) == 5
        one = policy.act(state, possible_actions=cands[3:4])
        assert one.action == 0 and one.probabilities == [1.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"possible_actions": ["9"]}, r"possible_actions\[0\]: unknown action '9' \(expected one"),
        ({"possible_actions": []}, "^possible_actions: Value should have at least 1 item"),
        ({"possible_actions": ["0", "0"]}, r"possible_actions\[1\]: action '0' is listed twice"),
        ({"possible_actions": [{"0": 1.0}]}, "a dqn model takes action names"),
        ({"state": {"x": 1.0}}, "state_features: .*'x' is not a string of a non-negative int"),
        ({"state": {"0": math.nan}}, r"state_features\.0: Input should be a finite number"),
        ({"state": {"99999": 1.0}}, "state_features: holds none of the model's state features"),
        ({"sequence_number": -1}, "^sequence_number: Input should be greater than or equal to 0"),
    ],
)
def test_bad_requests_name_the_field(dqn_model: Path, kwargs: dict, match: str) -> None:
    state = kwargs.pop("state", _state(dqn_model))
    with Policy(dqn_model) as policy, pytest.raises(RequestError, match=match):
        policy.act(state, **kwargs)


def test_parametric_requires_candidate_maps(parametric_model: Path) -> None:
    state = _state(parametric_model)
    with Policy(parametric_model) as policy:
        with pytest.raises(RequestError, match="possible_actions: required by a parametric"):
            policy.act(state)
        with pytest.raises(RequestError, match="takes candidate feature maps"):
            policy.act(state, possible_actions=["0"])


def test_feedback_without_a_log_dir_says_so(dqn_model: Path) -> None:
    with Policy(dqn_model) as policy, pytest.raises(ConfigError, match="no log_dir"):
        policy.feedback("x", 1.0)


def test_a_parametric_batch_of_mixed_candidate_counts_is_one_call(parametric_model: Path) -> None:
    """Candidate sets of different sizes, padded into one model call, score as each does
    alone (the padding is masked, never chosen)."""
    from reagent_lite.serving.schemas import ActRequest

    ids = meta(parametric_model)["action_feature_ids"]
    rng = np.random.default_rng(1)
    requests = [
        ActRequest(
            state_features=_state(parametric_model, seed=k),
            possible_actions=[{f: float(rng.normal()) for f in ids} for _ in range(k)],
        )
        for k in (1, 3, 6)
    ]
    with Policy(parametric_model, exploration="softmax:0.5") as policy:
        together = policy.act_batch(requests)
        assert policy.stats()["model_calls"] == 1
        alone = [policy.act_batch([r])[0] for r in requests]
    for t, a in zip(together, alone, strict=True):
        assert not isinstance(t, Exception) and not isinstance(a, Exception)
        np.testing.assert_allclose(t.probabilities, a.probabilities, rtol=1e-5)
    assert [len(t.probabilities) for t in together if not isinstance(t, Exception)] == [1, 3, 6]


def test_policy_with_a_log_dir_logs_each_decision_and_joins_feedback(
    dqn_model: Path, parametric_model: Path, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    with Policy(dqn_model, "epsilon:0.5", log_dir=tmp_path / "dqn", seed=0) as policy:
        made = [policy.act(_state(dqn_model, i), possible_actions=["1", "0"]) for i in range(3)]
        assert policy.feedback(made[1].decision_id, 4.0, {"m": 1.0})
        assert not policy.feedback("unknown", 1.0)
    rows = {r["decision_id"]: r for r in pq.read_table(tmp_path / "dqn").to_pylist()}
    assert set(rows) == {d.decision_id for d in made}
    for d in made:
        row = rows[d.decision_id]
        assert (row["action"], row["action_probability"]) == (d.action, d.propensity)
        assert row["possible_actions"] == ["1", "0"] and row["model_id"] == d.model_id
    assert rows[made[1].decision_id]["reward"] == 4.0

    ids = meta(parametric_model)["action_feature_ids"]
    cands = [{ids[0]: float(i)} for i in range(3)]
    with Policy(parametric_model, "softmax:1", log_dir=tmp_path / "par", seed=0) as policy:
        d = policy.act(_state(parametric_model), possible_actions=cands)
    (row,) = pq.read_table(tmp_path / "par").to_pylist()
    assert dict(row["action"]) == cands[int(d.action)]
    assert [dict(c) for c in row["possible_actions"]] == cands
