"""The exploration policy a served model acts with, and the exact probability of each
action it could have taken (the propensity the decision log records).

    greedy       probability 1 on the best action (ties: the lowest rank)
    epsilon:E    1 - E + E/n on the best action, E/n on each of the others
    softmax:T    softmax(Q / T) over the possible actions

Probabilities are computed in float64 over exactly the actions a request offers, in its
order, so they sum to 1 there and an action the request did not offer is never taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from reagent_lite.errors import ConfigError

ExplorationName = Literal["greedy", "epsilon", "softmax"]
EXPLORATION_HELP = "greedy, epsilon:E (0 <= E <= 1) or softmax:T (T > 0)"


@dataclass(frozen=True)
class Exploration:
    name: ExplorationName
    # epsilon's E or softmax's temperature T (unused by greedy).
    value: float = 0.0

    @classmethod
    def parse(cls, text: str, flag: str = "--exploration") -> Exploration:
        """`greedy`, `epsilon:0.1` or `softmax:0.5`; `ConfigError` naming `flag` otherwise."""
        name, sep, raw = text.strip().partition(":")
        if name == "greedy" and not sep:
            return cls("greedy")
        if name in ("epsilon", "softmax") and sep:
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if name == "epsilon" and 0.0 <= value <= 1.0:
                return cls("epsilon", value)
            if name == "softmax" and math.isfinite(value) and value > 0.0:
                return cls("softmax", value)
        raise ConfigError(f"{flag}: {text!r} is not an exploration (expected {EXPLORATION_HELP})")

    def __str__(self) -> str:
        return self.name if self.name == "greedy" else f"{self.name}:{self.value:g}"

    def probabilities(self, q: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """The probability of each of the `n` possible actions whose Q-values are `q`
        (float, shape [n]); `rank` breaks ties for the best action (lowest wins)."""
        q = q.astype(np.float64)
        n = len(q)
        if self.name == "softmax":
            # Shifted by the maximum: exp never overflows and the best action gets exp(0).
            z = np.exp((q - q.max()) / self.value)
            return np.asarray(z / z.sum())
        best = best_index(q, rank)
        share = self.value / n if self.name == "epsilon" else 0.0
        probs = np.full(n, share)
        probs[best] = 1.0 - share * (n - 1)
        return probs


def best_index(q: np.ndarray, rank: np.ndarray) -> int:
    """The index of the highest Q; among equal ones, the one of lowest `rank`."""
    ties = np.flatnonzero(q == q.max())
    return int(ties[np.argmin(rank[ties])])


def sample(probs: np.ndarray, uniform: float) -> int:
    """The action `uniform` (in [0, 1)) picks by inverse CDF: an action of probability 0 is
    never picked, whatever rounding the cumulative sum has."""
    cumulative = np.cumsum(probs)
    index = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
    index = min(index, len(probs) - 1)
    while probs[index] == 0.0:  # only past the last positive entry, by rounding
        index -= 1
    return index
