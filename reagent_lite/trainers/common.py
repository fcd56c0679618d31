"""What the DQN and parametric DQN trainers share: hyper-parameters, optimizer, TD loss,
soft target update, the Bellman target and the accumulate → clip → step → update loop.

A trainer subclass only says how to get Q of the logged action (plus the candidate set
CQL pushes down) and the value of the next state; everything else lives here. No I/O and
no ranks: the loop reduces the returned tensors across processes if it wants to.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from reagent_lite.config import BaseWorkflowConfig
from reagent_lite.discount import transition_discount
from reagent_lite.errors import ConfigError
from reagent_lite.torch_private import foreach_lerp_

OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
LOSSES = ("mse", "huber")


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

    From `compute_loss`, `total` still carries the gradient; `train_step` returns a
    detached record.
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


def adam(
    params: Iterable[nn.Parameter], lr: float, *, weight_decay: float = 0.0, decoupled: bool = False
) -> torch.optim.Optimizer:
    """Adam (AdamW with `decoupled`), fused where the parameters' device has the kernel:
    one kernel per step over all parameters (CUDA, and CPU since torch 2.4) instead of a
    dozen per-tensor passes; on the CPU reference step that is ~7%."""
    plist = list(params)
    fused = bool(plist) and all(p.device.type in ("cpu", "cuda") for p in plist)
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    return cls(plist, lr=lr, weight_decay=weight_decay, fused=fused or None)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """`optimizer.load_state_dict(state)`, keeping this run's kernel choice: a checkpoint's
    groups carry the choice of the run that wrote it (e.g. not fused, from before CPU Adam
    was fused, or on another device). torch places a loaded step counter by the *saved*
    group's choice (on the parameter's device, float32, only for a fused or capturable
    one), so for a group fused here the counters are placed as the fused kernel needs."""
    kernels = [{k: g.get(k) for k in ("fused", "foreach")} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)  # type: ignore[arg-type]
    for group, chosen in zip(optimizer.param_groups, kernels, strict=True):
        group.update(chosen)
        if not (group.get("fused") or group.get("capturable")):
            continue
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor) and (
                step.device != p.device or step.dtype != torch.float32
            ):
                optimizer.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)


def build_optimizer(params: Iterable[nn.Parameter], hp: DQNHyperParams) -> torch.optim.Optimizer:
    """The configured optimizer with `l2_decay` as weight decay."""
    plist = list(params)
    lr, wd = hp.learning_rate, hp.l2_decay
    if hp.optimizer in ("adam", "adamw"):
        return adam(plist, lr, weight_decay=wd, decoupled=hp.optimizer == "adamw")
    if hp.optimizer == "sgd":
        return torch.optim.SGD(plist, lr=lr, weight_decay=wd)
    return torch.optim.RMSprop(plist, lr=lr, weight_decay=wd)


def td_loss(q: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean squared or Huber (δ = 1) error between Q and its (detached) target."""
    if kind == "huber":
        return F.smooth_l1_loss(q, target, beta=1.0)
    return F.mse_loss(q, target)


class SoftUpdate:
    """target ← (1 − τ)·target + τ·online, one fused foreach kernel over all parameters.

    The parameter lists are taken once: walking the module tree every step costs more
    than the update itself on a CPU. They hold the `Parameter` objects, which `.to()` and
    an in-place `load_state_dict` keep; whatever replaces them (`load_state_dict(...,
    assign=True)`, buffers moved by `.to()`) must call `refresh()`."""

    def __init__(self, target: nn.Module, online: nn.Module):
        self.target, self.online = target, online
        self.refresh()

    def refresh(self) -> None:
        self.targets: list[torch.Tensor] = list(self.target.parameters())
        self.sources: list[torch.Tensor] = list(self.online.parameters())
        self.buffers = list(zip(self.target.buffers(), self.online.buffers(), strict=True))

    @torch.no_grad()
    def __call__(self, tau: float) -> None:
        if self.targets:
            foreach_lerp_(self.targets, self.sources, tau)
        for t_buf, o_buf in self.buffers:
            t_buf.copy_(o_buf)


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """One soft update of `target` towards `online` (see `SoftUpdate`)."""
    SoftUpdate(target, online)(tau)


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row max and argmax of `values` [B, K] over entries with `mask` > 0.

    Masked entries are replaced by the dtype's lowest finite value rather than −inf so that
    nothing downstream sees inf − inf. Returns (max, argmax); a row with no valid entry
    gets max 0 (and an arbitrary argmax).
    """
    valid = mask > 0
    best, idx = _lowest_where_invalid(values, valid).max(dim=1)
    return torch.where(valid.any(dim=1), best, 0.0), idx


def masked_argmax(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row argmax of `values` [B, K] over entries with `mask` > 0 (ties: the first, as
    `masked_max`) and whether the row has any such entry (if not, the index is arbitrary)."""
    valid = mask > 0
    return _lowest_where_invalid(values, valid).argmax(dim=1), valid.any(dim=1)


