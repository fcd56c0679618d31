"""The decision log's files: the step-log schema of its rows, part names, and the durable
write and read of one Parquet part (see `decision_log.py` for how they are used)."""

from __future__ import annotations

import datetime as dt
import math
import numbers
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reagent_lite.io_utils import atomic_write_bytes

JOURNAL_DIR = "_journal"  # the timeline skips names starting with "_"
# part-20261128T101500.123456Z-000001.parquet: UTC time in µs, then a sequence number.
_PART = re.compile(r"^part-(\d{8}T\d{6}\.\d{6})Z-(\d{6,})\.parquet$")
_TIME_FORMAT = "%Y%m%dT%H%M%S.%f"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

FeatureMap = Mapping[int, float]


@dataclass(frozen=True)
class DecisionRecord:
    """One decision as the server made it (the step of an episode it answers)."""

    decision_id: str
    mdp_id: str
    sequence_number: int
    state_features: dict[int, float]  # feature id -> value
    action: str | dict[int, float]  # dqn: action name; parametric: the chosen candidate's map
    possible_actions: list[str] | list[dict[int, float]]
    action_probability: float  # the exploration policy's exact probability of `action`
    model_id: str  # SHA-256 of the model.pt2 that made it
    time_s: float  # seconds since the epoch (UTC) when it was made


@dataclass(frozen=True)
class Row:
    """A decision with its outcome: one step-log row of a final part."""

    rec: DecisionRecord
    reward: float
    metrics: Mapping[str, float]
    feedback_missing: bool


_FMAP = pa.map_(pa.string(), pa.float64())


@dataclass(frozen=True)
class LogKind:
    """A served kind as its decision log sees it: its name (messages) and the type of its
    `action` column (`Kind.log_action`; `possible_actions` is a list of it)."""

    name: str
    action: pa.DataType

    def __str__(self) -> str:
        return self.name


def log_kind(kind: str) -> LogKind:
    """The registered kind `kind` as its decision log sees it; `ValueError` naming the
    served kinds for another name."""
    from reagent_lite.kinds import get_kind, served_kinds

    served = served_kinds()
    action = get_kind(kind).log_action if kind in served else None
    if action is None:
        raise ValueError(f"kind is {kind!r}; expected one of {', '.join(served)}")
    return LogKind(kind, action)


def schema(kind: LogKind) -> pa.Schema:
    """Step-log columns the timeline reads (docs/TIMELINE.md "Input"), then the columns it
    carries through: metrics, decision_id, model_id, decision_time, feedback_missing."""
    return pa.schema(
        [
            ("mdp_id", pa.string()),
            ("sequence_number", pa.int64()),
            ("state_features", _FMAP),
            ("action", kind.action),
            ("reward", pa.float64()),
            ("possible_actions", pa.list_(kind.action)),
            ("action_probability", pa.float64()),
            ("metrics", _FMAP),
            ("decision_id", pa.string()),
            ("model_id", pa.string()),
            ("decision_time", pa.timestamp("us", tz="UTC")),
            ("feedback_missing", pa.bool_()),
        ]
    )


def _fmap(features: FeatureMap) -> list[tuple[str, float]]:
    # Feature ids are strings of digits in every table reagent-lite reads (as in ReAgent).
    return [(str(int(k)), float(v)) for k, v in features.items()]


