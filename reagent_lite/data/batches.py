"""Batch types: the tensors one shard of logged transitions becomes.

Every field is a torch tensor whose leading dimension is the number of transitions N, so
the generic helpers below (move, index, length) walk `dataclasses.fields` and adding a field
is one line. State and action features are stored raw, with a presence mask (1 = present);
normalization happens later, with the same `Preprocessor` that is baked into the export.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

_T = TypeVar("_T", bound="_TensorBatch")


class _TensorBatch:
    """Generic helpers shared by the batch dataclasses (all fields are tensors [N, ...])."""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    def fields(self) -> dict[str, torch.Tensor]:
        """The tensors by field name, in declaration order."""
        return {name: getattr(self, name) for name in self.field_names()}

    def _replace(self: _T, tensors: dict[str, torch.Tensor]) -> _T:
        return type(self)(**tensors)

    def to(self: _T, device: torch.device | str, non_blocking: bool = False) -> _T:
        """A copy with every tensor on `device` (tensors already there are not copied)."""
        return self._replace(
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.fields().items()}
        )

    def index(self: _T, idx: torch.Tensor) -> _T:
        """The rows `idx` (int64 indices or a bool mask along dim 0) of every field."""
        return self._replace({k: v[idx] for k, v in self.fields().items()})

    def pin_memory(self: _T) -> _T:
        return self._replace({k: v.pin_memory() for k, v in self.fields().items()})

    def nbytes(self) -> int:
        """Total bytes held by the tensors (for memory reports)."""
        return sum(v.element_size() * v.nelement() for v in self.fields().values())

    def __len__(self) -> int:
        first = next(iter(self.fields().values()))
        return int(first.shape[0])

    def _check_lengths(self) -> None:
        lengths = {k: int(v.shape[0]) for k, v in self.fields().items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{type(self).__name__}: fields differ in length: {lengths}")

    def __post_init__(self) -> None:
        self._check_lengths()

    @classmethod
    def concat(cls: type[_T], parts: list[_T]) -> _T:
        """Rows of several batches of the same type, in order."""
        names = cls.field_names()
        return cls(**{n: torch.cat([getattr(p, n) for p in parts]) for n in names})

    def summary(self) -> dict[str, Any]:
        """Shapes and dtypes by field (for logs and --dry_run)."""
        return {k: (tuple(v.shape), str(v.dtype)) for k, v in self.fields().items()}


@dataclass(eq=False)
class DiscreteTransitions(_TensorBatch):
    """Transitions with a discrete action set: F state features, A actions."""

    state: torch.Tensor  # float32 [N, F] raw values (0 where absent)
    state_presence: torch.Tensor  # float32 [N, F] 1 = present
    action: torch.Tensor  # int64 [N] index into the config's `actions`
    reward: torch.Tensor  # float32 [N]
    next_state: torch.Tensor  # float32 [N, F]
    next_state_presence: torch.Tensor  # float32 [N, F]
    next_action: torch.Tensor  # int64 [N], -1 when there is none (terminal)
    possible_actions_mask: torch.Tensor  # float32 [N, A]
    possible_next_actions_mask: torch.Tensor  # float32 [N, A]
    propensity: torch.Tensor  # float32 [N] logging-policy probability of `action`
    time_diff: torch.Tensor  # float32 [N] steps to the next state (discount exponent)
    terminal: torch.Tensor  # float32 [N] 1 = terminal
    mdp_id: torch.Tensor  # int64 [N] dense episode codes (per table)
    sequence_number: torch.Tensor  # int64 [N]


@dataclass(eq=False)
class ParametricTransitions(_TensorBatch):
    """Transitions whose actions are feature vectors: F state features, G action features,
    K candidate actions per row (padded; `*_mask` marks the real candidates)."""

    state: torch.Tensor  # float32 [N, F]
    state_presence: torch.Tensor  # float32 [N, F]
    next_state: torch.Tensor  # float32 [N, F]
    next_state_presence: torch.Tensor  # float32 [N, F]
    action: torch.Tensor  # float32 [N, G]
    action_presence: torch.Tensor  # float32 [N, G]
    next_action: torch.Tensor  # float32 [N, G] (all absent when terminal)
    next_action_presence: torch.Tensor  # float32 [N, G]
    possible_actions: torch.Tensor  # float32 [N, K, G]
    possible_actions_presence: torch.Tensor  # float32 [N, K, G]
    possible_actions_mask: torch.Tensor  # float32 [N, K]
    possible_next_actions: torch.Tensor  # float32 [N, K, G]
    possible_next_actions_presence: torch.Tensor  # float32 [N, K, G]
    possible_next_actions_mask: torch.Tensor  # float32 [N, K]
    action_index: torch.Tensor  # int64 [N] logged action's slot in possible_actions, -1 if absent
    reward: torch.Tensor  # float32 [N]
    propensity: torch.Tensor  # float32 [N]
    time_diff: torch.Tensor  # float32 [N]
    terminal: torch.Tensor  # float32 [N]
    mdp_id: torch.Tensor  # int64 [N]
    sequence_number: torch.Tensor  # int64 [N]
