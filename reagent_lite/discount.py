"""The one discounting rule, for training and for evaluation alike.

A transition is discounted by γ^Δ: Δ is its `time_diff` when
`rl.use_seq_num_diff_as_time_diff` is on, else 1 (the shard builder writes 1 then, so
that both sides read one column). Step t of an episode is therefore discounted by
γ^(Δ_0 + … + Δ_{t−1}), the time elapsed since the episode's first step: the Bellman target
r + γ^Δ·V(s') sums to exactly that return, and the sequential estimators (and the logged
episode value they are normalised by) value the same return. Where no Δ is given, it is the
gap to the next sequence number of the episode (1 after the last step), as the timeline
writes `time_diff` — and as Horizon valued a logged episode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from torch import Tensor

FloatArray = npt.NDArray[np.float64]


def transition_discount(
    gamma: float, time_diff: Callable[[], Tensor], *, use_time_diff: bool
) -> Tensor | float:
    """The discount of each transition's next value: γ^time_diff where time gaps count,
    else γ itself (a float, so that the caller can fuse r + γ·V into one kernel).
    `time_diff` is read only where gaps count: a training batch gathers a column when it
    is read, and an unused gather is a kernel in every step."""
    return gamma ** time_diff() if use_time_diff else gamma


def sequence_gaps(episodes: np.ndarray, sequence_numbers: np.ndarray) -> FloatArray:
    """Δ of rows sorted by (episode, sequence number): each step's gap to the next step of
    its episode, 1 for an episode's last step."""
    seq = np.asarray(sequence_numbers, dtype=np.float64)
    gaps = np.ones(seq.shape[0])
    same = episodes[1:] == episodes[:-1]
    gaps[:-1][same] = (seq[1:] - seq[:-1])[same]
    return gaps


def episode_discounts(gamma: float, steps: FloatArray) -> FloatArray:
    """`[M, T]` each step's Δ (episodes in rows, steps in order) → the discount of each step,
    γ^(time elapsed since the episode's first step)."""
    elapsed = np.hstack([np.zeros((steps.shape[0], 1)), np.cumsum(steps, axis=1)[:, :-1]])
    return np.asarray(gamma**elapsed, dtype=np.float64)
