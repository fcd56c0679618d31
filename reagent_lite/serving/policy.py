"""`Policy`: an exported model that acts with exploration and logs every decision with
its propensity, for users who embed it (`reagent_lite.Policy`) and for `reagent-lite serve`,
which batches its HTTP requests into `act_batch` (one code path for both).

    with reagent_lite.Policy("outputs/cartpole_dqn", exploration="epsilon:0.1",
                             log_dir="logs/round1", seed=0) as policy:
        d = policy.act({"0": 0.1, "1": -0.3}, possible_actions=["0", "1"])
        policy.feedback(d.decision_id, reward=1.0)

The model is loaded as `predict` loads it (model_meta.json's digest checked against
model.pt2, the program's signature against the meta); `reload` swaps in a new one
atomically, and each decision names the model that made it (`model_id`).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import ValidationError

from reagent_lite.errors import ConfigError
from reagent_lite.kinds.serving import Choice, RequestError
from reagent_lite.serving.exploration import Exploration, sample
from reagent_lite.serving.model_files import LoadedModel, load_model_files
from reagent_lite.serving.schemas import ActRequest, FeedbackRequest, describe_errors

if TYPE_CHECKING:
    from reagent_lite.serving.decision_log import DecisionLog, DecisionRecord

# Episodes whose last sequence number is remembered (least recently used forgotten first):
# a client that sends `mdp_id` without `sequence_number` continues its episode.
EPISODES_KEPT = 100_000


def _invalid(err: ValidationError) -> RequestError:
    """Pydantic's errors as a `RequestError`, each already naming its field."""
    loc = err.errors()[0].get("loc", ()) if err.errors() else ()
    return RequestError.whole(str(loc[0]) if loc else "request", describe_errors(err))


@dataclass(frozen=True)
class Decision:
    """What `act` decided: the fields `POST /v1/act` answers with."""

    decision_id: str
    action: str | int  # dqn: the action name; parametric: the candidate's index
    propensity: float
    probabilities: list[float]  # one per possible action, in the request's order
    model_id: str
    mdp_id: str
    sequence_number: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Row:
    """One request, checked against the model and laid out in its feature order."""

    request: ActRequest
    state: np.ndarray  # [F] raw values, NaN = absent
    choice: Choice  # its actions, as the model's kind reads and names them


