"""The models counterfactual evaluation needs, trained alongside the Q-network.

* reward model r̂(s, a): regression of the logged reward on (state, logged action);
* policy-value model q̂(s, a): the value of the evaluated policy π (`EvaluatedPolicy`:
  by default the greedy policy `model.pt2` serves), fitted by expected-SARSA targets
  r + γ^Δt Σ_a' π(a'|s') q̂_target(s', a').

Both are nets of the same shape as the Q-network (built by the workflow kind), so the
same code serves discrete actions and parametric candidates. No I/O, no ranks.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from reagent_lite.data.rows import Rows
from reagent_lite.discount import transition_discount
from reagent_lite.evaluation.diagnostics import CpeNotices
from reagent_lite.trainers.common import unwrap
from reagent_lite.trainers.optim import (
    OptimizerKernel,
    SoftUpdate,
    adam,
    load_optimizer_state,
)

_NEG = -1e9


def masked_softmax(q: Tensor, mask: Tensor, temperature: float) -> Tensor:
    """Softmax of q / temperature over the entries where mask is 1; all-masked rows → 0."""
    logits = torch.where(mask > 0, q / temperature, torch.full_like(q, _NEG))
    probs = torch.softmax(logits, dim=-1) * (mask > 0)
    return probs / probs.sum(dim=-1, keepdim=True).clamp_min(1e-12)


def masked_greedy(q: Tensor, mask: Tensor) -> Tensor:
    """One-hot [B, K] of the best entry of q where mask is 1; all-masked rows → 0.

    Ties go to the first (lowest-index) candidate: `torch.argmax` returns the first maximum,
    and so do the consumers of `model.pt2` (the online check, `predict`'s best action and
    its stable ranking), so this is the policy the exported model serves."""
    valid = mask > 0
    scores = torch.where(valid, q, torch.full_like(q, float("-inf")))
    best = scores.argmax(dim=-1, keepdim=True)
    hot = torch.zeros_like(q).scatter_(-1, best, 1.0)
    return hot * valid.any(dim=-1, keepdim=True).to(q.dtype)


@dataclass(frozen=True)
class EvaluatedPolicy:
    """The policy counterfactual evaluation values (`evaluation.policy`).

    "greedy" (the default) is the policy `model.pt2` serves: argmax of Q over each row's
    candidates, ties to the first. It is deterministic, so an importance weight is
    1/μ(a|s) where the logged action is the greedy one and 0 elsewhere. "softmax" is
    softmax(Q / temperature) over the candidates: a policy nobody serves, reported under
    its own name for comparison with ReAgent's numbers."""

    name: Literal["greedy", "softmax"] = "greedy"
    temperature: float = 1.0

    def probs(self, q: Tensor, mask: Tensor) -> Tensor:
        """[B, K] probabilities over the candidates (mask 1); all-masked rows → 0."""
        if self.name == "greedy":
            return masked_greedy(q, mask)
        return masked_softmax(q, mask, self.temperature)

    def describe(self) -> dict[str, Any]:
        """What metrics.jsonl, model_meta.json and the report say was evaluated."""
        if self.name == "greedy":
            return {"name": "greedy", "temperature": None, "served_by_model": True}
        return {"name": "softmax", "temperature": self.temperature, "served_by_model": False}

    @property
    def label(self) -> str:
        if self.name == "greedy":
            return "greedy policy (what model.pt2 serves)"
        return f"softmax(Q / {self.temperature:g}) policy (not what model.pt2 serves)"


def gather_logged(q: Tensor, index: Tensor) -> Tensor:
    """q[i, index[i]], with 0 where index is -1 (logged action not among candidates)."""
    safe = index.clamp_min(0).unsqueeze(-1)
    return torch.where(
        index >= 0, q.gather(-1, safe).squeeze(-1), torch.zeros_like(index, dtype=q.dtype)
    )