def double_q_value(
    online_q: torch.Tensor, target_q: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Double Q's next-state value [B]: `target_q` at the action the online net rates best
    among those with `mask` > 0 (ties: the first, as `masked_max`); rows with none get 0."""
    best, any_valid = masked_argmax(online_q, mask)
    value = target_q.gather(1, best.unsqueeze(1)).squeeze(1)
    return torch.where(any_valid, value, 0.0)


def _lowest_where_invalid(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`values` with entries not `valid` replaced by the dtype's lowest finite value."""
    return torch.where(valid, values, torch.finfo(values.dtype).min)


def masked_logsumexp(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row logsumexp over valid entries; rows with none give 0 (finite value and gradient)."""
    valid = mask > 0
    lse = _lowest_where_invalid(values, valid).logsumexp(dim=1)
    return torch.where(valid.any(dim=1), lse, 0.0)


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


class BackwardSeed:
    """`seed(loss, scale)`: what `loss.backward()` starts from so that every gradient comes
    out multiplied by `scale` (None for 1: autograd's own seed). The factor is a device
    scalar made once per (scale, dtype, device), so inside a captured step it costs no
    kernel: a micro-batch's 1/n, and where the caller's all-reduce does not divide, the
    1/world size of gradient averaging, ride on the backward itself."""

    def __init__(self) -> None:
        self._seeds: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}

    def __call__(self, loss: torch.Tensor, scale: float) -> torch.Tensor | None:
        if scale == 1.0:
            return None
        key = (scale, loss.dtype, loss.device)
        seed = self._seeds.get(key)
        if seed is None:
            seed = self._seeds[key] = torch.full((), scale, dtype=loss.dtype, device=loss.device)
        return seed


class QLearningTrainer(Generic[BatchT]):
    """Shared trainer: target net, optimizer, scheduler, loss, step and soft updates.

    Subclasses implement `_q_logged` (Q of the logged action with grad through a given
    module, plus the scores of the candidate set that CQL regularises), `_next_value`
    (value of the next state, called without grad), `_reward` and `_terminal`.

    `q_net` may be a DDP/DP wrapper around `online`: `train_step` forwards through it (so
    its hooks run) unless told to average the gradients itself (`grad_sync`); grad-free
    forwards, evaluation (`eval_td_loss`) and the target copy use the plain module.
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
        self.optimizer = build_optimizer(self.online.parameters(), hparams)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, hparams.lr_decay)
        self._soft_update = SoftUpdate(self.target, self.online)
        self._optimized = [p for g in self.optimizer.param_groups for p in g["params"]]
        self._seed = BackwardSeed()

    def modules(self) -> list[nn.Module]:
        """The modules a step changes (parameters and buffers): online and target."""
        return [self.online, self.target]

    # -- the per-workflow part --------------------------------------------------------------
    def _q_logged(self, batch: BatchT, net: nn.Module) -> QLogged:
        """(Q of logged action [B] by `net` (`q_net` or `online`), Q of the current
        candidates [B, K] — what CQL regularises, masked by `batch.possible_actions_mask` —,
        and a loss the subclass adds from the same forward, or None)."""
        raise NotImplementedError

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
            self.hp.gamma, batch.time_diff, use_time_diff=self.hp.use_seq_num_diff_as_time_diff
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
        the logged action, averaged over the batch.
        """
        target = self.compute_target(batch)
        q, candidate_q, own_loss = self._q_logged(batch, self.q_net if net is None else net)
        td = td_loss(q, target, self.hp.q_network_loss)
        if self.hp.cql_alpha > 0.0:
            # The mask is read only here: without CQL its rows are never gathered.
            cql = (masked_logsumexp(candidate_q, batch.possible_actions_mask) - q).mean()
            total = td + self.hp.cql_alpha * cql
        else:
            cql = torch.zeros((), device=q.device, dtype=q.dtype)
            total = td
        if own_loss is not None:  # e.g. BCQ's imitation network, trained in the same step
            total = total + own_loss
        return DQNLoss(td.detach(), cql.detach(), total, q.detach().mean())

    def train_step(
        self,
        batches: Sequence[BatchT],
        grad_sync: Callable[[], None] | None = None,
        loss: Callable[[BatchT, nn.Module], DQNLoss] | None = None,
        apply: Callable[[], None] | None = None,
        loss_scale: float = 1.0,
    ) -> DQNLoss:
        """One optimizer step over `batches` (the `minibatches_per_step` micro-batches).

        Gradients of equal-sized micro-batches are accumulated with each loss divided by
        their number, which equals one step on their union. Without `grad_sync` the forward
        goes through `q_net` (under DDP the all-reduce runs only on the last micro-batch's
        backward); with it, through the plain `online` module, and `grad_sync()` averages
        the gradients over the ranks once they are accumulated, before clipping — what a
        CUDA graph, which cannot hold DDP's hooks, does. `loss(batch, net)` replaces
        `compute_loss` (a compiled version of it, `training.compiled.CompiledLoss`), and
        `apply()` replaces `apply_update` (`training.compiled.CompiledApply`).
        `loss_scale` multiplies every gradient (`grad_sync.loss_scale`: the 1/world size of
        an average whose all-reduce does not divide), through the backward's seed.
        """
        n = len(batches)
        if n == 0:
            raise ValueError("train_step needs at least one batch")
        # Through the DDP wrapper its hooks divide: a scale as well would divide twice.
        assert loss_scale == 1.0 or grad_sync is not None, "loss_scale without grad_sync"
        net = self.q_net if grad_sync is None else self.online
        for p in self._optimized:  # = optimizer.zero_grad(set_to_none=True), minus its wrapper
            p.grad = None
        records = []
        no_sync = getattr(net, "no_sync", None)
        for i, batch in enumerate(batches):
            ctx = no_sync() if (no_sync is not None and i < n - 1) else contextlib.nullcontext()
            with ctx:
                record = self.compute_loss(batch, net=net) if loss is None else loss(batch, net)
                record.total.backward(self._seed(record.total, loss_scale / n))
            records.append(record.detach())
        if grad_sync is not None:
            grad_sync()
        if self.hp.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.hp.clip_grad_norm)
        (self.apply_update if apply is None else apply)()
        return DQNLoss.mean(records)

    def apply_update(self) -> None:
        """The optimizer step on the gradients in place, then the soft target update."""
        self.optimizer.step()
        self._soft_update(self.hp.target_update_rate)

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
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.online.load_state_dict(state["q_net"])
        self.target.load_state_dict(state["target"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._soft_update.refresh()
