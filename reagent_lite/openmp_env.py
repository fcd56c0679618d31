"""OpenMP's wait policy for this process, chosen before torch loads (torch-free on purpose).

OpenMP reads ``OMP_WAIT_POLICY`` once, when its runtime loads with ``import torch``; later
changes reach only processes started afterwards. The command-line entry point calls
`choose_wait_policy_early` before it imports torch, and `distributed/threads.py` asks
`wait_policy_here` what this process got. Threads that wait passively sleep instead of
spinning: on a shared CPU a spinning thread keeps the core from the peer it waits for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

WAIT_VAR = "OMP_WAIT_POLICY"
# Measured by benchmarks/bench_neighbours.py (docs/DISTRIBUTED.md).
DEFAULT_WAIT = "PASSIVE"

# The user's OMP_WAIT_POLICY as the entry point found it, and whether torch was still to
# be imported then. None: the entry point did not choose (a program calling the library,
# whose environment is its own).
_early: tuple[str | None, bool] | None = None


def choose_wait_policy_early(environ: MutableMapping[str, str] | None = None) -> None:
    """Sets ``OMP_WAIT_POLICY`` for this process (and the processes it starts) unless the
    user did; a second call changes nothing."""
    global _early
    env = os.environ if environ is None else environ
    if _early is not None:
        return
    user = env.get(WAIT_VAR) or None
    _early = (user, "torch" not in sys.modules)
    if user is None:
        env[WAIT_VAR] = DEFAULT_WAIT


def wait_policy_here() -> tuple[str | None, bool]:
    """(the user's OMP_WAIT_POLICY or None, whether this process could still be given
    ours when its OpenMP loaded)."""
    if _early is not None:
        return _early
    return os.environ.get(WAIT_VAR) or None, "torch" not in sys.modules
