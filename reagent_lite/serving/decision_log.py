"""The decision log: every decision the server makes, joined to its feedback, written as
step-log rows that `reagent-lite timeline --input LOG_DIR` reads as they are.

Design (what is where, and why nothing is lost):

* **Rows.** A decision's row needs its reward, so `record` holds a decision in memory
  until `feedback` arrives for it (joined; the row is then *ready*) or `feedback_window_s`
  after its `time_s` has passed (the row is written with reward 0.0, no metrics and
  `feedback_missing` true, and counted). Feedback for an unknown, expired or already
  answered decision returns False and is counted (`feedback_unmatched`).
* **Final parts.** A flusher thread wakes every `flush_interval_s` (sooner when
  `part_max_rows` rows are ready) and writes the ready rows as `LOG_DIR/part-<UTC time>-
  <seq>.parquet`, at most `part_max_rows` rows each: a dot-named temp file (which readers
  skip), fsynced, renamed, the directory fsynced. Names sort in write order.
* **Journal.** So that a SIGKILL loses at most the last flush interval also of decisions
  still waiting for feedback, the same flush then writes the decisions recorded since the
  last one that are still held to `LOG_DIR/_journal/` (same part format; the timeline
  skips names starting with `_`). Feedback needs no journal of its own: a joined row is
  written to a final part in the flush that follows it, before that flush's journal part.
  A journal part is deleted once every decision in it is in a final part.
* **Recovery.** On start-up the journal is read; decisions already in a final part
  written since the oldest journal part are not held again (no duplicates), the others
  are held again until their window (counted from `time_s`) ends. Left-over temp files
  of a killed write are removed.
* **Failures.** A write that fails (a full disk, a directory turned read-only) leaves
  the rows in memory and every part written before untouched; until a later flush
  succeeds, `record` raises `LogUnavailable` naming the directory and the errno (the
  server answers 503), so no answered decision goes unlogged.
* **Threads.** One lock guards the in-memory state; `record` and `feedback` never wait
  for disk I/O (the flusher swaps the buffers out under the lock and writes outside it).
* **Refusals.** `record` raises `RecordRefused` (422) for a decision whose row the
  timeline or the workflows would refuse, the whole log with it for a repeated step.
* One log per directory: an exclusive `flock` on `_journal/.lock` while it is open (the
  kernel drops it with the process), since two logs would delete each other's journal.
* `close` writes everything, held decisions as feedback missing, and empties the journal.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from reagent_lite.errors import ReagentLiteError
from reagent_lite.io_utils import describe_os_error, remove_temp_files
from reagent_lite.serving.log_parts import (
    JOURNAL_DIR,
    DecisionRecord,
    Row,
    check_record,
    is_number,
    list_parts,
    log_kind,
    part_name,
    part_time_us,
    read_decision_ids,
    read_records,
    schema,
    write_part,
)

__all__ = ["DecisionLog", "DecisionRecord", "LogUnavailable", "RecordRefused"]


class RecordRefused(ValueError):
    """A decision the log will not take because the timeline would refuse its row, or
    the whole log, for it (the server answers 422 with this message)."""


class LogUnavailable(ReagentLiteError, RuntimeError):
    """The log cannot take decisions now (a full disk, an unwritable directory, closed):
    the server answers 503 with this message."""

    exit_code = 2  # at start-up it is the --log-dir flag that is wrong, as for outputs


@dataclass
class _Held:
    rec: DecisionRecord
    ticket: int  # its entry in the expiry heap (a stale entry has another ticket)


class DecisionLog:
    """Decisions and their feedback, written as rotated Parquet step-log parts (see the
    module docstring for the design)."""

    def __init__(
        self,
        log_dir: Path,
        kind: str,
        *,
        flush_interval_s: float = 1.0,
        part_max_rows: int = 50_000,
        feedback_window_s: float = 600.0,
    ) -> None:
        if flush_interval_s <= 0 or part_max_rows < 1 or feedback_window_s < 0:
            raise ValueError(
                f"flush_interval_s={flush_interval_s}, part_max_rows={part_max_rows}, "
                f"feedback_window_s={feedback_window_s}: expected > 0, >= 1 and >= 0"
            )
        self.log_dir, self.kind = Path(log_dir), log_kind(kind)  # ValueError: not served
        self._journal = self.log_dir / JOURNAL_DIR
        self._interval, self._max_rows = flush_interval_s, part_max_rows
        self._window = feedback_window_s
        self._lock = threading.Lock()  # the in-memory state below
        self._io = threading.RLock()  # one flush at a time
        self._wake = threading.Condition(self._lock)
        self._held: dict[str, _Held] = {}  # decision_id -> decision waiting for feedback
        # (deadline: time_s + window, ticket, decision_id): expiry without a scan of _held;
        # entries of answered decisions stay until their deadline and are then skipped.
        self._deadlines: list[tuple[float, int, str]] = []
        self._tickets = itertools.count()
        # (mdp_id, sequence_number) of the held decisions: a repeat (a client's retry) would
        # make the timeline refuse the whole log, so it is refused here.
        self._steps: set[tuple[str, int]] = set()
        self._ready: list[Row] = []  # rows for the next final part
        self._unjournaled: list[str] = []  # held ids not yet in a journal part
        self._journal_of: dict[str, Path] = {}  # id (held or ready) -> its journal part
        self._journal_live: dict[Path, int] = {}  # journal part -> ids not yet final
        self._counts = dict.fromkeys(
            ("decisions", "feedback_joined", "feedback_unmatched", "feedback_missing",
             "parts", "recovered"), 0)  # fmt: skip
        self._failure: str | None = None
        self._closed = False
        self._last_us, self._seq = 0, 0
        try:
            self._journal.mkdir(parents=True, exist_ok=True)
            for directory in (self.log_dir, self._journal):  # fail now, not at the first flush
                tempfile.NamedTemporaryFile(dir=directory, prefix=".write-probe-").close()
            self._dir_lock = self._lock_dir()
        except OSError as err:
            raise LogUnavailable(
                f"decision log: cannot use {describe_os_error(err)}; expected a writable directory"
            ) from err
        try:
            remove_temp_files(self.log_dir)
            remove_temp_files(self._journal)
            self._recover()
        except (OSError, ValueError, LogUnavailable) as err:
            os.close(self._dir_lock)  # not left locked by a log that never opened
            if isinstance(err, LogUnavailable):
                raise
            raise LogUnavailable(f"decision log {self.log_dir}: cannot recover: {err}") from err
        self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
        self._thread.start()

    # -- the server's calls ------------------------------------------------------------

    def record(self, rec: DecisionRecord) -> None:
        """Holds `rec` until its feedback (thread-safe; no disk I/O). LogUnavailable when
        the log is closed or its last write failed; RecordRefused for a row the timeline
        would refuse (a propensity outside (0, 1], the wrong action type, a repeated id or
        a repeated step of a held decision)."""
        problem = check_record(rec, self.kind)
        if problem:
            raise RecordRefused(problem)
        with self._lock:
            self._check_available()
            if rec.decision_id in self._held:
                raise RecordRefused(f"decision_id {rec.decision_id!r} is already recorded")
            step = (rec.mdp_id, rec.sequence_number)
            if step in self._steps:
                raise RecordRefused(
                    f"mdp_id {rec.mdp_id!r}, sequence_number {rec.sequence_number}: a decision "
                    "of that step is already waiting for feedback; expected one per step"
                )
            self._hold(rec)
            self._unjournaled.append(rec.decision_id)
            self._counts["decisions"] += 1

    def feedback(
        self, decision_id: str, reward: float, metrics: Mapping[str, float] | None = None
    ) -> bool:
        """Joins `reward` (and `metrics`) to a held decision; False (counted) when no
        decision `decision_id` is held: unknown, its window ended, or already answered.
        RecordRefused for a reward or metric that is not a finite number."""
        values = {"reward": reward, **{f"metrics[{k!r}]": v for k, v in (metrics or {}).items()}}
        for name, value in values.items():
            if not is_number(value):
                raise RecordRefused(
                    f"feedback for {decision_id!r}: {name} is {value!r}; expected a finite number"
                )
        with self._lock:
            if self._closed:
                raise LogUnavailable(f"decision log {self.log_dir} is closed")
            held = self._release(decision_id)
            if held is None:
                self._counts["feedback_unmatched"] += 1
                return False
            row_metrics = {str(k): float(v) for k, v in (metrics or {}).items()}
            self._ready.append(Row(held.rec, float(reward), row_metrics, False))
            self._counts["feedback_joined"] += 1
            if len(self._ready) >= self._max_rows:
                self._wake.notify()
            return True

    def flush(self) -> None:
        """Writes the ready rows and journals the held decisions now; LogUnavailable when
        a write fails (the rows stay in memory for the next try)."""
        self._flush()

    def close(self) -> None:
        """Stops the flusher and writes everything, held decisions as feedback missing;
        idempotent. LogUnavailable when that last write fails (the journal is kept)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._wake.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        with self._io:
            if self._dir_lock < 0:
                return  # closed before, everything written
            self._flush(expire_all=True)
            os.close(self._dir_lock)  # the lock goes with it
            self._dir_lock = -1

    def stats(self) -> Mapping[str, int]:
        """decisions, feedback_joined, feedback_unmatched, feedback_missing, pending,
        parts (final parts written by this process), recovered (held again at start)."""
        with self._lock:
            return {**self._counts, "pending": len(self._held) + len(self._ready)}

    # -- writing -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                if len(self._ready) < self._max_rows:
                    self._wake.wait(self._interval)
                if self._closed:
                    return
            # A failure is kept in self._failure: record() refuses until a flush succeeds.
            with contextlib.suppress(LogUnavailable):
                self._flush()

    def _flush(self, expire_all: bool = False) -> None:
        with self._io:
            with self._lock:
                self._expire(float("inf") if expire_all else time.time())
                ready, self._ready = self._ready, []
                new_ids, self._unjournaled = self._unjournaled, []
                # Held now; journaled even if feedback comes before the journal is written.
                new = [self._held[i].rec for i in new_ids if i in self._held]
            done = 0
            try:
                while done < len(ready):
                    chunk = ready[done : done + self._max_rows]
                    write_part(self._next_path(self.log_dir), chunk, self.kind)
                    done += len(chunk)
                    with self._lock:
                        self._counts["parts"] += 1
                        emptied = self._finalised(chunk)
                    for path in emptied:
                        path.unlink(missing_ok=True)
                if new:
                    self._write_journal(new)
            except OSError as err:
                self._failed(err, ready[done:], new_ids)
                raise LogUnavailable(self._message(err)) from err
            with self._lock:
                self._failure = None

    def _write_journal(self, recs: list[DecisionRecord]) -> None:
        path = self._next_path(self._journal)
        write_part(path, [Row(r, 0.0, {}, True) for r in recs], self.kind)
        with self._lock:
            # Rows that became ready since still count: they are final only once written.
            self._journal_live[path] = len(recs)
            for r in recs:
                self._journal_of[r.decision_id] = path

    def _failed(self, err: OSError, unwritten: list[Row], new_ids: list[str]) -> None:
        with self._lock:
            self._ready[:0] = unwritten
            self._unjournaled[:0] = new_ids
            self._failure = self._message(err)

    def _finalised(self, rows: list[Row]) -> list[Path]:
        """Called under the lock once `rows` are in a final part: the journal parts that
        now hold nothing unwritten, for the caller to delete (outside the lock)."""
        emptied = []
        for row in rows:
            path = self._journal_of.pop(row.rec.decision_id, None)
            if path is None:
                continue
            self._journal_live[path] -= 1
            if self._journal_live[path] == 0:
                del self._journal_live[path]
                emptied.append(path)
        return emptied

    def _hold(self, rec: DecisionRecord) -> None:
        ticket = next(self._tickets)
        self._held[rec.decision_id] = _Held(rec, ticket)
        self._steps.add((rec.mdp_id, rec.sequence_number))
        heapq.heappush(self._deadlines, (rec.time_s + self._window, ticket, rec.decision_id))

    def _release(self, decision_id: str) -> _Held | None:
        held = self._held.pop(decision_id, None)
        if held is not None:
            self._steps.discard((held.rec.mdp_id, held.rec.sequence_number))
        return held

    def _expire(self, now_s: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now_s:
            _, ticket, decision_id = heapq.heappop(self._deadlines)
            held = self._held.get(decision_id)
            if held is None or held.ticket != ticket:
                continue  # answered already
            self._release(decision_id)
            self._ready.append(Row(held.rec, 0.0, {}, True))
            self._counts["feedback_missing"] += 1

    def _next_path(self, directory: Path) -> Path:
        # Strictly increasing times, also across restarts (see _recover): a final part
        # always sorts after the journal parts whose decisions it holds.
        with self._lock:
            self._last_us = max(time.time_ns() // 1000, self._last_us + 1)
            self._seq += 1
            return directory / part_name(self._last_us, self._seq)

    def _check_available(self) -> None:
        if self._closed:
            raise LogUnavailable(f"decision log {self.log_dir} is closed")
        if self._failure is not None:
            raise LogUnavailable(self._failure)

    def _lock_dir(self) -> int:
        """An exclusive lock on the directory for this log's life (the kernel drops it
        when the process dies, SIGKILL included): two logs in one directory would delete
        each other's journal parts."""
        fd = os.open(self._journal / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogUnavailable(
                f"decision log {self.log_dir}: another decision log writes there (it holds "
                f"{self._journal / '.lock'}); expected one per directory"
            ) from None
        return fd

    def _message(self, err: OSError) -> str:
        return (
            f"decision log {self.log_dir}: cannot write {describe_os_error(err)}; decisions "
            "are refused until a write succeeds (parts already written are complete)"
        )

    # -- start-up ----------------------------------------------------------------------

    def _recover(self) -> None:
        finals, journal = list_parts(self.log_dir), list_parts(self._journal)
        times = [part_time_us(p.name) or 0 for p in finals + journal]
        self._last_us = max(times, default=0)
        if finals:
            # Parts of another kind (or format) in one directory: the timeline would refuse it.
            found = pq.read_schema(finals[-1])
            if not found.equals(schema(self.kind)):
                action = found.field("action").type if "action" in found.names else "none"
                raise LogUnavailable(
                    f"decision log {self.log_dir}: {finals[-1].name} holds rows of another kind "
                    f"or format (action: {action}); expected {self.kind} decision-log parts: "
                    "give this model its own log directory"
                )
        if not journal:
            return
        oldest = part_time_us(journal[0].name) or 0
        final_ids: set[str] = set()
        for p in finals:
            if (part_time_us(p.name) or 0) > oldest:
                final_ids.update(read_decision_ids(p))
        for path in journal:
            live = 0
            for rec in read_records(path):
                if rec.decision_id in final_ids or rec.decision_id in self._held:
                    continue
                self._hold(rec)
                self._journal_of[rec.decision_id] = path
                live += 1
            if live:
                self._journal_live[path] = live
            else:
                path.unlink()
        self._counts["recovered"] = len(self._held)
