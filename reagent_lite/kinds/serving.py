"""The serving part of a kind: how a served model acts on one request.

`reagent_lite.serving` (the in-process `Policy` and `reagent-lite serve`) knows requests,
exploration, episodes and the decision log; what differs between kinds is here, behind
`Acting`, which a kind builds for a model's feature space (`Kind.acting`):

* which actions a request offers, checked against the model (`choose`): a `Choice`
  holding what the response names them (`answers`), their tie-break order (`rank`), what
  the decision log records for them (`logged`) and the array the model call reads;
* the model's Q for each request's actions, from one call of the program (`q_values`);
* what `GET /v1/model` shows of the model's actions (`describe`).

The decision log's `action` column type is a class attribute of the kind
(`Kind.log_action`), since a log is opened before any model space is known.

`RequestError` lives here, not in `serving/`, because the kinds raise it and the serving
package imports the kinds (never the other way round).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from reagent_lite.errors import ConfigError, DataError

if TYPE_CHECKING:
    from torch import Tensor

# What a request offers: action names, candidate feature maps (id → raw value), or None
# (the request names none: the kind decides what that means).
Offered = Sequence[str] | Sequence[Mapping[str, float]] | None


class RequestError(DataError):
    """A request the model cannot act on; `field` names the request field at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field

    @classmethod
    def whole(cls, field: str, message: str) -> RequestError:
        """An error whose `message` names its fields itself."""
        out = cls(field, "")
        out.args = (message,)
        return out


class NotServed(ConfigError):
    """A model of a kind that is scored (`predict`) but not served."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"a {kind} model cannot be served (its kind has no `acting`)")
        self.kind = kind


@dataclass(frozen=True)
class Choice:
    """One request's actions, checked against the model, in the request's order."""

    answers: list[str] | list[int]  # what the response calls each action
    rank: np.ndarray  # [n] ties go to the lowest rank (as `predict` breaks them)
    logged: list[str] | list[dict[int, float]]  # the decision log's `possible_actions`
    inputs: np.ndarray  # what `q_values` reads for this request (the kind's layout)


def feature_row(features: Mapping[str, float], index: Mapping[str, int]) -> np.ndarray:
    """`features` as one row in the model's order, NaN where absent (an id the model was
    not trained on is ignored, as `predict` ignores it)."""
    out = np.full(len(index), np.nan, np.float32)
    for fid, value in features.items():
        j = index.get(fid)
        if j is not None:
            out[j] = value
    return out


class Acting(ABC):
    """How a served model of one kind acts (see the module notes). Immutable: a policy
    keeps it with the model it was built for and swaps both together on reload."""

    @abstractmethod
    def describe(self) -> dict[str, list[str]]:
        """The model's actions as `GET /v1/model` shows them (beside its state ids)."""

    @abstractmethod
    def choose(self, offered: Offered) -> Choice:
        """The request's `possible_actions` checked against the model; `RequestError`
        naming the field (and the entry) at fault."""

    @abstractmethod
    def q_values(
        self,
        program: Callable[..., Tensor],
        state: tuple[Tensor, Tensor],
        choices: Sequence[Choice],
    ) -> list[np.ndarray]:
        """Q of each choice's actions, in its order, from one call of `program` on the
        batch's state (values, presence) and what the choices hold."""