class Policy:
    """An exported model that explores and (with `log_dir`) logs each decision."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        exploration: str | Exploration = "greedy",
        log_dir: str | os.PathLike[str] | None = None,
        seed: int | None = None,
        *,
        flush_interval_s: float = 1.0,
        feedback_window_s: float = 600.0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.exploration = (
            exploration if isinstance(exploration, Exploration) else Exploration.parse(exploration)
        )
        self._model: LoadedModel = load_model_files(self.model_dir)
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self._episodes: OrderedDict[str, int] = OrderedDict()
        self.counts = {"decisions": 0, "model_calls": 0, "reloads": 0}
        self._log: DecisionLog | None = None
        if log_dir is not None:
            from reagent_lite.serving.decision_log import DecisionLog

            self._log = DecisionLog(
                Path(log_dir),
                self._model.kind,
                flush_interval_s=flush_interval_s,
                feedback_window_s=feedback_window_s,
            )

    @property
    def model(self) -> LoadedModel:
        """The model now serving (replaced whole by `reload`, never changed in place)."""
        return self._model

    def act(
        self,
        state_features: Mapping[str | int, float],
        possible_actions: Sequence[str] | Sequence[Mapping[str | int, float]] | None = None,
        mdp_id: str | None = None,
        sequence_number: int | None = None,
    ) -> Decision:
        """One decision (see `POST /v1/act`); `RequestError` names a bad field, and
        `LogUnavailable` says the decision could not be logged (nothing was decided)."""
        body: dict[str, Any] = {"state_features": _str_keys(state_features)}
        if possible_actions is not None:
            body["possible_actions"] = [
                _str_keys(a) if isinstance(a, Mapping) else a for a in possible_actions
            ]
        body.update(mdp_id=mdp_id, sequence_number=sequence_number)
        try:
            request = ActRequest.model_validate(body)
        except ValidationError as err:
            raise _invalid(err) from None
        (outcome,) = self.act_batch([request])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def act_batch(self, requests: Sequence[ActRequest]) -> list[Decision | Exception]:
        """A decision (or the error that stopped it) per request, from one model call."""
        model = self._model  # one model for the whole batch, whatever reload does meanwhile
        rows: list[_Row] = []
        outcomes: list[Decision | Exception | None] = [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                rows.append(_prepare(model, request))
            except RequestError as err:
                outcomes[i] = err
        q_rows = self._q_values(model, rows) if rows else []
        done = iter(zip(rows, q_rows, strict=True))
        for i in range(len(requests)):
            if outcomes[i] is None:
                row, q = next(done)
                try:
                    outcomes[i] = self._decide(model, row, q)
                except Exception as err:  # LogUnavailable: this decision is not answered
                    outcomes[i] = err
        return [o for o in outcomes if o is not None]

    def _q_values(self, model: LoadedModel, rows: list[_Row]) -> list[np.ndarray]:
        """The Q-value of each row's possible actions, in its order: one model call."""
        from reagent_lite.data.scoring import values_and_presence

        state = values_and_presence(np.stack([r.state for r in rows]).astype(np.float32))
        with torch.no_grad():
            out = model.acting.q_values(model.program, state, [r.choice for r in rows])
        with self._lock:
            self.counts["model_calls"] += 1
        return out

    def _decide(self, model: LoadedModel, row: _Row, q: np.ndarray) -> Decision:
        probs = self.exploration.probabilities(q, row.choice.rank)
        request = row.request
        with self._lock:
            index = sample(probs, float(self._rng.random()))
            mdp_id, seq = self._episode_step(request.mdp_id, request.sequence_number)
        decision = Decision(
            decision_id=uuid.uuid4().hex,
            action=row.choice.answers[index],
            propensity=float(probs[index]),
            probabilities=[float(p) for p in probs],
            model_id=model.model_id,
            mdp_id=mdp_id,
            sequence_number=seq,
        )
        if self._log is not None:
            from reagent_lite.serving.decision_log import RecordRefused

            try:
                self._log.record(self._record(row, decision, index))
            except RecordRefused as err:  # a row the timeline would refuse: a bad request
                raise RequestError.whole("request", str(err)) from None
        with self._lock:
            self.counts["decisions"] += 1
        return decision

    def _episode_step(self, mdp_id: str | None, seq: int | None) -> tuple[str, int]:
        """The decision's episode and step: a generated id starts a new episode at 0; a
        known one without a number continues one after its last."""
        if mdp_id is None:
            mdp_id = uuid.uuid4().hex
        if seq is None:
            last = self._episodes.get(mdp_id)
            seq = 0 if last is None else last + 1
        self._episodes[mdp_id] = seq
        self._episodes.move_to_end(mdp_id)
        if len(self._episodes) > EPISODES_KEPT:
            self._episodes.popitem(last=False)
        return mdp_id, seq

    def _record(self, row: _Row, decision: Decision, index: int) -> DecisionRecord:
        from reagent_lite.serving.decision_log import DecisionRecord

        state = {int(k): v for k, v in row.request.state_features.items()}
        return DecisionRecord(
            decision_id=decision.decision_id,
            mdp_id=decision.mdp_id,
            sequence_number=decision.sequence_number,
            state_features=state,
            action=row.choice.logged[index],
            possible_actions=row.choice.logged,
            action_probability=decision.propensity,
            model_id=decision.model_id,
            time_s=time.time(),
        )

    def feedback(
        self, decision_id: str, reward: float, metrics: Mapping[str, float] | None = None
    ) -> bool:
        """Joins a reward (and optional metrics) to a logged decision; False when the id is
        unknown or older than the feedback window."""
        if self._log is None:
            raise ConfigError("feedback: this Policy has no log_dir (give log_dir= to log)")
        try:
            body = FeedbackRequest(
                decision_id=decision_id,
                reward=reward,
                metrics=None if metrics is None else dict(metrics),
            )
        except ValidationError as err:
            raise _invalid(err) from None
        return self._log.feedback(body.decision_id, body.reward, body.metrics)

    def reload(self) -> LoadedModel:
        """Loads the model now in `model_dir` and serves it from the next batch on; a model
        that fails the checks raises `ConfigError` and the old one keeps serving."""
        new = load_model_files(self.model_dir)
        if new.kind != self._model.kind:
            raise ConfigError(
                f"--model: '{self.model_dir}' now holds a {new.kind} model; this policy serves"
                f" (and logs) {self._model.kind} decisions: refused"
            )
        self._model = new  # one reference assignment: a batch sees the old or the new
        with self._lock:
            self.counts["reloads"] += 1
        return new

    def stats(self) -> dict[str, Any]:
        """Decisions, model calls and reloads so far, and the log's counts (`log`)."""
        with self._lock:
            out: dict[str, Any] = dict(self.counts)
        if self._log is not None:
            out["log"] = dict(self._log.stats())
        return out

    def close(self) -> None:
        """Writes every logged decision and feedback out; idempotent."""
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> Policy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _str_keys(features: Mapping[Any, Any]) -> dict[Any, Any]:
    return {str(k) if isinstance(k, int) else k: v for k, v in features.items()}


def _prepare(model: LoadedModel, request: ActRequest) -> _Row:
    """`request` checked against `model`: known state features here, its actions by the
    model's kind (`RequestError` naming the field)."""
    state = model.state_row(request.state_features)
    if np.isnan(state).all():
        ids = model.state_ids
        raise RequestError(
            "state_features",
            f"holds none of the model's state features (expected some of the ids"
            f" {ids[:8]}{' ...' if len(ids) > 8 else ''})",
        )
    return _Row(request, state, model.acting.choose(request.possible_actions))
