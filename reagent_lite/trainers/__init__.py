"""The maths of training: DQN and parametric DQN losses, targets and updates.

No I/O, no ranks; the training loop owns those.
"""

from __future__ import annotations

from reagent_lite.trainers.common import (
    DQNHyperParams,
    DQNLoss,
    QLearningTrainer,
    build_optimizer,
    td_loss,
)
from reagent_lite.trainers.dqn import DiscreteBatch, DQNTrainer, reward_boost_vector
from reagent_lite.trainers.optim import soft_update
from reagent_lite.trainers.parametric_dqn import ParametricBatch, ParametricDQNTrainer

__all__ = [
    "DQNHyperParams",
    "DQNLoss",
    "DQNTrainer",
    "DiscreteBatch",
    "ParametricBatch",
    "ParametricDQNTrainer",
    "QLearningTrainer",
    "build_optimizer",
    "reward_boost_vector",
    "soft_update",
    "td_loss",
]
