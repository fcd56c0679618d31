"""Row-wise maxima, argmaxima and logsumexp of Q over the entries a mask allows (the
possible actions, or a row's candidates), finite where a row allows none."""

from __future__ import annotations

import math

import torch


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


def behavior_certainty(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 − H(p) / log n per row [B], p = softmax of `logits` [B, A] over the n entries with
    `mask` > 0: 0 for a uniform p, 1 for a one-hot one (and for rows with n ≤ 1, where
    there is no choice). Detached: it weights a loss, it is not trained through it."""
    logits = logits.detach().float()
    valid = mask > 0
    log_p = _lowest_where_invalid(logits, valid).log_softmax(dim=1)
    # Masked entries have p = 0; 0 · log 0 is taken as 0 (where, not a product with −huge).
    entropy = -torch.where(valid, log_p.exp() * log_p, 0.0).sum(dim=1)
    n = valid.sum(dim=1)
    log_n = torch.log(n.clamp(min=2).to(logits.dtype))
    return torch.where(n > 1, (1.0 - entropy / log_n).clamp(0.0, 1.0), 1.0)


# `certainty_switch`: the share of a batch's rows whose certainty is looked at, and the
# certainty they must reach. Measured on the training states of trained imitators
# (benchmarks/RESULTS.md): the top 1% sit at 0.03 on uniformly random Acrobot logs, at
# 0.42–0.96 where any logger was sure of itself somewhere (Acrobot 60% random / 40%
# heuristic, heuristic, LunarLander 60/40); 0.1 is between, with a margin of 3× or more.
SWITCH_TOP_ROWS = 0.01
SWITCH_LEVEL = 0.1
# Optimizer steps with the full penalty whatever the imitator says: an untrained imitator
# looks uniform. On the Acrobot 60/40 logs the switch came on within 200 steps; with no
# such start one of five seeds failed there, with 560 one of three all-random seeds did.
SWITCH_FIRST_STEPS = 200


def certainty_switch(certainty: torch.Tensor) -> torch.Tensor:
    """1 (0-d, `certainty`'s dtype) when the batch's top `SWITCH_TOP_ROWS` of rows by
    `certainty` [B] all reach `SWITCH_LEVEL`, else 0: is the logger sure anywhere? A
    top share, not the mean: a mix of a uniform and a sure logger has a mean as low as
    the uniform's alone."""
    k = max(1, math.ceil(certainty.numel() * SWITCH_TOP_ROWS))
    kth_largest = certainty.topk(k).values[-1]
    return (kth_largest >= SWITCH_LEVEL).to(certainty.dtype)
