"""What the DQN and parametric DQN trainers share: hyper-parameters, optimizer, TD loss,
soft target update and the Bellman target. The step that runs them (accumulate → reduce
→ clip → optimizer step → soft update) is `training/update.py`'s, for every model.

A trainer subclass only says how to get Q of the logged action (plus the candidate set
CQL pushes down) and the value of the next state; everything else lives here. No I/O and
no ranks: the loop reduces the returned tensors across processes if it wants to.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.config.models import BaseWorkflowConfig
from reagent_lite.discount import transition_discount
from reagent_lite.errors import ConfigError

# The mask maths and step mechanics live in their own modules; the names stay importable
# from here (`as` marks a re-export).
from reagent_lite.trainers.masked import double_q_value as double_q_value
from reagent_lite.trainers.masked import masked_argmax as masked_argmax
from reagent_lite.trainers.masked import masked_logsumexp as masked_logsumexp
from reagent_lite.trainers.masked import masked_max as masked_max
from reagent_lite.trainers.optim import BackwardSeed as BackwardSeed
from reagent_lite.trainers.optim import OptimizerKernel as OptimizerKernel
from reagent_lite.trainers.optim import SoftUpdate as SoftUpdate
from reagent_lite.trainers.optim import adam as adam
from reagent_lite.trainers.optim import load_optimizer_state as load_optimizer_state
from reagent_lite.trainers.optim import soft_update as soft_update

OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
LOSSES = ("mse", "huber")
CQL_WEIGHTINGS = ("constant", "behavior_entropy", "certainty_switch")


@dataclass(frozen=True)
class DQNHyperParams:
    """Everything the trainers read from the config, flattened and typed."""

    gamma: float = 0.99
    target_update_rate: float = 0.01
    maxq_learning: bool = True
    double_q_learning: bool = True
    q_network_loss: str = "mse"
    reward_boost: Mapping[str, float] = field(default_factory=dict, hash=False)
    use_seq_num_diff_as_time_diff: bool = False
    cql_alpha: float = 0.0
    cql_weighting: str = "constant"
    learning_rate: float = 1e-3
    optimizer: str = "adam"
    l2_decay: float = 0.0
    lr_decay: float = 1.0
    clip_grad_norm: float | None = None
    minibatches_per_step: int = 1

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"training.optimizer: unknown optimizer (got {self.optimizer!r}); "
                f"expected one of {list(OPTIMIZERS)}"
            )
        if self.q_network_loss not in LOSSES:
            raise ConfigError(
                f"rl.q_network_loss: unknown loss (got {self.q_network_loss!r}); "
                f"expected one of {list(LOSSES)}"
            )
        if self.cql_weighting not in CQL_WEIGHTINGS:
            raise ConfigError(
                f"training.cql_weighting: unknown weighting (got {self.cql_weighting!r}); "
                f"expected one of {list(CQL_WEIGHTINGS)}"
            )
        if self.minibatches_per_step < 1:
            raise ConfigError(
                f"training.minibatches_per_step: must be >= 1 (got {self.minibatches_per_step})"
            )

    @classmethod
    def from_config(cls, cfg: BaseWorkflowConfig) -> DQNHyperParams:
        """The `rl`, `rainbow` and `training` blocks of a workflow config."""
        rl, rainbow, training = cfg.rl, cfg.rainbow, cfg.training
        return cls(
            gamma=rl.gamma,
            target_update_rate=rl.target_update_rate,
            maxq_learning=rl.maxq_learning,
            double_q_learning=rainbow.double_q_learning,
            q_network_loss=rl.q_network_loss,
            reward_boost=dict(rl.reward_boost),
            use_seq_num_diff_as_time_diff=rl.use_seq_num_diff_as_time_diff,
            cql_alpha=training.cql_alpha,
            cql_weighting=training.cql_weighting,
            learning_rate=training.learning_rate,
            optimizer=training.optimizer,
            l2_decay=training.l2_decay,
            lr_decay=training.lr_decay,
            clip_grad_norm=training.clip_grad_norm,
            minibatches_per_step=training.minibatches_per_step,
        )


@dataclass(frozen=True)
class DQNLoss:
    """One step's figures as 0-d tensors (reading them is the caller's device sync).

    From `compute_loss`, `total` still carries the gradient; a step keeps the detached
    record (`detach`).
    """

    td_loss: torch.Tensor
    cql_loss: torch.Tensor
    total: torch.Tensor
    mean_q: torch.Tensor

    def detach(self) -> DQNLoss:
        return DQNLoss(
            self.td_loss.detach(), self.cql_loss.detach(), self.total.detach(), self.mean_q.detach()
        )

    @staticmethod
    def mean(records: Sequence[DQNLoss]) -> DQNLoss:
        """Average of micro-batch records (they have equal sizes, so this is the batch mean)."""
        if len(records) == 1:
            return records[0]
        return DQNLoss(
            *(
                torch.stack([getattr(r, name) for r in records]).mean()
                for name in ("td_loss", "cql_loss", "total", "mean_q")
            )
        )

    def as_floats(self) -> dict[str, float]:
        """Host values for logging (one device sync per field; not for the hot path)."""
        return {
            "td_loss": float(self.td_loss),
            "cql_loss": float(self.cql_loss),
            "loss": float(self.total),
            "mean_q": float(self.mean_q),
        }


def build_optimizer(
    params: Iterable[nn.Parameter],
    hp: DQNHyperParams,
    kernel: OptimizerKernel | None = None,
    *,
    lr_scale: float = 1.0,
) -> torch.optim.Optimizer:
    """The configured optimizer with `l2_decay` as weight decay, Adam(W) built with `kernel`
    (the step plan's; default: the eager kernel), the learning rate × `lr_scale`."""
    plist = list(params)
    lr, wd = hp.learning_rate * lr_scale, hp.l2_decay
    if hp.optimizer in ("adam", "adamw"):
        return adam(plist, lr, weight_decay=wd, decoupled=hp.optimizer == "adamw", kernel=kernel)
    if hp.optimizer == "sgd":
        return torch.optim.SGD(plist, lr=lr, weight_decay=wd)
    return torch.optim.RMSprop(plist, lr=lr, weight_decay=wd)


def td_loss(q: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean squared or Huber (δ = 1) error between Q and its (detached) target."""
    if kind == "huber":
        return F.smooth_l1_loss(q, target, beta=1.0)
    return F.mse_loss(q, target)


def _device_of(module: nn.Module) -> torch.device:
    return next((p.device for p in module.parameters()), torch.device("cpu"))


def unwrap(module: nn.Module) -> nn.Module:
    """The plain module under a DDP / DataParallel wrapper (or the module itself)."""
    inner = getattr(module, "module", None)
    return inner if isinstance(inner, nn.Module) else module


class TransitionBatch(Protocol):
    """What the shared code reads from any batch (all [B], float32, on the net's device)."""

    @property
    def reward(self) -> torch.Tensor: ...
    @property
    def time_diff(self) -> torch.Tensor: ...
    @property
    def terminal(self) -> torch.Tensor: ...
    @property
    def possible_actions_mask(self) -> torch.Tensor: ...


BatchT = TypeVar("BatchT", bound=TransitionBatch)

# What a trainer's `_q_logged` returns: Q of the logged action [B], Q of the candidates
# [B, K] and a loss of its own to add to the step's (BCQ's imitation loss), or None.
QLogged = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


class QLearningTrainer(Generic[BatchT]):
    """Shared trainer: target net, optimizer, scheduler, loss and soft updates.

    Subclasses implement `_q_logged` (Q of the logged action with grad through a given
    module, plus the scores of the candidate set that CQL regularises), `_next_value`
    (value of the next state, called without grad), `_reward` and `_terminal`.

    `q_net` may be a DDP/DP wrapper around `online`: the step (`training.update.q_step`)
    forwards through it (so its hooks run) unless it averages the gradients itself;
    grad-free forwards, evaluation (`eval_td_loss`) and the target copy use the plain module.
    Train/eval mode is the caller's business; the target network always stays in eval.
    """

    def __init__(
        self,
        q_net: nn.Module,
        hparams: DQNHyperParams,
        *,
        unwrapped: nn.Module | None = None,
    ) -> None:
        self.hp = hparams
        self.q_net = q_net
        self.online = unwrapped if unwrapped is not None else unwrap(q_net)
        self.target = copy.deepcopy(self.online)
        self.target.requires_grad_(False)
        self.target.eval()
        self._soft_update = SoftUpdate(self.target, self.online)
        # Taken once: walking the module tree every step costs on a CPU (`SoftUpdate`).
        self._params = list(self.online.parameters())
        self._optim: tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler] | None
        self._optim = None

    # -- the optimizer, built once as the step plan needs -----------------------------------
    def parameters(self) -> list[nn.Parameter]:
        """The parameters the optimizer steps: the online network's."""
        return self._params

    def build_optimizer(self, kernel: OptimizerKernel, *, lr_scale: float = 1.0) -> None:
        """Builds the optimizer with the step plan's `kernel` (and its per-epoch lr decay),
        the learning rate × `lr_scale` (`training.scale_lr_with_world_size`). Once, before
        the first step or state load: an optimizer is never rebuilt or patched later."""
        if self._optim is not None:
            raise RuntimeError("the trainer's optimizer is built already")
        opt = build_optimizer(self.parameters(), self.hp, kernel, lr_scale=lr_scale)
        self._optim = opt, torch.optim.lr_scheduler.ExponentialLR(opt, self.hp.lr_decay)

    def _built(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        if self._optim is None:  # no plan asked (tests, tools): the eager kernel
            self.build_optimizer(OptimizerKernel.eager(_device_of(self.online)))
        assert self._optim is not None
        return self._optim

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._built()[0]

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self._built()[1]

    def modules(self) -> list[nn.Module]:
        """The modules a step changes (parameters and buffers): online and target."""
        return [self.online, self.target]

    # -- the per-workflow part --------------------------------------------------------------
    def _q_logged(self, batch: BatchT, net: nn.Module) -> QLogged:
        """(Q of logged action [B] by `net` (`q_net` or `online`), Q of the current
        candidates [B, K] — what CQL regularises, masked by `batch.possible_actions_mask` —,
        and a loss the subclass adds from the same forward, or None)."""
        raise NotImplementedError

    def _q_logged_weighted(
        self, batch: BatchT, net: nn.Module
    ) -> tuple[QLogged, torch.Tensor | None]:
        """`_q_logged` and, from the same forward, a per-row weight [B] of the CQL term
        (detached), or None for the constant cql_alpha (`training.cql_weighting`)."""
        return self._q_logged(batch, net), None

    def _next_value(self, batch: BatchT) -> torch.Tensor:
        """Value of the next state [B] (max or SARSA, from the target net); no grad."""
        raise NotImplementedError

    def _reward(self, batch: BatchT) -> torch.Tensor:
        return batch.reward

    def _terminal(self, batch: BatchT) -> torch.Tensor:
        return batch.terminal

    # -- shared maths ----------------------------------------------------------------------
    def discount(self, batch: BatchT) -> torch.Tensor | float:
        """γ^time_diff when time gaps count, else γ for every row (`reagent_lite.discount`)."""
        return transition_discount(
            self.hp.gamma,
            lambda: batch.time_diff,
            use_time_diff=self.hp.use_seq_num_diff_as_time_diff,
        )

    @torch.no_grad()
    def compute_target(self, batch: BatchT) -> torch.Tensor:
        """Bellman target r + (1 − terminal)·γ^Δt·V(s') [B], without gradient."""
        return self.bellman_target(batch, self._next_value(batch))

    def bellman_target(self, batch: BatchT, next_value: torch.Tensor) -> torch.Tensor:
        """r + (1 − terminal)·γ^Δt·`next_value` (call without gradient)."""
        not_done = 1.0 - self._terminal(batch)
        discount = self.discount(batch)
        if isinstance(discount, float):  # one kernel: r + γ·(not_done·V)
            return torch.addcmul(self._reward(batch), not_done, next_value, value=discount)
        return self._reward(batch) + not_done * discount * next_value

    def compute_loss(self, batch: BatchT, *, net: nn.Module | None = None) -> DQNLoss:
        """TD loss + cql_alpha · CQL term; `total` carries the gradient (through `net`,
        by default `q_net`), the rest are detached.

        CQL (Kumar et al. 2020) here is logsumexp of Q over the *possible* actions minus Q of
        the logged action, averaged over the batch (each row × its weight, when the trainer
        gives one: `_q_logged_weighted`).
        """
        target = self.compute_target(batch)
        logged, weight = self._q_logged_weighted(batch, self.q_net if net is None else net)
        q, candidate_q, own_loss = logged
        td = td_loss(q, target, self.hp.q_network_loss)
        if self.hp.cql_alpha > 0.0:
            # The mask is read only here: without CQL its rows are never gathered.
            gap = masked_logsumexp(candidate_q, batch.possible_actions_mask) - q
            cql = gap.mean() if weight is None else (weight * gap).mean()
            total = td + self.hp.cql_alpha * cql
        else:
            cql = torch.zeros((), device=q.device, dtype=q.dtype)
            total = td
        if own_loss is not None:  # e.g. BCQ's imitation network, trained in the same step
            total = total + own_loss
        return DQNLoss(td.detach(), cql.detach(), total, q.detach().mean())

    def apply_update(self) -> None:
        """The optimizer step on the gradients in place, then the soft target update (the
        step itself is `training.update.q_step`'s)."""
        self.optimizer.step()
        self._soft_update(self.hp.target_update_rate)

    def step_tensors(self) -> list[torch.Tensor]:
        """Device tensors besides the modules' and the optimizer's that a step updates in
        place (a captured step's warm-up restores them too, `graphs.WarmupSnapshot`)."""
        return []

    @torch.no_grad()
    def eval_td_loss(self, batch: BatchT) -> torch.Tensor:
        """The TD loss of `batch` through the plain module (no wrapper, whose forward may
        talk to other ranks: evaluation runs on one rank). Mode is the caller's business."""
        return self.compute_loss(batch, net=self.online).td_loss

    def on_epoch_end(self) -> None:
        """Per-epoch learning-rate decay (`lr_decay`)."""
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return {
            "q_net": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            # Numbers, not the device tensors a graph's lr makes of them: a portable file.
            "scheduler": {
                k: [float(x) if isinstance(x, torch.Tensor) else x for x in v]
                if isinstance(v, list)
                else v
                for k, v in self.scheduler.state_dict().items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.online.load_state_dict(state["q_net"])
        self.target.load_state_dict(state["target"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._soft_update.refresh()
