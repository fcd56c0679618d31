"""Counterfactual evaluation of the current Q-network on the eval table (rank 0 only).

Turns networks + eval tensors into the arrays the pure estimators of `cpe.py` and
`sequential.py` take; the learned policy is a softmax over Q / temperature restricted to
the possible actions (or candidates), as in ReAgent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from reagent_lite.evaluation.cpe import one_step_estimates
from reagent_lite.evaluation.cpe_models import CpeNets, gather_logged, masked_softmax
from reagent_lite.evaluation.sequential import sequential_estimates
from reagent_lite.training.tensordict import TensorDict

_CHUNK = 65_536


@torch.no_grad()
def _predict(kind: Any, net: nn.Module, data: TensorDict) -> Tensor:
    parts = [kind.q_all(net, chunk, next_state=False) for chunk in data.chunks(_CHUNK)]
    return torch.cat(parts).float()


def evaluate_cpe(
    kind: Any,
    q_net: nn.Module,
    cpe_nets: CpeNets,
    data: TensorDict,
    *,
    temperature: float,
    gamma: float,
    n_bootstrap: int,
    seed: int,
) -> dict[str, dict[str, float | None]]:
    """All CPE estimates for the softmax policy of `q_net` on `data` (eval tensors)."""
    was_training = q_net.training, cpe_nets.training
    q_net.eval()
    cpe_nets.eval()
    try:
        q = _predict(kind, q_net, data)
        r_hat = _predict(kind, cpe_nets.reward_net, data)
        q_hat = _predict(kind, cpe_nets.value_net, data)
    finally:
        q_net.train(was_training[0])
        cpe_nets.train(was_training[1])
    mask = kind.candidate_mask(data, next_state=False).float()
    idx = kind.logged_index(data)
    probs = masked_softmax(q, mask, temperature)
    # Rows whose logged action is not among the candidates cannot be scored: drop them.
    keep = (idx >= 0).cpu().numpy()

    def np_(t: Tensor) -> np.ndarray:
        return t.detach().cpu().numpy()[keep]

    one_step = one_step_estimates(
        np_(probs),
        np_(idx),
        np_(data.propensity),
        np_(data.reward),
        np_(r_hat),
        np_(mask),
        n_bootstrap=n_bootstrap,
        seed=seed,
    )
    sequential = sequential_estimates(
        np_(data.mdp_id),
        np_(data.sequence_number),
        np_(data.reward),
        np_(data.propensity),
        np_(gather_logged(probs, idx)),
        np_(gather_logged(q_hat, idx)),
        np_((probs * q_hat).sum(-1)),
        gamma=gamma,
        n_bootstrap=n_bootstrap,
        seed=seed,
    )
    out = {name: est.to_dict() for name, est in {**one_step, **sequential}.items()}
    out["rows"] = {"scored": float(keep.sum()), "dropped": float((~keep).sum())}
    return out
