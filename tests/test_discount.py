"""The one discounting rule: training's per-transition discount, backed up over an
episode, gives the same value as the episode discounts the sequential estimators use."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reagent_lite.discount import episode_discounts, sequence_gaps, transition_discount

# Horizon's episode "6" (ml/rl/test/evaluator/test_evaluator.py in facebookresearch/ReAgent,
# `test_compute_episode_value_from_samples`): sequence numbers 2, 4, 5, 8, rewards 3, 2, 0, 1,
# γ = 0.5; Horizon's values from each step onward.
SEQ = np.array([2, 4, 5, 8])
REWARDS = np.array([3.0, 2.0, 0.0, 1.0])
HORIZON_VALUES = [3.515625, 2.0625, 0.125, 1.0]


def backed_up(gamma: float, steps: np.ndarray, *, use_time_diff: bool) -> list[float]:
    """Each step's value by training's Bellman backup r + discount·V(next), last step terminal."""
    values, nxt = [], 0.0
    for r, dt in zip(REWARDS[::-1], steps[::-1], strict=True):
        discount = transition_discount(
            gamma, lambda dt=dt: torch.tensor(dt), use_time_diff=use_time_diff
        )
        nxt = float(r + discount * nxt)
        values.append(nxt)
    return values[::-1]


def test_gaps_are_the_time_between_steps_of_an_episode() -> None:
    episodes = np.array([0, 0, 0, 1, 1])
    assert sequence_gaps(episodes, np.array([3, 5, 6, 10, 11])).tolist() == [2, 1, 1, 1, 1]


@pytest.mark.parametrize("use_time_diff", [True, False])
def test_training_and_evaluation_discount_alike(use_time_diff: bool) -> None:
    gaps = sequence_gaps(np.zeros(4, dtype=int), SEQ)
    training = backed_up(0.5, gaps, use_time_diff=use_time_diff)
    # What the shard builder hands both sides: the gaps, or 1 per row with the flag off.
    steps = gaps if use_time_diff else np.ones(4)
    evaluation = float(np.sum(episode_discounts(0.5, steps[None, :]) * REWARDS))
    assert training[0] == pytest.approx(evaluation)
    if use_time_diff:
        assert training == pytest.approx(HORIZON_VALUES)
    else:
        assert training[0] == pytest.approx(3 + 0.5 * 2 + 0.25 * 0 + 0.125 * 1)