def is_number(value: object) -> bool:
    """A finite real number (numpy's too; not a bool, not a string)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_record(rec: DecisionRecord, kind: LogKind) -> str | None:
    """What is wrong with `rec` (naming the field) when the timeline would refuse its row,
    or when it could not be written at all (a value of the wrong type, found here rather
    than by the flusher, where it would hold up every row after it)."""
    for name in ("decision_id", "mdp_id", "model_id"):
        if not isinstance(getattr(rec, name), str):
            return f"decision {rec.decision_id!r}: {name} is {getattr(rec, name)!r}; expected a str"
    for name, value in (("sequence_number", rec.sequence_number), ("time_s", rec.time_s)):
        if not is_number(value) or (name == "sequence_number" and int(value) != value):
            return f"decision {rec.decision_id!r}: {name} is {value!r}; expected a finite number"
    if not isinstance(rec.state_features, Mapping) or not isinstance(
        rec.possible_actions, (list, tuple)
    ):
        return (
            f"decision {rec.decision_id!r}: state_features is a {type(rec.state_features)} "
            f"and possible_actions a {type(rec.possible_actions)}; expected a dict and a list"
        )
    p = rec.action_probability
    if not is_number(p) or not 0.0 < p <= 1.0:
        return (
            f"decision {rec.decision_id!r}: action_probability is {p!r}; expected a number "
            "in (0, 1]"
        )
    # The action column's type says what a decision's actions are: names or feature maps.
    names = pa.types.is_string(kind.action)
    want, what = (
        (str, "action names (str)") if names else (Mapping, "feature maps (dict[int, float])")
    )
    if not isinstance(rec.action, want) or not all(
        isinstance(a, want) for a in rec.possible_actions
    ):
        return (
            f"decision {rec.decision_id!r}: a {kind} decision's action and possible_actions "
            f"are {what}; got action {rec.action!r}"
        )
    maps: list[tuple[str, FeatureMap]] = [("state_features", rec.state_features)]
    if isinstance(rec.action, Mapping):
        maps.append(("action", rec.action))
        maps += [
            (f"possible_actions[{i}]", a)
            for i, a in enumerate(rec.possible_actions)
            if isinstance(a, Mapping)
        ]
    for name, features in maps:
        for k, v in features.items():
            if not isinstance(k, numbers.Integral) or k < 0 or not is_number(v):
                return (
                    f"decision {rec.decision_id!r}: {name} has {k!r}: {v!r}; expected "
                    "non-negative integer feature ids and finite values"
                )
    return None


def table(rows: Sequence[Row], kind: LogKind) -> pa.Table:
    """The rows as an Arrow table of `schema(kind)` (journal parts use it too)."""

    def action(a: str | FeatureMap) -> str | list[tuple[str, float]]:
        return a if isinstance(a, str) else _fmap(a)

    recs = [r.rec for r in rows]
    columns = {
        "mdp_id": [r.mdp_id for r in recs],
        "sequence_number": [int(r.sequence_number) for r in recs],
        "state_features": [_fmap(r.state_features) for r in recs],
        "action": [action(r.action) for r in recs],
        "reward": [float(r.reward) for r in rows],
        "possible_actions": [[action(a) for a in r.possible_actions] for r in recs],
        "action_probability": [float(r.action_probability) for r in recs],
        "metrics": [[(str(k), float(v)) for k, v in r.metrics.items()] for r in rows],
        "decision_id": [r.decision_id for r in recs],
        "model_id": [r.model_id for r in recs],
        "decision_time": [round(r.time_s * 1e6) for r in recs],
        "feedback_missing": [r.feedback_missing for r in rows],
    }
    return pa.table(columns, schema=schema(kind))


def write_part(path: Path, rows: Sequence[Row], kind: LogKind) -> None:
    """Writes a part durably: a dot-named temp file (skipped by readers), fsynced, renamed
    to `path`, the directory fsynced. Raises OSError (the temp file removed) on failure."""
    # Encoded in memory, then written by Python: a full disk is then an OSError with its
    # errno (Arrow's own writer reports it without one).
    buffer = pa.BufferOutputStream()
    pq.write_table(table(rows, kind), buffer)
    atomic_write_bytes(path, buffer.getvalue().to_pybytes())


def read_records(path: Path) -> list[DecisionRecord]:
    """The decisions of a (journal) part."""
    out: list[DecisionRecord] = []
    for d in pq.read_table(path).to_pylist():

        def fmap(pairs: Iterable[tuple[str, float]]) -> dict[int, float]:
            return {int(k): float(v) for k, v in pairs}

        action: str | dict[int, float]
        possible: list[str] | list[dict[int, float]]
        if isinstance(d["action"], str):  # dqn
            action, possible = d["action"], [str(a) for a in d["possible_actions"]]
        else:
            action, possible = fmap(d["action"]), [fmap(a) for a in d["possible_actions"]]
        out.append(
            DecisionRecord(
                decision_id=d["decision_id"],
                mdp_id=d["mdp_id"],
                sequence_number=d["sequence_number"],
                state_features=fmap(d["state_features"]),
                action=action,
                possible_actions=possible,
                action_probability=d["action_probability"],
                model_id=d["model_id"],
                time_s=d["decision_time"].timestamp(),
            )
        )
    return out


def read_decision_ids(path: Path) -> list[str]:
    return [str(x) for x in pq.read_table(path, columns=["decision_id"]).column(0).to_pylist()]


def part_time_us(name: str) -> int | None:
    """The time in a part's name (µs since the epoch), None for another file."""
    m = _PART.match(name)
    if m is None:
        return None
    t = dt.datetime.strptime(m.group(1), _TIME_FORMAT).replace(tzinfo=dt.UTC)
    return (t - _EPOCH) // dt.timedelta(microseconds=1)


def part_name(time_us: int, seq: int) -> str:
    t = _EPOCH + dt.timedelta(microseconds=time_us)  # integer maths: names parse back exactly
    return f"part-{t.strftime(_TIME_FORMAT)}Z-{seq:06d}.parquet"


def list_parts(directory: Path) -> list[Path]:
    """The parts in `directory` (not its temp files or anything else), oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if part_time_us(p.name) is not None)
