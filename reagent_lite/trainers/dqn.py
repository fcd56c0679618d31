"""DQN over a discrete action set: Q(s) → [B, A], targets from the masked next-state max.

Only Q of the logged action and the next-state value are specific to this trainer; the
loss, optimizer, accumulation and target updates are in `common.py`. With a BCQ network
(`models/bcq.py`, `rainbow.bcq_drop_threshold`) the same step also trains its imitation
network on the logged actions (cross-entropy, added to the loss: the two networks share no
parameter, so each gets only its own gradient), and the next-state max runs over the
actions the imitation network allows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.config.models import DQNWorkflowConfig
from reagent_lite.errors import ConfigError
from reagent_lite.models.bcq import BCQQNetwork
from reagent_lite.trainers.common import DQNHyperParams, QLearningTrainer, QLogged
from reagent_lite.trainers.masked import (
    SWITCH_FIRST_STEPS,
    behavior_certainty,
    certainty_switch,
    double_q_value,
    masked_max,
)


class DiscreteBatch(Protocol):
    """The fields of `DiscreteTransitions` the trainer reads, states already normalized.

    `state`, `next_state` [B, D] float32; `action`, `next_action` int64 [B] (−1 = none);
    `possible_actions_mask`, `possible_next_actions_mask` [B, A] (1 = possible);
    `reward`, `time_diff`, `terminal` [B] float32.
    """

    @property
    def state(self) -> torch.Tensor: ...
    @property
    def action(self) -> torch.Tensor: ...
    @property
    def reward(self) -> torch.Tensor: ...
    @property
    def next_state(self) -> torch.Tensor: ...
    @property
    def next_action(self) -> torch.Tensor: ...
    @property
    def possible_actions_mask(self) -> torch.Tensor: ...
    @property
    def possible_next_actions_mask(self) -> torch.Tensor: ...
    @property
    def time_diff(self) -> torch.Tensor: ...
    @property
    def terminal(self) -> torch.Tensor: ...


def reward_boost_vector(
    actions: Sequence[str], reward_boost: Mapping[str, float]
) -> torch.Tensor | None:
    """`rl.reward_boost` (action name → boost) as a [A] tensor in `actions` order, or None."""
    if not reward_boost:
        return None
    unknown = sorted(set(reward_boost) - set(actions))
    if unknown:
        raise ConfigError(
            f"rl.reward_boost: unknown action(s) (got {unknown}); expected names from "
            f"actions {list(actions)}"
        )
    return torch.tensor([float(reward_boost.get(a, 0.0)) for a in actions], dtype=torch.float32)


class DQNTrainer(QLearningTrainer[DiscreteBatch]):
    """(Double) DQN / SARSA with optional CQL on a network mapping [B, D] → [B, A]."""

    def __init__(
        self,
        q_net: nn.Module,
        hparams: DQNHyperParams,
        *,
        n_actions: int,
        reward_boost_vector: torch.Tensor | None = None,
        unwrapped: nn.Module | None = None,
    ) -> None:
        super().__init__(q_net, hparams, unwrapped=unwrapped)
        self.n_actions = int(n_actions)
        # BCQ: the online network's imitator decides which next actions the max may take.
        self.bcq: BCQQNetwork | None = self.online if isinstance(self.online, BCQQNetwork) else None
        if hparams.cql_weighting != "constant" and self.bcq is None:
            raise ValueError(
                f"cql_weighting {hparams.cql_weighting!r} reads the logging policy off an "
                "imitation network: q_net must be a BCQQNetwork"
            )
        # certainty_switch: full CQL for the first steps, while the imitator still looks
        # uniform everywhere; a device tensor counted down by the update, so a compiled or
        # captured step reads its value rather than a constant baked in.
        device = next(self.online.parameters()).device
        self._switch_first_steps = torch.full((), float(SWITCH_FIRST_STEPS), device=device)
        self.reward_boost: torch.Tensor | None = None
        if reward_boost_vector is not None:
            if reward_boost_vector.shape != (self.n_actions,):
                raise ValueError(
                    f"reward_boost_vector must have shape ({self.n_actions},) "
                    f"(got {tuple(reward_boost_vector.shape)})"
                )
            device = next(self.online.parameters()).device
            self.reward_boost = reward_boost_vector.to(device=device, dtype=torch.float32)

    @classmethod
    def from_config(
        cls, q_net: nn.Module, cfg: DQNWorkflowConfig, *, unwrapped: nn.Module | None = None
    ) -> DQNTrainer:
        """Hyper-parameters from `cfg.rl/rainbow/training`, actions from `cfg.actions`."""
        hp = DQNHyperParams.from_config(cfg)
        actions = list(cfg.actions)
        return cls(
            q_net,
            hp,
            n_actions=len(actions),
            reward_boost_vector=reward_boost_vector(actions, hp.reward_boost),
            unwrapped=unwrapped,
        )

    def _reward(self, batch: DiscreteBatch) -> torch.Tensor:
        if self.reward_boost is None:
            return batch.reward
        return batch.reward + self.reward_boost[batch.action]

    def _q_logged(self, batch: DiscreteBatch, net: nn.Module) -> QLogged:
        return self._q_logged_weighted(batch, net)[0]

    def _q_logged_weighted(
        self, batch: DiscreteBatch, net: nn.Module
    ) -> tuple[QLogged, torch.Tensor | None]:
        logged = batch.action.unsqueeze(1)
        if self.bcq is None:
            q_all = net(batch.state)
            return (q_all.gather(1, logged).squeeze(1), q_all, None), None
        q_all, logits = BCQQNetwork.split(net(batch.state, imitation=True))
        imitation = F.cross_entropy(logits.float(), batch.action)
        weight = None
        if self.hp.cql_weighting != "constant":
            # How sure the logger was here: uniform logging (w ≈ 0) leaves no action out of
            # the data for CQL to push down, and its penalty would only flatten Q.
            weight = behavior_certainty(logits, batch.possible_actions_mask).to(q_all.dtype)
            if self.hp.cql_weighting == "certainty_switch":
                # All rows or none: full CQL unless the logger was unsure everywhere.
                first = (self._switch_first_steps > 0).to(weight.dtype)
                weight = torch.maximum(certainty_switch(weight), first).expand_as(weight)
        return (q_all.gather(1, logged).squeeze(1), q_all, imitation), weight

    def _next_value(self, batch: DiscreteBatch) -> torch.Tensor:
        # An imitator without a threshold drops nothing: the plain max, no imitator forward.
        if self.bcq is not None and self.bcq.threshold is not None:
            return self._bcq_next_value(batch)
        target_q = self.target(batch.next_state)
        if not self.hp.maxq_learning:
            # SARSA: the logged next action; rows without one (−1) are worth nothing.
            na = batch.next_action
            value = target_q.gather(1, na.clamp(min=0).unsqueeze(1)).squeeze(1)
            return torch.where(na >= 0, value, torch.zeros_like(value))
        mask = batch.possible_next_actions_mask
        if not self.hp.double_q_learning:
            return masked_max(target_q, mask)[0]
        # Double Q: the online net picks the action, the target net values it.
        return double_q_value(self.online(batch.next_state), target_q, mask)

    def _bcq_next_value(self, batch: DiscreteBatch) -> torch.Tensor:
        """`_next_value` over the raw Q of both networks, the max restricted to the next
        state's candidates that the online imitator allows (a row where it allows none of
        them is worth 0, as a row without candidates; the served policy then plays the
        first candidate). SARSA's logged next action is valued as is."""
        assert self.bcq is not None
        target_q = BCQQNetwork.split(self.target(batch.next_state, imitation=True))[0]
        if not self.hp.maxq_learning:
            na = batch.next_action
            value = target_q.gather(1, na.clamp(min=0).unsqueeze(1)).squeeze(1)
            return torch.where(na >= 0, value, torch.zeros_like(value))
        online_q, logits = BCQQNetwork.split(self.bcq(batch.next_state, imitation=True))
        mask = batch.possible_next_actions_mask * self.bcq.allowed(logits)
        if not self.hp.double_q_learning:
            return masked_max(target_q, mask)[0]
        return double_q_value(online_q, target_q, mask)

    def apply_update(self) -> None:
        super().apply_update()
        if self.hp.cql_weighting == "certainty_switch":
            self._switch_first_steps.sub_(1.0).clamp_(min=0.0)

    def step_tensors(self) -> list[torch.Tensor]:
        return [self._switch_first_steps]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["switch_first_steps"] = float(self._switch_first_steps)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._switch_first_steps.fill_(float(state.get("switch_first_steps", 0.0)))
