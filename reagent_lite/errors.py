"""The error types a user can see, each with the exit code the workflows use for it.

Every error that reaches the command line is one of these: the CLI prints its message
(never a traceback) and exits with `exit_code`.
"""

from __future__ import annotations


class ReagentLiteError(Exception):
    """Base class: a problem with the user's input or environment, explained in words."""

    exit_code = 1
    # True when every rank raises this error at the same agreed point (a preemption stop):
    # the ranks then leave the process group as a finished run does, not by aborting it.
    agreed_by_all_ranks = False


class ConfigError(ReagentLiteError):
    """The config file or the command-line flags are wrong (raised before any process group)."""

    exit_code = 2


class DataError(ReagentLiteError):
    """A data file is missing, unreadable or holds bad values (names file, column, row count)."""

    exit_code = 3


class DistributedError(ReagentLiteError):
    """Rendezvous or collective failure: a missing or dead peer, a duplicate node index."""

    exit_code = 4


class TrainingError(ReagentLiteError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""

    exit_code = 5