class CpeNets(nn.Module):
    def __init__(self, reward_net: nn.Module, value_net: nn.Module):
        super().__init__()
        self.reward_net = reward_net
        self.value_net = value_net
        # One per run, like these models: the CPE warnings already given (said once).
        self.notices = CpeNotices()

    def forward(self, batch: Rows, kind: Any) -> tuple[Tensor, Tensor]:
        # Both heads in one forward, so that a DDP wrapper syncs both gradients.
        return (
            kind.q_all(self.reward_net, batch, next_state=False),
            kind.q_all(self.value_net, batch, next_state=False),
        )


class CpeModelTrainer:
    """The maths of both CPE models, one optimizer step of them per training step of the
    Q-network (the step itself is `training.update.cpe_step`'s: the Q-network's code path).

    `nets` may be a DDP wrapper around the `CpeNets` (`plain`): the step forwards through
    it unless it averages the gradients itself."""

    def __init__(
        self,
        kind: Any,
        nets: nn.Module,
        *,
        gamma: float,
        policy: EvaluatedPolicy,
        target_update_rate: float,
        learning_rate: float,
        use_time_diff: bool,
        optimizer_kernel: OptimizerKernel | None = None,
    ):
        self.kind = kind
        self.nets = nets  # possibly DDP-wrapped CpeNets
        plain = unwrap(nets)
        assert isinstance(plain, CpeNets)
        self.plain: CpeNets = plain
        self.target_value = copy.deepcopy(plain.value_net).requires_grad_(False)
        self._soft_update = SoftUpdate(self.target_value, plain.value_net)
        self.gamma = gamma
        self.policy = policy
        self.tau = target_update_rate
        self.use_time_diff = use_time_diff
        # The step plan's kernel (default: the eager one); the learning rate never changes
        # here, so it stays a number even where the Q-trainer's is a device tensor.
        kernel = optimizer_kernel or OptimizerKernel.eager(next(plain.parameters()).device)
        kernel = dataclasses.replace(kernel, tensor_lr=False)
        self.optimizer = adam(nets.parameters(), learning_rate, kernel=kernel)
        self._params = list(nets.parameters())

    def modules(self) -> list[nn.Module]:
        """The modules a step changes (parameters and buffers)."""
        return [self.plain, self.target_value]

    def parameters(self) -> list[nn.Parameter]:
        """The parameters the optimizer steps: both models'."""
        return self._params

    def compute_loss(self, batch: Rows, q_net: nn.Module, nets: nn.Module) -> Tensor:
        """Both models' loss on `batch` (fields read as attributes), forwarding through
        `nets` (`self.nets` or the plain `CpeNets`); `q_net` (the plain Q-network, no
        gradient) gives the policy whose value is fitted."""
        kind = self.kind
        with torch.no_grad():
            q_next = kind.q_all(q_net, batch, next_state=True)
            mask_next = kind.candidate_mask(batch, next_state=True)
            pi_next = self.policy.probs(q_next, mask_next)
            v_next = (pi_next * kind.q_all(self.target_value, batch, next_state=True)).sum(-1)
            discount = transition_discount(
                self.gamma, lambda: batch.time_diff, use_time_diff=self.use_time_diff
            )
            target = batch.reward + (1.0 - batch.terminal) * discount * v_next
        idx = kind.logged_index(batch)
        valid = (idx >= 0).to(batch.reward.dtype)
        denom = valid.sum().clamp_min(1.0)
        r_hat, q_hat = nets(batch, kind)
        # Rows without a logged action count for nothing, even where the reward is not finite.
        reward_err = torch.where(valid > 0, gather_logged(r_hat, idx) - batch.reward, 0.0)
        value_err = F.smooth_l1_loss(gather_logged(q_hat, idx), target, reduction="none")
        value_err = torch.where(valid > 0, value_err, 0.0)
        return ((reward_err**2).sum() + value_err.sum()) / denom

    def apply_update(self) -> None:
        """The optimizer step on the gradients in place, then the target value net's soft
        update."""
        self.optimizer.step()
        self._soft_update(self.tau)

    def state_dict(self) -> dict[str, Any]:
        return {
            "nets": self.plain.state_dict(),
            "target_value": self.target_value.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.plain.load_state_dict(state["nets"])
        self.target_value.load_state_dict(state["target_value"])
        load_optimizer_state(self.optimizer, state["optimizer"])
        self._soft_update.refresh()
